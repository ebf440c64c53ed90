"""Reproduces docs/reports/pusht.md, table 'What limits it', row 'a CNN reads the T' (its reader).

A CNN that reads gym-pusht's T from a frame: its position and angle, trained on the recorded
state (``pusht_state_dynamics.py --reader-steps``).

The agent's position and velocity come with every observation (``proprio``); the T's pose is
what only the pixels show. The reader is the Push-T state model's (``swmcli.zoo.pusht_state``:
a full-resolution stage, then stride-2 stages down to 4 x 4, the pixel coordinates as two more
input channels, an MLP head), trained here alone, its output scaled by the training targets'
spread, with the squared error in the success criterion's units (position over 20 px, the
angle's cosine and sine over pi/9), on the training episodes' frames; its error is measured on
the held-out episodes' frames.
"""

from __future__ import annotations

import numpy as np
import torch
from rich.console import Console
from torch import nn

from swmcli.data.formats import open_reader
from swmcli.zoo.pusht_state import POSITION_UNIT, PoseReader, pose_features

BATCH = 128


def read_state(model: PoseReader, pixels: np.ndarray, agent: np.ndarray) -> np.ndarray:
    """gym-pusht's state ``[agent x, y, T x, y, angle]`` of one frame: the agent's given (its
    ``proprio``), the T's read."""
    with torch.inference_mode():
        x, y, cos, sin = model(torch.as_tensor(pixels)[None])[0]
    angle = torch.atan2(sin, cos)
    pose = [x * POSITION_UNIT, y * POSITION_UNIT, angle]
    return np.array([agent[0], agent[1], *pose], np.float32)


def frames_and_states(path, episodes) -> tuple[torch.Tensor, torch.Tensor]:
    """Every frame of ``episodes`` in the dataset at ``path``, with its recorded state."""
    reader = open_reader(path)
    pixels, states = [], []
    for index in episodes:
        rows = reader.read_episode(index, keys=["pixels", "state"])
        pixels.append(rows["pixels"])
        states.append(rows["state"])
    return torch.as_tensor(np.concatenate(pixels)), torch.as_tensor(np.concatenate(states))


def pose_errors(model: PoseReader, pixels, states) -> tuple[float, float]:
    """The mean error of the T's position (px) and angle (degrees) read from ``pixels``."""
    with torch.inference_mode():
        read = torch.cat([model(pixels[i : i + 512]) for i in range(0, len(pixels), 512)])
    position = (read[:, :2] * POSITION_UNIT - states[:, 2:4]).norm(dim=1)
    turned = torch.atan2(read[:, 3], read[:, 2]) - states[:, 4]
    turned = torch.atan2(turned.sin(), turned.cos()).abs().rad2deg()
    return position.mean().item(), turned.mean().item()


def train_reader(path, training, heldout, steps: int, console: Console) -> PoseReader:
    """A reader trained ``steps`` steps of ``BATCH`` frames of the ``training`` episodes; its
    error on the ``heldout`` episodes' frames printed."""
    pixels, states = frames_and_states(path, training)
    held_pixels, held_states = frames_and_states(path, heldout)
    model = PoseReader(pixels.shape[1])
    target = pose_features(states)
    model.mean.copy_(target.mean(0))
    model.std.copy_(target.std(0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, 1e-3, steps, pct_start=0.05)
    console.print(f"the reader: {len(pixels):,} frames; {steps:,} steps of {BATCH}")
    for step in range(steps):
        chosen = torch.randint(len(pixels), (BATCH,))
        loss = nn.functional.mse_loss(model(pixels[chosen]), target[chosen])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % 1000 == 0 or step == steps - 1:
            console.print(f"reader step {step}: {loss:.4f}")
    model.eval()
    position, angle = pose_errors(model, held_pixels, held_states)
    console.print(f"the reader, held-out frames: T {position:.1f} px, angle {angle:.1f} degrees")
    return model
