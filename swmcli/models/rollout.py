"""The predictor rolled out: latents imagined from a history and action plans, fed back in;
and observations encoded, with the agent's state where the model takes it.

What planning scores (``planning.planners``) and what the multi-step loss trains
(``models.losses``); any protocol model rolls out the same way.
"""

import torch

from swmcli.models.outputs import encode_checked, predict_checked


def encode_observation(model, observation: dict[str, torch.Tensor]) -> torch.Tensor:
    """``model.encode`` of an observation's (or a batch's) ``pixels``, with its ``proprio``
    when it holds one (read only for models trained with ``model.proprio``)."""
    return encode_checked(model, observation["pixels"], observation.get("proprio"))


def rollout(model, history: torch.Tensor, past_actions: torch.Tensor, plans: torch.Tensor):
    """Imagine the latents that action plans lead to, feeding predictions back in.

    ``history`` ``(B, K, D)``: latents of the last K observations; ``past_actions``
    ``(B, K-1, A)``: the blocks taken between them; ``plans`` ``(B, H, A)``: blocks to try.
    Returns the predicted latents ``(B, H, D)`` after each planned block. The context is cut to
    the model's ``context_len`` when it has one.
    """
    window = getattr(model, "context_len", None) or None
    latents, actions = history, past_actions
    predictions = []
    for step in range(plans.shape[1]):
        actions = torch.cat([actions, plans[:, step : step + 1]], dim=1)
        if window is not None:
            latents, actions = latents[:, -window:], actions[:, -window:]
        following = predict_checked(model, latents, actions)[:, -1:]
        predictions.append(following)
        latents = torch.cat([latents, following], dim=1)
    return torch.cat(predictions, dim=1)
