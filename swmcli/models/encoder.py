"""Encoders: one uint8 frame -> one latent vector. A small CNN (default) or a ViT-tiny.

Both take float frames ``(N, 3, H, W)`` already normalized on the device (see
``world_model.normalize_pixels``) and return ``(N, latent_dim)``. Each ends in a linear projection
followed by a BatchNorm without affine parameters, as in LeWM: the latent is centred and scaled
per dimension, which the anti-collapse regularizer then shapes into an isotropic Gaussian. The
BatchNorm uses the global batch's statistics under data-parallel training (``global_batch``).
"""

import torch
from torch import nn

from swmcli.models.global_batch import GlobalBatchNorm1d

SMALLEST_SIDE = 4  # the CNN halves the frame until its side is at most this


def cnn_stages(resolution: int) -> int:
    """Stride-2 stages the CNN uses at ``resolution``: 32 -> 3, 64 -> 4, 224 -> 6."""
    stages, side = 0, resolution
    while side > SMALLEST_SIDE:
        side = (side + 1) // 2
        stages += 1
    return max(stages, 1)


class CNNEncoder(nn.Module):
    """Stride-2 conv stages (channels double from ``width``, capped at 8x) and a projection."""

    def __init__(self, resolution: int, latent_dim: int, width: int):
        super().__init__()
        layers: list[nn.Module] = []
        channels_in, side = 3, resolution
        for stage in range(cnn_stages(resolution)):
            channels_out = width * 2 ** min(stage, 3)
            layers += [
                nn.Conv2d(channels_in, channels_out, 3, stride=2, padding=1),
                nn.GroupNorm(_groups(channels_out), channels_out),
                nn.GELU(),
            ]
            channels_in, side = channels_out, (side + 1) // 2
        self.features = nn.Sequential(*layers)
        self.project = nn.Sequential(nn.Flatten(), nn.Linear(channels_in * side * side, latent_dim))
        self.norm = GlobalBatchNorm1d(latent_dim, affine=False)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        """Frames ``(N, 3, H, W)`` float -> latents ``(N, latent_dim)``."""
        return self.norm(self.project(self.features(frames)))


class ViTEncoder(nn.Module):
    """ViT-tiny: patch embedding, a CLS token, pre-norm transformer layers, a projection."""

    def __init__(
        self, resolution: int, latent_dim: int, patch: int, dim: int, depth: int, heads: int
    ):
        super().__init__()
        patches = (resolution // patch) ** 2
        self.embed = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.position = nn.Parameter(torch.randn(1, patches + 1, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(
            dim, heads, 4 * dim, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.transformer = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.final_norm = nn.LayerNorm(dim)
        self.project = nn.Linear(dim, latent_dim)
        self.norm = GlobalBatchNorm1d(latent_dim, affine=False)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        """Frames ``(N, 3, H, W)`` float -> latents ``(N, latent_dim)`` from the CLS token."""
        tokens = self.embed(frames).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls.expand(len(tokens), -1, -1), tokens], dim=1)
        tokens = self.transformer(tokens + self.position)
        return self.norm(self.project(self.final_norm(tokens[:, 0])))


class CNNDecoder(nn.Module):
    """The CNN encoder mirrored: a latent -> a normalized frame ``(N, 3, H, W)``.

    What ``model.reconstruction_weight`` trains the latent with: to draw the frame back, the
    latent must hold everything in it, the pushed T's pose as much as the agent. Each stage
    doubles the side with a stride-2 transposed convolution (the last one draws the 3 colours
    directly: no full-resolution stage, the costliest).
    """

    def __init__(self, resolution: int, latent_dim: int, width: int):
        super().__init__()
        stages = cnn_stages(resolution)
        self.resolution = resolution
        self.side = resolution
        for _ in range(stages):
            self.side = (self.side + 1) // 2
        self.channels = width * 2 ** min(stages - 1, 3)
        self.project = nn.Linear(latent_dim, self.channels * self.side * self.side)
        layers: list[nn.Module] = []
        channels_in = self.channels
        for stage in reversed(range(1, stages)):
            channels_out = width * 2 ** min(stage - 1, 3)
            layers += [
                nn.ConvTranspose2d(channels_in, channels_out, 4, stride=2, padding=1),
                nn.GroupNorm(_groups(channels_out), channels_out),
                nn.GELU(),
            ]
            channels_in = channels_out
        layers.append(nn.ConvTranspose2d(channels_in, 3, 4, stride=2, padding=1))
        self.layers = nn.Sequential(*layers)

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents ``(N, latent_dim)`` -> frames ``(N, 3, H, W)``, cropped to the resolution
        where the encoder's halvings rounded up."""
        grid = self.project(latents).reshape(-1, self.channels, self.side, self.side)
        return self.layers(grid)[..., : self.resolution, : self.resolution]


def _groups(channels: int) -> int:
    # GroupNorm rather than BatchNorm inside the CNN: statistics per frame, so a planner's
    # batch of one goal image encodes the same as it would inside a training batch.
    return 8 if channels % 8 == 0 else 1
