"""The Push-T state model (``swmcli.zoo.pusht_state``, preset ``pusht-state-64``) without
gym-pusht: its predictor's geometry, what its latent holds, and ``swm train`` of it on data laid
out as gym-pusht's (tests/test_pusht.py trains and plans it on gym-pusht's own)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from swmcli.data.formats import open_writer
from swmcli.training.checkpoints import load_checkpoint
from swmcli.zoo.pusht_state import (
    ARENA,
    POSITION_UNIT,
    VELOCITY_UNIT,
    TFrameDynamics,
    build,
    state_latent,
)

FRAMESKIP = 5


def _moved(state, proprio, angle: float, shift):
    """gym-pusht's state ``(N, 5)`` and proprio ``(N, 4)`` of the scene turned by ``angle``
    about the arena's centre, then shifted by ``shift`` px; and that move of points ``(..., 2)``
    and of vectors."""
    cos, sin = math.cos(angle), math.sin(angle)
    rotation = torch.tensor([[cos, -sin], [sin, cos]])
    centre = torch.full((2,), ARENA / 2)

    def place(points):
        return (points - centre) @ rotation.T + centre + shift

    def vector(vectors):
        return vectors @ rotation.T

    state = torch.cat([place(state[:, 0:2]), place(state[:, 2:4]), state[:, 4:5] + angle], 1)
    proprio = torch.cat([place(proprio[:, 0:2]), vector(proprio[:, 2:4])], 1)
    return state, proprio, place, vector


@pytest.mark.parametrize("action_scale", [0.0, 100.0], ids=["targets", "moves"])
def test_the_predictor_pushes_alike_wherever_the_t_lies_and_however_it_is_turned(action_scale):
    """Turn and shift the whole scene: the prediction turns and shifts with it (it sees the
    agent and the actions in the T's own frame), whatever its weights; actions as targets
    across the arena (gym-pusht) or as moves from the agent (stable-worldmodel's Push-T)."""
    torch.manual_seed(0)
    dynamics = TFrameDynamics(FRAMESKIP, action_scale=action_scale)
    count = 16
    state = torch.cat([torch.rand(count, 4) * 300 + 100, torch.rand(count, 1) * 6], 1)
    proprio = torch.cat([state[:, 0:2], torch.randn(count, 2) * 100], 1)
    actions = torch.rand(count, FRAMESKIP, 2) * 2 - 1
    angle, shift = 0.7, torch.tensor([25.0, -40.0])
    moved_state, moved_proprio, place, vector = _moved(state, proprio, angle, shift)
    if action_scale:  # moves turn with the scene
        moved_actions = vector(actions)
    else:  # targets across the arena move with it
        moved_actions = place((actions + 1) * ARENA / 2) / (ARENA / 2) - 1

    with torch.no_grad():
        before = dynamics(state_latent(state, proprio), actions.flatten(1))
        after = dynamics(state_latent(moved_state, moved_proprio), moved_actions.flatten(1))
    # The prediction moved as the scene did: positions in px, the angle, the velocity.
    predicted_state = torch.cat(
        [before[:, 0:4] * POSITION_UNIT, torch.atan2(before[:, 5], before[:, 4])[:, None]], 1
    )
    predicted_proprio = torch.cat([predicted_state[:, :2], before[:, 6:8] * VELOCITY_UNIT], 1)
    expected = state_latent(*_moved(predicted_state, predicted_proprio, angle, shift)[:2])
    torch.testing.assert_close(after, expected, atol=2e-4, rtol=0)
    assert not torch.allclose(after, before, atol=1e-2)  # it did move


def test_the_latent_is_the_agents_proprio_and_the_t_the_reader_reads():
    torch.manual_seed(0)
    model = build(resolution=32, frameskip=FRAMESKIP).eval()
    pixels = torch.randint(0, 256, (3, 4, 32, 32, 3), dtype=torch.uint8)
    proprio = torch.randn(3, 4, 4) * 100 + 200
    with torch.no_grad():
        latents = model.encode(pixels, proprio)
        single = model.encode(pixels[:, 0], proprio[:, 0])  # one frame per observation
        read = model.reader(pixels.flatten(0, 1)).unflatten(0, (3, 4))
    assert latents.shape == (3, 4, 8) and single.shape == (3, 8)
    torch.testing.assert_close(latents[..., 0:2], proprio[..., 0:2] / POSITION_UNIT)
    torch.testing.assert_close(latents[..., 2:6], read)
    torch.testing.assert_close(latents[..., 6:8], proprio[..., 2:4] / VELOCITY_UNIT)
    torch.testing.assert_close(single, latents[:, 0])
    assert model.proprio_dims == 2 and model.context_len == 1  # the velocity: not a goal


def test_the_loss_trains_the_reader_on_the_recorded_t_and_the_predictor_on_recorded_states():
    torch.manual_seed(0)
    model = build(resolution=32, frameskip=FRAMESKIP, reader_batch=4)
    batch = {
        "pixels": torch.randint(0, 256, (6, 3, 32, 32, 3), dtype=torch.uint8),
        "state": torch.rand(6, 3, 5) * 400,
        "proprio": torch.randn(6, 3, 4) * 100,
        "action": torch.rand(6, 3, 2 * FRAMESKIP) * 2 - 1,
    }
    batch["action"][:, -1] = float("nan")  # an episode's last block
    terms = model.loss(batch)
    assert set(terms) == {"loss", "reader", "one_step", "rollout"}
    assert all(torch.isfinite(value) for value in terms.values())
    frames = torch.cat([batch["pixels"][:2, 0], batch["pixels"][2:4, -1]])
    poses = torch.cat([state_latent(batch["state"], batch["proprio"])[:2, 0, 2:6],
                       state_latent(batch["state"], batch["proprio"])[2:4, -1, 2:6]])  # fmt: skip
    expected = (model.reader(frames) - poses).pow(2).mean()
    torch.testing.assert_close(terms["reader"], expected)
    terms["loss"].backward()
    assert model.reader.head[-1].weight.grad.abs().sum() > 0
    assert model.dynamics.net[-1].weight.grad.abs().sum() > 0


def test_it_refuses_data_that_is_not_gym_pushts():
    from swmcli.errors import UsageError

    with pytest.raises(UsageError, match="action_dim 3 \\(not 2\\)"):
        build(resolution=32, frameskip=FRAMESKIP, action_dim=3)
    with pytest.raises(UsageError, match="state 2 \\(not 5 or 7\\)"):
        build(resolution=32, frameskip=FRAMESKIP, state_size=2)  # TwoRoom's


def _pusht_shaped_data(path: Path, episodes: int = 4, length: int = 40) -> None:
    """Episodes laid out as gym-pusht's (frames, state, proprio, action), random values."""
    rng = np.random.default_rng(0)
    meta = {"env_id": "gym_pusht:gym_pusht/PushT-v0", "resolution": 32, "action_dim": 2}
    with open_writer(path, mode="error", metadata=meta) as writer:
        for _ in range(episodes):
            action = rng.uniform(-1, 1, (length, 2)).astype(np.float32)
            action[-1] = np.nan
            writer.write_episode(
                {
                    "pixels": rng.integers(0, 256, (length, 32, 32, 3), dtype=np.uint8),
                    "state": rng.uniform(50, 450, (length, 5)).astype(np.float32),
                    "proprio": rng.normal(0, 100, (length, 4)).astype(np.float32),
                    "action": action,
                }
            )


def test_swm_train_trains_it_from_the_preset_and_resumes(tmp_path):
    """The preset's model trains through `swm train` (its preflight traces the loss on the
    data's proprio and state too), logs each loss term, warns of no passes (the passes warning
    is swm's model's), and a resumed run reads the state again (``model.state_weight`` kept)."""
    data, run = tmp_path / "pusht.lance", tmp_path / "run"
    _pusht_shaped_data(data)
    command = [sys.executable, "-m", "swmcli", "train", "--preset", "pusht-state-64",
               "--data", str(data), "--out", str(run), "--batch-size", "8",
               "--set", "model.kwargs.reader_batch=4", "--set", "eval.heldout_episodes=1",
               "--set", "train.log_every=1"]  # fmt: skip
    env = {**os.environ, "SWM_DEBUG": "0"}
    first = subprocess.run([*command, "--steps", "60"], env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert "passes over" not in first.stderr
    assert "preflight: a training step needs about" in first.stderr
    saved = json.loads((run / "config.json").read_text())
    assert saved["model"]["state_weight"] == 1.0
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {"reader", "one_step", "rollout"} <= set(metrics[-1])
    resumed = subprocess.run(
        [*command, "--resume", "--steps", "62"], env=env, capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr
    assert load_checkpoint(run)["step"] == 62
