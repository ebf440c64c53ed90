"""Memory techniques: each trains to the same losses as without it, and its memory is predicted.

Equality on a few real training steps of the tiny preset (float rounding apart); what each
technique saves, predicted (test_memprofile.py holds each prediction to the real CPU step within
5%).
"""

import copy
import gc
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from swmcli.cli import app
from swmcli.commands.train import run_train
from swmcli.config import resolve_config, with_settings
from swmcli.errors import UsageError
from swmcli.memory.measure import MemoryMonitor
from swmcli.memory.predict import PeakPredictor, Variant
from swmcli.training.recipe import make_optimizer
from swmcli.training.techniques import (
    InBackwardOptimizer,
    check_combination,
    checkpoint_activations,
    checkpointed_modules,
)

MODELS = Path(__file__).parent / "models"
# Each model of the matrix: its factory (None: swm's own) and the module classes to checkpoint.
MATRIX_MODELS = {
    "swm": (None, "TransformerEncoderLayer,Conv2d"),
    "mlp": (f"{MODELS / 'mlp_world_model.py'}:build", "Sequential"),
    "conv": (f"{MODELS / 'conv_world_model.py'}:build", "ConvStage"),
}
# No technique, each alone (checkpointing by layers and by class), each pair, all three.
TECHNIQUE_SETS = ["none", "bf16", "layers", "class", "inbwd", "bf16+layers", "bf16+class",
                  "bf16+inbwd", "layers+inbwd", "class+inbwd", "bf16+layers+inbwd",
                  "bf16+class+inbwd"]  # fmt: skip
_RUNS: dict[tuple[str, str], tuple[list[dict], int, int]] = {}


def _technique_settings(model: str, techniques: str) -> dict:
    factory, classes = MATRIX_MODELS[model]
    each = {
        "bf16": {"runtime.bf16": True},
        "layers": {"runtime.activation_checkpointing": "layers"},
        "class": {"runtime.activation_checkpointing": classes},
        "inbwd": {"runtime.optimizer_in_backward": True},
    }
    settings = {"model.factory": factory}
    for technique in techniques.split("+"):
        settings.update(each.get(technique, {}))
    return settings


def _matrix_run(tiny_data, tmp_path_factory, model: str, techniques: str):
    """Three real training steps of ``model`` with ``techniques`` (cached): the logged rows, the
    preflight's prediction (the CPU's semantics: this run is on the CPU) and the live-bytes peak
    of its steady steps."""
    if (model, techniques) not in _RUNS:
        out = tmp_path_factory.mktemp(f"{model}-{techniques}")
        flags = {"data.path": tiny_data, "train.out": out, "train.steps": 3}
        flags |= {"train.log_every": 1, "train.grad_clip": 0}  # in backward cannot clip
        cfg = resolve_config("tiny", flags={**flags, **_technique_settings(model, techniques)})
        monitor = MemoryMonitor(track_tensors=True)
        result = run_train(cfg, monitor)
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        steady = next(p for p in monitor.report.phases if p.name == "steady state")
        predicted = result.fields["preflight_step_bytes"]
        _RUNS[model, techniques] = rows, predicted, steady.live_tensor_peak_bytes
    return _RUNS[model, techniques]


@pytest.mark.parametrize("techniques", TECHNIQUE_SETS)
@pytest.mark.parametrize("model", MATRIX_MODELS)
def test_every_technique_set_trains_to_its_reference_as_predicted(
    tiny_data, tmp_path_factory, model, techniques
):
    """The technique matrix: each set trains 3 steps to its reference's losses (fp32 sets: the plain
    run's; bf16 sets: bf16 alone's) with the true gradient norm, and the preflight predicts its
    steady steps' live-bytes peak within 5%; or it is refused in one line before training."""
    if model == "mlp" and "layers" in techniques:  # an MLP has no repeated layers: refused
        with pytest.raises(UsageError, match="no module to checkpoint"):
            _matrix_run(tiny_data, tmp_path_factory, model, techniques)
        return
    rows, predicted, measured = _matrix_run(tiny_data, tmp_path_factory, model, techniques)
    reference = "bf16" if "bf16" in techniques else "none"
    expected = _matrix_run(tiny_data, tmp_path_factory, model, reference)[0]
    tolerance = 1e-4 if "bf16" in techniques else 1e-5
    for key in ("loss", "grad_norm"):
        values = [row[key] for row in rows]
        assert all(np.isfinite(values)) and values[0] > 0
        assert values == pytest.approx([row[key] for row in expected], rel=tolerance), key
    assert rows[-1]["loss"] != rows[0]["loss"]  # it trained
    assert predicted == pytest.approx(measured, rel=0.05)


def test_checkpointing_keeps_the_saved_weights_plain():
    layers = nn.Sequential(nn.Linear(4, 4), nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)]))
    keys = set(layers.state_dict())
    assert checkpoint_activations(layers, "layers") == 2
    assert set(layers.state_dict()) == keys  # checkpoints load with or without the technique
    assert checkpointed_modules(nn.Sequential(nn.Linear(2, 2)), "Linear")


def test_checkpointing_layers_takes_the_modules_that_run_in_a_list_of_lists():
    """DINO-WM's predictor holds ``[attention, feed_forward]`` per layer: those two run (and are
    recomputed), the inner list itself is never called."""
    pairs = nn.ModuleList(nn.ModuleList([nn.Linear(4, 4), nn.GELU()]) for _ in range(2))
    assert checkpointed_modules(pairs, "layers") == {module for pair in pairs for module in pair}


def test_checkpointing_names_a_module_class_the_model_lacks():
    with pytest.raises(UsageError, match="no Conv3d"):
        checkpointed_modules(nn.Sequential(nn.Linear(2, 2)), "Conv3d")
    with pytest.raises(UsageError, match="no module to checkpoint"):
        checkpointed_modules(nn.Sequential(nn.Linear(2, 2)), "layers")


def test_optimizer_in_backward_frees_each_gradient_and_reports_their_true_norm():
    model = nn.Linear(3, 3)
    plain = copy.deepcopy(model)
    cfg = resolve_config("tiny")
    optimizer = make_optimizer(model, cfg.train, in_backward=True)
    before = model.weight.detach().clone()
    optimizer.zero_grad()
    model(torch.ones(2, 3)).sum().backward()
    assert model.weight.grad is None and not torch.equal(model.weight, before)
    assert isinstance(optimizer, InBackwardOptimizer) and len(optimizer.state) == 2
    plain(torch.ones(2, 3)).sum().backward()
    expected = torch.nn.utils.get_total_norm([p.grad for p in plain.parameters()])
    assert float(optimizer.grad_norm()) == pytest.approx(float(expected), rel=1e-6)
    assert float(expected) > 0
    with pytest.raises(UsageError, match="accumulat"):
        settings = {"runtime.optimizer_in_backward": True, "train.grad_clip": 0}
        check_combination(with_settings(cfg, {**settings, "train.grad_accum": 2}))


@pytest.mark.parametrize("command", ["train", "memprofile"])
def test_optimizer_in_backward_with_clipping_is_refused_in_one_line_before_any_work(
    tmp_path, command
):
    out = tmp_path / "run"
    flags = ["--preset", "tiny", "--optimizer-in-backward", "--set", f"train.out={str(out)!r}"]
    result = CliRunner().invoke(app, [command, *flags])
    assert result.exit_code == 2, result.output
    assert result.output.count("error:") == 1 and "Traceback" not in result.output
    assert "cannot clip" in result.output and "--grad-clip 0" in result.output
    assert not out.exists()  # refused before anything was written


def test_techniques_lower_the_predicted_peak():
    cfg = resolve_config("tiny")
    predictor = PeakPredictor(
        cfg, {"pixels": np.zeros((32, 32, 3), np.uint8), "action": np.zeros(2)}
    )
    base = Variant("train", False, 16, cfg.data.history_len, 1)
    checkpointed = predictor.predict(replace(base, checkpointing="layers"))
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
            # All-reduced here, not chained on gloo's future: a Python callback would leave gloo's
            # thread wanting the GIL, which the reducer's deallocation holds while it joins them.
            reduced.append(bucket.index())
            dist.all_reduce(bucket.buffer())
            done = torch.futures.Future()
            done.set_result(bucket.buffer())
            return done

        ddp.register_comm_hook(None, count)
        optimizer = torch.optim.AdamW(ddp.parameters())
        batches = [{"x": torch.randn(2, 4)} for _ in range(3)]
        optimizer_step(ddp, optimizer, iter(batches), make_runner(), 1.0, micro_batches=3)
        assert len(reduced) == 1
    finally:
        # DDP's reducer holds the group: dropped first, the group goes inside
        # destroy_process_group, as `swm train` does it, not in the reducer's deallocation.
        ddp = optimizer = None
        gc.collect()
        dist.destroy_process_group()


def test_a_frozen_encoder_lowers_the_predicted_optimizer_state_and_peak():
    frames = {"pixels": np.zeros((32, 32, 3), np.uint8), "action": np.zeros(2)}
    base = Variant("train", False, 16, 3, 1)
    plain = PeakPredictor(resolve_config("tiny"), frames).predict(base)
    frozen_cfg = resolve_config("tiny", flags={"train.freeze": "encoder"})
    frozen = PeakPredictor(frozen_cfg, frames).predict(base)
    assert frozen.by_category["optimizer_state"] < plain.by_category["optimizer_state"]
    assert frozen.peak_bytes < plain.peak_bytes


def test_a_frozen_agent_state_norm_is_predicted_without_it():
    # The traced model leaves the agent's state out; swm train checks the name on its own model.
    flags = {"model.proprio": True, "train.freeze": "encoder,proprio_norm"}
    frames = {"pixels": np.zeros((32, 32, 3), np.uint8), "action": np.zeros(2)}
    peak = PeakPredictor(resolve_config("tiny", flags=flags), frames).predict(
        Variant("train", False, 16, 3, 1)
    )
    assert peak.by_category["optimizer_state"] > 0  # the predictor still trains
