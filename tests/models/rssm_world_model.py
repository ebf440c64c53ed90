"""A recurrent world model (Dreamer's RSSM), brought to swm through the recurrent protocol.

Written against docs/bring-your-model.md (its recurrent section)::

    swm train --preset tiny --model tests/models/rssm_world_model.py:build
    swm memprofile --model tests/models/rssm_world_model.py:build --predict-for cpu
    swm eval runs/tiny

A conv encoder (``EncoderStage``: Conv2d stride 2 -> LayerNorm over channels -> SiLU) embeds each
frame; a GRUCell carries the deterministic path ``h``; a diagonal Gaussian stochastic latent
``z`` has a prior ``p(z | h)`` and a posterior ``q(z | h, frame)``; a conv-transpose decoder
(``DecoderStage``) draws the frame back from ``(h, z)``. The loss is the frame's squared error
plus ``kl_weight`` times the KL of posterior to prior, held at ``free_nats`` at least.

The state swm carries is ``(h, z)``; the latent the planner scores is ``z`` (the mean, outside
training). ``encode(pixels, state=, action=)`` steps ``h`` with the previous ``z`` and the block
taken, then reads the posterior; ``predict(latents, actions, state=)`` steps ``h`` with each given
latent and block and reads the prior. Without a state both start from ``initial_state``: a
``predict`` of T positions then runs the cell T times.
"""

import itertools

import torch
from torch import nn
from torch.nn import functional

MIN_STD = 0.1


class EncoderStage(nn.Module):
    """Conv2d (stride 2) -> LayerNorm over channels -> SiLU."""

    def __init__(self, channels_in: int, channels_out: int):
        super().__init__()
        self.conv = nn.Conv2d(channels_in, channels_out, 4, stride=2, padding=1)
        self.norm = nn.LayerNorm(channels_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.conv(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return functional.silu(x)


class DecoderStage(nn.Module):
    """ConvTranspose2d (stride 2) -> LayerNorm over channels -> SiLU."""

    def __init__(self, channels_in: int, channels_out: int):
        super().__init__()
        self.conv = nn.ConvTranspose2d(channels_in, channels_out, 4, stride=2, padding=1)
        self.norm = nn.LayerNorm(channels_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.conv(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return functional.silu(x)


def gaussian(parameters: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, std) of a diagonal Gaussian from its 2 * Z raw parameters."""
    mean, raw = parameters.float().chunk(2, dim=-1)
    return mean, functional.softplus(raw) + MIN_STD


def kl_divergence(posterior, prior) -> torch.Tensor:
    """KL(posterior || prior) of diagonal Gaussians ``(mean, std)``, summed over the latent."""
    (mean_q, std_q), (mean_p, std_p) = posterior, prior
    ratio = (std_q / std_p).pow(2)
    return 0.5 * (ratio + ((mean_q - mean_p) / std_p).pow(2) - 1 - ratio.log()).sum(-1)


class RSSM(nn.Module):
    """Encoder, GRUCell deterministic path, Gaussian stochastic latent, decoder."""

    def __init__(self, action_block: int, resolution: int, width: int, stages: int,
                 embed: int, deter: int, stoch: int, hidden: int, free_nats: float,
                 kl_weight: float):  # fmt: skip
        super().__init__()
        channels = [3] + [width * 2**i for i in range(stages)]
        self.side = resolution // 2**stages
        self.encoder = nn.ModuleList(
            EncoderStage(c_in, c_out) for c_in, c_out in itertools.pairwise(channels)
        )
        self.embed = nn.Linear(channels[-1] * self.side**2, embed)
        self.step_input = nn.Linear(stoch + action_block, hidden)
        self.cell = nn.GRUCell(hidden, deter)
        self.prior = nn.Sequential(
            nn.Linear(deter, hidden), nn.SiLU(), nn.Linear(hidden, 2 * stoch)
        )
        self.posterior = nn.Sequential(
            nn.Linear(deter + embed, hidden), nn.SiLU(), nn.Linear(hidden, 2 * stoch)
        )
        self.unembed = nn.Linear(deter + stoch, channels[-1] * self.side**2)
        reverse = channels[:0:-1]  # the encoder's widths back, the last stage draws RGB
        self.decoder = nn.ModuleList(
            DecoderStage(c_in, c_out) for c_in, c_out in itertools.pairwise(reverse)
        )
        self.draw = nn.ConvTranspose2d(reverse[-1], 3, 4, stride=2, padding=1)
        self.sizes = {"deter": deter, "stoch": stoch, "action": action_block}
        self.free_nats, self.kl_weight = free_nats, kl_weight

    def initial_state(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(h, z)`` before an episode's first frame: zeros, on the model's device."""
        weight = self.cell.weight_hh
        return (
            weight.new_zeros(batch_size, self.sizes["deter"]),
            weight.new_zeros(batch_size, self.sizes["stoch"]),
        )

    def encode(self, pixels, *, state=None, action=None):
        """Latents of frames ``(*lead, H, W, 3)``; with ``state`` (batch first) and the blocks
        ``action`` that led to the frames, ``(latents, state after them)``."""
        embedded = self._embed(pixels)
        if state is None:  # every frame as an episode's first
            flat = embedded.reshape(-1, embedded.shape[-1])
            state = self.initial_state(len(flat))
            latent, _ = self._observe(flat, state, flat.new_zeros(len(flat), self.sizes["action"]))
            return latent.reshape(*embedded.shape[:-1], -1)
        return self._observe(embedded, state, action)

    def predict(self, latents, actions, *, state=None):
        """The prior's next latents ``(B, T, Z)`` after each latent and block; with ``state`` (at
        the first latent), ``(next latents, state after the last)``."""
        if state is None:  # rebuilt from zero: the first latent seen as an episode's first frame
            h, _ = self.initial_state(latents.shape[0])
            h = self._step(h, torch.zeros_like(latents[:, 0]), torch.zeros_like(actions[:, 0]))
        else:
            h = state[0]
        following = []
        for step in range(latents.shape[1]):
            h = self._step(h, latents[:, step], actions[:, step])
            following.append(self._sample(gaussian(self.prior(h))).to(latents.dtype))
        following = torch.stack(following, dim=1)
        return following if state is None else (following, (h, following[:, -1]))

    def loss(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        pixels, actions = batch["pixels"], torch.nan_to_num(batch["action"].float())
        embedded = self._embed(pixels)
        h, z = self.initial_state(pixels.shape[0])
        action = torch.zeros_like(actions[:, 0])
        features, divergences = [], []
        for step in range(pixels.shape[1]):
            h = self._step(h, z, action)
            posterior = gaussian(self.posterior(torch.cat([h, embedded[:, step].to(h.dtype)], -1)))
            z = self._sample(posterior)
            divergences.append(kl_divergence(posterior, gaussian(self.prior(h))))
            features.append(torch.cat([h.float(), z], -1))
            action = actions[:, step]
        drawn = self._decode(torch.stack(features, dim=1).flatten(0, 1))
        target = pixels.flatten(0, 1).permute(0, 3, 1, 2).float() / 127.5 - 1
        reconstruction = (drawn.float() - target).pow(2).mean()
        kl = torch.stack(divergences).mean()
        return {
            "loss": reconstruction + self.kl_weight * kl.clamp(min=self.free_nats),
            "reconstruction": reconstruction.detach(),
            "kl": kl.detach(),
        }

    def _observe(self, embedded: torch.Tensor, state, action):
        """The posterior step: ``(z, (h, z))`` after ``action`` from ``state``, seeing a frame."""
        h = self._step(*state, action)
        z = self._sample(gaussian(self.posterior(torch.cat([h, embedded.to(h.dtype)], -1))))
        return z, (h, z)

    def _embed(self, pixels: torch.Tensor) -> torch.Tensor:
        x = pixels.reshape(-1, *pixels.shape[-3:]).permute(0, 3, 1, 2).float() / 127.5 - 1
        for stage in self.encoder:
            x = stage(x)
        return self.embed(x.flatten(1)).reshape(*pixels.shape[:-3], -1)

    def _step(self, h, z, action) -> torch.Tensor:
        """The deterministic path: ``h`` after the latent ``z`` and the block ``action``."""
        action = torch.nan_to_num(action).to(z.dtype)
        x = functional.silu(self.step_input(torch.cat([z, action], dim=-1)))
        return self.cell(x, h.to(x.dtype))

    def _sample(self, distribution) -> torch.Tensor:
        mean, std = distribution
        return mean + std * torch.randn_like(std) if self.training else mean

    def _decode(self, features: torch.Tensor) -> torch.Tensor:
        x = self.unembed(features).reshape(len(features), -1, self.side, self.side)
        for stage in self.decoder:
            x = stage(x)
        return self.draw(x)


def build(action_dim: int, frameskip: int, resolution: int, width: int = 8, stages: int = 2,
          embed: int = 32, deter: int = 32, stoch: int = 8, hidden: int = 32,
          free_nats: float = 1.0, kl_weight: float = 1.0) -> RSSM:  # fmt: skip
    """The RSSM for frames of ``resolution`` (divisible by ``2**stages``), tiny by default."""
    return RSSM(frameskip * action_dim, resolution, width, stages, embed, deter, stoch, hidden,
                free_nats, kl_weight)  # fmt: skip


def build_without_loss(action_dim: int, frameskip: int, resolution: int) -> RSSM:
    """The RSSM without a loss of its own: swm trains it with its JEPA loss, carrying its state."""
    model = build(action_dim, frameskip, resolution)
    model.loss = None
    return model
