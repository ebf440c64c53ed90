"""Data-parallel training under ``torchrun``: who this process is, its process group, its share.

torchrun starts one process per device and tells each its place through the environment (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, and the rendezvous in ``MASTER_ADDR``/``MASTER_PORT``). A process
started any other way is the only rank of a world of one, and nothing here does anything.

Each global batch (``--batch-size`` clips, chosen by ``(seed, step)``) is cut into ``WORLD_SIZE``
equal contiguous shares in rank order; rank r reads share r only. Batch statistics see the whole
batch through ``models.global_batch``.
"""

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

from swmcli.errors import SwmError, UsageError, first_line


@dataclass(frozen=True)
class World:
    """This process's place among the data-parallel ranks."""

    rank: int = 0
    local_rank: int = 0
    size: int = 1

    @property
    def is_main(self) -> bool:
        """Rank 0 writes checkpoints, metrics and the report."""
        return self.rank == 0


def world_from_env() -> World:
    """The world torchrun describes in the environment (a world of one without torchrun)."""
    return World(
        rank=int(os.environ.get("RANK", 0)),
        local_rank=int(os.environ.get("LOCAL_RANK", 0)),
        size=int(os.environ.get("WORLD_SIZE", 1)),
    )


def check_batch_split(world: World, batch_size: int) -> int:
    """Clips each rank reads per micro-batch; refuses a global batch the ranks cannot share."""
    if batch_size % world.size:
        raise UsageError(
            f"--batch-size {batch_size} (the global batch) does not split into {world.size} "
            "equal shares",
            hint=f"use a multiple of {world.size}",
        )
    return batch_size // world.size


def rank_device(world: World) -> str | None:
    """This rank's device when data-parallel on a GPU machine (``cuda:LOCAL_RANK``, one process
    per GPU); None lets the runner choose."""
    import torch

    if world.size == 1 or not torch.cuda.is_available():
        return None
    torch.cuda.set_device(world.local_rank)
    return f"cuda:{world.local_rank}"


def start(world: World) -> None:
    """Join the process group (NCCL on CUDA, gloo on the CPU); nothing in a world of one."""
    if world.size == 1:
        return
    import torch
    import torch.distributed as dist

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    # torch's timeouts: a dead peer's closed socket ends a gloo collective at once; a hung rank
    # ends the run after the backend's default (gloo 30 min, NCCL 10 min).
    dist.init_process_group(backend)


def stop(world: World) -> None:
    """Leave the process group."""
    import torch.distributed as dist

    if world.size > 1 and dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def joined(world: World, run_dir) -> Iterator[None]:
    """Inside the process group (``start``, ``stop`` on the way out); a collective that fails
    because a peer rank went away ends the run as one line with a hint (``lost_rank_error``)."""
    start(world)
    try:
        yield
    except Exception as error:
        if world.size > 1 and is_lost_rank(error):
            raise lost_rank_error(error, world, run_dir) from error
        raise
    finally:
        stop(world)


def wrap(model, world: World, device):
    """``model`` under DistributedDataParallel (gradients averaged over the ranks in backward);
    the model itself in a world of one."""
    if world.size == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def _collective_device():
    """Where a small tensor must be for a collective: NCCL reduces only CUDA tensors."""
    import torch
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def rank_share(order, batch_size: int, world: World):
    """This rank's clips of a global clip ``order`` (any sized iterable, read lazily) taken
    ``batch_size`` at a time: share ``rank`` of each batch, in order (rank r of batch b:
    ``order[b*B + r*B/W : b*B + (r+1)*B/W]``)."""
    return order if world.size == 1 else _RankShare(order, batch_size, world)


class _RankShare:
    """``rank_share`` of a lazily drawn order: holds one global batch at a time."""

    def __init__(self, order, batch_size: int, world: World):
        self._order, self._batch_size, self._world = order, batch_size, world

    def __len__(self) -> int:
        return len(self._order) // self._world.size

    def __iter__(self):
        share = self._batch_size // self._world.size
        low = self._world.rank * share
        batch = []
        for clip in self._order:
            batch.append(clip)
            if len(batch) == self._batch_size:
                yield from batch[low : low + share]
                batch = []


def mean_over_ranks(values: dict[str, float], world: World) -> dict[str, float]:
    """Each figure averaged over the ranks (every rank gets the result)."""
    if world.size == 1:
        return values
    import torch
    import torch.distributed as dist

    keys = list(values)
    tensor = torch.tensor(
        [float(values[k]) for k in keys], dtype=torch.float64, device=_collective_device()
    )
    dist.all_reduce(tensor)
    return {k: float(v) / world.size for k, v in zip(keys, tensor.tolist(), strict=True)}


def gather_objects(value, world: World) -> list:
    """Every rank's ``value`` (picklable), in rank order."""
    if world.size == 1:
        return [value]
    import torch.distributed as dist

    gathered = [None] * world.size
    dist.all_gather_object(gathered, value)
    return gathered


def is_lost_rank(error: BaseException) -> bool:
    """Whether ``error`` is a collective failing because a peer rank went away."""
    import torch.distributed as dist

    return isinstance(error, dist.DistError) or (
        isinstance(error, RuntimeError) and "gloo" in str(error).lower()
    )


def lost_rank_error(error: BaseException, world: World, run_dir) -> SwmError:
    """A collective that failed because another rank died, as one line with a hint."""
    import re

    # gloo's message: "[.../pair.cc:537] Read error [127.0.0.1]:3998: Connection reset by peer.
    # This is typically caused by ..." -> its first sentence, without the source location.
    reason = re.sub(r"^\[[^\]]*\]\s*", "", first_line(error)).split(". ")[0]
    return SwmError(
        f"rank {world.rank}: another rank stopped answering ({reason})",
        hint=f"the run ends here; `swm train --out {run_dir} --resume` (same --nproc) continues "
        "from its last checkpoint",
    )


def launch(nproc: int, arguments: list[str]) -> None:
    """Run ``python -m swmcli ARGUMENTS`` as ``nproc`` ranks on this machine with torchrun
    (``torch.distributed.run``, standalone rendezvous); a clear error when a rank fails."""
    import logging

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    launcher = ["--standalone", "--nproc-per-node", str(nproc), "--module", "swmcli"]
    args = get_args_parser().parse_args([*launcher, *arguments])
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default, without its warning
    # torchrun logs each failure at length (each of its loggers with its own level); the error
    # below says it in one line.
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        run(args)
    except SignalException:  # Ctrl-C or SIGTERM: torchrun has stopped the ranks
        raise KeyboardInterrupt from None
    except ChildFailedError as failed:
        raise _failed_ranks_error(failed.failures) from None


def _failed_ranks_error(failures: dict) -> SwmError:
    """One line naming the rank that failed first and how (exit code or signal)."""
    import signal

    # Timestamps are whole seconds: on a tie, not the ranks torchrun itself stopped (SIGTERM),
    # then a rank killed by a signal before one that exited (its peers exit when it dies).
    rank, first = min(
        failures.items(),
        key=lambda item: (
            item[1].timestamp,
            item[1].exitcode == -signal.SIGTERM,
            item[1].exitcode >= 0,
            item[0],
        ),
    )
    code = first.exitcode
    how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    others = " (torchrun then stopped the other ranks)" if len(failures) > 1 else ""
    return SwmError(
        f"data-parallel training stopped: rank {rank} {how}{others}",
        hint="the last checkpoint is kept: rerun with --resume (same --nproc) to continue",
        exit_code=130 if code == 130 else 1,
    )


@contextlib.contextmanager
def gradient_sync(objective, last: bool) -> Iterator[None]:
    """All-reduce gradients in this backward only when it is the ``last`` micro-batch of a step
    (earlier ones accumulate locally): DDP's ``no_sync``, FSDP's gradient-sync switch."""
    if last:
        yield
    elif hasattr(objective, "no_sync"):
        with objective.no_sync():
            yield
    elif hasattr(objective, "set_requires_gradient_sync"):
        objective.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            objective.set_requires_gradient_sync(True)
    else:
        yield
