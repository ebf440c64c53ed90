"""A world model that is not swm's: TD-MPC2-style MLPs with their own latent-consistency loss.

Brought to swm through the model protocol (docs/bring-your-model.md)::

    swm train --preset tiny --model tests/models/mlp_world_model.py:build
    swm memprofile --model tests/models/mlp_world_model.py:build --resolution 224 --budget 24GiB

``build`` makes an MLP encoder (frames pooled to 16x16) and a Markov MLP dynamics model
``z' = z + f(z, a)``, trained with TD-MPC2's multi-step latent consistency (predictions rolled
out from the first latent toward the stop-gradient latents of the clip, weights ``rho**t``) plus
a variance hinge that keeps the latents spread (TD-MPC2 gets that from its reward and value
heads, which pixel-only clips do not have). ``build_frozen`` keeps a frozen random convolutional
encoder (DINO-WM style: only the predictor learns) and has no loss of its own, so swm trains it
with its JEPA loss.
"""

import itertools

import torch
from torch import nn
from torch.nn import functional

POOLED_SIDE = 16


def frames(pixels: torch.Tensor) -> torch.Tensor:
    """uint8 ``(..., H, W, 3)`` -> float ``(N, 3, H, W)`` in [-1, 1]."""
    flat = pixels.reshape(-1, *pixels.shape[-3:]).permute(0, 3, 1, 2)
    return flat.float() / 127.5 - 1.0


def mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for size_in, size_out in itertools.pairwise(sizes[:-1]):
        layers += [nn.Linear(size_in, size_out), nn.LayerNorm(size_out), nn.Mish()]
    return nn.Sequential(*layers, nn.Linear(sizes[-2], sizes[-1]))


class MLPWorldModel(nn.Module):
    """encode: pooled pixels -> MLP -> latent; predict: one MLP step per position."""

    context_len = 1  # Markov: the next latent depends on the last one and its action only

    def __init__(
        self, action_block: int, latent_dim: int, hidden: int, rho: float, spread_weight: float
    ):
        super().__init__()
        self.encoder = mlp([3 * POOLED_SIDE**2, hidden, hidden, latent_dim])
        self.dynamics = mlp([latent_dim + action_block, hidden, hidden, latent_dim])
        self.rho, self.spread_weight = rho, spread_weight

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        pooled = functional.adaptive_avg_pool2d(frames(pixels), POOLED_SIDE)
        return self.encoder(pooled.flatten(1)).reshape(*pixels.shape[:-3], -1)

    def predict(self, latents: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        actions = torch.nan_to_num(actions, nan=0.0).to(latents.dtype)
        return latents + self.dynamics(torch.cat([latents, actions], dim=-1))

    def loss(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        latents = self.encode(batch["pixels"])
        targets = latents.detach()
        actions = batch["action"][:, :-1]
        latent = latents[:, :1]
        consistency = latents.new_zeros(())
        for step in range(actions.shape[1]):
            latent = self.predict(latent, actions[:, step : step + 1])
            error = functional.mse_loss(latent.float(), targets[:, step + 1 : step + 2].float())
            consistency = consistency + self.rho**step * error
        spread = torch.relu(1.0 - latents.flatten(0, -2).float().std(0)).mean()
        return {
            "loss": consistency + self.spread_weight * spread,
            "consistency": consistency.detach(),
            "spread": spread.detach(),
        }


def build(
    action_dim: int,
    frameskip: int,
    latent_dim: int = 32,
    hidden: int = 128,
    rho: float = 0.5,
    spread_weight: float = 10.0,
):
    """The TD-MPC2-style model for action blocks of ``frameskip * action_dim`` values."""
    return MLPWorldModel(frameskip * action_dim, latent_dim, hidden, rho, spread_weight)


class FrozenEncoderWorldModel(nn.Module):
    """A frozen random convolutional encoder and a trained MLP predictor; no loss of its own."""

    def __init__(self, action_block: int, latent_dim: int, hidden: int):
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Conv2d(3, 16, 4, stride=4), nn.GELU(), nn.AdaptiveAvgPool2d(4), nn.Flatten()
        )
        self.project = nn.Linear(16 * 4 * 4, latent_dim)
        self.encoder.requires_grad_(False)
        self.project.requires_grad_(False)
        self.dynamics = mlp([latent_dim + action_block, hidden, latent_dim])

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        latents = self.project(self.encoder(frames(pixels)))
        return latents.reshape(*pixels.shape[:-3], -1)

    def predict(self, latents: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        actions = torch.nan_to_num(actions, nan=0.0).to(latents.dtype)
        return latents + self.dynamics(torch.cat([latents, actions], dim=-1))


def build_frozen(action_dim: int, frameskip: int, latent_dim: int = 32, hidden: int = 64):
    """The frozen-encoder model; swm's JEPA loss trains its predictor."""
    return FrozenEncoderWorldModel(frameskip * action_dim, latent_dim, hidden)


def build_without_predict(**_shape):
    """Not a world model: it cannot predict (swm names the missing method)."""
    model = FrozenEncoderWorldModel(2, 8, 8)
    model.predict = None
    return model
