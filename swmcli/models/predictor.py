"""The predictor: a transformer, causal over the history, conditioned on each action block.

Token ``t`` carries the latent of observation ``t`` plus an embedding of the dense action block
taken there (``frameskip`` env actions); its output is the predicted latent of observation
``t + 1`` (the latent of ``t`` plus a predicted change). A causal mask lets token ``t`` see only
tokens ``<= t``, so one forward pass over a clip of ``T`` observations gives ``T`` next-latent
predictions, each from its own past.
"""

import torch
from torch import nn


class Predictor(nn.Module):
    """``(latents (B, T, D), actions (B, T, A)) -> predicted next latents (B, T, D)``."""

    def __init__(
        self, latent_dim: int, action_dim: int, dim: int, depth: int, heads: int, max_len: int
    ):
        super().__init__()
        self.max_len = max_len
        self.embed_latent = nn.Linear(latent_dim, dim)
        self.embed_action = nn.Sequential(
            nn.Linear(action_dim, dim), nn.GELU(), nn.Linear(dim, dim)
        )
        self.position = nn.Parameter(torch.randn(1, max_len, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(
            dim, heads, 4 * dim, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.transformer = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.final_norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, latent_dim)
        # A boolean upper-triangular mask (True = may not attend), built once for max_len.
        mask = torch.ones(max_len, max_len, dtype=torch.bool).triu(1)
        self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, latents: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Next-latent predictions, one per input position (position ``t`` predicts ``t + 1``)."""
        length = latents.shape[1]
        tokens = self.embed_latent(latents) + self.embed_action(actions)
        tokens = tokens + self.position[:, :length]
        mask = self.causal_mask[:length, :length]
        hidden = self.transformer(tokens, mask=mask, is_causal=True)
        # Residual: the predictor learns the change of the latent, which is small per step.
        return latents + self.out(self.final_norm(hidden))
