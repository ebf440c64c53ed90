"""Push-T's world model in the success criterion's units: the T's pose read from the frame by a
CNN, the agent's state given, the next state predicted in the T's own frame (preset
``pusht-state-64``; its figures: docs/reports/pusht.md, "pusht-state-64").

A latent is gym-pusht's state as the success criterion weighs it: ``[agent x, y, T x, y] / 20
px``, the T's angle as ``[cos, sin] / (pi/9)``, then the agent's velocity over 400 px/s, which
the planner does not count (``proprio_dims`` 2, ``eval.proprio_weight`` 0). The agent's position
and velocity are the observation's ``proprio``; the T's pose is what only the pixels show, and
``PoseReader`` reads it. ``TFrameDynamics`` predicts one action block on: an MLP that sees
the agent, its velocity and the action block's targets turned into the T's frame (pushing is the
same wherever the T lies and however it is turned), its output turned back into the arena.

``loss`` trains both from the data's recorded ``state`` (``model.state_weight`` > 0 has the batch
carry it): the reader on one frame of each of ``reader_batch`` clips (the first of half, the last
of the rest), squared error in the criterion's units; the predictor on every clip's recorded
states, one block on from each and rolled out on its own predictions from the first, its error
over the batch's spread of each value. The recorded state is a training target only: planning
encodes pixels and ``proprio``.
"""

import math

import torch
from torch import nn

from swmcli.errors import UsageError
from swmcli.models.encoder import cnn_stages
from swmcli.models.world_model import normalize_pixels

POSITION_UNIT, ANGLE_UNIT = 20.0, math.pi / 9  # px, radians: the success region
VELOCITY_UNIT = 400.0  # px/s: the agent's velocity, an input only
FRAME_UNIT = 100.0  # px: positions in the T's frame, as the MLP in that frame sees them
ARENA = 512.0  # px: gym-pusht's arena side; an action in [-1, 1] is a target across it
ACTION_DIM = 2  # the agent's target x, y


def pose_features(state: torch.Tensor) -> torch.Tensor:
    """gym-pusht's state ``(..., 5)`` -> the T's x, y, cos, sin ``(..., 4)``, the criterion's
    units."""
    angle = state[..., 4]
    return torch.stack(
        [
            state[..., 2] / POSITION_UNIT,
            state[..., 3] / POSITION_UNIT,
            angle.cos() / ANGLE_UNIT,
            angle.sin() / ANGLE_UNIT,
        ],
        dim=-1,
    )


def state_latent(state: torch.Tensor, proprio: torch.Tensor) -> torch.Tensor:
    """The latent ``(..., 8)`` of gym-pusht's recorded state ``(..., 5)`` and proprio
    ``(..., 4)``: the agent, the T's pose, the agent's velocity."""
    state, proprio = state.float(), proprio.float()
    agent = state[..., 0:2] / POSITION_UNIT
    return torch.cat([agent, pose_features(state), proprio[..., 2:4] / VELOCITY_UNIT], dim=-1)


class PoseReader(nn.Module):
    """uint8 frames ``(N, H, W, 3)`` -> the T's pose features ``(N, 4)`` (``pose_features``): a
    full-resolution stage, then stride-2 stages down to 4 x 4, the pixel coordinates as two more
    input channels, an MLP head; its output scaled by ``std`` and shifted by ``mean`` (the
    arena's centre and spread by default)."""

    def __init__(self, resolution: int, width: int = 16, arena: float = ARENA):
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
        centre, spread, turn = arena / 2 / POSITION_UNIT, arena / 4 / POSITION_UNIT, 1 / ANGLE_UNIT
        self.register_buffer("mean", torch.tensor([centre, centre, 0.0, 0.0]))
        self.register_buffer("std", torch.tensor([spread, spread, turn, turn]))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        frames = normalize_pixels(pixels)
        coordinates = self.coordinates.expand(len(frames), -1, -1, -1).to(frames.dtype)
        read = self.head(self.features(torch.cat([frames, coordinates], 1)))
        return read * self.std.to(read.dtype) + self.mean.to(read.dtype)


def turn(points: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Points ``(..., 2)`` turned by the angle of that cosine and sine ``(...)``."""
    x, y = points[..., 0], points[..., 1]
    return torch.stack([cos * x - sin * y, sin * x + cos * y], dim=-1)


class TFrameDynamics(nn.Module):
    """A Markov predictor in the T's frame: from one latent (``state_latent``) and its action
    block ``(..., frameskip * 2)``, an MLP sees the agent (relative to the T), its velocity and
    the action block's targets, all turned into the T's frame, and gives the agent's next
    position and velocity and the T's move and turn there; they are turned back into the arena.

    An action is the agent's target across the arena (gym-pusht: ``[-1, 1]`` is ``[0, arena]``),
    or, with ``action_scale`` > 0, a move of the target from where the agent is, that many px a
    unit (stable-worldmodel's ``swm/PushT-v1``: 100); moves are turned into the T's frame alike."""

    def __init__(
        self, frameskip: int, width: int = 256, arena: float = ARENA, action_scale: float = 0.0
    ):
        super().__init__()
        self.frameskip, self.arena, self.action_scale = frameskip, arena, action_scale
        self.net = nn.Sequential(
            nn.Linear(4 + 2 * frameskip, width),
            nn.GELU(),
            nn.Linear(width, width),
            nn.GELU(),
            nn.Linear(width, width),
            nn.GELU(),
            nn.Linear(width, 7),
        )

    def forward(self, latents: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Each latent's next ``(..., 8)`` from its own and its action block's."""
        agent, tee = latents[..., 0:2] * POSITION_UNIT, latents[..., 2:4] * POSITION_UNIT
        velocity = latents[..., 6:8] * VELOCITY_UNIT
        angle = torch.atan2(latents[..., 5], latents[..., 4])
        cos, sin = angle.cos(), angle.sin()
        each = actions.to(latents.dtype).unflatten(-1, (self.frameskip, ACTION_DIM))  # env actions
        # Into the T's frame: relative to the T, turned back by its angle.
        agent_seen = turn(agent - tee, cos, -sin)
        if self.action_scale:  # moves: turned only
            targets_seen = turn(each * self.action_scale, cos[..., None], -sin[..., None])
        else:
            targets = (each + 1) * self.arena / 2
            targets_seen = turn(targets - tee[..., None, :], cos[..., None], -sin[..., None])
        inputs = [
            agent_seen / FRAME_UNIT,
            turn(velocity, cos, -sin) / VELOCITY_UNIT,
            targets_seen[..., 0] / FRAME_UNIT,
            targets_seen[..., 1] / FRAME_UNIT,
        ]
        out = self.net(torch.cat(inputs, dim=-1))
        # Back into the arena.
        agent = tee + turn(agent_seen + out[..., 0:2] * FRAME_UNIT, cos, sin)
        velocity = turn(out[..., 2:4] * VELOCITY_UNIT, cos, sin)
        tee = tee + turn(out[..., 4:6] * FRAME_UNIT, cos, sin)
        angle = (angle + out[..., 6])[..., None]
        return torch.cat(
            [
                agent / POSITION_UNIT,
                tee / POSITION_UNIT,
                angle.cos() / ANGLE_UNIT,
                angle.sin() / ANGLE_UNIT,
                velocity / VELOCITY_UNIT,
            ],
            dim=-1,
        )


class PushTStateModel(nn.Module):
    """The reader and the predictor in the T's frame as one world model (the module's docstring)."""

    proprio_dims = 2  # the agent's velocity: in the latent, out of the planner's cost
    context_len = 1  # Markov: the state holds all the predictor needs

    def __init__(self, resolution: int, frameskip: int, width: int, hidden: int,
                 reader_batch: int, arena: float, action_scale: float):  # fmt: skip
        super().__init__()
        self.reader = PoseReader(resolution, width, arena)
        self.dynamics = TFrameDynamics(frameskip, hidden, arena, action_scale)
        self.reader_batch = reader_batch

    def encode(self, pixels: torch.Tensor, proprio: torch.Tensor) -> torch.Tensor:
        """uint8 pixels ``(..., H, W, 3)`` and proprio ``(..., 4)`` -> latents ``(..., 8)``."""
        pose = self.reader(pixels).reshape(*pixels.shape[:-3], 4)
        proprio = proprio.to(pose.dtype)
        agent, velocity = proprio[..., 0:2] / POSITION_UNIT, proprio[..., 2:4] / VELOCITY_UNIT
        return torch.cat([agent, pose, velocity], dim=-1)

    def predict(self, latents: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.dynamics(latents, torch.nan_to_num(actions, nan=0.0))

    def loss(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        truth = state_latent(batch["state"], batch["proprio"])  # (B, T, 8)
        actions = batch["action"]
        half = min(self.reader_batch, len(truth)) // 2
        frames = torch.cat([batch["pixels"][:half, 0], batch["pixels"][half : 2 * half, -1]])
        poses = torch.cat([truth[:half, 0, 2:6], truth[half : 2 * half, -1, 2:6]])
        reader = (self.reader(frames).float() - poses).pow(2).mean()
        spread = truth.flatten(0, 1).std(0)  # each value's, so each counts alike

        def error(predicted: torch.Tensor) -> torch.Tensor:
            return ((predicted.float() - truth[:, 1:]) / spread).pow(2).mean()

        one_step = error(self.predict(truth[:, :-1], actions[:, :-1]))
        imagined, latent = [], truth[:, 0]
        for block in range(truth.shape[1] - 1):
            latent = self.predict(latent, actions[:, block])
            imagined.append(latent)
        rollout = error(torch.stack(imagined, dim=1))
        return {
            "loss": reader + one_step + rollout,
            "reader": reader,
            "one_step": one_step,
            "rollout": rollout,
        }


def build(
    resolution: int,
    frameskip: int,
    action_dim: int = ACTION_DIM,
    proprio_dim: int = 4,
    state_size: int = 5,
    width: int = 16,
    hidden: int = 256,
    reader_batch: int = 64,
    arena: float = ARENA,
    action_scale: float = 0.0,
) -> PushTStateModel:
    """The factory (``model.factory = "swmcli.zoo.pusht_state:build"``): a reader of
    ``width`` channels, a predictor MLP of ``hidden`` units, the reader trained on
    ``reader_batch`` frames a step; actions are targets, or moves of ``action_scale`` px a unit
    (``TFrameDynamics``). The data must be laid out as gym-pusht's (its sizes checked;
    stable-worldmodel's ``swm/PushT-v1`` appends the agent's velocity to the state)."""
    sizes = {"action_dim": (action_dim, (ACTION_DIM,)), "proprio": (proprio_dim, (4,)),
             "state": (state_size, (5, 7))}  # fmt: skip
    wrong = [f"{name} {given} (not {' or '.join(map(str, wanted))})"
             for name, (given, wanted) in sizes.items() if given not in wanted]  # fmt: skip
    if wrong:
        raise UsageError(
            f"the Push-T state model reads gym-pusht's data, and this data has {', '.join(wrong)}",
            hint="train it on gym-pusht's data (swm collect --preset pusht-64) or "
            "stable-worldmodel's swm/PushT-v1 (with model.kwargs.action_scale=100)",
        )
    return PushTStateModel(resolution, frameskip, width, hidden, reader_batch, arena, action_scale)
