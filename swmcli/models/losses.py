"""The JEPA loss: MSE to the next latents plus an anti-collapse regularizer on the latents.

Without a regularizer the encoder can map every frame to one point and the prediction error drops
to zero (collapse). Two regularizers are offered:

- ``sigreg`` (default, LeWM / LeJEPA's Sketched Isotropic Gaussian Regularizer): projects the
  latents on random unit directions and, for each, measures with the Epps-Pulley statistic how far
  the empirical characteristic function is from a standard normal's. It pushes the latent
  distribution towards an isotropic Gaussian, has one weight and no per-term tuning, and its cost
  is linear in batch size — why LeWM trains end to end with it and no EMA target or stop-gradient.
- ``vicreg``: a variance hinge (std of each dimension >= 1) plus a covariance penalty (off-diagonal
  terms to 0): cheaper to read, quadratic in latent_dim, two terms to balance.
"""

import torch

from swmcli.models.global_batch import gather_rows
from swmcli.models.outputs import predict_checked
from swmcli.models.rollout import encode_observation, is_recurrent, observe_clip, rollout

SIGREG_SLICES = 256  # random directions per step
SIGREG_KNOTS = 17  # quadrature points t in [0, SIGREG_T_MAX] for the characteristic function
SIGREG_T_MAX = 3.0


def sigreg(latents: torch.Tensor, slices: int = SIGREG_SLICES) -> torch.Tensor:
    """Epps-Pulley distance of ``latents (N, D)`` from N(0, I), averaged over random 1-D slices.

    The directions come from torch's global generator, which training seeds and checkpoints, so a
    resumed run draws the same ones.
    """
    latents = latents.float()
    count, dim = latents.shape
    directions = torch.randn(dim, slices, device=latents.device)
    directions = directions / directions.norm(dim=0, keepdim=True)
    projected = latents @ directions  # (N, slices)
    t = torch.linspace(0.0, SIGREG_T_MAX, SIGREG_KNOTS, device=latents.device)
    angles = projected.unsqueeze(-1) * t  # (N, slices, knots)
    gaussian = torch.exp(-0.5 * t**2)  # characteristic function of N(0, 1), also the window
    real_error = (angles.cos().mean(0) - gaussian) ** 2
    imag_error = angles.sin().mean(0) ** 2
    # Trapezoid weights over [0, t_max]; the integrand is even in t, hence the factor 2.
    weights = torch.full_like(t, SIGREG_T_MAX / (SIGREG_KNOTS - 1))
    weights[[0, -1]] /= 2
    statistic = 2 * ((real_error + imag_error) * gaussian * weights).sum(-1) * count
    return statistic.mean()


def vicreg(latents: torch.Tensor) -> torch.Tensor:
    """Variance hinge plus off-diagonal covariance of ``latents (N, D)`` (VICReg, no invariance)."""
    latents = latents.float()
    centred = latents - latents.mean(0)
    std = torch.sqrt(centred.var(0) + 1e-4)
    variance = torch.relu(1.0 - std).mean()
    covariance = (centred.T @ centred) / (len(latents) - 1)
    off_diagonal = covariance - torch.diag(torch.diagonal(covariance))
    return 25.0 * variance + off_diagonal.pow(2).sum() / latents.shape[1]


REGULARIZERS = {"sigreg": sigreg, "vicreg": vicreg}


def prediction_loss(predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error between predicted and actual next latents (in float32)."""
    return torch.nn.functional.mse_loss(predicted.float(), target.float())


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


def _regularize(model, flat: torch.Tensor, regularizer: str) -> torch.Tensor:
    """The regularizer over the latents ``(N, D)``; with a state readout, over the image's other
    values only (the state read has the spread of the recorded state, the agent's state that of
    its data), 0 where none are left."""
    state_dims = getattr(model, "state_dims", 0)
    if state_dims:
        flat = flat[:, state_dims : flat.shape[1] - getattr(model, "proprio_dims", 0)]
        if not flat.shape[1]:
            return flat.new_zeros(())
    return REGULARIZERS[regularizer](flat)


def jepa_loss(
    model,
    batch: dict[str, torch.Tensor],
    regularizer: str,
    weight: float,
    rollout_weight: float,
    reconstruction_weight: float = 0.0,
    state_weight: float = 0.0,
) -> dict[str, torch.Tensor]:
    """swm's training loss for any protocol model: MSE to the next latents + weight * regularizer.

    With ``rollout_weight`` > 0, plus that weight times the MSE of the predictor rolled out
    from the clip's first latent on its own predictions (the multi-step loss: planning
    imagines several blocks ahead, and teacher forcing alone never trains that). With
    ``reconstruction_weight`` > 0, plus that weight times the error of the frames drawn back
    from their latents (swm's model's decoder). With ``state_weight`` > 0, plus that weight times
    the error of the state the latents read (swm's model's ``state_error``); the regularizer then
    spreads only the rest of the latent (the state has a spread of its own). A recurrent model
    (``initial_state``) encodes the clip with its state carried from frame to frame and predicts
    and rolls out from the state at the first frame.
    Returns ``loss`` (minimized) and its parts (detached) for logging: ``prediction``,
    ``regularizer``, ``rollout``, ``reconstruction`` and ``state`` (when used), and
    ``latent_rank``
    (effective rank of the batch's latents; near 1 = collapse).
    """
    actions = batch["action"][:, :-1].float()
    if is_recurrent(model):  # each frame seen after the blocks before it; the state carried
        latents, state = observe_clip(model, batch)
        predicted, _ = predict_checked(model, latents[:, :-1], actions, state)
    else:
        latents, state = encode_observation(model, batch), None
        predicted = predict_checked(model, latents[:, :-1], actions)
    prediction = prediction_loss(predicted, latents[:, 1:])
    # The regularizer is a statistic of the whole batch: every rank's latents under DDP.
    flat = gather_rows(latents.reshape(-1, latents.shape[-1]))
    spread = _regularize(model, flat, regularizer)
    total = prediction + weight * spread
    terms = {
        "prediction": prediction.detach(),
        "regularizer": spread.detach(),
        "latent_rank": effective_rank(flat.detach()),
    }
    if rollout_weight > 0:
        imagined = rollout(model, latents[:, :1], actions[:, :0], actions, state)
        multi_step = prediction_loss(imagined, latents[:, 1:])
        total = total + rollout_weight * multi_step
        terms["rollout"] = multi_step.detach()
    if reconstruction_weight > 0:
        drawn = model.reconstruction_error(latents, batch["pixels"])
        total = total + reconstruction_weight * drawn
        terms["reconstruction"] = drawn.detach()
    if state_weight > 0:
        read = model.state_error(latents, batch["state"])
        total = total + state_weight * read
        terms["state"] = read.detach()
    return {"loss": total, **terms}
