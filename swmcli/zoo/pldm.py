"""PLDM as stable-worldmodel 0.1.1 trains it (``scripts/train/pldm.py`` with
``scripts/train/config/pldm.yaml``; preset ``pldm-224``), module for module: parameter names and
shapes are upstream's ``PLDM`` plus the inverse-dynamics head its training script trains beside it
(``idm``).

LeWM's modules (``lewm.py``), shared in ``jepa.py``, with another loss:

- ``encoder``: ViT-tiny at 224 px, patch 14 (stable-pretraining's ``vit_hf``, ``hf_vision``'s
  ``hf_vit``), its CLS token;
- ``projector``: ``jepa.MLP`` of hidden width 2048 with BatchNorm1d (each rank's batch under data
  parallelism, as upstream: so is VCReg's), the CLS token -> the latent (192);
- ``action_encoder``: ``jepa.ActionEmbedder``, a 1x1 Conv1d over the action block
  (frameskip x action_dim), then an MLP to 192;
- ``predictor``: ``jepa.Predictor``, 6 AdaLN-zero transformer blocks (16 heads of 64, MLP 2048,
  dropout 0.1) over the history's latents, conditioned on their action embeddings, causal in time;
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
from swmcli.zoo.jepa import MLP, ActionEmbedder, Predictor

WEIGHTS = {"temp_align": 0.2, "std": 18.0, "std_t": 0.7, "cov": 12.0, "cov_t": 0.0, "idm": 0.0}
VAR_EPS = 1e-4


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
        self.action_encoder = ActionEmbedder(action_block, dim)
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
