"""A world model whose memory under bf16 hinges on LayerNorm: a ConvNeXt-style encoder (each stage
a strided Conv2d, then LayerNorm over the channels at every pixel, then GELU), an MLP predictor
with LayerNorm, and a loss of its own.

Brought to swm through the model protocol (docs/bring-your-model.md)::

    swm memprofile --model tests/models/layernorm_world_model.py:build --bf16 --predict-for cpu

Under CPU bf16 autocast each LayerNorm takes bf16 activations with float32 weights, and the CPU
kernel saves its mean and rstd for backward in float32: one pair per pixel of every stage, which
the prediction must count as float32 (``docs/reports/memory-accuracy.md`` measures it).
"""

import itertools

import torch
from torch import nn
from torch.nn import functional


class LayerNormStage(nn.Module):
    """Conv2d (stride 2) -> LayerNorm over channels (channels-last) -> GELU."""

    def __init__(self, channels_in: int, channels_out: int):
        super().__init__()
        self.conv = nn.Conv2d(channels_in, channels_out, 3, stride=2, padding=1)
        self.norm = nn.LayerNorm(channels_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x).permute(0, 2, 3, 1)
        return functional.gelu(self.norm(x)).permute(0, 3, 1, 2)


class LayerNormWorldModel(nn.Module):
    """encode: LayerNormStages -> pooled -> latent; predict: an MLP over (latent, action)."""

    def __init__(self, action_block: int, width: int, stages: int, latent_dim: int):
        super().__init__()
        channels = [3] + [width * 2**i for i in range(stages)]
        self.stages = nn.ModuleList(
            LayerNormStage(c_in, c_out) for c_in, c_out in itertools.pairwise(channels)
        )
        self.project = nn.Linear(channels[-1], latent_dim)
        self.predictor = nn.Sequential(
            nn.Linear(latent_dim + action_block, 4 * latent_dim),
            nn.LayerNorm(4 * latent_dim),
            nn.GELU(),
            nn.Linear(4 * latent_dim, latent_dim),
        )

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        x = pixels.reshape(-1, *pixels.shape[-3:]).permute(0, 3, 1, 2).float() / 127.5 - 1
        for stage in self.stages:
            x = stage(x)
        return self.project(x.mean(dim=(2, 3))).reshape(*pixels.shape[:-3], -1)

    def predict(self, latents: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        actions = torch.nan_to_num(actions, nan=0.0).to(latents.dtype)
        return latents + self.predictor(torch.cat([latents, actions], dim=-1))

    def loss(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        latents = self.encode(batch["pixels"])
        predicted = self.predict(latents[:, :-1], batch["action"][:, :-1])
        prediction = functional.mse_loss(predicted.float(), latents[:, 1:].detach().float())
        flat = latents.flatten(0, -2).float()
        variance = torch.relu(1.0 - torch.sqrt(flat.var(0) + 1e-4)).mean()
        return {"loss": prediction + variance, "prediction": prediction.detach()}


def build(action_dim: int, frameskip: int, width: int = 8, stages: int = 3, latent_dim: int = 32):
    """The LayerNorm conv + MLP model; ``width`` channels in the first stage, doubling."""
    return LayerNormWorldModel(frameskip * action_dim, width, stages, latent_dim)
