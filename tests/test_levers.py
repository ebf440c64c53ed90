"""Memory levers: each trains to the same losses as without it, and its memory is predicted.

Equality on a few real training steps of the tiny preset (float rounding apart); what each lever
saves, predicted (test_memprofile.py holds each prediction to the real CPU step within 5%).
"""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from swmcli.commands.train import run_train
from swmcli.config import resolve_config, with_settings
from swmcli.errors import UsageError
from swmcli.memory.levers import (
    InBackwardOptimizer,
    check_lever_combination,
    checkpoint_activations,
    checkpointed_modules,
    make_optimizer,
)
from swmcli.memory.measure import MemoryMonitor
from swmcli.memory.predict import PeakPredictor, Variant

NO_CLIP = {"train.grad_clip": 1e9}  # optimizer-in-backward cannot clip: compare unclipped


def _losses(tiny_data, out: Path, **settings) -> list[float]:
    flags = {"data.path": tiny_data, "train.out": out, "train.steps": 3, "train.log_every": 1}
    cfg = resolve_config("tiny", flags={**flags, **NO_CLIP, **settings})
    run_train(cfg, MemoryMonitor())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [row["loss"] for row in rows]


@pytest.fixture(scope="module")
def baseline(tiny_data, tmp_path_factory):
    return _losses(tiny_data, tmp_path_factory.mktemp("baseline"))


@pytest.mark.parametrize(
    "lever",
    [
        {"runtime.activation_checkpointing": "blocks"},
        {"runtime.activation_checkpointing": "TransformerEncoderLayer,Conv2d"},
        {"runtime.optimizer_in_backward": True},
    ],
    ids=["checkpoint-blocks", "checkpoint-types", "optimizer-in-backward"],
)
def test_lever_trains_to_the_same_losses(tiny_data, tmp_path, baseline, lever):
    losses = _losses(tiny_data, tmp_path, **lever)
    assert losses == pytest.approx(baseline, rel=1e-5)
    assert losses[-1] != losses[0]  # it trained


def test_checkpointing_keeps_the_saved_weights_plain():
    layers = nn.Sequential(nn.Linear(4, 4), nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)]))
    keys = set(layers.state_dict())
    assert checkpoint_activations(layers, "blocks") == 2
    assert set(layers.state_dict()) == keys  # checkpoints load with or without the lever
    assert checkpointed_modules(nn.Sequential(nn.Linear(2, 2)), "Linear")


def test_checkpointing_names_a_module_class_the_model_lacks():
    with pytest.raises(UsageError, match="no Conv3d"):
        checkpointed_modules(nn.Sequential(nn.Linear(2, 2)), "Conv3d")
    with pytest.raises(UsageError, match="no module to checkpoint"):
        checkpointed_modules(nn.Sequential(nn.Linear(2, 2)), "blocks")


def test_optimizer_in_backward_frees_each_gradient_and_refuses_accumulation():
    model = nn.Linear(3, 3)
    cfg = resolve_config("tiny")
    optimizer = make_optimizer(model, cfg.train, in_backward=True)
    before = model.weight.detach().clone()
    model(torch.ones(2, 3)).sum().backward()
    assert model.weight.grad is None and not torch.equal(model.weight, before)
    assert isinstance(optimizer, InBackwardOptimizer) and len(optimizer.state) == 2
    with pytest.raises(UsageError, match="accumulat"):
        check_lever_combination(
            with_settings(cfg, {"runtime.optimizer_in_backward": True, "train.grad_accum": 2})
        )


def test_levers_lower_the_predicted_peak():
    cfg = resolve_config("tiny")
    predictor = PeakPredictor(
        cfg, {"pixels": np.zeros((32, 32, 3), np.uint8), "action": np.zeros(2)}
    )
    base = Variant("train", False, 16, cfg.data.history_len, 1)
    checkpointed = predictor.predict(replace(base, checkpointing="blocks"))
    assert checkpointed.peak_bytes < predictor.predict(base).peak_bytes
    # One clip: the weights' bytes decide the peak, and no step holds every gradient.
    one = replace(base, batch_size=1)
    in_backward = predictor.predict(replace(one, in_backward=True))
    assert in_backward.peak_bytes < predictor.predict(one).peak_bytes
    assert in_backward.by_category["gradients"] < predictor.predict(one).by_category["gradients"]


def test_gradient_accumulation_all_reduces_only_the_last_micro_batch(tmp_path):
    """A real DDP (gloo, one rank) counting its all-reduces: one per optimizer step, however
    many micro-batches it accumulates."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from swmcli.models.runner import make_runner
    from swmcli.training.step import optimizer_step

    class Squares(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 4)

        def forward(self, batch):
            return {"loss": self.linear(batch["x"]).square().mean()}

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        ddp = DistributedDataParallel(Squares())
        reduced = []

        def count(state, bucket):
            reduced.append(bucket.index())
            work = dist.all_reduce(bucket.buffer(), async_op=True)
            return work.get_future().then(lambda future: future.value()[0])

        ddp.register_comm_hook(None, count)
        optimizer = torch.optim.AdamW(ddp.parameters())
        batches = [{"x": torch.randn(2, 4)} for _ in range(3)]
        optimizer_step(ddp, optimizer, iter(batches), make_runner(), 1.0, micro_batches=3)
        assert len(reduced) == 1
    finally:
        dist.destroy_process_group()
