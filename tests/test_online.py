"""`swm train --online`: a policy fills the capped buffer while the model trains; whole episodes
are evicted; a killed run keeps every finished episode and resumes from its record."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from swmcli.commands.train import run_train
from swmcli.config import resolve_config, with_settings
from swmcli.data.formats import open_reader
from swmcli.envs.make import make_env
from swmcli.envs.policies import make_policy
from swmcli.envs.recording import action_dim_of, episode_rows, episode_seed
from swmcli.errors import UsageError
from swmcli.memory.measure import MemoryMonitor
from swmcli.training.checkpoints import checkpoint_path, load_checkpoint

ROOT = Path(__file__).parents[1]
ONLINE = {
    "online.enabled": True,
    "env.id": "swm/TwoRoom-v0",
    "online.warmup_steps": 100,
    "online.updates_per_step": 0.25,
    "online.max_steps": 200,
    "train.log_every": 1,
}


def _cfg(tmp_path: Path, **flags):
    settings = {"train.out": tmp_path / "run", "online.record": tmp_path / "record.lance"}
    return resolve_config("tiny", flags={**settings, **ONLINE, **flags})


def _episodes_are_the_seeded_ones(record: Path, cfg) -> list[int]:
    """Every recorded episode equals episode i of the policy's seeded rollouts; their lengths."""
    reader = open_reader(record)
    env = make_env(cfg.env.id, cfg.env.resolution, cfg.env.max_episode_steps)
    for index in range(reader.num_episodes):
        seed = episode_seed(cfg.train.seed, index)
        policy = make_policy(cfg.online.policy, env, seed)
        rows = list(episode_rows(env, policy, action_dim_of(env), seed=seed))
        stored = reader.read_episode(index)
        for key in rows[0]:
            expected = np.stack([row[key] for row in rows])
            assert np.array_equal(stored[key], expected, equal_nan=True), (index, key)
    lengths = reader.episode_lengths.tolist()
    reader.close()
    return lengths


def test_online_learns_and_evicts_whole_episodes(tmp_path):
    cfg = _cfg(tmp_path, **{"train.steps": 60})
    result = run_train(cfg, MemoryMonitor()).fields
    rows = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    first = np.mean([row["prediction"] for row in rows[:5]])
    last = np.mean([row["prediction"] for row in rows[-5:]])
    assert last < 0.7 * first, (first, last)
    # 100 warm-up rows + 59 steps / 0.25 = 336 rows collected, into a 200-step ring.
    assert result["collected_steps"] >= 336 and result["evicted_episodes"] > 0
    lengths = _episodes_are_the_seeded_ones(tmp_path / "record.lance", cfg)
    assert len(lengths) == result["collected_episodes"]
    # The ring holds the newest whole episodes: evicted ones are the oldest, none in part.
    held = result["buffer_episodes"]
    assert held + result["evicted_episodes"] == len(lengths)
    assert result["buffer_filled_steps"] == sum(lengths[-held:]) <= 200
    assert result["buffer_bytes"] == 200 * (32 * 32 * 3 + 4 * 2 + 4 * 2 + 4 + 1 + 1 + 4 * 2)
    # `swm eval` finds the recorded episodes.
    assert json.loads((tmp_path / "run/config.json").read_text())["data"]["path"] == str(
        (tmp_path / "record.lance").resolve()
    )


def _online_in_subprocess(tmp_path: Path) -> subprocess.Popen:
    code = (
        "import sys, json\n"
        "from swmcli.config import resolve_config\n"
        "from swmcli.memory.measure import MemoryMonitor\n"
        "from swmcli.commands.train import run_train\n"
        "flags = json.loads(sys.argv[1])\n"
        "run_train(resolve_config('tiny', flags=flags), MemoryMonitor())\n"
    )
    flags = {
        **ONLINE,
        "train.out": str(tmp_path / "run"),
        "online.record": str(tmp_path / "record.lance"),
        "train.steps": 2000,
        "train.checkpoint_every": 5,
    }
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", code, json.dumps(flags)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _recorded(record: Path) -> int:
    try:
        reader = open_reader(record)
    except Exception:  # not created yet
        return 0
    count = reader.num_episodes
    reader.close()
    return count


def test_sigkill_keeps_every_finished_episode_and_resume_continues(tmp_path):
    record = tmp_path / "record.lance"
    process = _online_in_subprocess(tmp_path)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not (
        checkpoint_path(tmp_path / "run").exists() and _recorded(record) >= 8
    ):
        time.sleep(0.05)
    before_kill = _recorded(record)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert before_kill >= 8
    cfg = _cfg(tmp_path)
    kept = _episodes_are_the_seeded_ones(record, cfg)
    assert len(kept) >= before_kill  # every episode finished before the kill, whole
    saved = load_checkpoint(tmp_path / "run")["step"]

    # --resume refills the buffer from the record and goes on collecting after its episodes.
    further = with_settings(cfg, {"train.steps": saved + 40})
    resumed = run_train(further, MemoryMonitor(), resume=True).fields
    assert resumed["resumed_from_step"] == saved
    assert resumed["refilled_episodes"] >= 1
    assert resumed["collected_episodes"] > len(kept)
    assert load_checkpoint(tmp_path / "run")["step"] == saved + 40
    after = _episodes_are_the_seeded_ones(record, cfg)
    assert after[: len(kept)] == kept and len(after) == resumed["collected_episodes"]


def test_flags_that_do_not_go_together_are_refused_before_any_work(tmp_path):
    with pytest.raises(UsageError, match="--online trains from the buffer it fills"):
        run_train(_cfg(tmp_path, **{"data.in_memory": True}), MemoryMonitor())
    offline = {"online.enabled": False, "data.path": tmp_path / "absent.lance"}
    with pytest.raises(UsageError, match="this run is not online"):
        run_train(_cfg(tmp_path, **offline), MemoryMonitor())


def test_online_resume_needs_a_record(tmp_path):
    cfg = _cfg(tmp_path, **{"online.record": None, "train.steps": 2})
    run_train(cfg, MemoryMonitor())
    with pytest.raises(UsageError, match="resumes from its --record"):
        run_train(with_settings(cfg, {"train.steps": 4}), MemoryMonitor(), resume=True)


PLANNER = {
    "online.policy": "planner",
    "online.warmup_steps": 40,
    "online.updates_per_step": 0.5,
    "eval.horizon": 2,
    "eval.samples": 16,
    "eval.iterations": 2,
    "eval.elites": 4,
    "eval.keep_elites": 1,
}


def test_planner_policy_collects_with_the_model_it_trains(tmp_path):
    cfg = _cfg(tmp_path, **PLANNER, **{"train.steps": 40})
    result = run_train(cfg, MemoryMonitor()).fields
    assert result["policy"] == "planner" and result["collected_episodes"] >= 1
    rows = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    # Planning in eval mode without gradients hands the model back trainable: it still learns.
    first = np.mean([row["prediction"] for row in rows[:5]])
    last = np.mean([row["prediction"] for row in rows[-5:]])
    assert last < 0.8 * first, (first, last)
    reader = open_reader(tmp_path / "record.lance")
    actions = np.concatenate([reader.read_episode(i)["action"][:-1] for i in range(2)])
    reader.close()
    assert np.all(np.abs(actions) <= 1) and actions.std(axis=0).min() > 0.05
    # Not the expert's or the random policy's seeded actions: the planner chose them.
    env = make_env(cfg.env.id, cfg.env.resolution, cfg.env.max_episode_steps)
    seed = episode_seed(cfg.train.seed, 0)
    for name in ("expert", "random"):
        other = list(episode_rows(env, make_policy(name, env, seed), 2, seed=seed, limit=5))
        assert not np.allclose(actions[:4], np.stack([row["action"] for row in other[:4]]))


def test_planner_policy_needs_a_goal_image(tmp_path):
    import test_envs

    cfg = _cfg(tmp_path, **PLANNER, **{"env.id": test_envs.TINY_ID, "train.steps": 2})
    with pytest.raises(UsageError, match="--policy planner plans toward the env's goal image"):
        run_train(cfg, MemoryMonitor())
    assert not (tmp_path / "record.lance").exists()
