"""Bring your env: any gymnasium id (``module:Id`` included) through collect, train and eval, and
``--policy module:factory``; each failure is one line. Push-T's own tests: tests/test_pusht.py."""

import json
from typing import ClassVar

import gymnasium as gym
import numpy as np
import pytest
from typer.testing import CliRunner

from swmcli.cli import app
from swmcli.data.formats import open_reader
from swmcli.envs.make import make_env
from swmcli.errors import UsageError

runner = CliRunner()
TINY_TRAIN = ["--steps", "3", "--batch-size", "4", "--set", "model.cnn_width=4"]
TINY_TRAIN += ["--set", "model.predictor_depth=1", "--set", "model.predictor_dim=32"]
TINY_TRAIN += ["--set", "data.num_workers=0", "--set", "eval.heldout_episodes=1"]


def _invoke(*args):
    return runner.invoke(app, [str(arg) for arg in args])


def test_cartpole_collect_train_eval_plays_cartpole_and_says_why_there_is_no_planning(tmp_path):
    pytest.importorskip("pygame", reason="CartPole draws its frames with pygame")
    data, run_dir = tmp_path / "cp.lance", tmp_path / "cp_run"
    collected = _invoke(
        "collect", "--env", "CartPole-v1", "--policy", "random", "--steps", 400,
        "--resolution", 32, "--out", data,
    )  # fmt: skip
    assert collected.exit_code == 0, collected.output
    trained = _invoke("train", "--data", data, "--out", run_dir, *TINY_TRAIN)
    assert trained.exit_code == 0, trained.output
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["env"]["id"] == "CartPole-v1" and saved["env"]["resolution"] == 32
    evaluated = _invoke("eval", run_dir, "--json")
    assert evaluated.exit_code == 0, evaluated.output
    report = json.loads(evaluated.stdout)
    assert report["env"] == "CartPole-v1" and report["open_loop_mse_first"] >= 0
    assert "success_rate" not in report
    assert any("no planning result: CartPole-v1 gives no goal image" in n for n in report["notes"])
    refused = _invoke("eval", run_dir, "--protocol", "dataset")
    assert refused.exit_code == 2
    assert "CartPole-v1 cannot be set to a recorded state" in refused.output
    assert "Traceback" not in refused.output


GONE_MODULE = """
import gymnasium as gym
from test_bring_your_env import HoldEnv

gym.register(id="swmtest/Gone-v0", entry_point=HoldEnv)
"""


def test_a_run_whose_env_cannot_be_made_still_reports_its_open_loop_error(tmp_path, monkeypatch):
    import sys

    (tmp_path / "gone_envs_xyz.py").write_text(GONE_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    data, run_dir = tmp_path / "g.lance", tmp_path / "g_run"
    collected = _invoke(
        "collect", "--env", "gone_envs_xyz:swmtest/Gone-v0", "--policy", "random",
        "--steps", 60, "--resolution", 16, "--set", "env.max_episode_steps=20", "--out", data,
    )  # fmt: skip
    assert collected.exit_code == 0, collected.output
    assert open_reader(data).metadata["env_id"] == "gone_envs_xyz:swmtest/Gone-v0"
    assert _invoke("train", "--data", data, "--out", run_dir, *TINY_TRAIN).exit_code == 0
    # The module that registers the env is gone (uninstalled): eval says so in one line.
    (tmp_path / "gone_envs_xyz.py").unlink()
    del sys.modules["gone_envs_xyz"]
    del gym.envs.registry["swmtest/Gone-v0"]
    evaluated = _invoke("eval", run_dir, "--json")
    assert evaluated.exit_code == 0, evaluated.output
    report = json.loads(evaluated.stdout)
    assert report["env"] == "gone_envs_xyz:swmtest/Gone-v0" and report["open_loop_mse_first"] >= 0
    (note,) = [n for n in report["notes"] if n.startswith("no planning result")]
    assert "cannot make gone_envs_xyz:swmtest/Gone-v0 here" in note
    assert "pip install gone_envs_xyz" in note


class HoldEnv(gym.Env):
    """A real env with a Box action space in [0, 4] and a Dict observation (numpy frames)."""

    metadata: ClassVar[dict] = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, render_mode=None, side=8):
        self.render_mode, self.side = render_mode, side
        self.action_space = gym.spaces.Box(0.0, 4.0, (1,), np.float32)
        self.observation_space = gym.spaces.Dict(
            {
                "position": gym.spaces.Box(0.0, 4.0, (1,), np.float64),
                "goal": gym.spaces.Box(0.0, 4.0, (1,), np.float64),
                "image": gym.spaces.Box(0, 255, (2, 2, 3), np.uint8),
            }
        )
        self.position = 0.0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = float(self.np_random.uniform(0, 4))
        return self._observe(), {}

    def step(self, action):
        self.position = float(np.clip(action[0], 0.0, 4.0))
        return self._observe(), 0.0, False, False, {}

    def _observe(self):
        image = np.zeros((2, 2, 3), np.uint8)
        position, goal = np.array([self.position]), np.array([2.0])
        return {"position": position, "goal": goal, "image": image}

    def render(self):
        return np.full((self.side, self.side, 3), int(self.position * 60), np.uint8)


class NoPixelsEnv(HoldEnv):
    metadata: ClassVar[dict] = {"render_modes": ["human"], "render_fps": 10}


for _id, _entry in (("swmtest/Hold-v0", HoldEnv), ("swmtest/NoPixels-v0", NoPixelsEnv)):
    if _id not in gym.envs.registry:
        gym.register(id=_id, entry_point=_entry)


def test_module_id_envs_get_kwargs_unit_actions_and_their_vector_observations():
    env = make_env("test_bring_your_env:swmtest/Hold-v0", 16, 5, seed=0, kwargs={"side": 12})
    assert env.unwrapped.side == 12
    assert env.action_space.low.tolist() == [-1.0] and env.action_space.high.tolist() == [1.0]
    observation, *_ = env.step(np.array([1.0], np.float32))  # the top of [-1, 1] is 4.0
    assert env.unwrapped.position == 4.0
    assert set(observation) == {"pixels", "position", "goal"}  # Box parts kept, images dropped
    assert observation["pixels"].shape == (16, 16, 3) and observation["position"].dtype == "f4"


def test_env_errors_are_one_line_naming_the_fix():
    with pytest.raises(UsageError, match="no_such_env_module_xyz") as missing:
        make_env("no_such_env_module_xyz:Foo-v0", 16, 5)
    assert missing.value.hint == "pip install no_such_env_module_xyz"
    with pytest.raises(UsageError, match="has no rgb_array rendering") as no_pixels:
        make_env("swmtest/NoPixels-v0", 16, 5)
    assert "render_modes" in no_pixels.value.hint
    result = _invoke("collect", "--env", "no_such_env_module_xyz:Foo-v0", "--steps", 5)
    assert result.exit_code == 2 and "pip install no_such_env_module_xyz" in result.output
    assert "Traceback" not in result.output


def hold_at_goal(env, seed):
    """A ``--policy module:factory`` for the tests: always the middle of the action space."""
    return lambda observation: np.zeros(env.action_space.shape, np.float32)


def not_a_factory(env, seed):
    return 42


def test_module_factory_policies_drive_collection_and_are_recorded(tmp_path):
    out = tmp_path / "hold.lance"
    result = _invoke(
        "collect", "--env", "swmtest/Hold-v0", "--policy", "test_bring_your_env:hold_at_goal",
        "--steps", 12, "--resolution", 16, "--out", out, "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    reader = open_reader(out)
    assert reader.metadata["policy"] == "test_bring_your_env:hold_at_goal"
    assert reader.metadata["env_id"] == "swmtest/Hold-v0"
    episode = reader.read_episode(0, keys=["action", "position"])
    assert np.all(episode["action"][:-1] == 0.0) and np.all(episode["position"][1:] == 2.0)
    reader.close()


def test_online_training_collects_a_module_id_env_with_a_module_factory_policy(tmp_path):
    record, run_dir = tmp_path / "online.lance", tmp_path / "online_run"
    result = _invoke(
        "train", "--online", "--env", "test_bring_your_env:swmtest/Hold-v0",
        "--policy", "test_bring_your_env:hold_at_goal", "--warmup-steps", 40,
        "--updates-per-step", 1, "--record", record, "--out", run_dir,
        "--set", "env.resolution=16", "--set", "env.max_episode_steps=20",
        "--set", "data.frameskip=1", *TINY_TRAIN,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    reader = open_reader(record)
    assert reader.metadata["env_id"] == "test_bring_your_env:swmtest/Hold-v0"
    assert reader.metadata["policy"] == "test_bring_your_env:hold_at_goal"
    assert np.all(reader.read_episode(0, keys=["action"])["action"][:-1] == 0.0)
    reader.close()


@pytest.mark.parametrize(
    ("policy", "words"),
    [
        ("no_such_policy_module_xyz:make", "pip install no_such_policy_module_xyz"),
        ("test_bring_your_env:absent", "has no callable 'absent'"),
        ("test_bring_your_env:not_a_factory", "returned int, not a callable"),
        ("greedy", "module:factory"),
    ],
)
def test_bad_module_factory_policies_are_one_line_errors(tmp_path, policy, words):
    out = tmp_path / "x.lance"
    result = _invoke("collect", "--env", "swmtest/Hold-v0", "--policy", policy, "--out", out)
    assert result.exit_code == 2 and words in result.output, result.output
    assert "Traceback" not in result.output and not out.exists()
