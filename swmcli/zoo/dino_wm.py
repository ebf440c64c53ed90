"""DINO-WM as stable-worldmodel 0.1.1 trains it on Push-T (``scripts/train/prejepa.py`` with
``scripts/train/config/prejepa.yaml``: ``PreJEPA``; preset ``dino-wm-224``), module for module:
parameter names and shapes are upstream's.

- ``backbone``: DINOv2-small (``facebook/dinov2-small``'s settings), frozen (the preset's
  ``train.freeze``), its patch tokens (16 x 16 at 224 px, 384 wide) are a frame's latent. Built
  with random weights: nothing is downloaded (the weights change no figure of memory);
- ``extra_encoders``: a Conv1d (kernel 1) each for the agent's state (``proprio``) and the action
  block, to 10 values, repeated over the patches and appended to each: 404 per patch;
- ``predictor``: 6 transformer blocks (16 heads of 64, MLP 2048, dropout 0.1) over every patch of
  the history's frames, causal frame by frame (a patch sees its frame's and earlier frames').

A latent under swm's protocol is a frame's patches, flattened, then its proprio embedding
(``256 * 384 + 10``); ``predict`` appends the action embedding to each patch, as upstream's
``rollout`` does, and returns the predicted patches and the first patch's proprio embedding
(upstream's ``split_embedding``). The loss is prejepa.py's: MSE of the predicted patches and
proprio embedding against the next frames' (the action part left out).
"""

import torch
import torch.nn.functional as F
from torch import nn

from swmcli.zoo.hf_vision import dinov2_small, imagenet_frames
from swmcli.zoo.jepa import FeedForward

EXTRA_DIM = 10  # prejepa.yaml's wm.encoding: proprio 10, action 10


class Attention(nn.Module):
    """Pre-norm multi-head attention under a frame-causal mask (``bias``, upstream's buffer)."""

    def __init__(self, dim: int, heads: int, dim_head: int, dropout: float, num_patches: int,
                 num_frames: int):  # fmt: skip
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.norm = nn.LayerNorm(dim)
        self.to_qkv = nn.Linear(dim, 3 * heads * dim_head, bias=False)
        self.to_out = nn.Sequential(nn.Linear(heads * dim_head, dim), nn.Dropout(dropout))
        frame = torch.arange(num_frames).repeat_interleave(num_patches)
        self.register_buffer("bias", (frame[:, None] >= frame[None, :]).float()[None, None])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(1, 2)
                   for t in self.to_qkv(self.norm(x)).chunk(3, dim=-1))  # fmt: skip
        tokens = x.shape[1]
        mask = self.bias[:, :, :tokens, :tokens] == 1
        drop = self.dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop)
        return self.to_out(out.transpose(1, 2).flatten(2))


class Transformer(nn.Module):
    def __init__(self, dim: int, depth: int, heads: int, dim_head: int, mlp_dim: int,
                 dropout: float, num_patches: int, num_frames: int):  # fmt: skip
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.layers = nn.ModuleList()
        for _ in range(depth):  # upstream's layout: [attention, feed-forward] per layer
            attention = Attention(dim, heads, dim_head, dropout, num_patches, num_frames)
            self.layers.append(nn.ModuleList([attention, FeedForward(dim, mlp_dim, dropout)]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for attention, feed_forward in self.layers:
            x = attention(x) + x
            x = feed_forward(x) + x
        return self.norm(x)


class CausalPredictor(nn.Module):
    """Every patch of every frame ``(B, T * P, dim)`` -> the next frames' ``(B, T * P, dim)``."""

    def __init__(self, num_patches: int, num_frames: int, dim: int, depth: int = 6,
                 heads: int = 16, dim_head: int = 64, mlp_dim: int = 2048,
                 dropout: float = 0.1):  # fmt: skip
        super().__init__()
        self.pos_embedding = nn.Parameter(torch.randn(1, num_frames * num_patches, dim))
        self.transformer = Transformer(dim, depth, heads, dim_head, mlp_dim, dropout,
                                       num_patches, num_frames)  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.transformer(x + self.pos_embedding[:, : x.shape[1]])


class Embedder(nn.Module):
    """Values ``(B, T, in_chans)`` -> ``(B, T, emb_dim)``: a Conv1d of kernel 1, in float32."""

    def __init__(self, in_chans: int, emb_dim: int = EXTRA_DIM):
        super().__init__()
        self.patch_embed = nn.Conv1d(in_chans, emb_dim, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            return self.patch_embed(x.float().transpose(1, 2)).transpose(1, 2)


class DinoWM(nn.Module):
    """The world model (the module's docstring) under swm's protocol."""

    proprio_dims = EXTRA_DIM  # the proprio embedding closes each latent

    def __init__(self, resolution: int, action_block: int, proprio_dim: int, num_frames: int):
        super().__init__()
        self.backbone = dinov2_small()
        patch = self.backbone.embeddings.patch_embeddings.projection.kernel_size[0]
        self.num_patches = (resolution // patch) ** 2
        self.width = self.backbone.hidden_size
        dim = self.width + 2 * EXTRA_DIM
        self.predictor = CausalPredictor(self.num_patches, num_frames, dim)
        self.extra_encoders = nn.ModuleDict(
            {"proprio": Embedder(proprio_dim), "action": Embedder(action_block)}
        )
        self.context_len = num_frames

    def encode(self, pixels: torch.Tensor, proprio: torch.Tensor) -> torch.Tensor:
        """uint8 ``(..., H, W, 3)`` and proprio ``(..., P)`` -> latents ``(..., 256 * 384 + 10)``:
        the frame's patch tokens (without the CLS token), then the proprio embedding."""
        lead = pixels.shape[:-3]
        patches = self.backbone(imagenet_frames(pixels))[:, 1:].detach()
        proprio = torch.nan_to_num(proprio, nan=0.0).reshape(-1, 1, proprio.shape[-1])
        state = self.extra_encoders["proprio"](proprio)[:, 0]
        latents = torch.cat([patches.flatten(1), state.to(patches.dtype)], dim=-1)
        return latents.reshape(*lead, -1)

    def predict(self, latents: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        predicted = self.predicted_tokens(latents, actions)
        state = predicted[:, :, 0, self.width : self.width + EXTRA_DIM]
        return torch.cat([predicted[..., : self.width].flatten(2), state], dim=-1)

    def predicted_tokens(self, latents: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """The predictor's output ``(B, T, P, 404)``: each patch, the proprio and the action
        embedding, predicted for the frame after each of ``latents``."""
        frames = latents.shape[1]
        action = self.extra_encoders["action"](torch.nan_to_num(actions, nan=0.0))
        tokens = self.tokens(latents, action.to(latents.dtype)).flatten(1, 2)
        return self.predictor(tokens).unflatten(1, (frames, self.num_patches))

    def tokens(self, latents: torch.Tensor, *extras: torch.Tensor) -> torch.Tensor:
        """Latents ``(B, T, D)`` as upstream's embedding ``(B, T, P, 384 + 10 + ...)``: each
        patch with the proprio embedding and ``extras`` appended."""
        patches = latents[..., :-EXTRA_DIM].unflatten(-1, (self.num_patches, self.width))
        appended = torch.cat([latents[..., -EXTRA_DIM:], *extras], dim=-1)
        appended = appended[:, :, None].expand(-1, -1, self.num_patches, -1)
        return torch.cat([patches, appended], dim=-1)

    def loss(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """prejepa.py's: the first ``num_frames`` frames predict each next one; MSE over every
        patch's values but the action embedding's (``pixels`` and ``proprio`` logged apart)."""
        latents = self.encode(batch["pixels"], batch["proprio"])
        history = self.context_len
        predicted = self.predicted_tokens(latents[:, :history], batch["action"][:, :history])
        predicted = predicted[..., : self.width + EXTRA_DIM]
        target = self.tokens(latents[:, 1 : history + 1]).detach()
        width = self.width
        return {
            "loss": F.mse_loss(predicted, target),
            "pixels": F.mse_loss(predicted[..., :width], target[..., :width]),
            "proprio": F.mse_loss(predicted[..., width:], target[..., width:]),
        }


def build(resolution: int, action_dim: int, frameskip: int, history_len: int,
          proprio_dim: int) -> DinoWM:  # fmt: skip
    """The factory (``model.factory = "swmcli.zoo.dino_wm:build"``, with ``model.proprio``): a
    clip of ``history_len`` frames trains a predictor of ``history_len - 1`` frames (prejepa.yaml:
    3 and one prediction)."""
    return DinoWM(resolution, frameskip * action_dim, proprio_dim, max(history_len - 1, 1))
