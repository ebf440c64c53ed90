"""`swm eval RUN_DIR` end to end on a tiny run: open-loop error, planning, pictures, errors."""

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from swmcli.collect import run_collect
from swmcli.config import resolve_config
from swmcli.core.memory import MemoryMonitor
from swmcli.core.runner import make_runner
from swmcli.errors import CheckpointError
from swmcli.evaluate import _episode_windows, load_model, run_eval
from swmcli.planning import PlannerSettings, cem, plan_costs
from swmcli.train import run_train


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("eval")
    data, run_dir = root / "tiny.lance", root / "run"
    run_collect(resolve_config("tiny", flags={"collect.out": data}), MemoryMonitor())
    cfg = resolve_config("tiny", flags={"data.path": data, "train.out": run_dir})
    run_train(cfg, MemoryMonitor())
    return run_dir


def test_eval_reports_errors_success_rates_and_pictures(tiny_run):
    monitor = MemoryMonitor(track_tensors=True)
    result = run_eval(tiny_run, monitor)
    fields = result.fields
    assert fields["checkpoint_step"] == 40
    assert fields["episodes"] == 4 and fields["planner"] == "cem"
    assert 0.0 <= fields["success_rate"] <= 1.0
    assert 0.0 <= fields["random_success_rate"] <= 1.0
    errors, reaching = result.tables
    assert [row[0] for row in errors.rows] == [1, 2, 3]  # one row per horizon step
    assert all(float(row[1]) >= 0 for row in errors.rows)
    assert [row[0] for row in reaching.rows] == ["cem", "random actions"]
    with Image.open(fields["gif"]) as gif:
        assert gif.n_frames > 3
    with Image.open(fields["strip"]) as strip:
        assert strip.size[0] > strip.size[1]
    names = [phase.name for phase in monitor.report.phases]
    assert names == ["load", "warm-up", "open-loop error", "plan", "random baseline"]


def test_eval_is_reproducible_and_mppi_runs(tiny_run):
    first = run_eval(tiny_run, MemoryMonitor(), episodes=2, planner="mppi")
    second = run_eval(tiny_run, MemoryMonitor(), episodes=2, planner="mppi")
    assert first.fields["planner"] == "mppi"
    assert first.tables[1].rows == second.tables[1].rows
    assert first.fields["open_loop_mse_last"] == second.fields["open_loop_mse_last"]


def test_eval_bf16_runs(tiny_run):
    result = run_eval(tiny_run, MemoryMonitor(), episodes=1, bf16=True)
    assert result.fields["dtype"] == "bfloat16"
    assert np.isfinite(result.fields["open_loop_mse_first"])


def test_cem_beats_random_plans_under_the_model(tiny_run):
    cfg = resolve_config("tiny")
    runner = make_runner()
    model, _ = load_model(tiny_run, cfg, runner)
    generator = torch.Generator().manual_seed(0)
    with runner.inference(model):
        latent, goal = (
            torch.randn(1, 32, generator=generator),
            torch.randn(1, 32, generator=generator),
        )
        settings = PlannerSettings(horizon=3, samples=64, iterations=3, elites=8)
        plan = cem(model, latent, goal, torch.zeros(3, 2), settings, generator)
        random_plans = torch.rand(64, 3, 2, generator=generator) * 2 - 1
        assert plan.shape == (3, 2) and plan.abs().max() <= 1
        best = plan_costs(model, latent, goal, plan[None])
        assert best <= plan_costs(model, latent, goal, random_plans).median()


def test_open_loop_windows_align_frames_and_dense_actions():
    length, frameskip, horizon = 9, 2, 2
    episode = {
        "pixels": np.arange(length, dtype=np.uint8)[:, None, None, None]
        * np.ones((1, 2, 2, 3), np.uint8),
        "action": np.stack([np.arange(length), -np.arange(length)], 1).astype(np.float32),
    }
    episode["action"][-1] = np.nan  # the last row has no action
    frames, blocks = _episode_windows(episode, frameskip, horizon)
    first_frames = [f[:, 0, 0, 0].tolist() for f in frames]
    assert first_frames[0] == [0, 2, 4] and [1, 3, 5] in first_frames
    assert blocks[0].tolist() == [[0, 0, 1, -1], [2, -2, 3, -3]]
    assert not any(np.isnan(b).any() for b in blocks)


def test_missing_run_and_missing_checkpoint_are_clear_errors(tiny_run, tmp_path):
    with pytest.raises(CheckpointError, match=r"config\.json"):
        run_eval(tmp_path, MemoryMonitor())
    (tmp_path / "config.json").write_text((tiny_run / "config.json").read_text())
    with pytest.raises(CheckpointError, match="no checkpoint"):
        run_eval(tmp_path, MemoryMonitor())
