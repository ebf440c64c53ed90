"""memprofile: fake-tensor predictions agree with real tensors; techniques, buffer and budgets.

CPU tests use the tiny preset's world model (a trace takes about a second); the `gpu` tests
measure on CUDA and are skipped (and deselected by default) without it.
"""

import copy
import json
import pickle
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils._pytree import tree_leaves
from typer.testing import CliRunner

from swmcli import report
from swmcli.cli import app
from swmcli.commands.memprofile import measure_rows, run_memprofile, technique_rows
from swmcli.config import resolve_config
from swmcli.data.buffer import step_bytes
from swmcli.envs.recording import sample_episodes
from swmcli.memory.fitting import (
    applicable_techniques,
    cheapest_fitting,
    combinations,
    plan_sentence,
)
from swmcli.memory.measure import LiveTensorBytes, MemoryMonitor
from swmcli.memory.predict import DEVICES, PeakPredictor, Variant, largest_fitting
from swmcli.memory.trace import (
    CategorisedLiveBytes,
    cuda_allowance_bytes,
    cuda_autocast_on_cpu,
    trace_step_peak,
)

USER_MODEL = str(Path(__file__).parent / "models" / "mlp_world_model.py") + ":build"
CONV_MODEL = str(Path(__file__).parent / "models" / "conv_world_model.py") + ":build"
LAYERNORM_MODEL = str(Path(__file__).parent / "models" / "layernorm_world_model.py") + ":build"
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def tworoom_step(resolution: int) -> dict[str, np.ndarray]:
    """One row of TwoRoom experience, laid out as the buffer stores it."""
    return {
        "pixels": np.zeros((resolution, resolution, 3), np.uint8),
        "state": np.zeros(2, np.float32),
        "goal": np.zeros(2, np.float32),
        "action": np.zeros(2, np.float32),
        "reward": np.float32(0),
        "terminated": np.bool_(False),
        "truncated": np.bool_(False),
    }


@pytest.fixture(scope="module")
def tiny():
    """The tiny preset's config and a predictor for it (traces are cached across tests)."""
    cfg = resolve_config("tiny")
    return cfg, PeakPredictor(cfg, tworoom_step(cfg.env.resolution))


def tiny_variant(cfg, **changes) -> Variant:
    base = Variant(
        "train",
        bf16=False,
        batch_size=4,
        history_len=cfg.data.history_len,
        frameskip=cfg.data.frameskip,
    )
    return replace(base, **changes)


def real_live_peak(model, make) -> int:
    """The step's peak of live tensor bytes on real CPU tensors, by the dispatch-mode counter."""
    alive, run = make(model)
    live = LiveTensorBytes()
    for tensor in [*model.parameters(), *model.buffers(), *tree_leaves(alive)]:
        live.track_tensor(tensor)
    with live:
        run()
    return live.peak


@pytest.mark.parametrize(
    "changes",
    [{}, {"bf16": True}, {"kind": "eval"}, {"kind": "eval", "grad_free": True}],
    ids=["train-fp32", "train-bf16", "eval-grad", "eval-grad-free"],
)
def test_prediction_equals_real_cpu_live_peak(tiny, changes):
    cfg, predictor = tiny
    variant = tiny_variant(cfg, **changes)
    model = predictor.model(variant.history_len, variant.frameskip)
    make = predictor.step_maker(variant)

    predicted = trace_step_peak(model, make, fake=True, round_bytes=1)
    measured = real_live_peak(copy.deepcopy(model), make)

    assert predicted.peak_bytes == pytest.approx(measured, rel=0.01)
    assert sum(predicted.by_category.values()) == predicted.peak_bytes


@pytest.mark.parametrize(
    ("factory", "modules"),
    [(None, "layers"), (USER_MODEL, "Linear"), (CONV_MODEL, "ConvStage")],
    ids=["swm-model", "mlp-model", "conv-model"],
)
@pytest.mark.parametrize(
    "changes",
    [{}, {"checkpointing": True}, {"in_backward": True}, {"bf16": True, "in_backward": True},
     {"bf16": True, "checkpointing": True}],
    ids=["plain", "checkpointing", "optimizer-in-backward", "bf16-optimizer-in-backward",
         "bf16-checkpointing"],
)  # fmt: skip
def test_prediction_with_techniques_equals_real_cpu_live_peak(factory, modules, changes):
    """Traced for CUDA (bf16: CUDA autocast's float32 casts, kept when a checkpointed GroupNorm
    is recomputed), fake against real CPU tensors under the same casts."""
    cfg = resolve_config("tiny", sets=[f'model.factory="{factory}"'] if factory else None)
    if changes.get("checkpointing"):
        changes = {**changes, "checkpointing": modules}  # an MLP has no layers: per module type
    predictor = PeakPredictor(cfg, tworoom_step(cfg.env.resolution))
    variant = replace(Variant("train", False, 8, cfg.data.history_len, 1), **changes)
    model = predictor.model(variant.history_len, variant.frameskip, variant.checkpointing)
    make = predictor.step_maker(variant)

    predicted = trace_step_peak(model, make, fake=True, round_bytes=1)
    measured = real_live_peak(copy.deepcopy(model), make)

    assert predicted.peak_bytes == pytest.approx(measured, rel=0.05)


def test_cpu_bf16_keeps_layernorm_statistics_in_float32_and_the_prediction_counts_them():
    """Under CPU autocast a LayerNorm of bf16 activations with float32 weights saves its mean
    and rstd in float32 (the fake kernel: bf16): predicted within 0.5% of the real step."""
    cfg = resolve_config("tiny", sets=[f'model.factory="{LAYERNORM_MODEL}"'])
    predictor = PeakPredictor(cfg, tworoom_step(cfg.env.resolution), "cpu")
    variant = tiny_variant(cfg, bf16=True, batch_size=2)
    model = predictor.model(variant.history_len, variant.frameskip)
    make = predictor.step_maker(variant)

    predicted = trace_step_peak(model, make, fake=True, round_bytes=1)
    measured = real_live_peak(copy.deepcopy(model), make)

    assert predicted.peak_bytes == pytest.approx(measured, rel=0.005)


def test_prediction_follows_the_optimizers_implementation():
    """train.optimizer_impl's AdamWs hold different temporaries at the step, where this model
    (large weights, a one-clip batch) peaks: each predicted as a real step holds it (foreach,
    the default, is measured so by the tests above)."""
    peaks = {}
    for impl in ("for-loop", "fused"):
        sets = [f'train.optimizer_impl="{impl}"', f'model.factory="{USER_MODEL}"']
        cfg = resolve_config("tiny", sets=sets)
        predictor = PeakPredictor(cfg, tworoom_step(cfg.env.resolution))
        variant = tiny_variant(cfg, batch_size=1)
        model = predictor.model(variant.history_len, variant.frameskip)
        make = predictor.step_maker(variant)
        peaks[impl] = trace_step_peak(model, make, fake=True, round_bytes=1).peak_bytes
        assert peaks[impl] == real_live_peak(copy.deepcopy(model), make), impl
    assert peaks["fused"] < 0.9 * peaks["for-loop"], peaks


@pytest.mark.parametrize("in_backward", [False, True], ids=["adamw", "optimizer-in-backward"])
def test_optimizer_state_remade_from_its_shapes_predicts_as_the_update_made_it(in_backward):
    """The first training row of a model shape makes the optimizer state by an update; later
    rows remake it from its shapes: the same step predicts the same bytes either way."""
    cfg = resolve_config("tiny")
    variant = replace(tiny_variant(cfg), in_backward=in_backward)
    made = PeakPredictor(cfg, tworoom_step(cfg.env.resolution)).predict(variant)
    predictor = PeakPredictor(cfg, tworoom_step(cfg.env.resolution))
    predictor.predict(replace(variant, batch_size=2))  # makes the state of this shape
    remade = predictor.predict(variant)

    assert remade.by_category == made.by_category
    model = predictor.model(variant.history_len, variant.frameskip)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert made.by_category["optimizer_state"] >= 2 * params  # AdamW's two moments at least


def test_fake_and_real_traces_agree_by_category(tiny):
    cfg, predictor = tiny
    variant = tiny_variant(cfg)
    model = predictor.model(variant.history_len, variant.frameskip)
    make = predictor.step_maker(variant)

    fake = trace_step_peak(model, make, fake=True)
    real = trace_step_peak(copy.deepcopy(model), make, fake=False)

    # Equal up to CPU kernel details: real CPU mse_loss keeps a 1 KiB scratch storage, fake 4 B.
    for category, real_bytes in real.by_category.items():
        assert fake.by_category[category] == pytest.approx(real_bytes, rel=0.01, abs=4096)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert fake.by_category["parameters"] >= params  # each storage rounded up to 512 bytes


def test_tracer_names_gradients_and_optimizer_state():
    model = nn.Linear(256, 256)  # 256 KiB of weight: every category is far above rounding
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    batch = torch.randn(64, 256)
    tracker = CategorisedLiveBytes()
    tracker.track_module(model)
    tracker.track(batch, "inputs")
    with tracker:
        model(batch).square().mean().backward()
        optimizer.step()
    params = sum(p.numel() * 4 for p in model.parameters())
    assert tracker.live["parameters"] == params
    assert tracker.live["gradients"] == params
    assert tracker.live["optimizer_state"] >= 2 * params  # exp_avg and exp_avg_sq (+ steps)
    assert tracker.live["inputs"] == batch.nbytes


def test_cpu_trace_casts_to_float32_where_cuda_autocast_does():
    frames = torch.randn(2, 8, 4, 4)
    conv, norm = nn.Conv2d(8, 8, 1), nn.GroupNorm(2, 8)
    with cuda_autocast_on_cpu(torch.bfloat16):
        lowered = conv(frames)
        normalized = norm(lowered)
        summed = lowered.sum()
    assert lowered.dtype == torch.bfloat16  # CPU autocast lowers convolutions, as CUDA does
    assert normalized.dtype == torch.float32  # CUDA runs group_norm in float32; CPU would not
    assert summed.dtype == torch.float32


def test_bf16_predicts_less_activation_memory(tiny):
    cfg, predictor = tiny
    fp32 = predictor.predict(tiny_variant(cfg))
    bf16 = predictor.predict(tiny_variant(cfg, bf16=True))
    assert bf16.by_category["activations"] < fp32.by_category["activations"]
    assert bf16.peak_bytes < fp32.peak_bytes


def test_gradient_free_eval_predicts_less_than_eval_with_gradients(tiny):
    cfg, predictor = tiny
    with_grad = predictor.predict(tiny_variant(cfg, kind="eval"))
    grad_free = predictor.predict(tiny_variant(cfg, kind="eval", grad_free=True))
    assert grad_free.peak_bytes < with_grad.peak_bytes
    assert grad_free.by_category["gradients"] == grad_free.by_category["optimizer_state"] == 0


def test_budget_search_returns_largest_batch_that_fits(tiny):
    cfg, predictor = tiny
    variant = tiny_variant(cfg)

    def need(batch: int) -> int:
        return predictor.needed_bytes(replace(variant, batch_size=batch))

    budget = need(10) + (need(11) - need(10)) // 2  # between batch 10 and 11
    calls = []
    best = largest_fitting(lambda n: calls.append(n) or need(n), budget, {4: need(4), 8: need(8)})

    assert need(best) <= budget < need(best + 1)
    assert best == 10
    assert len(calls) <= 3, calls  # memory is near linear in batch: a few predictions suffice


@settings(max_examples=200, deadline=None)
@given(
    fixed=st.integers(0, 10**6),
    per_item=st.integers(1, 10**4),
    wobble=st.integers(0, 50),
    budget=st.integers(1, 10**8),
    first=st.integers(1, 500),
)
def test_budget_search_matches_brute_force(fixed, per_item, wobble, budget, first):
    def need(n: int) -> int:  # increasing, close to linear, with a step every 7 items
        return fixed + per_item * n + wobble * (n // 7)

    found = largest_fitting(need, budget, {first: need(first), 2 * first: need(2 * first)})
    if found == 0:
        assert need(1) > budget
    else:
        assert need(found) <= budget < need(found + 1)


def test_allowance_covers_context_and_overhead():
    assert cuda_allowance_bytes(0) >= 512 * 2**20
    assert cuda_allowance_bytes(10 * 2**30) > cuda_allowance_bytes(0) + 2**30 - 1


@pytest.fixture(scope="module")
def tiny_result():
    cfg = resolve_config(
        "tiny", flags={"memprofile.budget": "1GiB", "memprofile.ram_budget": "1GB"}
    )
    monitor = MemoryMonitor()
    return cfg, run_memprofile(cfg, monitor), monitor


def test_run_memprofile_reports_every_technique_and_buffer(tiny_result):
    cfg, result, monitor = tiny_result
    fields = result.fields
    step = tworoom_step(cfg.env.resolution)
    assert fields["buffer_ram_bytes"] == cfg.collect.max_steps * step_bytes(step)
    assert fields["ram_budget_max_steps"] == 10**9 // step_bytes(step)
    assert fields["disk_lance_bytes"] > 0 and fields["disk_hdf5_bytes"] > 0
    assert fields["budget_batch_size"] > cfg.train.batch_size
    assert fields["budget_batch_needs_bytes"] <= 2**30
    techniques = [row[0] for row in result.tables[0].rows]
    for name in ("fp32 train", "bf16 autocast", "torch.compile", "gradient-free eval"):
        assert any(t.startswith(name) for t in techniques), name
    compile_row = next(row for row in result.tables[0].rows if row[0].startswith("torch.compile"))
    assert compile_row[2] == "measured on GPU"
    assert [phase.name for phase in monitor.report.phases] == ["sample", "predict"]
    # The techniques, one row each, and every combination of them under the budget: none is needed.
    for name in ("optimizer in backward (no clipping)", "activation checkpointing"):
        assert name in techniques
    assert len(result.tables[-1].rows) == 2**3  # bf16, optimizer in backward, checkpointing
    assert fields["plan"].startswith("to train B=16 at 32 in 1.00 GiB: no technique;")


def test_plan_picks_the_cheapest_techniques_that_fit(tiny):
    cfg, predictor = tiny
    techniques = applicable_techniques(cfg, predictor)
    options = combinations(predictor, tiny_variant(cfg, batch_size=64), techniques)
    by_name = {option.name: option for option in options}
    # A budget that bf16 alone meets: the plan is bf16, the cheapest, even where a dearer set
    # would leave more room.
    budget = by_name["bf16"].needed_bytes
    assert by_name["no technique"].needed_bytes > budget
    assert cheapest_fitting(options, budget).name == "bf16"
    everything = by_name["bf16 + optimizer in backward (no clipping) + activation checkpointing"]
    assert everything.needed_bytes < budget
    assert cheapest_fitting(options, everything.needed_bytes - 1) is None
    sentence = plan_sentence(options, budget, 32)
    assert sentence.startswith("to train B=64 at 32 in ") and ": bf16; " in sentence


def test_cli_profiles_a_user_model_with_its_plan_and_picture(tmp_path):
    picture = tmp_path / "memprofile.png"
    model = USER_MODEL
    flags = ["--model", model, "--resolution", "224", "--budget", "24GiB", "--json"]
    flags += ["--set", "collect.max_steps=1000", "--set", "memprofile.sample_episodes=1"]
    flags += ["--picture", str(picture)]
    result = CliRunner().invoke(app, ["memprofile", *flags])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout.strip().splitlines()[-1])
    assert payload["model"] == "MLPWorldModel from " + model
    assert payload["plan"].startswith("to train B=64 at 224 in 24.00 GiB: no technique;")
    assert picture.read_bytes()[:4] == b"\x89PNG"
    lacking = CliRunner().invoke(
        app, ["memprofile", "--model", model.replace(":build", ":build_without_predict")]
    )
    assert lacking.exit_code == 2
    assert "has no method predict(latents, actions) -> next latents" in lacking.output


def _memprofile_json(*flags: str) -> dict:
    result = CliRunner().invoke(app, ["memprofile", "--preset", "tiny", "--json", *flags])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_conv_groupnorm_model_is_predicted_for_cuda_or_the_cpu_and_skips_rows_it_cannot_take():
    """bf16 + checkpointing GroupNorm stages predicts (it crashed: recomputed in bf16 what the
    forward saved in float32); a model capped at 3 time steps skips the longer rows with a note;
    the table says whose semantics it follows, and the CPU's bf16 keeps GroupNorm in bf16."""
    flags = ["--model", CONV_MODEL, "--bf16", "--activation-checkpointing", "ConvStage"]
    flags += ["--frameskip", "2", "--set", "model.kwargs.max_len=3"]
    flags += ["--set", "memprofile.sample_episodes=1"]
    by_device = {device: _memprofile_json(*flags, "--predict-for", device) for device in DEVICES}
    for device, payload in by_device.items():
        assert payload["predicted_for"] == device
        title = payload["tables"][0]["title"]
        assert f"predicted for {'CUDA' if device == 'cuda' else 'the CPU'}" in title
        techniques = [row[0] for row in payload["tables"][0]["rows"]]
        asked = "bf16 + activation checkpointing (ConvStage)"
        # The combination asked for is a row; a row run with it names it.
        assert f"as asked: {asked}" in techniques and f"batch 8, {asked}" in techniques
        assert "activation checkpointing (ConvStage)" in techniques
        assert f"history 6, {asked}" not in techniques
        skipped = [note for note in payload["notes"] if "skipped" in note]
        assert [note.split(" skipped")[0] for note in skipped] == [
            f"row 'frameskip 1, same span (6 frames), {asked}'",
            f"row 'history 6, {asked}'",
        ]
        assert "the model cannot take" in skipped[0] and "RuntimeError" in skipped[0]
    peaks = {device: p["predicted_train_peak_bytes"] for device, p in by_device.items()}
    assert peaks["cpu"] < 0.9 * peaks["cuda"]  # CUDA keeps GroupNorm's output in float32


def test_the_tables_piped_at_80_columns_keep_every_row_name_whole(tiny_result, capsys, monkeypatch):
    _, result, monitor = tiny_result
    monkeypatch.setenv("COLUMNS", "80")
    report.emit(result, monitor.report, as_json=False)
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert not any("…" in line for line in lines)
    for name in ("fp32 train (baseline)", "gradient-free eval + bf16", "history 6"):
        # in both tables: the techniques, and the 9-column one by category
        assert sum(name in line for line in lines) == 2, name


def test_buffer_ram_at_224_is_30_gb():
    # 200,000 steps of 224x224x3 uint8 pixels plus the small keys: about 30.1 GB.
    step = tworoom_step(224)
    episodes, _ = sample_episodes(resolve_config("tiny", flags={"env.resolution": 224}), 1)
    real_step = {key: value[0] for key, value in episodes[0].items()}
    assert step_bytes(real_step) == step_bytes(step)
    assert round(200_000 * step_bytes(real_step) / 1e9, 1) == 30.1


def test_cli_json_and_bad_values():
    runner = CliRunner()
    result = runner.invoke(app, ["memprofile", "--preset", "tiny", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout.strip().splitlines()[-1])
    assert payload["predicted_train_peak_bytes"] > 0
    table = payload["tables"][0]
    assert table["rows"][0][0].startswith("fp32 train")
    peak = table["columns"].index("predicted_peak_bytes")
    assert table["rows"][0][peak] == payload["predicted_train_peak_bytes"], "raw bytes in JSON"

    for flags in (["--resolution", "-1"], ["--budget", "lots"], ["--ram-budget", "0GB"]):
        bad = runner.invoke(app, ["memprofile", "--preset", "tiny", *flags])
        assert bad.exit_code == 2, (flags, bad.output)


def test_snapshot_without_cuda_is_a_usage_error(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    bad = CliRunner().invoke(
        app, ["memprofile", "--preset", "tiny", "--snapshot", str(tmp_path / "s.pickle")]
    )
    assert bad.exit_code == 2
    assert "CUDA" in bad.output


# --- GPU -------------------------------------------------------------------------------------


@pytest.mark.gpu
@requires_cuda
def test_gpu_measured_peaks_within_10_percent_of_prediction(tmp_path):
    cfg = resolve_config("tworoom-224")
    predictor = PeakPredictor(cfg, tworoom_step(cfg.env.resolution))
    rows = technique_rows(cfg, applicable_techniques(cfg, predictor))
    rows = [row for row in rows if not row.variant.compile]
    for row in rows:
        row.predicted = predictor.predict(row.variant)
    snapshot = tmp_path / "memory.pickle"

    measure_rows(rows, predictor, MemoryMonitor(), snapshot)

    ratios = {
        row.technique: row.measured_allocated_bytes / row.predicted.peak_bytes for row in rows
    }
    print(ratios)
    assert all(0.9 <= ratio <= 1.1 for ratio in ratios.values()), ratios
    with snapshot.open("rb") as handle:
        assert "segments" in pickle.load(handle)


@pytest.mark.gpu
@requires_cuda
def test_gpu_run_measures_every_row_including_compile():
    cfg = resolve_config("tiny", flags={"runtime.compile": True})
    monitor = MemoryMonitor()
    result = run_memprofile(cfg, monitor)
    table = result.tables[0]
    allocated = table.columns.index("measured_allocated_bytes")
    assert all(row[allocated] not in ("-", "out of memory") for row in table.rows), table.rows
    assert any(phase.name.startswith("measure: torch.compile") for phase in monitor.report.phases)
