"""A CNN that reads gym-pusht's T from a frame: its position and angle, trained on the recorded
state (``pusht_state_dynamics.py --reader-steps``; docs/bring-your-env.md, "The T read from the
frames by a CNN of its own").

The agent's position and velocity come with every observation (``proprio``); the T's pose is
what only the pixels show. The reader is a small CNN (a full-resolution stage, then stride-2
stages down to 4 x 4, the pixel coordinates as two more input channels, an MLP head) trained
alone, with the squared error in the success criterion's units (position over 20 px, the
angle's cosine and sine over pi/9), on the training episodes' frames; its error is measured on
the held-out episodes' frames.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from rich.console import Console
from torch import nn

from swmcli.data.formats import open_reader
from swmcli.models.encoder import cnn_stages
from swmcli.models.world_model import normalize_pixels

POSITION_UNIT, ANGLE_UNIT = 20.0, math.pi / 9  # the success region
BATCH = 128


def pose_features(state: torch.Tensor) -> torch.Tensor:
    """gym-pusht's state ``(N, 5)`` -> the T's x, y, cos, sin ``(N, 4)``, the criterion's units."""
    angle = state[:, 4]
    return torch.stack(
        [
            state[:, 2] / POSITION_UNIT,
            state[:, 3] / POSITION_UNIT,
            angle.cos() / ANGLE_UNIT,
            angle.sin() / ANGLE_UNIT,
        ],
        dim=1,
    )


class PoseReader(nn.Module):
    """uint8 frames ``(N, H, W, 3)`` -> the T's pose features ``(N, 4)`` (``pose_features``)."""

    def __init__(self, resolution: int, width: int = 16):
        super().__init__()
        channels_in = 5  # the colours and the pixel coordinates
        layers: list[nn.Module] = [
            nn.Conv2d(channels_in, width, 3, padding=1),
            nn.GroupNorm(8, width),
            nn.GELU(),
        ]
        channels_in, side = width, resolution
        for stage in range(cnn_stages(resolution)):
            channels_out = width * 2 ** min(stage, 2)
            layers += [
                nn.Conv2d(channels_in, channels_out, 3, stride=2, padding=1),
                nn.GroupNorm(8, channels_out),
                nn.GELU(),
            ]
            channels_in, side = channels_out, (side + 1) // 2
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(channels_in * side * side, 256), nn.GELU(), nn.Linear(256, 4)
        )
        ys, xs = torch.meshgrid(
            torch.linspace(-1, 1, resolution), torch.linspace(-1, 1, resolution), indexing="ij"
        )
        self.register_buffer("coordinates", torch.stack([xs, ys])[None])
        self.register_buffer("mean", torch.zeros(4))
        self.register_buffer("std", torch.ones(4))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        frames = normalize_pixels(pixels)
        coordinates = self.coordinates.expand(len(frames), -1, -1, -1)
        return self.head(self.features(torch.cat([frames, coordinates], 1))) * self.std + self.mean

    def read(self, pixels: np.ndarray, agent: np.ndarray) -> np.ndarray:
        """gym-pusht's state ``[agent x, y, T x, y, angle]`` of one frame: the agent's given
        (its ``proprio``), the T's read."""
        with torch.inference_mode():
            x, y, cos, sin = self(torch.as_tensor(pixels)[None])[0]
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
