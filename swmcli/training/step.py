"""The training step: what ``swm train`` runs and ``swm memprofile`` traces.

One module, so that the step memprofile predicts is the step training takes: ``optimizer_step``
(forward under autocast, backward, clip, AdamW), the learning-rate schedule, the seeded clip
order, and the figures a step logs. The model with its memory techniques and its optimizer are
``recipe``'s (AdamW in ``train.optimizer_impl``'s implementation).
"""

import math

import numpy as np
import torch

from swmcli.training.distributed import gradient_sync, mean_over_ranks

TRAIN_KEYS = ["pixels", "action"]  # the only keys the loss reads: the loader fetches nothing else
PROPRIO_KEY = "proprio"  # the agent's own state, read too with model.proprio
STATE_KEY = "state"  # the env's recorded state, read too with model.state_weight
WARMUP_FRACTION = 0.05
FINAL_LR_FRACTION = 0.1


def train_keys(cfg) -> list[str]:
    """The keys training reads: ``TRAIN_KEYS``, the agent's state with ``model.proprio``, the
    env's recorded state with ``model.state_weight``."""
    proprio = [PROPRIO_KEY] if cfg.model.proprio else []
    state = [STATE_KEY] if cfg.model.state_weight > 0 else []
    return [*TRAIN_KEYS, *proprio, *state]


def learning_rate(step: int, total_steps: int, peak: float) -> float:
    """Linear warm-up over the first 5% of steps, then cosine decay to 10% of ``peak``."""
    warmup = max(1, int(WARMUP_FRACTION * total_steps))
    if step < warmup:
        return peak * (step + 1) / warmup
    progress_done = (step - warmup) / max(1, total_steps - warmup)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress_done)))
    return peak * (FINAL_LR_FRACTION + (1 - FINAL_LR_FRACTION) * cosine)


def _epoch_parts(num_clips: int, clips_per_step: int, first_step: int, last_step: int, seed: int):
    """The clip indices of steps ``first_step .. last_step-1``, one epoch's permutation (or part
    of it) at a time."""
    begin, end = first_step * clips_per_step, last_step * clips_per_step
    epoch = begin // num_clips
    while epoch * num_clips < end:
        permutation = np.random.default_rng([seed, epoch]).permutation(num_clips)
        low = max(begin - epoch * num_clips, 0)
        high = min(end - epoch * num_clips, num_clips)
        yield permutation[low:high]
        epoch += 1


class ClipOrder:
    """Clip indices for steps ``first_step .. last_step-1``, ``clips_per_step`` per step.

    Epochs are permutations drawn from ``(seed, epoch)``, so a step's clips do not depend on
    where a previous process stopped: resuming at step k reads what step k would have read.
    Drawn one epoch at a time: memory stays at one epoch's permutation however many steps are
    asked for (``--steps 100000000000`` allocates nothing more).
    """

    def __init__(self, num_clips: int, clips_per_step: int, first_step: int, last_step: int, seed):
        self._args = (num_clips, clips_per_step, first_step, last_step, seed)
        self._length = max(last_step - first_step, 0) * clips_per_step

    def __len__(self) -> int:
        return self._length

    def __iter__(self):
        for part in _epoch_parts(*self._args):
            yield from part.tolist()


def model_bytes(model, optimizer) -> int:
    """Bytes of the model's parameters, gradients and optimizer state (what training holds
    besides activations and batches)."""
    tensors = [*model.parameters()]
    tensors += [p.grad for p in model.parameters() if p.grad is not None]
    for state in optimizer.state.values():
        tensors += [v for v in state.values() if hasattr(v, "element_size")]
    return sum(t.numel() * t.element_size() for t in tensors)


def optimizer_step(
    objective, optimizer, device_batches, runner, grad_clip: float, micro_batches: int
):
    """One optimizer step: free the gradients, forward under autocast and backward for each of
    the ``micro_batches`` device batches, clip (``grad_clip`` > 0), step. ``objective`` is the
    model's ``interface.Objective`` (or its data-parallel wrapper). Returns the detached loss
    terms of each micro-batch and the global gradient norm before clipping (an optimizer that
    steps in backward took it as it went), without reading them back (memprofile runs this very
    function on fake tensors, which have no values). Data-parallel ranks all-reduce only the last
    micro-batch's gradients (``gradient_sync``)."""
    optimizer.zero_grad(set_to_none=True)
    parts = []
    for index, batch in enumerate(device_batches):
        with gradient_sync(objective, last=index == micro_batches - 1):
            with runner.autocast():
                terms = objective(batch)
            (terms["loss"] / micro_batches).backward()
        parts.append({key: torch.as_tensor(value).detach() for key, value in terms.items()})
    if hasattr(optimizer, "grad_norm"):  # it stepped in backward, taking each gradient's norm
        grad_norm = optimizer.grad_norm()
    else:
        grad_norm = clipped_norm(list(objective.parameters()), grad_clip)
    optimizer.step()
    return parts, grad_norm


def clipped_norm(parameters: list, grad_clip: float):
    """The global 2-norm of the gradients of ``parameters``, which are scaled down to
    ``grad_clip`` when it is above it (``grad_clip`` 0: not clipped)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    grad_norm = torch.nn.utils.get_total_norm(grads)
    if grad_clip > 0:
        torch.nn.utils.clip_grads_with_norm_(parameters, grad_clip, grad_norm)
    if hasattr(grad_norm, "full_tensor"):  # sharded parameters: the norm is a DTensor
        grad_norm = grad_norm.full_tensor()
    return grad_norm


MEETING_SECONDS = 1.0  # data-parallel ranks agree on stopping at least about this often
STOP = " stop"  # not a loss term's name: keys no model returns
SECONDS = " seconds"


class RankMeetings:
    """The figures each step logs, and the steps at which data-parallel ranks all-reduce them.

    Ranks meet (one all-reduce: each loss term, the stop flag, the step time) at every step that
    logs and, between those, often enough that Ctrl-C or SIGTERM on any rank stops every rank
    at the same step within about ``MEETING_SECONDS``: the next meeting is that many seconds
    ahead at the ranks' mean step time, so every rank computes the same step. Between meetings a
    rank's figures are its own (the progress bar's loss is rank 0's). Each collective makes one
    rank wait for the other and costs a gloo round trip: one every step cost 3-4% of a 100 ms
    step against a loop that all-reduces only what it logs. One process meets every step: it
    has no one to wait for.
    """

    def __init__(self, world, log_every: int, last_step: int) -> None:
        self.world = world
        self.log_every = log_every
        self.last_step = last_step
        self.next = 0  # the first step meets

    def logs(self, done: int) -> bool:
        """Whether step ``done``'s figures are logged."""
        return done % self.log_every == 0 or done == self.last_step

    def due(self, done: int) -> bool:
        """Whether the ranks meet after step ``done``: all of them answer the same."""
        return self.world.size == 1 or self.logs(done) or done >= self.next

    def figures(
        self, done: int, parts: list[dict], grad_norm, optimizer, interrupted: bool, seconds: float
    ) -> tuple[dict[str, float], bool]:
        """Step ``done``'s figures, read back from the device once: the mean of each loss term
        over the micro-batches (at a meeting, over the ranks too: the global batch's), the
        gradient norm and the learning rate; and whether the ranks stop after it (at a meeting,
        if any rank was ``interrupted``). ``seconds``: this rank's time for the last step."""
        means = {key: sum(float(part[key]) for part in parts) / len(parts) for key in parts[0]}
        stop = False
        if self.due(done):
            flags = {STOP: float(interrupted), SECONDS: seconds}
            agreed = mean_over_ranks({**means, **flags}, self.world)
            stop = agreed.pop(STOP) > 0
            mean_seconds = agreed.pop(SECONDS)
            ahead = int(MEETING_SECONDS / mean_seconds) if mean_seconds > 0 else 1
            self.next = done + min(max(ahead, 1), self.log_every)
            means = agreed
        lr = optimizer.param_groups[0]["lr"]
        return {**means, "grad_norm": float(grad_norm), "lr": lr}, stop
