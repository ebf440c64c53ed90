"""stable-worldmodel's own Push-T (``stable_worldmodel:swm/PushT-v1``) through swm, at tiny sizes.

Its venv is not swm's: stable-worldmodel imports torchvision, which needs the torch it was built
with (docs/bring-your-env.md, "stable-worldmodel's swm/PushT-v1"). Skipped, visibly, where
stable-worldmodel is not installed.
"""

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("stable_worldmodel", reason="needs stable-worldmodel and its torchvision")

import pusht_tiny

from swmcli.commands.evaluate import _goal_episodes, run_eval
from swmcli.config import resolve_config
from swmcli.data.formats import open_reader
from swmcli.envs.make import make_env
from swmcli.envs.plugins import restore_recorded
from swmcli.memory.measure import MemoryMonitor

ENV = "stable_worldmodel:swm/PushT-v1"
TINY = {
    **pusht_tiny.TINY,
    "env.id": ENV,
    "env.kwargs": {"resolution": 32, "with_target": False},
}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return pusht_tiny.collect_and_train(tmp_path_factory.mktemp("swm_pusht"), TINY)


def test_its_weak_policy_collects_proprio_and_moves_the_block(run_dir):
    cfg = resolve_config(config_file=run_dir / "config.json")
    reader = open_reader(cfg.data.path)
    assert {"pixels", "proprio", "state"} <= set(reader.keys)
    moved = 0
    for episode in range(1, reader.num_episodes):  # episode 0 is random actions
        rows = reader.read_episode(episode, keys=["state", "proprio"])
        np.testing.assert_array_equal(rows["proprio"][:, :2], rows["state"][:, :2])
        moved += np.linalg.norm(rows["state"][-1, 2:4] - rows["state"][0, 2:4]) > 1.0
    reader.close()
    assert moved >= 1


def test_the_dataset_protocol_restores_its_recorded_states_and_plans(run_dir):
    cfg = resolve_config(config_file=run_dir / "config.json")
    for episode in _goal_episodes(cfg):
        env = make_env(ENV, 32, 50, seed=0, kwargs=cfg.env.kwargs)
        env, observation = restore_recorded(env, episode.state, episode.goal_state, seed=0)
        # Its own _set_state runs one physics step (0.01 s) with the recorded velocity: the
        # agent moves by at most a few pixels, the block stays where it was recorded.
        np.testing.assert_allclose(observation["state"][2:5], episode.state[2:5], atol=1e-3)
        np.testing.assert_allclose(observation["state"][:2], episode.state[:2], atol=10.0)
        env.close()
    fields = run_eval(run_dir, MemoryMonitor()).fields
    assert fields["episodes"] == 3 and 0 <= fields["success_rate"] <= 1


def test_the_state_preset_trains_and_plans_on_it_with_moves_for_actions(run_dir, tmp_path):
    """pusht-state-64 on its data: its state (7 values, the agent's velocity last) and actions
    that move the agent's target from where the agent is (``model.kwargs.action_scale``)."""
    from swmcli.commands.evaluate import load_model
    from swmcli.commands.train import run_train
    from swmcli.models.runner import make_runner
    from swmcli.training.checkpoints import load_checkpoint

    data = resolve_config(config_file=run_dir / "config.json").data.path
    flags = {**TINY, "data.path": data, "train.out": tmp_path / "run", "train.batch_size": 4}
    flags["model.kwargs"] = {"width": 8, "hidden": 32, "reader_batch": 4, "action_scale": 100.0}
    run_train(resolve_config("pusht-state-64", flags=flags), MemoryMonitor())
    assert load_checkpoint(tmp_path / "run")["model_args"]["state_size"] == 7
    cfg = resolve_config(config_file=tmp_path / "run" / "config.json")
    model, _ = load_model(tmp_path / "run", cfg, make_runner())
    assert model.dynamics.action_scale == 100.0
    fields = run_eval(tmp_path / "run", MemoryMonitor()).fields
    assert fields["episodes"] == 3 and 0 <= fields["success_rate"] <= 1
