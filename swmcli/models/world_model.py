"""The JEPA world model: encoder + causal action-conditioned predictor, trained end to end.

Pixels reach the model as uint8 ``(B, T, H, W, 3)`` on the device and are normalized there (so the
host and the transfer carry 1 byte per channel, not 4). Actions are the dense action blocks
``(B, T, frameskip * action_dim)``; the last observation of an episode has NaN actions, replaced
by 0 here because a NaN, even in a position the loss ignores, poisons every gradient.

``encode`` and ``predict`` are the world-model protocol (``interface.py``), which the runner
compiles in place for ``--compile`` as it does for any model brought with ``--model``.

With ``model.proprio``, the agent's own state (the data's ``proprio``) joins the latent: each of
its values standardized by the statistics of the data (a BatchNorm without affine parameters:
nothing to learn, nothing to collapse; stable-worldmodel standardizes it alike) and appended to
the frame's latent, so the predictor predicts it too and the planner's cost sees it
(``proprio_dims``, its trailing part, weighted by ``eval.proprio_weight``).

With ``model.reconstruction_weight``, a decoder (the encoder mirrored) draws each frame back from
its latent during training, so the latent must hold all the frame shows (Push-T's T as well
as the agent); planning never decodes.

With ``model.state_weight``, the latent's first values are the env's recorded state read from the
frame (``state.StateFeatures``: in its units, angles as cosine and sine), trained against the
data's ``state`` key, so the planner's distance over them is the success criterion's.
"""

import torch
from torch import nn

from swmcli.errors import UsageError
from swmcli.models.encoder import CNNDecoder, CNNEncoder, ViTEncoder
from swmcli.models.global_batch import GlobalBatchNorm1d
from swmcli.models.predictor import Predictor
from swmcli.models.state import StateFeatures

PIXEL_MEAN = 0.5
PIXEL_STD = 0.25


def normalize_pixels(pixels: torch.Tensor) -> torch.Tensor:
    """uint8 ``(..., H, W, 3)`` -> float ``(N, 3, H, W)`` roughly in [-2, 2], on its device."""
    frames = pixels.reshape(-1, *pixels.shape[-3:]).permute(0, 3, 1, 2)
    return (frames.float() / 255.0 - PIXEL_MEAN) / PIXEL_STD


class WorldModel(nn.Module):
    """Encoder and predictor: ``encode`` and ``predict``, the world-model protocol
    (``interface.py``); trained with swm's JEPA loss (``losses.jepa_loss``), like any model
    without a ``loss`` of its own."""

    def __init__(
        self,
        encoder: nn.Module,
        predictor: Predictor,
        proprio_dims: int = 0,
        decoder: nn.Module | None = None,
        state: StateFeatures | None = None,
    ):
        super().__init__()
        self.encoder = encoder
        self.predictor = predictor
        self.proprio_dims = proprio_dims
        if proprio_dims:
            self.proprio_norm = GlobalBatchNorm1d(proprio_dims, affine=False)
        if decoder is not None:
            self.decoder = decoder
        self.state_dims = 0 if state is None else state.size
        if state is not None:
            self.state = state

    def encode(self, pixels: torch.Tensor, proprio: torch.Tensor | None = None) -> torch.Tensor:
        """uint8 pixels ``(B, T, H, W, 3)`` (or ``(B, H, W, 3)``) -> latents ``(B, T, D)``; with
        ``model.proprio``, the agent's state ``(B, T, P)`` standardized and appended."""
        latents = self.encoder(normalize_pixels(pixels)).reshape(*pixels.shape[:-3], -1)
        if self.state_dims:
            read = self.state.unstandardize(latents[..., : self.state_dims])
            latents = torch.cat([read, latents[..., self.state_dims :]], dim=-1)
        if not self.proprio_dims:
            return latents
        if proprio is None:
            raise UsageError(
                "this model was trained with model.proprio and encodes no frame without the "
                "agent's state",
                hint="pass the observation's proprio (swmcli.models.rollout.encode_observation)",
            )
        flat = proprio.reshape(-1, self.proprio_dims).float()
        state = self.proprio_norm(flat).reshape(*proprio.shape[:-1], -1)
        return torch.cat([latents, state.to(latents.dtype)], dim=-1)

    def predict(self, latents: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Next latents ``(B, T, D)`` from latents and action blocks ``(B, T, A)``."""
        return self.predictor(latents, torch.nan_to_num(actions, nan=0.0))

    def reconstruction_error(self, latents: torch.Tensor, pixels: torch.Tensor) -> torch.Tensor:
        """MSE between the frames the decoder draws from the clips' last latents (``latents``
        ``(B, T, D)``, the agent's state included, so the image part need not repeat it) and
        their uint8 ``pixels`` ``(B, T, H, W, 3)``. One frame a clip: the encoder is the same for
        every frame, and drawing costs several times encoding."""
        drawn = self.decoder(latents[:, -1])
        return nn.functional.mse_loss(drawn.float(), normalize_pixels(pixels[:, -1]))

    def state_error(self, latents: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """MSE between the state the latents ``(B, T, D)`` read (their first values) and the
        recorded ``state`` ``(B, T, S)``, in the state's units (``model.state_units``)."""
        target = self.state(state)
        self.state.observe(target.reshape(-1, self.state_dims))
        read = latents[..., : self.state_dims]
        return nn.functional.mse_loss(read.float(), target)

    @property
    def context_len(self) -> int:
        """The longest history the predictor was trained on (rollouts cut to it)."""
        return self.predictor.max_len


def build_jepa(
    model_cfg,
    *,
    resolution: int,
    action_dim: int,
    frameskip: int,
    history_len: int,
    proprio_dim: int = 0,
    state_size: int = 0,
) -> WorldModel:
    """swm's JEPA world model as a ``ModelConfig`` describes it, for frames of ``resolution``
    pixels (``interface.build_model`` builds it, or ``model.factory``'s model).

    ``action_dim`` is the env's (2 for TwoRoom); each observation's action block has
    ``frameskip * action_dim`` values. A clip of ``history_len`` observations trains the
    predictor on contexts of up to ``history_len - 1`` (the last one is only a target), so that is
    its length, and ``history_len`` must be at least 2. ``proprio_dim`` is the size of the
    agent's state (``model.proprio``; 0 without it);
    ``state_size`` the values of the data's ``state`` (read with ``model.state_weight``).
    """
    if history_len < 2:
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
        model_cfg.latent_dim + proprio_dim,
        frameskip * action_dim,
        model_cfg.predictor_dim,
        model_cfg.predictor_depth,
        model_cfg.predictor_heads,
        max_len=history_len - 1,
    )
    decoder = None
    if model_cfg.reconstruction_weight > 0:
        if model_cfg.encoder != "cnn":
            raise UsageError(
                "model.reconstruction_weight draws frames with the CNN encoder's mirror, and "
                f"this model's encoder is {model_cfg.encoder}",
                hint="use --set model.encoder=cnn, or drop model.reconstruction_weight",
            )
        decoder = CNNDecoder(resolution, model_cfg.latent_dim + proprio_dim, model_cfg.cnn_width)
    state = None
    if model_cfg.state_weight > 0:
        state = StateFeatures(state_size, model_cfg.state_units, model_cfg.state_angles)
        if state.size > model_cfg.latent_dim:
            raise UsageError(
                f"model.state_weight reads {state.size} state values into the latent, and "
                f"model.latent_dim is {model_cfg.latent_dim}",
                hint=f"use --set model.latent_dim={state.size} or more",
            )
    return WorldModel(encoder, predictor, proprio_dim, decoder, state)
