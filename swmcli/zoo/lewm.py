"""LeWM as stable-worldmodel 0.1.1 builds it (``scripts/train/lewm.py`` with
``scripts/train/config/lewm.yaml``), module for module: preset ``lewm-224``.

Every parameter has upstream's name and shape, so a state dict moves between the two as it is
(``load_state_dict`` either way; ``swmcli.training.lewm_checkpoints`` reads and writes
upstream's checkpoint folders):

- ``encoder``: stable-pretraining's ``vit_hf`` (``hf_vision.hf_vit``: a HuggingFace ``ViTModel``
  without pooler or mask token, under transformers 5's parameter names; ``lewm_checkpoints``
  renames transformers 4's): ViT-tiny, 12 layers of width 192, 3 heads, MLP 768, LayerNorm eps
  1e-12; its CLS token is the frame's embedding.
- ``projector`` and ``pred_proj``: ``jepa.MLP``, Linear -> BatchNorm1d (the global batch's under
  data parallelism) -> GELU -> Linear, hidden width 2048.
- ``action_encoder``: ``jepa.ActionEmbedder``, a 1x1 Conv1d over the action block
  (``frameskip * action_dim`` values) to 10, then Linear -> SiLU -> Linear to the embedding width.
- ``predictor``: ``jepa.Predictor``, a learned position per frame, then AdaLN-zero transformer
  blocks (the action embedding modulates each), causal attention of 16 heads x 64, MLP 2048,
  dropout 0.1.

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
from swmcli.zoo.hf_vision import VIT_SIZES, ImageEncoder, hf_vit, imagenet_frames
from swmcli.zoo.jepa import MLP, ActionEmbedder, Predictor


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

    def __init__(self, image_size: int, encoder: ImageEncoder, width: int, hidden: int,
                 action_inputs: int, predictor: Predictor, sigreg_weight: float,
                 sigreg_knots: int, sigreg_projections: int):  # fmt: skip
        super().__init__()
        self.image_size = image_size
        self.encoder = encoder
        self.predictor = predictor
        self.action_encoder = ActionEmbedder(action_inputs, width)
        self.projector = MLP(encoder.hidden_size, hidden, width, norm=GlobalBatchNorm1d)
        self.pred_proj = MLP(width, hidden, width, norm=GlobalBatchNorm1d)
        self.sigreg = {"knots": sigreg_knots, "projections": sigreg_projections}
        self.sigreg_weight = sigreg_weight

    @property
    def context_len(self) -> int:
        return self.predictor.num_frames

    def frames(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 ``(..., H, W, 3)`` -> the encoder's input ``(N, 3, S, S)``."""
        frames = imagenet_frames(pixels)
        if frames.shape[-2:] != (self.image_size, self.image_size):
            frames = functional.interpolate(
                frames, size=(self.image_size, self.image_size), mode="bilinear", antialias=True
            )
        return frames

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 pixels ``(..., H, W, 3)`` -> embeddings ``(..., D)``: the projected CLS token."""
        embeddings = self.projector(self.encoder(self.frames(pixels))[:, 0])
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
    encoder = hf_vit(tuple(vit) if vit else encoder_scale, patch_size, image_size)
    predictor = Predictor(history_len - 1, embed_dim, depth, heads, dim_head, mlp_dim, dropout)
    return LeWM(image_size, encoder, embed_dim, hidden_dim, frameskip * action_dim, predictor,
                sigreg_weight, sigreg_knots, sigreg_projections)  # fmt: skip
