"""Push-T (gym-pusht, the ``[pusht]`` extra) through swm's dataset protocol, at tiny sizes.

The mechanics the pusht-64 figures rest on: a recorded state set back exactly, goals
``goal_offset`` steps ahead in the same episode, the budget, success as the goal state reached,
the random baseline on the same episodes, and data in which the block moves. Skipped, visibly,
where gym-pusht is not installed.
"""

import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("gym_pusht", reason="Push-T needs the [pusht] extra: pip install gym-pusht")

import pusht_tiny
from repo_scripts import ROOT, run_script

from swmcli.commands.evaluate import _goal_episodes, load_model, run_eval
from swmcli.config import resolve_config
from swmcli.data.formats import open_reader
from swmcli.envs import pusht
from swmcli.envs.make import make_env
from swmcli.envs.plugins import restore_recorded
from swmcli.envs.policies import make_policy
from swmcli.errors import UsageError
from swmcli.memory.measure import MemoryMonitor
from swmcli.models.runner import make_runner
from swmcli.planning import planners
from swmcli.planning.episodes import run_episodes

TINY = {
    **pusht_tiny.TINY,
    "env.kwargs": {"observation_width": 32, "observation_height": 32},
    "eval.step_budget": 8,
}


@pytest.fixture(scope="module")
def pusht_run(tmp_path_factory) -> Path:
    return pusht_tiny.collect_and_train(tmp_path_factory.mktemp("pusht"), TINY)


def _cfg(run_dir: Path):
    return resolve_config(config_file=run_dir / "config.json")


def test_recorded_states_are_set_back_exactly_with_goals_offset_ahead(pusht_run):
    cfg = _cfg(pusht_run)
    assert cfg.env.id == "gym_pusht:gym_pusht/PushT-v0"  # the run plays the data's env
    reader = open_reader(cfg.data.path)
    episodes = _goal_episodes(cfg)
    assert len(episodes) == 3
    for episode in episodes:
        index, step = episode.source
        rows = reader.read_episode(index, keys=["state", "pixels"])
        np.testing.assert_array_equal(episode.goal_state, rows["state"][step + 6])
        env = make_env(cfg.env.id, 32, 50, seed=0, kwargs=cfg.env.kwargs)
        env, observation = restore_recorded(env, episode.state, episode.goal_state, seed=0)
        # Block where it was recorded (gym-pusht's own reset_to_state would move it).
        np.testing.assert_allclose(observation["state"], rows["state"][step], atol=1e-3)
        np.testing.assert_array_equal(observation["pixels"], rows["pixels"][step])
        env.close()
    reader.close()


def test_success_is_the_goal_state_reached_not_gym_pushts_fixed_target(pusht_run):
    cfg = _cfg(pusht_run)
    reader = open_reader(cfg.data.path)
    states = reader.read_episode(0, keys=["state"])["state"]
    reader.close()
    env = make_env(cfg.env.id, 32, 50, seed=0, kwargs=cfg.env.kwargs)
    goal = states[10]
    hold = (goal[:2] / 256.0 - 1.0).astype(np.float32)  # keep the agent where it is
    at_goal, _ = restore_recorded(env, goal, goal, seed=0)
    _, _, terminated, _, info = at_goal.step(hold)
    assert terminated and info["success"]
    far = goal.copy()
    far[2] = goal[2] + 100.0 if goal[2] < 300 else goal[2] - 100.0  # the block elsewhere
    away, _ = restore_recorded(env, goal, far, seed=0)
    _, _, terminated, _, info = away.step(hold)
    assert not terminated and not info["success"]


def test_the_budget_holds_and_random_actions_play_the_same_episodes(pusht_run):
    result = run_eval(pusht_run, MemoryMonitor())
    fields = result.fields
    assert fields["protocol"] == "dataset" and fields["budget"] == 8 and fields["episodes"] == 3
    assert 0 <= fields["random_success_rate"] <= 1
    cfg = _cfg(pusht_run)
    runner = make_runner()
    model, state = load_model(pusht_run, cfg, runner)
    episodes = _goal_episodes(cfg)
    with runner.inference(model):
        planned = run_episodes(model, cfg, runner, state["model_args"], episodes)
    random = run_episodes(None, cfg, runner, state["model_args"], episodes)
    assert max(planned["steps"] + random["steps"]) <= 8
    for (plan_frames, plan_goal, _), (random_frames, random_goal, _) in zip(
        planned["recorded"], random["recorded"], strict=True
    ):
        np.testing.assert_array_equal(plan_frames[0], random_frames[0])
        np.testing.assert_array_equal(plan_goal, random_goal)


def test_the_expert_pushes_the_block_in_every_episode():
    env = make_env("gym_pusht:gym_pusht/PushT-v0", 32, 40, seed=0)
    for seed in range(3):
        policy = make_policy("expert", env, seed)
        observation, _ = env.reset(seed=seed)
        start = observation["state"].copy()
        for _ in range(40):
            observation, *_ = env.step(policy(observation))
        assert np.linalg.norm(observation["state"][2:4] - start[2:4]) > 10.0, seed
    env.close()


def test_observations_carry_the_agents_position_and_velocity_as_proprio():
    env = make_env("gym_pusht:gym_pusht/PushT-v0", 32, 40, seed=0)
    observation, _ = env.reset(seed=0)
    assert env.observation_space.contains(observation)
    np.testing.assert_array_equal(observation["proprio"][:2], observation["state"][:2])
    np.testing.assert_array_equal(observation["proprio"][2:], [0.0, 0.0])  # at rest
    observation, *_ = env.step(np.array([0.9, 0.9], np.float32))  # a target far away
    np.testing.assert_allclose(observation["proprio"][:2], observation["state"][:2])
    assert np.linalg.norm(observation["proprio"][2:]) > 1.0  # moving toward it
    env.close()


def test_the_presets_model_holds_the_agents_state_plans_with_it_and_refuses_random_goals(
    pusht_run,
):
    cfg = _cfg(pusht_run)
    assert cfg.model.proprio and "proprio" in open_reader(cfg.data.path).keys
    runner = make_runner()
    model, state = load_model(pusht_run, cfg, runner)
    assert state["model_args"]["proprio_dim"] == 4 and model.proprio_dims == 4
    episodes = _goal_episodes(cfg)
    assert all(episode.goal_proprio.shape == (4,) for episode in episodes)
    result = run_eval(pusht_run, MemoryMonitor())
    assert result.fields["episodes"] == 3 and 0 <= result.fields["success_rate"] <= 1
    random_goals = resolve_config(
        config_file=pusht_run / "config.json", flags={"eval.protocol": "random-goal"}
    )
    with pytest.raises(UsageError, match=r"model\.proprio"):
        _goal_episodes(random_goals)


def test_the_misses_benchmark_splits_the_runs_own_successes_by_what_the_goal_asks(pusht_run):
    fields = run_eval(pusht_run, MemoryMonitor()).fields
    done = run_script("experiments/pusht_misses.py", str(pusht_run))
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {
        tuple(cell.strip() for cell in line.split("│")[1:3]): line.split("│")[3].strip()
        for line in done.stdout.splitlines()
        if line.count("│") >= 5
    }
    for policy, rate in (("planner", "success_rate"), ("random actions", "random_success_rate")):
        alone, move = rows[(policy, "agent alone")], rows[(policy, "T must move")]
        wins = int(alone.split("/")[0]) + int(move.split("/")[0])
        count = int(alone.split("/")[1]) + int(move.split("/")[1])
        assert count == fields["episodes"] == 3
        assert wins == round(fields[rate] * count), (policy, rows)


def test_the_pose_probe_reads_the_state_back_from_latents_and_from_the_frames(pusht_run):
    sys.path.insert(0, str(ROOT / "experiments"))
    import pose_probe

    latent = pose_probe.probe(pusht_run, every=1, sets=[])
    frames = pose_probe.probe(pusht_run, every=1, sets=[], frames=True)
    assert list(latent) == list(frames) == ["agent position", "T position", "T angle"]
    assert all(np.isfinite(three).all() and len(three) == 3 for three in latent.values())
    # The mean guess is the same for both; the frames' nearest neighbours know where the block is.
    assert [three[2] for three in latent.values()] == [three[2] for three in frames.values()]
    assert frames["T position"][1] < frames["T position"][2]


def test_the_oracle_benchmark_simulates_what_the_env_steps_and_plays_the_protocol(pusht_run):
    sys.path.insert(0, str(ROOT / "experiments"))
    import pusht_oracle

    cfg = _cfg(pusht_run)
    episode = _goal_episodes(cfg)[0]
    env = make_env(cfg.env.id, 32, 50, seed=0, kwargs=cfg.env.kwargs)
    env, _ = restore_recorded(env, episode.state, episode.goal_state, seed=0)
    physics = env.unwrapped
    assert pusht_oracle.criterion_cost(episode.goal_state, episode.goal_state) == 0
    # Aim through the block, from a moving start: contacts and velocities must both carry over.
    block = np.array(physics.block.position) / (pusht.ARENA / 2) - 1
    rng = np.random.default_rng(0)
    actions = (block + rng.normal(0, 0.05, (10, 2))).clip(-1, 1).astype(np.float32)
    env.step(-actions[0])
    saved, start = pusht_oracle.physics_state(physics), physics.get_obs().copy()
    targets = (actions + 1) * pusht.ARENA / 2
    simulated = pusht_oracle.simulate(physics, targets, 5, pusht_oracle.state_of, every_block=True)
    assert len(simulated) == 2
    pusht_oracle.set_physics_state(physics, saved)
    for action in actions:
        observation, *_ = env.step(action)
    np.testing.assert_allclose(simulated[-1], observation["state"], atol=1e-2)
    assert np.linalg.norm(observation["state"][2:4] - start[2:4]) > 1  # the block was pushed
    env.close()

    for score in ("criterion", "latent"):  # the tiny run's cost: its model, the state in it
        done = run_script(
            "experiments/pusht_oracle.py", str(pusht_run), "--samples", "6", "--iterations", "2",
            "--score", score,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        assert f"│ {score}" in done.stdout and "│ all " in done.stdout and "/3 = " in done.stdout
    other_env = run_script(
        "experiments/pusht_oracle.py", str(pusht_run), "--set", "env.id=swm/TwoRoom-v0"
    )
    assert other_env.returncode != 0 and "Traceback" not in other_env.stderr
    assert "gym-pusht's physics only" in other_env.stderr and "hint:" in other_env.stderr


def test_the_benchmarks_plays_never_plan_past_the_budget(pusht_run):
    sys.path.insert(0, str(ROOT / "experiments"))
    import pusht_oracle

    cfg = _cfg(pusht_run)  # budget 8 env steps, blocks of 5: two blocks, the second cut short
    settings = replace(planners.planner_settings(cfg.eval, 2), horizon=5, replan_every=1)
    horizons, steps = [], []

    def plan_from(_env, mean, _generator):
        horizons.append(len(mean))
        return torch.zeros_like(mean)

    episode = _goal_episodes(cfg)[0]
    pusht_oracle.play(cfg, episode, settings, plan_from, on_step=lambda *_: steps.append(1))
    assert horizons == [2, 1] and len(steps) == 8


def test_the_latent_reads_the_blocks_pose_and_plans_with_it(pusht_run, tmp_path):
    from swmcli.commands.train import run_train
    from swmcli.training.checkpoints import load_checkpoint

    units = [20.0, 20.0, 20.0, 20.0, float(pusht.SUCCESS_ANGLE)]
    flags = {**TINY, "data.path": _cfg(pusht_run).data.path, "train.out": tmp_path / "run"}
    flags |= {"model.state_weight": 1.0, "model.state_units": units, "model.state_angles": [4]}
    run_train(resolve_config("pusht-64", flags={**flags, "model.latent_dim": 6}), MemoryMonitor())
    assert load_checkpoint(tmp_path / "run")["model_args"]["state_size"] == 5
    model, _ = load_model(tmp_path / "run", _cfg(tmp_path / "run"), make_runner())
    assert model.state_dims == 6  # agent x, y, block x, y, the angle's cosine and sine
    result = run_eval(tmp_path / "run", MemoryMonitor())
    assert result.fields["episodes"] == 3 and 0 <= result.fields["success_rate"] <= 1


def test_the_state_dynamics_benchmark_trains_on_states_and_plays_the_protocol(pusht_run):
    done = run_script(
        "experiments/pusht_state_dynamics.py", str(pusht_run), "--steps", "2", "--eval-seeds",
        "1000", "2000",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "clips of 6 states; 2 steps of 256" in done.stdout
    assert "held out, 5 blocks on: agent " in done.stdout
    assert "eval.seed 1000: " in done.stdout and "eval.seed 2000: " in done.stdout


def test_the_t_frame_predictor_trains_again_on_its_planners_plays(pusht_run):
    done = run_script(
        "experiments/pusht_state_dynamics.py", str(pusht_run), "--steps", "2", "--predictor",
        "t-frame", "--planner-rounds", "1", "--planner-episodes", "2", "--set",
        "eval.step_budget=30",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    sizes = re.findall(r"([\d,]+) clips of 6 states; 2 steps of 512", done.stdout)
    first, second = (int(size.replace(",", "")) for size in sizes)
    assert "round 1: 2 plays of the planner" in done.stdout
    assert second == first + 2 * 5  # a 30-step budget: 5 clips of five 5-step blocks a play
    assert "the t-frame predictor on the recorded states" in done.stdout


def test_the_state_benchmark_plans_from_the_t_its_reader_reads(pusht_run):
    done = run_script(
        "experiments/pusht_state_dynamics.py", str(pusht_run), "--steps", "2", "--predictor",
        "t-frame", "--reader-steps", "2",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.search(r"the reader: [\d,]+ frames; 2 steps of 128", done.stdout)
    assert re.search(r"the reader, held-out frames: T [\d.]+ px, angle [\d.]+ degrees", done.stdout)
    assert "the t-frame predictor on the T read from the frames" in done.stdout


def test_the_planner_plans_from_the_pose_the_reader_reads_not_the_envs(pusht_run, monkeypatch):
    """A reader that always reads one pose: the plan starts from it and aims at it, whatever the
    env's state and the goal's, and the agent's position and velocity are the env's own."""
    sys.path.insert(0, str(ROOT / "experiments"))
    import pusht_oracle
    import pusht_state_dynamics as bench
    from pusht_reader import read_state

    from swmcli.zoo.pusht_state import PoseReader, pose_features

    cfg = _cfg(pusht_run)
    units = [20.0, 20.0, 20.0, 20.0, float(pusht.SUCCESS_ANGLE)]
    features = bench.StateFeatures(5, units, [4])
    read_pose = torch.tensor([[0.0, 0.0, 111.0, 222.0, 2.5]])
    reader = PoseReader(32).eval()
    torch.nn.init.zeros_(reader.head[-1].weight)
    torch.nn.init.zeros_(reader.head[-1].bias)
    reader.mean.copy_(pose_features(read_pose)[0])  # its output: the mean, this pose
    episode = _goal_episodes(cfg)[0]
    read = read_state(reader, episode.goal_pixels, episode.goal_proprio[:2])
    np.testing.assert_allclose(read, [*episode.goal_proprio[:2], 111.0, 222.0, 2.5], rtol=1e-5)

    seen = []
    real_cem = bench.planners.cem

    def spy(model, latent, goal, *args):
        seen.append((latent.clone(), goal.clone()))
        return real_cem(model, latent, goal, *args)

    monkeypatch.setattr(bench.planners, "cem", spy)
    model = bench.StandardizedTFrame(5, torch.zeros(8), torch.ones(8))
    settings = planners.planner_settings(cfg.eval, 2)
    starts = []

    def first_state(env, _action):
        if not starts:
            starts.append((pusht_oracle.state_of(env), pusht.proprio(env)))

    plan = bench.planner(model, features, settings, episode, reader)
    pusht_oracle.play(cfg, episode, settings, plan, on_step=first_state)
    latent, goal = seen[0]
    (state, proprio), pose = starts[0], features(read_pose)[0, 2:6]
    assert torch.allclose(latent[0, 2:6], pose) and torch.allclose(goal[0, 2:6], pose)
    assert np.linalg.norm(state[2:4] - [111.0, 222.0]) > 1  # the env's T is elsewhere
    expected = bench.latents_of(features, state, proprio)
    assert torch.allclose(latent[0, :2], expected[:2])  # the agent's position, its velocity
    assert torch.allclose(latent[0, 6:], expected[6:])


def test_a_predictor_trains_on_the_runs_frozen_encoder_and_agent_state_norm(pusht_run, tmp_path):
    from swmcli.commands.train import run_train
    from swmcli.training.checkpoints import load_checkpoint

    flags = {**TINY, "data.path": _cfg(pusht_run).data.path, "train.out": tmp_path / "run"}
    flags |= {"train.init_from": pusht_run, "train.freeze": "encoder,proprio_norm"}
    run_train(resolve_config("pusht-64", flags=flags), MemoryMonitor())
    before, after = load_checkpoint(pusht_run)["model"], load_checkpoint(tmp_path / "run")["model"]
    frozen = [name for name in before if name.startswith(("encoder.", "proprio_norm."))]
    assert any(name.startswith("proprio_norm.") for name in frozen)
    assert all(torch.equal(before[name], after[name]) for name in frozen)


def test_noisier_pushes_merge_with_the_held_out_episodes_last(pusht_run, tmp_path):
    """pusht-state-64's data recipe, small: the pusher at 3x its noise (``collect.noise``),
    merged after the source's training episodes and before its held-out ones."""
    from swmcli.commands.collect import run_collect
    from swmcli.data.merge import merge_datasets

    source, noisy, mixed = _cfg(pusht_run).data.path, tmp_path / "noisy.lance", tmp_path / "m.lance"
    flags = {**TINY, "collect.episodes": 1, "collect.random_episodes": 0, "collect.noise": 1.0}
    flags |= {"collect.seed": 1000, "collect.out": noisy}
    run_collect(resolve_config("pusht-state-64", flags=flags), MemoryMonitor())
    merge_datasets([source, noisy], mixed, heldout=2)
    before, pushes, after = open_reader(source), open_reader(noisy), open_reader(mixed)
    last = before.num_episodes - 1
    assert after.num_episodes == last + 2
    pairs = [(before, 0, 0), (pushes, 0, last - 1), (before, last - 1, last)]
    pairs += [(before, last, last + 1)]  # the held-out two, last
    for reader, old, new in pairs:
        first, second = reader.read_episode(old), after.read_episode(new)
        assert all(np.array_equal(first[k], second[k], equal_nan=True) for k in first)


def test_the_planner_data_benchmark_records_the_planners_steps_from_training_starts(
    pusht_run, tmp_path
):
    from swmcli.data.clips import heldout_split
    from swmcli.planning.goals import dataset_episodes

    cfg, out = _cfg(pusht_run), tmp_path / "planner.lance"
    done = run_script(
        "experiments/pusht_planner_data.py", str(pusht_run), str(out), "--episodes", "2", "--seed",
        "7", "--repeat", "2",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    before, after = open_reader(cfg.data.path), open_reader(out)
    training, heldout = heldout_split(before.num_episodes, cfg.eval.heldout_episodes)
    assert after.num_episodes == before.num_episodes + 2 * 2  # each planner episode twice
    last = before.read_episode(heldout[-1])
    assert all(
        np.array_equal(last[k], after.read_episode(after.num_episodes - 1)[k], equal_nan=True)
        for k in last
    )
    settings = cfg.eval.model_copy(update={"episodes": 2, "seed": 7})
    for index, start in zip(
        range(len(training), len(training) + 2 * 2, 2),
        dataset_episodes(cfg.data.path, settings, among=training),
        strict=True,
    ):
        assert start.source[0] in training, "the planner's starts are never held-out rows"
        played, copy = after.read_episode(index), after.read_episode(index + 1)
        assert all(np.array_equal(played[k], copy[k], equal_nan=True) for k in played)
        assert len(played["action"]) == TINY["eval.step_budget"] + 1, (
            "the whole budget, past success"
        )
        np.testing.assert_allclose(played["state"][0], start.state, atol=1e-3)
        assert np.isfinite(played["action"][:-1]).all() and np.isnan(played["action"][-1]).all()
        assert not np.array_equal(played["state"][0], played["state"][-1]), "the planner moved"


@pytest.fixture(scope="module")
def pusht_state_run(pusht_run, tmp_path_factory) -> Path:
    """The pusht-state-64 preset trained on the tiny run's data (80 steps of 4 clips)."""
    from swmcli.commands.train import run_train

    run = tmp_path_factory.mktemp("pusht-state") / "run"
    flags = {**TINY, "data.path": _cfg(pusht_run).data.path, "train.out": run}
    flags |= {"train.steps": 80, "train.batch_size": 4, "train.log_every": 10}
    flags["model.kwargs"] = {"width": 8, "hidden": 32, "reader_batch": 4}
    run_train(resolve_config("pusht-state-64", flags=flags), MemoryMonitor())
    return run


def test_the_state_preset_learns_the_recorded_state(pusht_state_run):
    metrics = [json.loads(line) for line in (pusht_state_run / "metrics.jsonl").open()]
    first, last = metrics[0], metrics[-1]
    assert last["step"] == 80
    for term in ("reader", "one_step", "rollout"):
        assert last[term] < first[term], (term, first, last)


def test_the_state_preset_plans_from_the_frame_and_the_agents_proprio(pusht_state_run, monkeypatch):
    """Its first plan starts from the latent of the frame the env draws and the agent's
    proprio: the agent's position and velocity over their units, the T the reader reads from
    the pixels (the recorded state is never an input)."""
    cfg = _cfg(pusht_state_run)
    model, _ = load_model(pusht_state_run, cfg, make_runner())
    episode = _goal_episodes(cfg)[0]
    seen = []
    real_cem = planners.cem

    def spy(model, latent, goal, *args):
        seen.append((latent.clone(), goal.clone()))
        return real_cem(model, latent, goal, *args)

    monkeypatch.setitem(planners.PLANNERS, "cem", spy)
    result = run_eval(pusht_state_run, MemoryMonitor())
    assert result.fields["episodes"] == 3 and 0 <= result.fields["success_rate"] <= 1
    latent, goal = seen[0]
    env = make_env(cfg.env.id, 32, 50, seed=0, kwargs=cfg.env.kwargs)
    env, observation = restore_recorded(env, episode.state, episode.goal_state, seed=0)
    env.close()
    with torch.no_grad():
        pose = model.reader(torch.as_tensor(observation["pixels"])[None])[0]
        goal_pose = model.reader(torch.as_tensor(episode.goal_pixels)[None])[0]
    proprio = torch.as_tensor(observation["proprio"])
    torch.testing.assert_close(latent[0, :2], proprio[:2] / 20)
    torch.testing.assert_close(latent[0, 2:6], pose)
    torch.testing.assert_close(latent[0, 6:], proprio[2:] / 400)
    torch.testing.assert_close(goal[0, 2:6], goal_pose)


def test_memprofile_traces_the_state_presets_loss_on_proprio_and_state():
    from swmcli.commands.memprofile import run_memprofile

    flags = {**TINY, "memprofile.sample_episodes": 1, "memprofile.predict_for": "cpu"}
    flags["model.kwargs"] = {"width": 8, "hidden": 32, "reader_batch": 4}
    result = run_memprofile(resolve_config("pusht-state-64", flags=flags), MemoryMonitor())
    fields = result.fields
    assert fields["predicted_train_peak_bytes"] > 0 and fields["predicted_eval_peak_bytes"] > 0
    assert not [note for note in result.notes if "skipped" in note]


def test_the_state_errors_benchmark_reads_the_runs_held_out_errors(pusht_state_run):
    done = run_script("experiments/pusht_state_errors.py", str(pusht_state_run))
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.search(r"the reader, held-out frames: T [\d.]+ px, angle [\d.]+ degrees", done.stdout)
    assert re.search(r"held out, 5 blocks on: agent [\d.]+ px, T [\d.]+ px", done.stdout)
