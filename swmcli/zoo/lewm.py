"""LeWM as stable-worldmodel 0.1.1 builds it (``scripts/train/lewm.py`` with
``scripts/train/config/lewm.yaml``), module for module: preset ``lewm-224``.

Every parameter has upstream's name and shape, so a state dict moves between the two as it is
(``load_state_dict`` either way; ``swmcli.training.lewm_checkpoints`` reads and writes
upstream's checkpoint folders):

- ``encoder``: stable-pretraining's ``vit_hf`` (a HuggingFace ``ViTModel`` without pooler or
  mask token, under transformers 5's parameter names; ``lewm_checkpoints`` renames transformers
  4's): ViT-tiny, 12 layers of width 192, 3 heads, MLP 768, LayerNorm eps 1e-12; its CLS token
  is the frame's embedding.
- ``projector`` and ``pred_proj``: Linear -> BatchNorm1d -> GELU -> Linear, hidden width 2048.
- ``action_encoder``: a 1x1 Conv1d over the action block (``frameskip * action_dim`` values) to
  10, then Linear -> SiLU -> Linear to the embedding width.
- ``predictor``: a learned position per frame, then AdaLN-zero transformer blocks (the action
  embedding modulates each), causal attention of 16 heads x 64, MLP 2048, dropout 0.1.

Pixels are uint8 ``(..., H, W, 3)``, scaled to [0, 1], normalized with ImageNet's mean and std
and resized to ``image_size`` (bilinear, antialiased) as upstream's transform does. The loss is
upstream's: the MSE of the next embeddings predicted from the clip's first ``num_frames`` plus
``sigreg_weight`` times SIGReg over each time step's batch of embeddings.
"""

import torch
from torch import nn
from torch.nn import functional

from swmcli.errors import UsageError
from swmcli.models.global_batch import GlobalBatchNorm1d, gather_rows

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
VIT_SIZES = {"tiny": (192, 12, 3)}  # width, layers, heads (stable-pretraining's vit_hf)
ACTION_SMOOTHED = 10  # upstream's Embedder: the Conv1d's outputs
ACTION_MLP_SCALE = 4


class PatchEmbeddings(nn.Module):
    def __init__(self, patch: int, width: int):
        super().__init__()
        self.projection = nn.Conv2d(3, width, patch, stride=patch)


class Embeddings(nn.Module):
    """Patches, a CLS token in front, a learned position each."""

    def __init__(self, image_size: int, patch: int, width: int):
        super().__init__()
        patches = (image_size // patch) ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, width))
        self.position_embeddings = nn.Parameter(torch.zeros(1, patches + 1, width))
        self.patch_embeddings = PatchEmbeddings(patch, width)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        nn.init.trunc_normal_(self.position_embeddings, std=0.02)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        tokens = self.patch_embeddings.projection(frames).flatten(2).transpose(1, 2)
        cls = self.cls_token.expand(len(tokens), -1, -1).to(tokens.dtype)
        return torch.cat([cls, tokens], dim=1) + self.position_embeddings.to(tokens.dtype)


class SelfAttention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            nn.Linear(width, width) for _ in range(4)
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        def split(linear: nn.Linear) -> torch.Tensor:
            return linear(tokens).unflatten(-1, (self.heads, -1)).transpose(1, 2)

        mixed = functional.scaled_dot_product_attention(
            split(self.q_proj), split(self.k_proj), split(self.v_proj)
        )
        return self.o_proj(mixed.transpose(1, 2).flatten(2))


class ViTMLP(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.fc2(functional.gelu(self.fc1(tokens)))


class ViTLayer(nn.Module):
    """Pre-norm attention and MLP (exact GELU), each added back."""

    def __init__(self, width: int, heads: int, eps: float):
        super().__init__()
        self.attention = SelfAttention(width, heads)
        self.layernorm_before = nn.LayerNorm(width, eps=eps)
        self.layernorm_after = nn.LayerNorm(width, eps=eps)
        self.mlp = ViTMLP(width)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        tokens = tokens + self.attention(self.layernorm_before(tokens))
        return tokens + self.mlp(self.layernorm_after(tokens))


class ViT(nn.Module):
    """stable-pretraining's ``vit_hf``: frames ``(N, 3, S, S)`` -> CLS tokens ``(N, width)``."""

    def __init__(self, image_size: int, patch: int, width: int, depth: int, heads: int,
                 eps: float = 1e-12):  # fmt: skip
        super().__init__()
        self.embeddings = Embeddings(image_size, patch, width)
        self.layers = nn.ModuleList(ViTLayer(width, heads, eps) for _ in range(depth))
        self.layernorm = nn.LayerNorm(width, eps=eps)
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Conv2d):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        tokens = self.embeddings(frames)
        for layer in self.layers:
            tokens = layer(tokens)
        return self.layernorm(tokens)[:, 0]


class MLP(nn.Module):
    """Linear -> BatchNorm1d (the global batch's under data parallelism) -> GELU -> Linear."""

    def __init__(self, inputs: int, hidden: int, outputs: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(inputs, hidden),
            GlobalBatchNorm1d(hidden),
            nn.GELU(),
            nn.Linear(hidden, outputs),
        )

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return self.net(rows)


class ActionEmbedder(nn.Module):
    """Action blocks ``(B, T, A)`` -> ``(B, T, width)``: a 1x1 Conv1d, then an MLP (fp32)."""

    def __init__(self, inputs: int, width: int):
        super().__init__()
        self.patch_embed = nn.Conv1d(inputs, ACTION_SMOOTHED, kernel_size=1)
        self.embed = nn.Sequential(
            nn.Linear(ACTION_SMOOTHED, ACTION_MLP_SCALE * width),
            nn.SiLU(),
            nn.Linear(ACTION_MLP_SCALE * width, width),
        )

    def forward(self, actions: torch.Tensor) -> torch.Tensor:
        smoothed = self.patch_embed(actions.float().transpose(1, 2)).transpose(1, 2)
        return self.embed(smoothed)


class CausalAttention(nn.Module):
    def __init__(self, width: int, heads: int, head_dim: int, dropout: float):
        super().__init__()
        inner = heads * head_dim
        self.heads, self.dropout = heads, dropout
        self.norm = nn.LayerNorm(width)
        self.to_qkv = nn.Linear(width, 3 * inner, bias=False)
        projects = not (heads == 1 and head_dim == width)
        self.to_out = (
            nn.Sequential(nn.Linear(inner, width), nn.Dropout(dropout))
            if projects
            else nn.Identity()
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        qkv = self.to_qkv(self.norm(tokens)).chunk(3, dim=-1)
        q, k, v = (part.unflatten(-1, (self.heads, -1)).transpose(1, 2) for part in qkv)
        dropout = self.dropout if self.training else 0.0
        mixed = functional.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        return self.to_out(mixed.transpose(1, 2).flatten(2))


class FeedForward(nn.Module):
    def __init__(self, width: int, hidden: int, dropout: float):
        super().__init__()
        self.net = nn.Sequential(
            nn.LayerNorm(width),
            nn.Linear(width, hidden),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, width),
            nn.Dropout(dropout),
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.net(tokens)


class ConditionalBlock(nn.Module):
    """A transformer block whose norms the condition shifts, scales and gates (AdaLN-zero:
    the gates start at 0, so each block starts as the identity)."""

    def __init__(self, width: int, heads: int, head_dim: int, mlp: int, dropout: float):
        super().__init__()
        self.attn = CausalAttention(width, heads, head_dim, dropout)
        self.mlp = FeedForward(width, mlp, dropout)
        self.norm1 = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.norm2 = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 6 * width))
        nn.init.zeros_(self.adaLN_modulation[-1].weight)
        nn.init.zeros_(self.adaLN_modulation[-1].bias)

    def forward(self, tokens: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        modulation = self.adaLN_modulation(condition).chunk(6, dim=-1)
        shift_attn, scale_attn, gate_attn, shift_mlp, scale_mlp, gate_mlp = modulation
        attended = self.attn(self.norm1(tokens) * (1 + scale_attn) + shift_attn)
        tokens = tokens + gate_attn * attended
        return tokens + gate_mlp * self.mlp(self.norm2(tokens) * (1 + scale_mlp) + shift_mlp)


class Transformer(nn.Module):
    def __init__(self, width: int, depth: int, heads: int, head_dim: int, mlp: int,
                 dropout: float):  # fmt: skip
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.layers = nn.ModuleList(
            ConditionalBlock(width, heads, head_dim, mlp, dropout) for _ in range(depth)
        )

    def forward(self, tokens: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        for block in self.layers:
            tokens = block(tokens, condition)
        return self.norm(tokens)


class Predictor(nn.Module):
    """Embeddings ``(B, T, D)`` and action embeddings ``(B, T, D)``, ``T <= num_frames`` ->
    each position's next embedding ``(B, T, D)``."""

    def __init__(self, num_frames: int, width: int, depth: int, heads: int, head_dim: int,
                 mlp: int, dropout: float):  # fmt: skip
        super().__init__()
        self.num_frames = num_frames
        self.pos_embedding = nn.Parameter(torch.randn(1, num_frames, width))
        self.transformer = Transformer(width, depth, heads, head_dim, mlp, dropout)

    def forward(self, embeddings: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        positions = self.pos_embedding[:, : embeddings.shape[1]].to(embeddings.dtype)
        return self.transformer(embeddings + positions, actions)


def sigreg(embeddings: torch.Tensor, knots: int, projections: int) -> torch.Tensor:
    """stable-worldmodel's SIGReg of ``embeddings (T, B, D)``: for each time step, the
    Epps-Pulley statistic of the batch projected on ``projections`` random unit directions
    (torch's global generator) against N(0, 1), over ``knots`` points of [0, 3]; averaged."""
    embeddings = embeddings.float()
    directions = torch.randn(embeddings.shape[-1], projections, device=embeddings.device)
    directions = directions / directions.norm(p=2, dim=0)
    t = torch.linspace(0, 3, knots, device=embeddings.device)
    window = torch.exp(-t.square() / 2)
    weights = torch.full((knots,), 2 * 3 / (knots - 1), device=embeddings.device)
    weights[[0, -1]] = 3 / (knots - 1)
    angles = (embeddings @ directions).unsqueeze(-1) * t  # (T, B, projections, knots)
    error = (angles.cos().mean(-3) - window).square() + angles.sin().mean(-3).square()
    return ((error @ (weights * window)) * embeddings.shape[-2]).mean()


class LeWM(nn.Module):
    """The world model (the module's docstring): ``encode``, ``predict`` and ``loss``."""

    def __init__(self, image_size: int, encoder: ViT, width: int, hidden: int, action_inputs: int,
                 predictor: Predictor, sigreg_weight: float, sigreg_knots: int,
                 sigreg_projections: int):  # fmt: skip
        super().__init__()
        self.image_size = image_size
        self.encoder = encoder
        self.predictor = predictor
        self.action_encoder = ActionEmbedder(action_inputs, width)
        self.projector = MLP(encoder.layernorm.normalized_shape[0], hidden, width)
        self.pred_proj = MLP(width, hidden, width)
        self.sigreg = {"knots": sigreg_knots, "projections": sigreg_projections}
        self.sigreg_weight = sigreg_weight
        self.register_buffer("pixel_mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), False)
        self.register_buffer("pixel_std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), False)

    @property
    def context_len(self) -> int:
        return self.predictor.num_frames

    def frames(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 ``(..., H, W, 3)`` -> the encoder's input ``(N, 3, S, S)``."""
        frames = pixels.reshape(-1, *pixels.shape[-3:]).permute(0, 3, 1, 2).float() / 255
        frames = (frames - self.pixel_mean) / self.pixel_std
        if frames.shape[-2:] != (self.image_size, self.image_size):
            frames = functional.interpolate(
                frames, size=(self.image_size, self.image_size), mode="bilinear", antialias=True
            )
        return frames

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 pixels ``(..., H, W, 3)`` -> embeddings ``(..., D)``: the projected CLS token."""
        embeddings = self.projector(self.encoder(self.frames(pixels)))
        return embeddings.reshape(*pixels.shape[:-3], -1)

    def predict(self, latents: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Next embeddings ``(B, T, D)`` from embeddings and action blocks ``(B, T, A)``."""
        conditions = self.action_encoder(torch.nan_to_num(actions, nan=0.0))
        predicted = self.predictor(latents, conditions.to(latents.dtype))
        return self.pred_proj(predicted.flatten(0, 1)).reshape(predicted.shape)

    def loss(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Upstream's ``lejepa_forward``: prediction MSE over the clip's last ``T - num_frames``
        steps + ``sigreg_weight`` x SIGReg over the batch (every rank's under DDP)."""
        embeddings = self.encode(batch["pixels"])
        context = self.context_len
        predicted = self.predict(embeddings[:, :context], batch["action"][:, :context])
        target = embeddings[:, embeddings.shape[1] - context :]
        prediction = (predicted.float() - target.float()).pow(2).mean()
        spread = sigreg(gather_rows(embeddings).transpose(0, 1), **self.sigreg)
        total = prediction + self.sigreg_weight * spread
        return {"loss": total, "prediction": prediction.detach(), "sigreg": spread.detach()}


def build(
    action_dim: int,
    frameskip: int,
    history_len: int,
    image_size: int = 224,
    patch_size: int = 14,
    encoder_scale: str = "tiny",
    embed_dim: int = 192,
    vit: tuple[int, int, int] | None = None,
    hidden_dim: int = 2048,
    depth: int = 6,
    heads: int = 16,
    dim_head: int = 64,
    mlp_dim: int = 2048,
    dropout: float = 0.1,
    sigreg_weight: float = 0.09,
    sigreg_knots: int = 17,
    sigreg_projections: int = 1024,
) -> LeWM:
    """The factory (``model.factory = "swmcli.zoo.lewm:build"``), ``lewm.yaml``'s settings by
    default: clips of ``history_len`` observations train a predictor of ``history_len - 1``
    frames (upstream's ``history_size``, one predicted step); each action block is
    ``frameskip * action_dim`` values. ``vit`` (width, layers, heads) replaces
    ``encoder_scale``'s for a smaller encoder (the tests' tiny LeWM). Frames of any resolution
    are resized to ``image_size``."""
    if history_len < 2:
        raise UsageError(
            f"LeWM predicts from history_len - 1 frames, and history_len is {history_len}",
            hint="use --history-len 4 (upstream's history 3 and one predicted step)",
        )
    if vit is None and encoder_scale not in VIT_SIZES:
        raise UsageError(
            f"LeWM's encoder_scale {encoder_scale!r} is not one swm builds",
            hint=f"use one of {', '.join(VIT_SIZES)}, or model.kwargs.vit=[width, layers, heads]",
        )
    width, layers, vit_heads = vit or VIT_SIZES[encoder_scale]
    encoder = ViT(image_size, patch_size, width, layers, vit_heads)
    predictor = Predictor(history_len - 1, embed_dim, depth, heads, dim_head, mlp_dim, dropout)
    return LeWM(image_size, encoder, embed_dim, hidden_dim, frameskip * action_dim, predictor,
                sigreg_weight, sigreg_knots, sigreg_projections)  # fmt: skip
