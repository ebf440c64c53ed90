"""The image encoders of the published world models in Hugging Face transformers 5's module
layout (its parameter names and shapes: a state dict of its ``ViTModel`` or ``Dinov2Model``
loads as it is), built from their settings with random weights, drawn as transformers draws them
(weights and embeddings from a normal of std 0.02, truncated at +-2, biases 0): nothing is
downloaded.

- ``hf_vit``: ``ViTModel`` without its pooler or mask token, as stable-pretraining's ``vit_hf``
  builds it (PLDM's and LeWM's encoder: ViT-tiny, patch 14 at 224 px; LeWM's may be another size).
- ``dinov2_small``: ``Dinov2Model`` in ``facebook/dinov2-small``'s settings (DINO-WM's frozen
  encoder): LayerScale, a mask token, position embeddings for 518 px, interpolated to the
  frame's patch grid on every call as ``interpolate_pos_encoding`` does.

``ImageEncoder.forward`` takes frames ``(N, 3, H, W)`` (ImageNet-normalized, ``imagenet_frames``)
and returns the last hidden state ``(N, 1 + patches, dim)``, the CLS token first.
"""

import torch
import torch.nn.functional as F
from torch import nn

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def imagenet_frames(pixels: torch.Tensor) -> torch.Tensor:
    """uint8 frames ``(..., H, W, 3)`` -> float ``(N, 3, H, W)``, ImageNet-normalized (the
    published models' ``ToImage`` transform)."""
    frames = pixels.reshape(-1, *pixels.shape[-3:]).permute(0, 3, 1, 2).float() / 255
    mean = frames.new_tensor(IMAGENET_MEAN)[:, None, None]
    std = frames.new_tensor(IMAGENET_STD)[:, None, None]
    return (frames - mean) / std


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        q, k, v = (
            projection(tokens).unflatten(-1, (self.heads, -1)).transpose(1, 2)
            for projection in (self.q_proj, self.k_proj, self.v_proj)
        )
        return self.o_proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2))


class Mlp(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(tokens)))


class ViTLayer(nn.Module):
    """transformers' ``ViTLayer``: pre-norm attention and MLP, each added back."""

    def __init__(self, dim: int, heads: int, eps: float):
        super().__init__()
        self.attention = Attention(dim, heads)
        self.layernorm_before = nn.LayerNorm(dim, eps=eps)
        self.layernorm_after = nn.LayerNorm(dim, eps=eps)
        self.mlp = Mlp(dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        tokens = tokens + self.attention(self.layernorm_before(tokens))
        return tokens + self.mlp(self.layernorm_after(tokens))


class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.lambda1 = nn.Parameter(torch.ones(dim))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens * self.lambda1


class Dinov2Layer(nn.Module):
    """transformers' ``Dinov2Layer``: pre-norm attention and MLP, each scaled (LayerScale)."""

    def __init__(self, dim: int, heads: int, eps: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attention = Attention(dim, heads)
        self.layer_scale1 = LayerScale(dim)
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = Mlp(dim)
        self.layer_scale2 = LayerScale(dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        tokens = tokens + self.layer_scale1(self.attention(self.norm1(tokens)))
        return tokens + self.layer_scale2(self.mlp(self.norm2(tokens)))


class PatchEmbeddings(nn.Module):
    def __init__(self, dim: int, patch: int):
        super().__init__()
        self.projection = nn.Conv2d(3, dim, patch, stride=patch)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.projection(frames).flatten(2).transpose(1, 2)


class Embeddings(nn.Module):
    """The CLS token, the patches and their position embeddings (made for ``image_size``,
    interpolated bicubically where the frame's patch grid differs)."""

    def __init__(self, dim: int, patch: int, image_size: int, mask_token: bool):
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        if mask_token:
            self.mask_token = nn.Parameter(torch.zeros(1, dim))
        self.patch_embeddings = PatchEmbeddings(dim, patch)
        grid = image_size // patch
        self.position_embeddings = nn.Parameter(torch.zeros(1, grid * grid + 1, dim))
        self.grid = grid
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        nn.init.trunc_normal_(self.position_embeddings, std=0.02)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        patches = self.patch_embeddings(frames)
        tokens = torch.cat([self.cls_token.expand(len(patches), -1, -1), patches], dim=1)
        return tokens + self.positions(*frames.shape[-2:])  # float32, as transformers adds them

    def positions(self, height: int, width: int) -> torch.Tensor:
        patch = self.patch_embeddings.projection.kernel_size[0]
        height, width = height // patch, width // patch
        if (height, width) == (self.grid, self.grid):
            return self.position_embeddings
        cls, grid = self.position_embeddings[:, :1], self.position_embeddings[:, 1:]
        grid = grid.reshape(1, self.grid, self.grid, -1).permute(0, 3, 1, 2).float()
        grid = F.interpolate(grid, size=(height, width), mode="bicubic", align_corners=False)
        return torch.cat([cls, grid.to(cls.dtype).permute(0, 2, 3, 1).flatten(1, 2)], dim=1)


class Encoder(nn.Module):
    """transformers' ``Dinov2Encoder``: the layers, as ``layer``."""

    def __init__(self, layers: list[nn.Module]):
        super().__init__()
        self.layer = nn.ModuleList(layers)


class ImageEncoder(nn.Module):
    """transformers' ``ViTModel`` (its layers as ``layers``) or ``Dinov2Model`` (as
    ``encoder.layer``): embeddings, the layers, a final LayerNorm."""

    def __init__(self, layer, dim: int, depth: int, heads: int, patch: int, image_size: int,
                 eps: float, dinov2: bool):  # fmt: skip
        super().__init__()
        self.embeddings = Embeddings(dim, patch, image_size, mask_token=dinov2)
        layers = [layer(dim, heads, eps) for _ in range(depth)]
        if dinov2:
            self.encoder = Encoder(layers)
        else:
            self.layers = nn.ModuleList(layers)
        self.layernorm = nn.LayerNorm(dim, eps=eps)
        self.hidden_size, self.dinov2 = dim, dinov2
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Conv2d):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        """Frames ``(N, 3, H, W)`` -> the last hidden state ``(N, 1 + patches, dim)``."""
        tokens = self.embeddings(frames)
        for layer in self.encoder.layer if self.dinov2 else self.layers:
            tokens = layer(tokens)
        return self.layernorm(tokens)


VIT_SIZES = {"tiny": (192, 12, 3), "small": (384, 12, 6), "base": (768, 12, 12)}


def hf_vit(size: str | tuple[int, int, int] = "tiny", patch_size: int = 14,
           image_size: int = 224) -> ImageEncoder:  # fmt: skip
    """stable-pretraining's ``vit_hf(size, patch_size, image_size, pretrained=False,
    use_mask_token=False)``: ``ViTModel`` without a pooler (LayerNorm eps 1e-12). ``size`` is
    one of ``VIT_SIZES`` or its (width, layers, heads)."""
    dim, depth, heads = VIT_SIZES[size] if isinstance(size, str) else size
    return ImageEncoder(ViTLayer, dim, depth, heads, patch_size, image_size, 1e-12, False)


def dinov2_small() -> ImageEncoder:
    """``Dinov2Model`` in ``facebook/dinov2-small``'s settings (384 wide, 12 layers of 6 heads,
    patch 14, made for 518 px, LayerNorm eps 1e-6), random weights."""
    return ImageEncoder(Dinov2Layer, 384, 12, 6, 14, 518, 1e-6, True)
