"""The pieces stable-worldmodel 0.1.1's JEPAs share, LeWM's (``lewm.py``) and PLDM's
(``pldm.py``), under upstream's parameter names and shapes; their encoder is ``hf_vision``'s
``hf_vit``.

- ``MLP``: Linear -> norm (BatchNorm1d unless told) -> GELU -> Linear: the ``projector``,
  ``pred_proj`` (hidden width 2048) and PLDM's ``idm`` (LayerNorm).
- ``ActionEmbedder``: upstream's ``Embedder``, a 1x1 Conv1d over the action block
  (``frameskip * action_dim`` values) to 10, then Linear -> SiLU -> Linear to the embedding width.
- ``Predictor``: a learned position per frame, then AdaLN-zero transformer blocks (the action
  embedding shifts, scales and gates each), causal attention, by default ``lewm.yaml``'s and
  ``pldm.yaml``'s 6 blocks of 16 heads x 64, MLP 2048, dropout 0.1; its blocks' ``FeedForward``
  is also DINO-WM's (``dino_wm.py``).

As upstream, the fp32 positions are added as they are: under autocast the residual stream of the
predictor stays in fp32.
"""

import torch
from torch import nn
from torch.nn import functional

ACTION_SMOOTHED = 10  # upstream's Embedder: the Conv1d's outputs
ACTION_MLP_SCALE = 4


class MLP(nn.Module):
    """Linear -> ``norm`` -> GELU -> Linear."""

    def __init__(self, inputs: int, hidden: int, outputs: int, norm=nn.BatchNorm1d):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(inputs, hidden),
            norm(hidden),
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

    def __init__(self, num_frames: int, width: int, depth: int = 6, heads: int = 16,
                 head_dim: int = 64, mlp: int = 2048, dropout: float = 0.1):  # fmt: skip
        super().__init__()
        self.num_frames = num_frames
        self.pos_embedding = nn.Parameter(torch.randn(1, num_frames, width))
        self.transformer = Transformer(width, depth, heads, head_dim, mlp, dropout)

    def forward(self, embeddings: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.transformer(embeddings + self.pos_embedding[:, : embeddings.shape[1]], actions)
