"""Predicting one step's peak memory: the steps swm runs, traced on fake tensors.

A ``Variant`` is the settings of one step (train or eval, fp32 or bf16, batch, history,
frameskip). ``PeakPredictor`` builds the configured world model once per clip shape and traces
each variant's step with ``swmcli.memory.trace.trace_step_peak`` (cached), for the device the step
will run on: ``"cuda"`` (what CUDA bf16 autocast keeps in float32, each storage rounded up to 512
bytes as the allocator rounds it) or ``"cpu"`` (CPU autocast as it is, exact bytes). The training
step is ``swm train``'s own ``optimizer_step``; the eval step is encode + predict, with or without
gradients. ``largest_fitting`` finds the largest batch whose prediction fits a budget in a few
predictions. ``swm memprofile`` turns these into its technique table.
"""

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from swmcli.config import SwmConfig, with_settings
from swmcli.errors import BudgetExceeded
from swmcli.host import available_host_bytes
from swmcli.memory.trace import (
    CUDA_ROUNDING_BYTES,
    StepPeak,
    copy_sharing_weights,
    cuda_allowance_bytes,
    cuda_autocast_on_cpu,
    recompute_with_cuda_casts,
    trace_step_peak,
)
from swmcli.models.global_batch import simulated_ranks
from swmcli.models.interface import Objective, build_model
from swmcli.models.rollout import encode_observation
from swmcli.models.runner import Runner
from swmcli.training.recipe import freeze_parts, make_optimizer
from swmcli.training.step import PROPRIO_KEY, STATE_KEY, TRAIN_KEYS, optimizer_step, train_keys
from swmcli.training.techniques import (
    InBackwardOptimizer,
    checkpoint_activations,
    comma_names,
    layers,
)
from swmcli.units import format_bytes

DEVICES = ("cuda", "cpu")  # whose semantics a prediction follows
MAX_BUDGET_PREDICTIONS = 32  # the budget search's cap; near-linear memory needs 2 or 3
LINE_GUESSES = 3  # then bisection
UNTRACED_PART = "proprio_norm"  # swm's model's part for the agent's state, left out of a trace


@dataclass(frozen=True)
class Variant:
    """The settings of one technique row: what runs, in which precision, on what clips."""

    kind: str  # "train" or "eval"
    bf16: bool
    batch_size: int
    history_len: int
    frameskip: int
    grad_free: bool = False  # eval only: requires_grad_(False) + inference_mode
    compile: bool = False
    ranks: int = 1  # data-parallel training: batch_size is global, each rank holds its share
    checkpointing: str | None = None  # techniques: modules whose activations are recomputed
    in_backward: bool = False  # techniques: the optimizer step fused into backward
    shard: bool = False  # FSDP2 over the ranks: parameters, gradients, AdamW state sharded

    @property
    def rank_batch_size(self) -> int:
        """Clips one rank holds (eval runs in one process: all of them)."""
        if self.kind != "train":
            return self.batch_size
        return max(1, self.batch_size // self.ranks)

    def describe(self) -> str:
        """The settings in words, for the table."""
        precision = "bf16" if self.bf16 else "fp32"
        words = f"{precision} B={self.batch_size} H={self.history_len} F={self.frameskip}"
        if self.ranks > 1 and self.kind == "train":
            words += f" / {self.ranks} ranks" + (" sharded" if self.shard else "")
        if self.checkpointing:
            words += f" AC={self.checkpointing}"
        if self.in_backward:
            words += " opt-in-bwd"
        return words + " compiled" if self.compile else words


def configured_variant(cfg: SwmConfig, batch_size: int) -> Variant:
    """The training step ``cfg`` runs (precision, clips, ranks, techniques) at ``batch_size``."""
    runtime = cfg.runtime
    return Variant(
        "train",
        runtime.bf16,
        batch_size,
        cfg.data.history_len,
        cfg.data.frameskip,
        ranks=runtime.nproc,
        checkpointing=runtime.activation_checkpointing,
        in_backward=runtime.optimizer_in_backward,
        shard=runtime.shard and runtime.nproc > 1,
    )


def traced_grad_clip(cfg: SwmConfig, variant: Variant) -> float:
    """The clipping a traced step runs: the config's, none where the optimizer steps in backward
    (training refuses clipping there: ``techniques.check_combination``)."""
    return 0.0 if variant.in_backward else cfg.train.grad_clip


def traced_micro_batches(cfg: SwmConfig, variant: Variant) -> int:
    """Micro-batches a traced training step runs: two show every accumulation cost (the second
    runs with the gradients alive); one where the optimizer steps in backward (no accumulation)."""
    return 1 if variant.in_backward else min(cfg.train.grad_accum, 2)


# --- the steps: the same code is traced on fake tensors and run on a GPU ------------------------


def train_step(
    objective, optimizer, batch, runner, grad_clip: float, micro_batches: int = 1
) -> None:
    """One optimizer step exactly as ``swm train`` takes it (its own ``optimizer_step``), with
    ``batch`` standing for each micro-batch: a later one runs with the gradients alive."""
    optimizer_step(objective, optimizer, [batch] * micro_batches, runner, grad_clip, micro_batches)


def make_optimizer_state(model, optimizer) -> None:
    """The optimizer state a second training step starts with (AdamW's moments), made by one
    update from zero gradients, which are then freed: a step traced after it peaks as the second
    step of training does (its state alive throughout), without tracing a first forward and
    backward (half of a trace's time). The first step never peaks higher: it holds the same
    tensors, less the state during its forward and backward."""
    import torch

    parameters = _trainable(model)
    for parameter in parameters:
        parameter.grad = torch.zeros_like(parameter)
    if isinstance(optimizer, InBackwardOptimizer):  # one optimizer per parameter
        for one in optimizer.optimizers.values():
            one.step()
    else:
        optimizer.step()
    for parameter in parameters:
        parameter.grad = None


def _trainable(model) -> list:
    return [p for p in model.parameters() if p.requires_grad]


def _state_of(optimizer, parameter) -> dict:
    """Where ``optimizer`` keeps ``parameter``'s state (its own, per-parameter optimizer's)."""
    if isinstance(optimizer, InBackwardOptimizer):
        return optimizer.optimizers[parameter].state
    return optimizer.state


class OptimizerStates:
    """The state a second training step starts with, for each model shape traced: made by
    ``make_optimizer_state`` the first time, then remade one tensor at a time from what that
    update made (an update on fake tensors is a quarter of a ViT-B trace, and per-parameter
    optimizers step hundreds of times): zeros of the moments' shapes, and scalars (AdamW's
    ``step``) with their values, which the next update reads."""

    def __init__(self) -> None:
        self._layouts: dict[Any, list[dict[str, Any]]] = {}

    def make(self, key, model, optimizer) -> list:
        """Give ``optimizer`` (of ``model``) its state; returns the state's tensors."""
        parameters = _trainable(model)
        layout = self._layouts.get(key)
        if layout is None:
            make_optimizer_state(model, optimizer)
            self._layouts[key] = [
                {name: _entry(value) for name, value in _state_of(optimizer, p)[p].items()}
                for p in parameters
            ]
        else:
            for parameter, entries in zip(parameters, layout, strict=True):
                state = {name: _remade(entry) for name, entry in entries.items()}
                _state_of(optimizer, parameter)[parameter] = state
        return [list(_state_of(optimizer, p)[p].values()) for p in parameters]


@dataclass(frozen=True)
class _StateTensor:
    """How to remake one tensor of optimizer state: zeros of its layout, or a scalar's value."""

    layout: tuple  # (shape, stride); () for a scalar
    dtype: Any
    device: Any
    value: float | None  # a scalar's (AdamW's step count, which the update reads)

    def make(self):
        import torch

        if self.value is not None:
            return torch.tensor(self.value, dtype=self.dtype, device=self.device)
        return torch.empty_strided(*self.layout, dtype=self.dtype, device=self.device).zero_()


def _entry(value):
    """What remakes one state value: a ``_StateTensor`` for a tensor, else the value itself. A
    scalar keeps its value where it has one to read (a fused AdamW's step is a fake tensor on
    the parameters' device: its value is never read on the host)."""
    import torch
    from torch._subclasses.fake_tensor import DataDependentOutputException

    if not isinstance(value, torch.Tensor):
        return value
    layout = (value.shape, value.stride())
    if value.dim() == 0:
        try:
            return _StateTensor((), value.dtype, value.device, value.item())
        except DataDependentOutputException:
            pass
    return _StateTensor(layout, value.dtype, value.device, None)


def _remade(entry):
    return entry.make() if isinstance(entry, _StateTensor) else entry


def eval_step(model, batch, runner, grad_free: bool):
    """One eval forward: encode the clip and predict next latents (kept alive until returned)."""
    if grad_free:
        with runner.inference(model):
            latents = encode_observation(model, batch)
            return model.predict(latents[:, :-1], batch["action"][:, :-1])
    model.eval()
    with runner.autocast():
        latents = encode_observation(model, batch)
        return model.predict(latents[:, :-1], batch["action"][:, :-1])


def clip_batch(step: dict[str, np.ndarray], variant: Variant, device: str = "cpu") -> dict:
    """The device batch ``swm train`` moves for ``variant``: each key of ``step`` (one row of
    the data's keys that training reads) in clip layout.

    ``pixels`` is uint8 ``(B, history_len, H, W, 3)``; ``action`` is ``(B, history_len,
    frameskip * action_dim)``. Zeros: under a fake mode they cost nothing; on a GPU the pixels
    are made random.
    """
    import torch

    batch = {}
    leading = (variant.rank_batch_size, variant.history_len)
    for key, value in step.items():
        value = np.asarray(value)
        if key == "action":
            shape = (*leading, variant.frameskip * value.size)
        else:
            shape = (*leading, *value.shape)
        dtype = torch.from_numpy(np.zeros(0, value.dtype)).dtype
        batch[key] = torch.zeros(shape, dtype=dtype, device=device)
    if device != "cpu":
        batch["pixels"].random_(0, 256)
    return batch


def cuda_runner(variant: Variant):
    """A Runner on the GPU in ``variant``'s precision, for measuring the same step for real."""
    import torch

    dtype = torch.bfloat16 if variant.bf16 else torch.float32
    return Runner(torch.device("cuda"), dtype, "memprofile", compile=variant.compile)


@dataclass
class TraceRunner:
    """The Runner's autocast and inference contexts, for tracing a step on CPU tensors as it runs
    on ``device``.

    bf16 is CPU autocast; for ``"cuda"`` plus the float32 casts CUDA autocast adds
    (``cuda_autocast_on_cpu``), so the trace keeps the dtypes a GPU keeps, and so do the
    recomputations of checkpointed modules (``prepare``). Inference is the Runner's (eval mode,
    ``requires_grad_(False)``, ``inference_mode``).
    """

    bf16: bool
    device: str = "cuda"

    @property
    def cuda_casts(self) -> bool:
        return self.bf16 and self.device == "cuda"

    def prepare(self, model) -> None:
        """The traced copy of the model: its checkpointed modules recompute as its forward ran."""
        if self.cuda_casts:
            recompute_with_cuda_casts(model)

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 autocast as ``device`` runs it, or nothing in fp32."""
        import torch

        if not self.bf16:
            return contextlib.nullcontext()
        if self.cuda_casts:
            return cuda_autocast_on_cpu(torch.bfloat16)
        return torch.autocast("cpu", dtype=torch.bfloat16)

    @contextlib.contextmanager
    def inference(self, model) -> Iterator[Any]:
        """Gradient-free evaluation, as ``Runner.inference``."""
        import torch

        model.eval()
        model.requires_grad_(False)
        with torch.inference_mode(), self.autocast():
            yield model


class PeakPredictor:
    """Predicts each variant's peak once (cached) from a fake-tensor trace of its step, as the
    step runs on ``device`` (``"cuda"`` or ``"cpu"``)."""

    def __init__(self, cfg: SwmConfig, step: dict[str, np.ndarray], device: str = "cuda"):
        if device not in DEVICES:
            raise ValueError(f"predictions are for one of {DEVICES}, not {device!r}")
        self.cfg = cfg
        if cfg.model.factory is None:
            # swm's state readout (model.state_weight) and proprio norm hold no weight and read
            # a few floats a frame: traced without them, as the batch without those keys.
            self.model_cfg = cfg.model.model_copy(update={"state_weight": 0.0})
            keys = TRAIN_KEYS
        else:  # a model of the user's reads every key its training reads
            self.model_cfg, keys = cfg.model, train_keys(cfg)
        self.step = {key: step[key] for key in keys if key in step}
        self.device = device
        self.round_bytes = CUDA_ROUNDING_BYTES if device == "cuda" else 1
        self.action_dim = int(np.asarray(step["action"]).size)
        self._models: dict[tuple[int, int], Any] = {}
        self._peaks: dict[Variant, StepPeak] = {}
        self._optimizer_states = OptimizerStates()
        self.seconds = 0.0

    def model(self, history_len: int, frameskip: int, checkpointing: str | None = None):
        """The real (CPU) world model for these clip settings (its ``checkpointing`` modules
        wrapped); traces use fake copies of it. Built once per clip shape: the checkpointed
        model is the plain one's structure, wrapped, sharing its weights."""
        key = (history_len, frameskip, checkpointing)
        if key not in self._models:
            if checkpointing:
                model = copy_sharing_weights(self.model(history_len, frameskip))
                checkpoint_activations(model, checkpointing)
            else:
                shape = {
                    "resolution": self.cfg.env.resolution,
                    "action_dim": self.action_dim,
                    "frameskip": frameskip,
                    "history_len": history_len,
                }
                sizes = {"proprio_dim": PROPRIO_KEY, "state_size": STATE_KEY}
                if self.cfg.model.factory is not None:
                    shape |= {arg: np.size(self.step[key]) for arg, key in sizes.items()
                              if key in self.step}  # fmt: skip
                model = build_model(self.model_cfg, shape)
                if self.cfg.train.freeze:
                    # The traced model leaves the agent's state out (its norm holds no weight):
                    # freeze the rest; any other name the model lacks is refused, as train does.
                    parts = dict(model.named_modules())
                    wanted = comma_names(self.cfg.train.freeze)
                    own = self.cfg.model.factory is None and self.cfg.model.proprio
                    untraced = {UNTRACED_PART} if own else set()
                    present = [name for name in wanted if name not in untraced or name in parts]
                    if present:
                        freeze_parts(model, ",".join(present))
            self._models[key] = model
        return self._models[key]

    def predict(self, variant: Variant) -> StepPeak:
        """The predicted peak of ``variant`` (eager; compile is not predictable here).

        Data-parallel training (``ranks`` > 1) is one rank's peak: its share of the batch, the
        batch statistics over all ranks' latents, plus DDP's gradient buckets.
        """
        variant = replace(variant, compile=False)
        if variant not in self._peaks:
            start = time.perf_counter()
            model = self.model(variant.history_len, variant.frameskip, variant.checkpointing)
            data_parallel = variant.kind == "train" and variant.ranks > 1
            with simulated_ranks(variant.ranks if data_parallel else 1):
                make = self.step_maker(variant)
                peak = trace_step_peak(model, make, round_bytes=self.round_bytes)
            if data_parallel:
                add = _with_shards if variant.shard else _with_ddp_buckets
                peak = add(peak, model, variant.ranks)
            self._peaks[variant] = peak
            self.seconds += time.perf_counter() - start
        return self._peaks[variant]

    def step_maker(self, variant: Variant) -> Callable:
        """``make(model) -> (alive, run)`` for ``trace_step_peak``: the variant's step."""
        return self._train_maker(variant) if variant.kind == "train" else self._eval_maker(variant)

    def _train_maker(self, variant: Variant) -> Callable:
        def make(model):

            batch = clip_batch(self.step, variant)
            objective = Objective(model, self.model_cfg)
            optimizer = make_optimizer(model, self.cfg.train, variant.in_backward)
            runner = TraceRunner(variant.bf16, self.device)
            runner.prepare(model)
            grad_clip = traced_grad_clip(self.cfg, variant)
            micro_batches = traced_micro_batches(self.cfg, variant)
            shape = (variant.history_len, variant.frameskip, variant.in_backward)
            state = self._optimizer_states.make(shape, model, optimizer)

            def run() -> None:
                train_step(objective, optimizer, batch, runner, grad_clip, micro_batches)

            return {"inputs": batch, "optimizer_state": state}, run

        return make

    def _eval_maker(self, variant: Variant) -> Callable:
        def make(model):
            batch = clip_batch(self.step, variant)
            runner = TraceRunner(variant.bf16, self.device)
            runner.prepare(model)
            return {"inputs": batch}, lambda: eval_step(model, batch, runner, variant.grad_free)

        return make

    def needed_bytes(self, variant: Variant) -> int:
        """Predicted peak plus the CUDA allowance: what a GPU must have free for ``variant``."""
        peak = self.predict(variant).peak_bytes
        return peak + cuda_allowance_bytes(peak)


def ddp_bucket_bytes(model) -> int:
    """What DistributedDataParallel allocates per rank for its gradient buckets: one flat copy
    of every trainable parameter's gradient (its default, ``gradient_as_bucket_view=False``)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def _with_ddp_buckets(peak: StepPeak, model, ranks: int) -> StepPeak:
    # Allocated when DDP wraps the model and kept for the run: alive at every step's peak.
    buckets = ddp_bucket_bytes(model)
    by_category = {**peak.by_category, "ddp_buckets": buckets}
    return replace(peak, peak_bytes=peak.peak_bytes + buckets, by_category=by_category)


def _with_shards(peak: StepPeak, model, ranks: int) -> StepPeak:
    """One rank's peak under FSDP2 (``techniques.shard``), from the unsharded trace: parameters,
    gradients and AdamW state are ``1/ranks`` each, plus what FSDP holds whole: the root's
    weights (gathered for the whole step), its unsharded gradients and their flat reduce-scatter
    copy (3x the root), two layers' weights and gradients (the one computing and the one
    prefetched: 4x the largest layer), and one more unit's flat buffer, the largest: a
    collective's thread may still hold the last one when the next is allocated (two gloo ranks
    under load measured one root or one layer more in two of about ten full test runs)."""

    def weights(module) -> int:
        return sum(p.numel() * p.element_size() for p in module.parameters())

    layer_bytes = [weights(layer) for layer in layers(model)]
    root = weights(model) - sum(layer_bytes)
    largest = max(layer_bytes, default=0)
    gathered = 3 * root + 4 * largest + max(root, largest)
    by_category = dict(peak.by_category)
    for category in ("parameters", "gradients", "optimizer_state"):
        by_category[category] = -(-by_category[category] // ranks)
    by_category["fsdp_gathered"] = gathered
    return replace(peak, peak_bytes=sum(by_category.values()), by_category=by_category)


def largest_fitting(need: Callable[[int], int], budget: int, known: dict[int, int]) -> int:
    """The largest ``n >= 1`` with ``need(n) <= budget`` (0 if none), for ``need`` increasing.

    ``known`` holds values of ``need`` already computed (at least two). Memory is close to
    linear in batch size, so a line through known points lands on or next to the answer, and one
    or two more evaluations (``need(n)``, ``need(n + 1)``) confirm it; should the line miss
    (a step in ``need``), bisection of the bracket finishes the search.
    """
    low, high = 0, None
    for attempt in range(MAX_BUDGET_PREDICTIONS):
        low = max((n for n, used in known.items() if used <= budget), default=0)
        high = min((n for n, used in known.items() if used > budget), default=None)
        if high == low + 1:
            return low
        if attempt < LINE_GUESSES:
            candidate = _line_guess(known, budget, low, high)
        else:
            candidate = 2 * low if high is None else (low + high) // 2
        upper = high - 1 if high is not None else math.inf
        candidate = int(min(max(candidate, low + 1), upper))
        known[candidate] = need(candidate)
    return low


def _line_guess(known: dict[int, int], budget: int, low: int, high: int | None) -> float:
    """Where the line through the bracket's ends (or the two nearest points) meets the budget."""
    if low and high is not None:
        (n1, b1), (n2, b2) = (low, known[low]), (high, known[high])
    else:
        (n1, b1), (n2, b2) = sorted(known.items(), key=lambda item: abs(item[1] - budget))[:2]
    slope = (b2 - b1) / (n2 - n1)
    if slope <= 0:
        return max(n1, n2) + 1
    return math.floor(n1 + (budget - b1) / slope)


def check_training_fits(cfg: SwmConfig, args: dict[str, int], device) -> int:
    """Refuse, before anything is allocated, a training step the device cannot hold.

    Predicts the configured step's peak as it runs on ``device`` (CUDA's autocast and allocator
    rounding on a GPU, plus the CUDA allowance; CPU autocast and exact bytes elsewhere) and compares
    it with the device's free memory (the host's available RAM on a CPU, shared by the
    data-parallel ranks); ``args`` is the clip shape (``interface.model_args``). Returns the
    bytes predicted (per rank); raises ``BudgetExceeded`` naming the largest (global) batch size
    that fits.
    """
    import torch

    resolution = args["resolution"]
    probe = with_settings(cfg, {"env.resolution": resolution})
    step = {
        "pixels": np.zeros((resolution, resolution, 3), np.uint8),
        "action": np.zeros(args["action_dim"], np.float32),
    }
    for key, size in ((PROPRIO_KEY, "proprio_dim"), (STATE_KEY, "state_size")):
        if size in args:
            step[key] = np.zeros(args[size], np.float32)
    on_cuda = torch.device(device).type == "cuda"
    predictor = PeakPredictor(probe, step, "cuda" if on_cuda else "cpu")
    ranks = cfg.runtime.nproc
    host_share = available_host_bytes() // ranks  # data-parallel ranks share the host's RAM
    available = torch.cuda.mem_get_info(device)[0] if on_cuda else host_share

    def need(batch_size: int) -> int:
        variant = configured_variant(cfg, batch_size)
        if on_cuda:
            return predictor.needed_bytes(variant)
        return predictor.predict(variant).peak_bytes

    needed = need(cfg.train.batch_size)
    if needed <= available:
        return needed
    known = {cfg.train.batch_size: needed, ranks: need(ranks)}
    best = largest_fitting(need, available, known) // ranks * ranks
    per_rank = " per rank" if ranks > 1 else ""
    raise BudgetExceeded(
        f"a training step at batch size {cfg.train.batch_size} needs about "
        f"{format_bytes(needed)}{per_rank} but {format_bytes(available)} is free on {device}",
        hint=f"use --batch-size {best} or less, or --bf16 (`swm memprofile` shows the options)"
        if best
        else "lower --resolution or --history-len (even batch size 1 does not fit)",
        needed=needed,
        available=available,
    )
