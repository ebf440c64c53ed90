"""Data-parallel training under ``torchrun``: who this process is, its process group, its share.

torchrun starts one process per device and tells each its place through the environment (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, and the rendezvous in ``MASTER_ADDR``/``MASTER_PORT``). A process
started any other way is the only rank of a world of one, and nothing here does anything.

Each global batch (``--batch-size`` clips, chosen by ``(seed, step)``) is cut into ``WORLD_SIZE``
equal contiguous shares in rank order; rank r reads share r only. Batch statistics see the whole
batch through ``models.global_batch``.
"""

import os
from dataclasses import dataclass
from datetime import timedelta

import numpy as np

from swmcli.errors import SwmError, UsageError

# A rank that stops answering ends the run after this long (a dead peer's closed socket ends it
# at once; this bounds a hung one).
COLLECTIVE_TIMEOUT = timedelta(minutes=5)


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


def rank_device(world: World, device):
    """This rank's device: ``cuda:LOCAL_RANK`` on a GPU machine, else the device given."""
    import torch

    if world.size > 1 and device.type == "cuda":
        torch.cuda.set_device(world.local_rank)
        return torch.device("cuda", world.local_rank)
    return device


def start(world: World, device) -> None:
    """Join the process group (NCCL on CUDA, gloo on the CPU); nothing in a world of one."""
    if world.size == 1:
        return
    import torch.distributed as dist

    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)


def stop(world: World) -> None:
    """Leave the process group."""
    import torch.distributed as dist

    if world.size > 1 and dist.is_initialized():
        dist.destroy_process_group()


def rank_share(order: np.ndarray, batch_size: int, world: World) -> np.ndarray:
    """This rank's clips of a global clip ``order`` read ``batch_size`` at a time: share
    ``rank`` of each batch, in order (rank r of batch b: ``order[b*B + r*B/W : ...]``)."""
    share = batch_size // world.size
    return order.reshape(-1, world.size, share)[:, world.rank].reshape(-1)


def mean_over_ranks(values: dict[str, float], world: World) -> dict[str, float]:
    """Each figure averaged over the ranks (every rank gets the result)."""
    if world.size == 1:
        return values
    import torch
    import torch.distributed as dist

    keys = sorted(values)
    tensor = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
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


def lost_rank_error(error: Exception, world: World) -> SwmError:
    """A collective that failed because another rank died, as one line with a hint."""
    from swmcli.errors import first_line

    return SwmError(
        f"rank {world.rank}: another rank stopped during training ({first_line(error)})",
        hint="the run ends; `swm train --out RUN_DIR --resume` continues from its last checkpoint",
    )
