"""PLDM as stable-worldmodel 0.1.1 trains it (``scripts/train/pldm.py`` with
``scripts/train/config/pldm.yaml``; preset ``pldm-224``), module for module: parameter names and
shapes are upstream's ``PLDM`` plus the inverse-dynamics head its training script trains beside it
(``idm``).

- ``encoder``: ViT-tiny at 224 px, patch 14 (stable-pretraining's ``vit_hf``), its CLS token;
- ``projector``: an MLP of hidden width 2048 with BatchNorm1d, the CLS token -> the latent (192);
- ``action_encoder``: a 1x1 Conv1d over the action block (frameskip x action_dim), then an MLP
  to 192;
- ``predictor``: 6 AdaLN-zero transformer blocks (16 heads of 64, MLP 2048, dropout 0.1) over
  the history's latents, conditioned on their action embeddings, causal in time;
- ``pred_proj``: the prediction's MLP, as the projector;
- ``idm``: an MLP (hidden 512, LayerNorm) from two consecutive latents to the action block between
  them (its loss weighs 0 in ``pldm.yaml``, and it runs all the same).

The loss is ``pldm.yaml``'s: prediction MSE, plus VCReg's variance (18) over the batch and over
time (0.7), covariance (12) and the temporal alignment of consecutive latents (0.2); the terms of
weight 0 (the IDM's, the covariance over time) are computed as upstream computes them.
"""

import torch
import torch.nn.functional as F
from torch import nn

from swmcli.zoo.hf_vision import hf_vit, imagenet_frames

WEIGHTS = {"temp_align": 0.2, "std": 18.0, "std_t": 0.7, "cov": 12.0, "cov_t": 0.0, "idm": 0.0}
VAR_EPS = 1e-4


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale) + shift


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int, dropout: float):
        super().__init__()
        self.net = nn.Sequential(
            nn.LayerNorm(dim),
            nn.Linear(dim, hidden),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, dim),
            nn.Dropout(dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Attention(nn.Module):
    """Pre-norm multi-head attention, causal in time."""

    def __init__(self, dim: int, heads: int, dim_head: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.norm = nn.LayerNorm(dim)
        self.to_qkv = nn.Linear(dim, 3 * heads * dim_head, bias=False)
        self.to_out = nn.Sequential(nn.Linear(heads * dim_head, dim), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(1, 2)
                   for t in self.to_qkv(self.norm(x)).chunk(3, dim=-1))  # fmt: skip
        drop = self.dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=drop, is_causal=True)
        return self.to_out(out.transpose(1, 2).flatten(2))


class ConditionalBlock(nn.Module):
    """A transformer block modulated by the condition (AdaLN-zero)."""

    def __init__(self, dim: int, heads: int, dim_head: int, mlp_dim: int, dropout: float):
        super().__init__()
        self.attn = Attention(dim, heads, dim_head, dropout)
        self.mlp = FeedForward(dim, mlp_dim, dropout)
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        nn.init.zeros_(self.adaLN_modulation[-1].weight)
        nn.init.zeros_(self.adaLN_modulation[-1].bias)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift1, scale1, gate1, shift2, scale2, gate2 = self.adaLN_modulation(c).chunk(6, dim=-1)
        x = x + gate1 * self.attn(modulate(self.norm1(x), shift1, scale1))
        return x + gate2 * self.mlp(modulate(self.norm2(x), shift2, scale2))


class Transformer(nn.Module):
    def __init__(self, dim: int, depth: int, heads: int, dim_head: int, mlp_dim: int,
                 dropout: float):  # fmt: skip
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.layers = nn.ModuleList(
            ConditionalBlock(dim, heads, dim_head, mlp_dim, dropout) for _ in range(depth)
        )

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        for block in self.layers:
            x = block(x, c)
        return self.norm(x)


class Predictor(nn.Module):
    """Latents ``(B, T, D)`` and their action embeddings ``(B, T, D)`` -> the next latents."""

    def __init__(self, num_frames: int, dim: int, depth: int = 6, heads: int = 16,
                 dim_head: int = 64, mlp_dim: int = 2048, dropout: float = 0.1):  # fmt: skip
        super().__init__()
        self.num_frames = num_frames
        self.pos_embedding = nn.Parameter(torch.randn(1, num_frames, dim))
        self.transformer = Transformer(dim, depth, heads, dim_head, mlp_dim, dropout)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return self.transformer(x + self.pos_embedding[:, : x.shape[1]], c)


class Embedder(nn.Module):
    """An action block ``(B, T, A)`` -> ``(B, T, emb_dim)``: a 1x1 Conv1d, then an MLP."""

    def __init__(self, input_dim: int, emb_dim: int, smoothed_dim: int = 10, mlp_scale: int = 4):
        super().__init__()
        self.patch_embed = nn.Conv1d(input_dim, smoothed_dim, kernel_size=1)
        self.embed = nn.Sequential(
            nn.Linear(smoothed_dim, mlp_scale * emb_dim),
            nn.SiLU(),
            nn.Linear(mlp_scale * emb_dim, emb_dim),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.embed(self.patch_embed(x.float().transpose(1, 2)).transpose(1, 2))


class MLP(nn.Module):
    """Linear, norm, GELU, linear."""

    def __init__(self, input_dim: int, hidden_dim: int, output_dim: int, norm=nn.BatchNorm1d):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(input_dim, hidden_dim),
            norm(hidden_dim),
            nn.GELU(),
            nn.Linear(hidden_dim, output_dim),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _std_loss(z: torch.Tensor) -> torch.Tensor:
    """``z`` ``(B, T, D)``, centred: the hinge on each value's spread over the first axis."""
    std = (z.var(dim=0) + VAR_EPS).sqrt()
    return F.relu(1 - std).mean()


def _cov_loss(z: torch.Tensor) -> torch.Tensor:
    """``z`` ``(B, T, D)``, centred: the squared off-diagonal covariance over the first axis."""
    z = z.transpose(0, 1)
    cov = z.transpose(1, 2) @ z / (z.shape[1] - 1)  # (T, D, D)
    off = cov.pow(2).sum(dim=(-1, -2)) - cov.diagonal(dim1=-2, dim2=-1).pow(2).sum(-1)
    dim = z.shape[-1]
    return (off / (dim * dim - dim)).mean()


def vcreg(z: torch.Tensor) -> dict[str, torch.Tensor]:
    """stable-worldmodel's VCReg of latents ``(B, T, D)``: variance and covariance over the batch
    (``std``, ``cov``) and over time (``std_t``, ``cov_t``)."""
    z = z - z.mean(dim=0, keepdim=True)
    over_time = z.transpose(0, 1)
    return {"std": _std_loss(z), "std_t": _std_loss(over_time),
            "cov": _cov_loss(z), "cov_t": _cov_loss(over_time)}  # fmt: skip


class PLDM(nn.Module):
    """The world model (the module's docstring) under swm's protocol: ``encode`` the frames'
    latents, ``predict`` the next from latents and action blocks, ``loss`` pldm.yaml's."""

    def __init__(self, resolution: int, action_block: int, num_frames: int, dim: int = 192,
                 hidden: int = 2048, idm_hidden: int = 512):  # fmt: skip
        super().__init__()
        self.encoder = hf_vit("tiny", 14, resolution)
        self.predictor = Predictor(num_frames, dim)
        self.action_encoder = Embedder(action_block, dim)
        self.projector = MLP(self.encoder.hidden_size, hidden, dim)
        self.pred_proj = MLP(dim, hidden, dim)
        self.idm = MLP(2 * dim, idm_hidden, action_block, norm=nn.LayerNorm)
        self.context_len = num_frames

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 ``(..., H, W, 3)`` -> latents ``(..., 192)``: the projected CLS token."""
        cls = self.encoder(imagenet_frames(pixels))[:, 0]
        return self.projector(cls).reshape(*pixels.shape[:-3], -1)

    def predict(self, latents: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        actions = self.action_encoder(torch.nan_to_num(actions, nan=0.0))
        predicted = self.predictor(latents, actions.to(latents.dtype))
        return self.pred_proj(predicted.flatten(0, 1)).reshape(predicted.shape)

    def loss(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """pldm.py's: the first ``num_frames`` latents predict each next one."""
        actions = torch.nan_to_num(batch["action"], nan=0.0)
        latents = self.encode(batch["pixels"])  # (B, T, D)
        history = self.context_len
        predicted = self.predict(latents[:, :history], actions[:, :history])
        terms = {"pred": (predicted - latents[:, 1 : history + 1]).square().mean()}
        action_predicted = self.idm(torch.cat([latents[:, 1:], latents[:, :-1]], dim=-1))
        terms["idm"] = F.mse_loss(action_predicted, actions[:, :-1].to(action_predicted.dtype))
        terms["temp_align"] = F.mse_loss(latents[:, :-1], latents[:, 1:])
        terms |= vcreg(latents)
        total = terms["pred"] + sum(weight * terms[name] for name, weight in WEIGHTS.items())
        return {"loss": total, **terms}


def build(resolution: int, action_dim: int, frameskip: int, history_len: int) -> PLDM:
    """The factory (``model.factory = "swmcli.zoo.pldm:build"``): a clip of ``history_len``
    frames trains a predictor of ``history_len - 1`` frames (pldm.yaml: 3 and one prediction)."""
    return PLDM(resolution, frameskip * action_dim, max(history_len - 1, 1))
