"""Batch statistics over the global batch when training runs data-parallel (torchrun, DDP).

Under DDP each rank sees only its share of a batch. Everything the loss computes over the batch
as a whole must see all of it, or 2 ranks x 32 clips train a different model from 1 x 64 (LeWM
users report that a per-GPU SIGReg plans worse). Two such statistics exist here: the encoder's
final BatchNorm and the anti-collapse regularizer. ``gather_rows`` hands the regularizer every
rank's latents, and ``GlobalBatchNorm1d`` normalises with the mean and variance of the global
batch; both carry gradients back to the rank that owns each row (torch.distributed.nn's
differentiable collectives). Without a process group (or with one rank) both are the plain
single-process operations, so a checkpoint is the same whatever the world size.

Why not ``torch.nn.SyncBatchNorm``: it refuses CPU tensors, and DDP here also runs on gloo/CPU;
one code path, tested on CPU, serves both.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


def data_parallel_world() -> int:
    """Ranks in the default process group (1 when there is none)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size()


_simulated_ranks = 1  # see simulated_ranks


@contextmanager
def simulated_ranks(count: int) -> Iterator[None]:
    """Inside the `with`, without a process group, ``gather_rows`` returns ``count`` copies of
    the rows: what one rank of ``count`` holds, for predicting its memory on fake tensors."""
    global _simulated_ranks
    previous, _simulated_ranks = _simulated_ranks, count
    try:
        yield
    finally:
        _simulated_ranks = previous


def gather_rows(rows: torch.Tensor) -> torch.Tensor:
    """Every rank's ``rows`` stacked in rank order (gradients flow back to each rank's rows);
    ``rows`` itself without data parallelism. Ranks must hold equally many rows."""
    if data_parallel_world() == 1:
        return rows if _simulated_ranks == 1 else torch.cat([rows] * _simulated_ranks)
    import torch.distributed as dist
    from torch.distributed import _functional_collectives as collectives

    # torch 2.13 deprecates torch.distributed.nn.functional.all_gather for these functional
    # collectives; all_gather_single carries gradients from 2.13, the _autograd name before.
    gather = getattr(collectives, "all_gather_single", None)
    if gather is None or not hasattr(collectives, "all_gather_single_autograd"):
        gather = collectives.all_gather_tensor_autograd
    return gather(rows.contiguous(), 0, dist.group.WORLD)


def _global_sum(values: torch.Tensor) -> torch.Tensor:
    """The sum of every rank's ``values`` (a differentiable all-reduce, as one all-gather)."""
    return gather_rows(values.unsqueeze(0)).sum(0)


class GlobalBatchNorm1d(nn.BatchNorm1d):
    """``BatchNorm1d`` whose training statistics are those of the global batch (the same state
    dict: a checkpoint loads into either)."""

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        world = data_parallel_world()
        if world == 1 or not self.training:
            return super().forward(rows)
        values = rows.float()
        count = values.shape[0] * world
        sums = _global_sum(torch.cat([values.sum(0), (values * values).sum(0)]))
        mean = sums[: self.num_features] / count
        variance = (sums[self.num_features :] / count - mean * mean).clamp_min(0)
        with torch.no_grad():
            self.num_batches_tracked += 1
            unbiased = variance * count / max(count - 1, 1)
            self.running_mean.lerp_(mean.detach(), self.momentum)
            self.running_var.lerp_(unbiased.detach(), self.momentum)
        normalised = (values - mean) * torch.rsqrt(variance + self.eps)
        if self.affine:
            normalised = normalised * self.weight + self.bias
        return normalised.to(rows.dtype)
