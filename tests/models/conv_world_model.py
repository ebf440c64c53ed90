"""A world model that is not swm's: a conv + GroupNorm encoder, a causal transformer predictor,
and a VICReg-style loss of its own.

Brought to swm through the model protocol (docs/bring-your-model.md)::

    swm train --preset tiny --model tests/models/conv_world_model.py:build
    swm memprofile --model tests/models/conv_world_model.py:build --bf16 \
        --activation-checkpointing ConvStage

The encoder is a stack of ``ConvStage`` (Conv2d -> GroupNorm -> SiLU, stride 2), pooled to one
latent per frame; the predictor is ``depth`` pre-norm transformer layers (an ``nn.ModuleList``:
what swm's ``layers`` picks), causal over time, each position reading its latent plus its action
block. Its loss is the next-latent error against stop-gradient targets plus VICReg's variance and
covariance terms on the latents. GroupNorm under bf16 autocast is where CPU and CUDA differ
(CUDA runs it in float32, CPU in bf16), and where a checkpointed module must recompute in the
dtype it saved. ``max_len`` fixes the positional table: a model that takes at most that many
time steps (memprofile skips the rows it cannot take).
"""

import itertools

import torch
from torch import nn
from torch.nn import functional


class ConvStage(nn.Module):
    """Conv2d (stride 2) -> GroupNorm -> SiLU."""

    def __init__(self, channels_in: int, channels_out: int, groups: int):
        super().__init__()
        self.conv = nn.Conv2d(channels_in, channels_out, 3, stride=2, padding=1)
        self.norm = nn.GroupNorm(groups, channels_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return functional.silu(self.norm(self.conv(x)))


class Layer(nn.Module):
    """A pre-norm causal self-attention + MLP layer over (B, T, D)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attention = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        steps = x.shape[1]
        causal = torch.ones(steps, steps, dtype=torch.bool, device=x.device).triu(1)
        h = self.norm1(x)
        x = x + self.attention(h, h, h, attn_mask=causal, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class ConvWorldModel(nn.Module):
    """encode: ConvStages -> pooled -> latent; predict: causal transformer over (latent, action)."""

    def __init__(self, action_block: int, max_len: int, width: int, stages: int, latent_dim: int,
                 depth: int, heads: int, groups: int):  # fmt: skip
        super().__init__()
        channels = [3] + [width * 2**i for i in range(stages)]
        self.encoder = nn.Sequential(
            *(ConvStage(c_in, c_out, groups) for c_in, c_out in itertools.pairwise(channels)),
        )
        self.project = nn.Linear(channels[-1], latent_dim)
        self.embed = nn.Linear(latent_dim + action_block, latent_dim)
        self.position = nn.Parameter(torch.zeros(max_len, latent_dim))
        self.layers = nn.ModuleList(Layer(latent_dim, heads) for _ in range(depth))
        self.head = nn.Linear(latent_dim, latent_dim)
        self.context_len = max_len

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        frames = pixels.reshape(-1, *pixels.shape[-3:]).permute(0, 3, 1, 2).float() / 127.5 - 1
        features = self.encoder(frames).mean(dim=(2, 3))
        return self.project(features).reshape(*pixels.shape[:-3], -1)

    def predict(self, latents: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        actions = torch.nan_to_num(actions, nan=0.0).to(latents.dtype)
        x = self.embed(torch.cat([latents, actions], dim=-1)) + self.position[: latents.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return latents + self.head(x)

    def loss(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        latents = self.encode(batch["pixels"])
        predicted = self.predict(latents[:, :-1], batch["action"][:, :-1])
        prediction = functional.mse_loss(predicted.float(), latents[:, 1:].detach().float())
        flat = latents.flatten(0, -2).float()
        variance = torch.relu(1.0 - torch.sqrt(flat.var(0) + 1e-4)).mean()
        centred = flat - flat.mean(0)
        covariance = (centred.T @ centred) / max(len(flat) - 1, 1)
        off_diagonal = covariance - torch.diag(torch.diagonal(covariance))
        covariance_loss = off_diagonal.square().sum() / flat.shape[1]
        return {
            "loss": prediction + variance + 0.04 * covariance_loss,
            "prediction": prediction.detach(),
            "variance": variance.detach(),
        }


def build(
    action_dim: int,
    frameskip: int,
    history_len: int,
    max_len: int | None = None,
    width: int = 8,
    stages: int = 2,
    latent_dim: int = 32,
    depth: int = 2,
    heads: int = 2,
    groups: int = 4,
):
    """The conv + transformer model for clips of ``history_len`` frames (``max_len`` caps it)."""
    return ConvWorldModel(
        frameskip * action_dim, max_len or history_len, width, stages, latent_dim, depth, heads,
        groups,
    )  # fmt: skip
