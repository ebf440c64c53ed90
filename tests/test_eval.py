"""`swm eval RUN_DIR` end to end on a tiny run: open-loop error, planning, pictures, errors."""

import json
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from swmcli.commands.collect import run_collect
from swmcli.commands.evaluate import (
    _goal_episodes,
    load_model,
    open_loop_errors,
    run_eval,
)
from swmcli.commands.train import run_train
from swmcli.config import ModelConfig, check_eval_changes, load_run_config, resolve_config
from swmcli.data.clips import heldout_split
from swmcli.data.formats import open_reader
from swmcli.errors import CheckpointError, UsageError
from swmcli.memory.measure import MemoryMonitor
from swmcli.models.runner import make_runner
from swmcli.models.world_model import build_jepa
from swmcli.planning.episodes import run_episodes
from swmcli.planning.plan_videos import FPS, HOLD_SECONDS
from swmcli.planning.planners import (
    PLANNERS,
    PlannerSettings,
    RecedingHorizon,
    block_costs,
    cem,
    plan_costs,
)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("eval")
    data, run_dir = root / "tiny.lance", root / "run"
    run_collect(resolve_config("tiny", flags={"collect.out": data}), MemoryMonitor())
    cfg = resolve_config("tiny", flags={"data.path": data, "train.out": run_dir})
    run_train(cfg, MemoryMonitor())
    return run_dir


def _with(run_dir, flags):
    """The run's config with eval/runtime ``flags``, as `swm eval RUN_DIR --flag` resolves it."""
    check_eval_changes(flags, None)
    return load_run_config(run_dir, flags)


def test_eval_reports_errors_success_rates_and_pictures(tiny_run):
    monitor = MemoryMonitor(track_tensors=True)
    result = run_eval(tiny_run, monitor)
    fields = result.fields
    assert fields["checkpoint_step"] == 40
    assert fields["episodes"] == 4 and fields["planner"] == "cem"
    errors, reaching = result.tables
    overall = [row for row in reaching.rows if row[1] == "all"]
    for row, rate in zip(overall, ("success_rate", "random_success_rate"), strict=True):
        wins, episodes = map(int, row[2].split("/"))
        assert episodes == 4 and fields[rate] == wins / episodes
    assert [row[0] for row in errors.rows] == [1, 2, 3]  # one row per horizon step
    assert all(float(row[1]) >= 0 for row in errors.rows)
    assert [row[0] for row in reaching.rows if row[1] == "all"] == ["cem", "random actions"]
    low, high = fields["success_interval"]
    assert low <= fields["success_rate"] <= high
    assert fields["planning_seconds_per_env_step"] > 0
    with Image.open(fields["gif"]) as gif:
        assert gif.n_frames > 3
        assert gif.size[1] >= 256  # large enough to see the agent
    with Image.open(fields["strip"]) as strip:
        assert strip.size[0] > strip.size[1]
    names = [phase.name for phase in monitor.report.phases]
    assert names == ["load", "warm-up", "open-loop error", "plan", "random baseline"]


def test_eval_is_reproducible_and_mppi_runs(tiny_run):
    flags = {"eval.episodes": 2, "eval.planner": "mppi"}
    first = run_eval(tiny_run, MemoryMonitor(), _with(tiny_run, flags))
    second = run_eval(tiny_run, MemoryMonitor(), _with(tiny_run, flags))
    assert first.fields["planner"] == "mppi"
    assert first.tables[1].rows == second.tables[1].rows
    assert first.fields["open_loop_mse_last"] == second.fields["open_loop_mse_last"]


def test_eval_bf16_runs(tiny_run):
    flags = {"eval.episodes": 1, "runtime.bf16": True}
    result = run_eval(tiny_run, MemoryMonitor(), _with(tiny_run, flags))
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


@pytest.mark.parametrize(
    ("shrink", "budget", "horizons"),
    [
        (False, None, [3, 3, 3, 3, 3]),
        (True, None, [3, 2, 1, 3, 2]),
        (False, 5, [3, 3, 3, 2, 1]),  # five blocks of budget: the last plans stop at its end
        (True, 5, [3, 2, 1, 2, 1]),
    ],
)
def test_plans_aim_at_the_previous_plans_deadline_and_never_past_the_budget(
    tiny_run, shrink, budget, horizons
):
    cfg = resolve_config("tiny")
    runner = make_runner()
    model, state = load_model(tiny_run, cfg, runner)
    shape = state["model_args"]
    settings = PlannerSettings(
        horizon=3, samples=16, iterations=2, elites=4, replan_every=1, shrink_horizon=shrink,
        action_dim=shape["action_dim"],
    )  # fmt: skip
    block = shape["frameskip"] * shape["action_dim"]
    planner = RecedingHorizon(model, "cem", settings, block, seed=0, budget_blocks=budget)
    searched = []  # the horizon of each search: the length of its warm start
    search = planner.plan_once
    planner.plan_once = lambda *args: searched.append(len(args[3])) or search(*args)
    pixels = torch.zeros(shape["resolution"], shape["resolution"], 3, dtype=torch.uint8)
    with runner.inference(model):
        planner.reset(pixels)
        executed = [planner.act(pixels) for _ in horizons]
    assert searched == horizons
    assert all(blocks.shape == (1, block) and blocks.abs().max() <= 1 for blocks in executed)


def test_proprio_weight_scales_only_the_agent_state_part_of_the_cost():
    torch.manual_seed(0)
    model = build_jepa(
        ModelConfig(latent_dim=8, cnn_width=4, predictor_dim=16, predictor_depth=1),
        resolution=32,
        action_dim=2,
        frameskip=1,
        history_len=2,
        proprio_dim=4,
    ).eval()
    latent = torch.zeros(1, 12)
    goal = torch.zeros(1, 12)
    goal[0, -4:] = 3.0  # the goal differs in the agent's state only
    plans = torch.rand(5, 2, 2) * 2 - 1
    with torch.inference_mode():
        base = plan_costs(model, latent, goal, plans, "trajectory")
        visual = plan_costs(model, latent, goal, plans, "trajectory", proprio_weight=0.0)
        double = plan_costs(model, latent, goal, plans, "trajectory", proprio_weight=2.0)
    torch.testing.assert_close(double - visual, 2 * (base - visual))
    assert (base > visual).all()


def test_each_cost_reads_the_blocks_its_own_way():
    # distances to the goal after each of three blocks: passes through it, ends near it, stays off
    distances = torch.tensor([[4.0, 0.0, 5.0], [3.0, 2.0, 1.0], [2.0, 2.0, 2.0]])
    assert block_costs(distances, "terminal").tolist() == [5.0, 1.0, 2.0]
    assert block_costs(distances, "trajectory").tolist() == [3.0, 2.0, 2.0]
    assert block_costs(distances, "reach").tolist() == [0.0, 1.0, 2.0]
    assert block_costs(distances, "reach").argmin() == 0  # the plan that passes through the goal


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


def test_open_loop_horizon_shortens_to_the_longest_held_out_episode(tiny_run):
    from swmcli.config import with_settings

    cfg = with_settings(load_run_config(tiny_run), {"eval.horizon": 1000})
    runner = make_runner()
    model, _ = load_model(tiny_run, cfg, runner)
    reader = open_reader(cfg.data.path)
    _, heldout = heldout_split(reader.num_episodes, cfg.eval.heldout_episodes)
    longest = max(int(reader.episode_lengths[i]) for i in heldout)
    reader.close()
    with runner.inference(model):
        errors = open_loop_errors(model, cfg, runner)
    assert len(errors["model"]) == longest // cfg.data.frameskip - 1 >= 1


def test_missing_run_and_missing_checkpoint_are_clear_errors(tiny_run, tmp_path):
    with pytest.raises(CheckpointError, match=r"config\.json"):
        run_eval(tmp_path, MemoryMonitor())
    (tmp_path / "config.json").write_text((tiny_run / "config.json").read_text())
    with pytest.raises(CheckpointError, match="no checkpoint"):
        run_eval(tmp_path, MemoryMonitor())


def test_only_a_lewm_run_exports_as_a_stable_worldmodel_folder(tiny_run, tmp_path):
    from swmcli.commands.convert import run_convert

    with pytest.raises(UsageError, match="swm's own JEPA model, and only LeWM") as error:
        run_convert(tiny_run, tmp_path / "out", layout="stable-worldmodel")
    assert "lewm-224" in error.value.hint and not (tmp_path / "out").exists()
    with pytest.raises(UsageError, match="run directory: it converts to --layout stable-world"):
        run_convert(tiny_run, tmp_path / "out.lance")


# --- protocols, flags, warnings, goal-less envs ---------------------------------------------


def test_dataset_protocol_starts_from_recorded_states_with_goals_offset_ahead(tiny_run):
    from swmcli.data.formats import open_reader
    from swmcli.envs.make import make_env
    from swmcli.envs.plugins import restore_recorded
    from swmcli.planning.goals import goal_episodes

    cfg = resolve_config(
        config_file=tiny_run / "config.json",
        flags={"eval.protocol": "dataset", "eval.goal_offset": 5, "eval.episodes": 6},
    )
    reader = open_reader(cfg.data.path)
    first = reader.num_episodes - cfg.eval.heldout_episodes
    episodes = goal_episodes(cfg)
    assert len(episodes) == 6 and len({e.source for e in episodes}) == 6  # no repeats
    for episode in episodes:
        index, step = episode.source
        assert index >= first  # held-out episodes only
        rows = reader.read_episode(index, keys=["state", "pixels"])
        assert step + 5 < len(rows["state"])
        np.testing.assert_array_equal(episode.state, rows["state"][step])
        np.testing.assert_array_equal(episode.goal_pixels, rows["pixels"][step + 5])
        # Its own rows, not views that would hold the whole episode's frames while eval runs.
        for held in (episode.state, episode.goal_state, episode.goal_pixels):
            assert held.base is None or held.base.nbytes <= 2 * held.nbytes
        env = make_env(cfg.env.id, cfg.env.resolution, 50, seed=0)
        env, observation = restore_recorded(env, episode.state, episode.goal_state, seed=0)
        # The env now is where the dataset was: same frame, and its goal is the state 5 steps on.
        np.testing.assert_array_equal(observation["pixels"], rows["pixels"][step])
        np.testing.assert_allclose(env.unwrapped.goal, rows["state"][step + 5], atol=1e-5)
        np.testing.assert_array_equal(env.unwrapped.goal_pixels(), episode.goal_pixels)
    reader.close()


def test_dataset_protocol_respects_the_budget_and_plays_random_on_the_same_episodes(
    tiny_run, monkeypatch
):
    searched = []  # the horizon of each search: budget 3 = horizon 3, so 3, 2, 1 per episode
    search = PLANNERS["cem"]
    monkeypatch.setitem(
        PLANNERS, "cem", lambda *args: searched.append(len(args[3])) or search(*args)
    )
    flags = {
        "eval.protocol": "dataset",
        "eval.goal_offset": 4,
        "eval.step_budget": 3,
        "eval.episodes": 3,
    }
    result = run_eval(tiny_run, MemoryMonitor(), _with(tiny_run, flags))
    fields = result.fields
    assert fields["protocol"] == "dataset" and fields["budget"] == 3
    assert fields["goal_offset"] == 4 and fields["episodes"] == 3
    cfg = resolve_config(config_file=tiny_run / "config.json", flags=flags)
    runner = make_runner()
    model, state = load_model(tiny_run, cfg, runner)
    episodes = _goal_episodes(cfg)
    with runner.inference(model):
        planned = run_episodes(model, cfg, runner, state["model_args"], episodes)
    random = run_episodes(None, cfg, runner, state["model_args"], episodes)
    assert max(planned["steps"] + random["steps"]) <= 3
    assert 2 in searched  # no plan past the budget: each episode's plans shrink to its end
    assert all(now in (3, before - 1) for before, now in pairwise(searched))
    for (plan_frames, plan_goal, _), (random_frames, random_goal, _) in zip(
        planned["recorded"], random["recorded"], strict=True
    ):
        np.testing.assert_array_equal(plan_frames[0], random_frames[0])  # same start state
        np.testing.assert_array_equal(plan_goal, random_goal)
    assert planned["kind"] == random["kind"]
    assert set(planned["kind"]) <= {"same room", "other room"}


def test_dataset_protocol_refuses_offsets_longer_than_every_episode(tiny_run):
    with pytest.raises(UsageError, match="no held-out episode is longer"):
        flags = {"eval.protocol": "dataset", "eval.goal_offset": 500}
        run_eval(tiny_run, MemoryMonitor(), _with(tiny_run, flags))


def test_envs_that_cannot_be_set_to_a_recorded_state_are_refused():
    from test_envs import TINY_ID

    from swmcli.envs.make import make_env
    from swmcli.envs.plugins import restore_recorded

    env = make_env(TINY_ID, 32, 10, seed=0)
    with pytest.raises(UsageError, match="cannot be set to a recorded state"):
        restore_recorded(env, np.zeros(4), np.zeros(4), seed=0)


def test_wilson_interval_matches_the_textbook_values():
    from swmcli.planning.goals import wilson_interval

    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson_interval(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    assert wilson_interval(45, 50) == pytest.approx((0.7864, 0.9565), abs=1e-4)


def test_planner_flags_and_sets_reach_the_planner_and_other_sections_are_refused(tiny_run):
    from typer.testing import CliRunner

    from swmcli.cli import app

    cli = CliRunner()
    args = ["eval", str(tiny_run), "--episodes", "1", "--samples", "8", "--iterations", "1"]
    args += ["--step-budget", "4", "--set", "eval.cost=trajectory", "--set", "eval.noise_beta=2"]
    result = cli.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    settings = payload["planner_settings"]
    assert settings["samples"] == 8 and settings["iterations"] == 1
    assert settings["cost"] == "trajectory" and settings["noise_beta"] == 2
    assert payload["budget"] == 4 and isinstance(payload["warnings"], list)
    refused = cli.invoke(app, ["eval", str(tiny_run), "--set", "model.latent_dim=3"])
    assert refused.exit_code == 2 and "cannot change model.latent_dim" in refused.output


def test_warnings_name_the_cause_and_are_printed_once(tiny_run):
    from swmcli.commands.evaluate import _open_loop_warning, _planner_warning

    worse = {"model": [1.01, 1.2], "no_change": [0.87, 0.9]}
    assert "no better than the no-change baseline" in _open_loop_warning(worse)[0]
    assert _open_loop_warning({"model": [0.1], "no_change": [0.9]}) == []
    tie = {"success": [False, True]}
    assert "no better than random" in _planner_warning(tie, tie)[0]
    assert _planner_warning({"success": [True, True]}, tie) == []
    # A planner that never reaches anything in one step is no better than random: warned once.
    from typer.testing import CliRunner

    from swmcli.cli import app

    args = ["eval", str(tiny_run), "--episodes", "1", "--step-budget", "1", "--samples", "4"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert result.output.count("no better than random") == 1


def test_eval_on_an_env_without_goals_reports_open_loop_and_why_no_planning(tmp_path):
    from test_envs import TINY_ID

    data, run_dir = tmp_path / "tiny_env.lance", tmp_path / "run"
    env = {"env.id": TINY_ID, "env.resolution": 16, "collect.policy": "random"}
    run_collect(resolve_config("tiny", flags={**env, "collect.out": data}), MemoryMonitor())
    cfg = resolve_config(
        "tiny", flags={**env, "data.path": data, "train.out": run_dir, "train.steps": 4}
    )
    run_train(cfg, MemoryMonitor())
    result = run_eval(run_dir, MemoryMonitor())
    assert result.fields["env"] == TINY_ID
    assert result.fields["planning"] is None
    assert "gives no goal image" in result.fields["no_planning_reason"]
    assert len(result.tables[0].rows) == 3  # the open-loop error is reported
    assert any("no planning result" in note for note in result.notes)
    with pytest.raises(UsageError, match="--video: no planning result"):
        run_eval(run_dir, MemoryMonitor(), video=True)


def test_budget_defaults_to_twice_the_goal_offset_or_the_env_episode():
    from swmcli.config import eval_budget

    dataset = {"eval.protocol": "dataset", "eval.goal_offset": 25}
    assert eval_budget(resolve_config(flags=dataset)) == 50
    assert eval_budget(resolve_config(flags={"env.max_episode_steps": 80})) == 80
    assert eval_budget(resolve_config(flags={**dataset, "eval.step_budget": 7})) == 7


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
        run_eval(run_dir, MemoryMonitor(), _with(run_dir, {"eval.episodes": 1}))


def test_the_plan_or_model_benchmark_costs_every_start_row_under_the_model_and_in_the_env(
    tiny_run,
):
    from repo_scripts import run_script

    sets = ["eval.protocol=dataset", "eval.goal_offset=3", "eval.episodes=3"]
    done = run_script(
        "experiments/plan_or_model.py", str(tiny_run), "--play",
        *[part for item in sets for part in ("--set", item)],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    row = next(line for line in done.stdout.splitlines() if line.startswith("│ 3 "))
    rows, short, misranked, ratio = (cell.strip() for cell in row.strip("│ ").split("│"))
    # tiny's horizon (3 blocks of 1 step) is the offset: every start row has its recorded plan.
    assert rows == "3" and int(short) + int(misranked) == 3
    assert float(ratio) > 0 and "do not end at the goal" not in done.stdout
    # --play: the recorded actions, replayed in the env from the restored start, reach the goal.
    played = next(line for line in done.stdout.splitlines() if "│ the recorded actions" in line)
    assert played.rstrip(" │").endswith("3/3")
    # ... and end on the goal frame itself: the image's distance after the last block is nil.
    line = next(line for line in done.stdout.splitlines() if line.startswith("the recorded"))
    distances = [float(value) for value in line.split(": ")[-1].split(", ")]
    assert len(distances) == 3 and distances[-1] < 1e-6 < distances[0]


def test_eval_video_writes_each_planned_episode(tiny_run):
    av = pytest.importorskip("av", reason="PyAV (the video extra) writes the videos")
    flags = {"eval.episodes": 2, "eval.step_budget": 3}
    result = run_eval(tiny_run, MemoryMonitor(), _with(tiny_run, flags), video=True)
    videos = result.fields["videos"]
    assert [Path(v).name for v in videos] == ["episode_1.mp4", "episode_2.mp4"]
    with av.open(videos[0]) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    steps = len(frames) - FPS * HOLD_SECONDS  # the last frame is held
    assert 1 <= steps <= 4 and frames[0].shape[1] >= 2 * 128  # the frame beside the goal
    assert not np.array_equal(frames[0], frames[-1])

    def framed(frame):  # colour down the right edge: the verdict's frame, whole
        edge = frame[20:60, -8:].astype(int)
        return (edge.max(-1) - edge.min(-1)).min(0).max() > 100

    assert framed(frames[-1]) and not framed(frames[0])
