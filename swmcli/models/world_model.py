"""The JEPA world model: encoder + causal action-conditioned predictor, trained end to end.

Pixels reach the model as uint8 ``(B, T, H, W, 3)`` on the device and are normalized there (so the
host and the transfer carry 1 byte per channel, not 4). Actions are the dense blocks
``(B, T, frameskip * action_dim)``; the last observation of an episode has NaN actions, replaced
by 0 here because a NaN, even in a position the loss ignores, poisons every gradient.

``encode`` and ``predict`` go through ``encoder_call`` / ``predictor_call``, which are the
modules themselves or their ``torch.compile`` wrappers (set by the runner). The wrappers are not
registered as submodules, so ``state_dict`` and saving always see the plain modules.
"""

from typing import Any

import torch
from torch import nn

from swmcli.models.encoder import CNNEncoder, ViTEncoder
from swmcli.models.global_batch import gather_rows
from swmcli.models.losses import REGULARIZERS, prediction_loss
from swmcli.models.predictor import Predictor

PIXEL_MEAN = 0.5
PIXEL_STD = 0.25


def normalize_pixels(pixels: torch.Tensor) -> torch.Tensor:
    """uint8 ``(..., H, W, 3)`` -> float ``(N, 3, H, W)`` roughly in [-2, 2], on its device."""
    frames = pixels.reshape(-1, *pixels.shape[-3:]).permute(0, 3, 1, 2)
    return (frames.float() / 255.0 - PIXEL_MEAN) / PIXEL_STD


def effective_rank(latents: torch.Tensor) -> torch.Tensor:
    """exp(entropy) of the normalized singular values of centred ``latents (N, D)``.

    D for a spread-out (isotropic) cloud, 1 when every latent lies on one line: a collapse
    measure that per-dimension normalization (the encoder's BatchNorm) cannot hide.
    """
    centred = latents.float() - latents.float().mean(0)
    singular = torch.linalg.svdvals(centred)
    weights = singular / singular.sum().clamp_min(1e-12)
    entropy = -(weights * weights.clamp_min(1e-12).log()).sum()
    return entropy.exp()


class WorldModel(nn.Module):
    """Encoder and predictor plus the loss; ``encode``/``predict``/``rollout`` for planning."""

    def __init__(
        self,
        encoder: nn.Module,
        predictor: Predictor,
        regularizer: str,
        weight: float,
        rollout_weight: float = 0.0,
    ):
        super().__init__()
        self.encoder = encoder
        self.predictor = predictor
        self.regularizer = REGULARIZERS[regularizer]
        self.regularizer_weight = weight
        self.rollout_weight = rollout_weight
        self.use_compiled(None, None)

    def use_compiled(self, encoder_call: Any, predictor_call: Any) -> None:
        """Route forward passes through compiled wrappers (None: the plain modules)."""
        # object.__setattr__ keeps the wrappers out of the module tree and the state_dict.
        plain_encoder = encoder_call is None
        plain_predictor = predictor_call is None
        object.__setattr__(self, "encoder_call", self.encoder if plain_encoder else encoder_call)
        object.__setattr__(
            self, "predictor_call", self.predictor if plain_predictor else predictor_call
        )

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 pixels ``(B, T, H, W, 3)`` (or ``(B, H, W, 3)``) -> latents ``(B, T, D)``."""
        latents = self.encoder_call(normalize_pixels(pixels))
        return latents.reshape(*pixels.shape[:-3], -1)

    def predict(self, latents: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Next latents ``(B, T, D)`` from latents and action blocks ``(B, T, A)``."""
        return self.predictor_call(latents, torch.nan_to_num(actions, nan=0.0))

    def loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Training loss of a device batch: MSE to the next latents + weight * regularizer.

        With ``rollout_weight`` > 0, plus that weight times the MSE of the predictor rolled out
        from the clip's first latent on its own predictions (the multi-step loss: planning
        imagines several blocks ahead, and teacher forcing alone never trains that).
        Returns the loss and its parts (detached) for logging: ``prediction``, ``regularizer``,
        ``rollout`` (when used) and ``latent_rank`` (effective rank of the batch's latents;
        near 1 = collapse).
        """
        latents = self.encode(batch["pixels"])
        actions = batch["action"][:, :-1].float()
        predicted = self.predict(latents[:, :-1], actions)
        prediction = prediction_loss(predicted, latents[:, 1:])
        # The regularizer is a statistic of the whole batch: every rank's latents under DDP.
        flat = gather_rows(latents.reshape(-1, latents.shape[-1]))
        regularizer = self.regularizer(flat)
        total = prediction + self.regularizer_weight * regularizer
        parts = {
            "prediction": prediction.detach(),
            "regularizer": regularizer.detach(),
            "latent_rank": effective_rank(flat.detach()),
        }
        if self.rollout_weight > 0:
            imagined = self.rollout(latents[:, :1], actions[:, :0], actions)
            rollout = prediction_loss(imagined, latents[:, 1:])
            total = total + self.rollout_weight * rollout
            parts["rollout"] = rollout.detach()
        return total, parts

    def forward(self, batch: dict[str, torch.Tensor]):
        """``loss(batch)``: what DistributedDataParallel calls (it syncs gradients of forward)."""
        return self.loss(batch)

    def rollout(
        self, history: torch.Tensor, past_actions: torch.Tensor, plans: torch.Tensor
    ) -> torch.Tensor:
        """Imagine the latents that action plans lead to, feeding predictions back in.

        ``history`` ``(B, K, D)``: latents of the last K observations; ``past_actions``
        ``(B, K-1, A)``: the blocks taken between them; ``plans`` ``(B, H, A)``: blocks to try.
        Returns the predicted latents ``(B, H, D)`` after each planned block. The context is cut
        to the predictor's trained length.
        """
        window = self.predictor.max_len
        latents, actions = history, past_actions
        predictions = []
        for step in range(plans.shape[1]):
            actions = torch.cat([actions, plans[:, step : step + 1]], dim=1)
            latents, actions = latents[:, -window:], actions[:, -window:]
            following = self.predict(latents, actions)[:, -1:]
            predictions.append(following)
            latents = torch.cat([latents, following], dim=1)
        return torch.cat(predictions, dim=1)


def build_world_model(
    model_cfg, *, resolution: int, action_dim: int, frameskip: int, history_len: int
) -> WorldModel:
    """The world model a ``ModelConfig`` describes, for frames of ``resolution`` pixels.

    ``action_dim`` is the env's (2 for TwoRoom); each observation's action block has
    ``frameskip * action_dim`` values. A clip of ``history_len`` observations trains the
    predictor on contexts of up to ``history_len - 1`` (the last one is only a target), so that is
    its length, and ``history_len`` must be at least 2.
    """
    if history_len < 2:
        from swmcli.errors import UsageError

        raise UsageError(
            f"history_len {history_len} leaves no next observation to predict",
            hint="use --history-len 2 or more (4 is usual)",
        )
    if model_cfg.encoder == "vit":
        encoder = ViTEncoder(
            resolution,
            model_cfg.latent_dim,
            model_cfg.vit_patch,
            model_cfg.vit_dim,
            model_cfg.vit_depth,
            model_cfg.vit_heads,
        )
    else:
        encoder = CNNEncoder(resolution, model_cfg.latent_dim, model_cfg.cnn_width)
    predictor = Predictor(
        model_cfg.latent_dim,
        frameskip * action_dim,
        model_cfg.predictor_dim,
        model_cfg.predictor_depth,
        model_cfg.predictor_heads,
        max_len=history_len - 1,
    )
    return WorldModel(
        encoder,
        predictor,
        model_cfg.regularizer,
        model_cfg.regularizer_weight,
        model_cfg.rollout_weight,
    )
