"""`swm eval RUN_DIR` end to end on a tiny run: open-loop error, planning, pictures, errors."""

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from swmcli.collect import run_collect
from swmcli.config import load_run_config, resolve_config
from swmcli.core.clips import heldout_split
from swmcli.core.memory import MemoryMonitor
from swmcli.core.runner import make_runner
from swmcli.core.storage import open_reader
from swmcli.errors import CheckpointError, UsageError
from swmcli.evaluate import load_model, open_loop_errors, run_eval
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
    errors, reaching = result.tables
    for row, rate in zip(reaching.rows, ("success_rate", "random_success_rate"), strict=True):
        wins, episodes = map(int, row[1].split("/"))
        assert episodes == 4 and fields[rate] == wins / episodes
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


def test_open_loop_error_reads_the_held_out_training_clips(tiny_run):
    cfg = load_run_config(tiny_run)
    runner = make_runner()
    model, _ = load_model(tiny_run, cfg, runner)
    horizon, skip = cfg.eval.horizon, cfg.data.frameskip
    span = (horizon + 1) * skip  # a training clip of horizon + 1 observations
    reader = open_reader(cfg.data.path)
    _, heldout = heldout_split(reader.num_episodes, cfg.eval.heldout_episodes)
    still = []
    with runner.inference(model):
        for index in heldout:
            pixels = torch.from_numpy(reader.read_episode(index, ["pixels"])["pixels"])
            for start in range(len(pixels) - span + 1):
                latents = model.encode(pixels[start : start + span : skip][None]).float()
                still.append((latents[:, :1] - latents[:, 1:]).pow(2).mean(-1)[0])
        errors = open_loop_errors(model, cfg, runner)
    reader.close()
    assert len(still) > 1 and len(errors["model"]) == horizon
    want = torch.stack(still).mean(0).numpy()
    assert np.allclose(errors["no_change"], want, rtol=1e-4, atol=1e-7)


def test_missing_run_and_missing_checkpoint_are_clear_errors(tiny_run, tmp_path):
    with pytest.raises(CheckpointError, match=r"config\.json"):
        run_eval(tmp_path, MemoryMonitor())
    (tmp_path / "config.json").write_text((tiny_run / "config.json").read_text())
    with pytest.raises(CheckpointError, match="no checkpoint"):
        run_eval(tmp_path, MemoryMonitor())


def test_eval_refuses_data_replaced_at_another_resolution(tiny_run, tmp_path):
    import json
    import shutil

    other = tmp_path / "other.lance"
    flags = {"collect.out": other, "collect.episodes": 2, "env.resolution": 48}
    run_collect(resolve_config("tiny", flags=flags), MemoryMonitor())
    run_dir = tmp_path / "run"
    shutil.copytree(tiny_run, run_dir)
    config = json.loads((run_dir / "config.json").read_text())
    config["data"]["path"] = str(other)
    (run_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(UsageError, match="trained on 32x32 frames"):
        run_eval(run_dir, MemoryMonitor(), episodes=1)
