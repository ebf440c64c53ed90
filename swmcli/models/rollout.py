"""The predictor rolled out: latents imagined from a history and action plans, fed back in;
and observations encoded, with the agent's state where the model takes it.

What planning scores (``planning.planners``) and what the multi-step loss trains
(``models.losses``); any protocol model rolls out the same way. A recurrent model (one with
``initial_state``, docs/bring-your-model.md) rolls out from the state it carries: one
``predict`` call of one position per planned block, H model steps for H blocks. A stateless model
is given the whole imagined sequence again at every block (cut to its ``context_len``).
"""

import torch
from torch.utils import _pytree

from swmcli.models.outputs import encode_checked, observe_checked, predict_checked


def encode_observation(model, observation: dict[str, torch.Tensor]) -> torch.Tensor:
    """``model.encode`` of an observation's (or a batch's) ``pixels``, with its ``proprio``
    when it holds one (read only for models trained with ``model.proprio``)."""
    return encode_checked(model, observation["pixels"], observation.get("proprio"))


def is_recurrent(model) -> bool:
    """Whether ``model`` keeps a state that swm carries between calls (it has ``initial_state``)."""
    return callable(getattr(model, "initial_state", None))


def repeat_state(state, count: int):
    """A state of batch 1 for ``count`` rows (each tensor repeated along its first dim; copies,
    not stride-0 views, so a compiled ``predict`` sees one layout for every call)."""
    return _pytree.tree_map_only(
        torch.Tensor, lambda value: value.expand(count, *value.shape[1:]).contiguous(), state
    )


def observe(model, observation: dict[str, torch.Tensor], state, action: torch.Tensor):
    """A recurrent model's latent of one frame per row (``pixels`` ``(B, H, W, 3)``, with its
    ``proprio``) reached from ``state`` by the action block ``action`` ``(B, A)``; and the
    state after it."""
    action = torch.nan_to_num(action.float())
    return observe_checked(model, observation["pixels"], observation.get("proprio"), state, action)


def observe_clip(model, batch: dict[str, torch.Tensor]):
    """A recurrent model's latents ``(B, T, D)`` of a clip's frames, each seen after the blocks
    before it (the filtered posterior), and the state at the first frame."""
    count, steps = batch["pixels"].shape[:2]
    state = model.initial_state(count)
    action = torch.zeros_like(batch["action"][:, 0], dtype=torch.float32)
    latents, first_state = [], None
    for step in range(steps):
        frame = {key: batch[key][:, step] for key in ("pixels", "proprio") if key in batch}
        latent, state = observe(model, frame, state, action)
        first_state = state if first_state is None else first_state
        latents.append(latent)
        action = batch["action"][:, step]
    return torch.stack(latents, dim=1), first_state


def rollout(
    model, history: torch.Tensor, past_actions: torch.Tensor, plans: torch.Tensor, state=None
):
    """Imagine the latents that action plans lead to, feeding predictions back in.

    ``history`` ``(B, K, D)``: latents of the last K observations; ``past_actions``
    ``(B, K-1, A)``: the blocks taken between them; ``plans`` ``(B, H, A)``: blocks to try.
    Returns the predicted latents ``(B, H, D)`` after each planned block. The context is cut to
    the model's ``context_len`` when it has one. With a recurrent model's ``state`` (its state at
    the last latent of ``history``, which holds the rest), the state is carried instead: one
    position per call, no context to cut.
    """
    if state is not None:
        return _carried(model, history[:, -1:], plans, state)
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


def _carried(model, latent: torch.Tensor, plans: torch.Tensor, state) -> torch.Tensor:
    predictions = []
    for step in range(plans.shape[1]):
        latent, state = predict_checked(model, latent, plans[:, step : step + 1], state)
        predictions.append(latent)
    return torch.cat(predictions, dim=1)
