"""What a world model's methods give back, checked where swm calls them: one line naming the
model, its file and the method when it is not what the protocol says (docs/bring-your-model.md).

Shapes are checked on every call: that reads no value, costs nothing, and works on the fake
tensors memprofile traces. Values are looked at only once a training step has failed or its loss
is not finite (``faults_named``, ``check_finite``): the method that first turns finite inputs into
NaN or infinity is then named, instead of the error it caused deeper in swm's loss.
"""

import inspect
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch.utils import _pytree

from swmcli.errors import SwmError, UsageError, shown_path

DOCS = "see docs/bring-your-model.md for the protocol"


def model_name(model) -> str:
    """``ClassName (file.py)`` of a model, for messages."""
    kind = type(model)
    try:
        return f"{kind.__name__} ({shown_path(inspect.getfile(kind))})"
    except (TypeError, OSError):
        return kind.__name__


def _shape(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def encode_checked(model, pixels: torch.Tensor, proprio: torch.Tensor | None = None):
    """``model.encode(pixels)`` (``model.encode(pixels, proprio)`` with the agent's state):
    latents ``(*lead, D)`` for pixels ``(*lead, H, W, 3)``."""
    latents = model.encode(pixels) if proprio is None else model.encode(pixels, proprio)
    _check_latents(model, latents, pixels)
    return latents


def observe_checked(model, pixels, proprio, state, action):
    """A recurrent model's ``encode(pixels[, proprio], state=state, action=action)``: the
    latents of frames ``(B, H, W, 3)`` reached by action blocks ``(B, A)`` from ``state``, and
    the state after them."""
    arguments = (pixels,) if proprio is None else (pixels, proprio)
    arguments, state, action = _packed((arguments, state, action))
    latents, state = _pair(model, "encode", model.encode(*arguments, state=state, action=action))
    _check_latents(model, latents, pixels)
    return latents, state


def _check_latents(model, latents, pixels: torch.Tensor) -> None:
    lead = tuple(pixels.shape[:-3])
    if (
        not isinstance(latents, torch.Tensor)
        or tuple(latents.shape[:-1]) != lead
        or (latents.dim() != len(lead) + 1)
    ):
        raise UsageError(
            f"model {model_name(model)}: encode(pixels of shape {tuple(pixels.shape)}) returned "
            f"{_shape(latents)}, not latents of shape {(*lead, 'D')}",
            hint=DOCS,
        )


def predict_checked(model, latents: torch.Tensor, actions: torch.Tensor, state=None):
    """``model.predict(latents, actions)``: next latents of the shape of ``latents``. With a
    recurrent model's ``state`` (the state at the first latent), ``predict(latents, actions,
    state=state)``: the next latents and the state after the last one."""
    if state is None:
        following = model.predict(latents, actions)
    else:
        latents, actions, state = _packed((latents, actions, state))
        following, state = _pair(model, "predict", model.predict(latents, actions, state=state))
    if not isinstance(following, torch.Tensor) or following.shape != latents.shape:
        raise UsageError(
            f"model {model_name(model)}: predict(latents of shape {tuple(latents.shape)}, actions "
            f"of shape {tuple(actions.shape)}) returned {_shape(following)}, not next latents of "
            f"shape {tuple(latents.shape)}",
            hint=DOCS,
        )
    return following if state is None else (following, state)


def _packed(arguments):
    """Every tensor of a recurrent model's call laid out as a fresh one: a compiled method then
    sees one layout per shape, whichever slice of a clip, plan or state it is given (its guards
    hold strides and storage offsets)."""
    return _pytree.tree_map_only(torch.Tensor, _row_major, arguments)


def _row_major(value: torch.Tensor) -> torch.Tensor:
    """``value``, or its copy where its strides or offset are not a fresh tensor's."""
    strides, step = [], 1
    for size in reversed(value.shape):
        strides.append(step)
        step *= size
    if value.storage_offset() == 0 and value.stride() == tuple(reversed(strides)):
        return value
    return value.clone(memory_format=torch.contiguous_format)


def _pair(model, method: str, returned) -> tuple:
    """What a recurrent model's ``method`` returned when given a state: (output, state)."""
    if not isinstance(returned, tuple) or len(returned) != 2:
        raise UsageError(
            f"model {model_name(model)} has initial_state, and its {method}(..., state=...) "
            f"returned {_shape(returned)}, not a pair (output, new state)",
            hint=f"return both from {method} when it is given a state ({DOCS})",
        )
    return returned


def loss_checked(model, terms) -> dict:
    """``model.loss(batch)``'s terms: a dict whose ``loss`` is a scalar tensor to minimize."""
    loss = terms.get("loss") if isinstance(terms, dict) else None
    if not isinstance(loss, torch.Tensor):
        raise UsageError(
            f"model {model_name(model)}: loss(batch) returned {_shape(terms)} without a tensor "
            "'loss' entry",
            hint='return {"loss": scalar tensor, ...other scalars to log}',
        )
    if loss.dim() != 0:
        raise UsageError(
            f"model {model_name(model)}: loss(batch)['loss'] is {_shape(loss)}, not a scalar",
            hint="reduce it to one number (e.g. .mean()) before returning it",
        )
    if torch.is_grad_enabled() and not loss.requires_grad:
        raise UsageError(
            f"model {model_name(model)}: loss(batch)['loss'] does not depend on any trainable "
            "parameter (it needs no gradient)",
            hint="compute it from the model's outputs, without .detach() or torch.no_grad()",
        )
    return terms


def check_trainable(model) -> None:
    """Refuse, before any step, a model with nothing for the optimizer to train."""
    parameters = list(model.parameters())
    if not any(p.requires_grad for p in parameters):
        what = "has no parameters" if not parameters else "has only frozen parameters"
        raise UsageError(
            f"model {model_name(model)} {what}: there is nothing to train",
            hint="give it parameters that require gradients (a frozen encoder is fine, as long "
            "as something else learns)",
        )


@contextmanager
def faults_named(model, optimizer, batch: Callable[[], dict], first: bool) -> Iterator[None]:
    """Around a training step: an error it raises becomes one line naming the model's method
    that gave NaN or infinity from finite inputs, when one did (``batch()`` gives the step's
    device batch again); any other error goes on as it was. On the ``first`` step of a run,
    gradients that are not finite are refused before the optimizer applies them (one value
    read back, once), so the method is found while the weights are still those it was given; a
    later step's NaN shows in its loss (``check_finite``)."""

    def refuse_nonfinite(*_) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"]]
        grads = [g for g in grads if g is not None]
        if grads and not bool(torch.stack([torch.isfinite(g).all() for g in grads]).all()):
            raise FloatingPointError("the first step's gradients are not finite")

    # An optimizer stepped inside backward (one per parameter) has no step to hook: its NaN
    # shows in the loss.
    register = getattr(optimizer, "register_step_pre_hook", None)
    handle = register(refuse_nonfinite) if first and register is not None else None
    try:
        yield
    except Exception as error:
        named = _nonfinite_method(model, batch)
        if named is None:
            raise
        raise named from error
    finally:
        if handle is not None:
            handle.remove()


def check_finite(loss: float, step: int, model, batch: Callable[[], dict]) -> None:
    """Stop training at a loss that is NaN or infinite: one line naming the model's method that
    made it, else saying the training diverged."""
    if math.isfinite(loss):
        return
    named = _nonfinite_method(model, batch)
    if named is not None:
        raise named
    raise SwmError(
        f"the loss is {loss} at step {step}: training diverged and was stopped",
        hint="lower the learning rate (--set train.lr=...) or train in fp32; the last "
        "checkpoint is kept",
    )


def _nonfinite_method(model, batch: Callable[[], dict]) -> UsageError | None:
    """Which of encode, predict, loss turns finite inputs into NaN or infinity on this batch
    (None when the weights themselves are no longer finite: a diverged run, not a method)."""
    try:
        if not all(bool(torch.isfinite(p).all()) for p in model.parameters()):
            return None
        with torch.no_grad():
            values = batch()
            pixels, actions = values["pixels"], values["action"][:, :-1].float()
            latents = model.encode(pixels)
            if not bool(torch.isfinite(latents).all()):
                return _nonfinite(model, "encode", "pixels")
            following = model.predict(latents[:, :-1], torch.nan_to_num(actions))
            if not bool(torch.isfinite(following).all()):
                return _nonfinite(model, "predict", "latents and actions")
            own = getattr(model, "loss", None)
            if own is not None and not bool(torch.isfinite(own(values)["loss"]).all()):
                return _nonfinite(model, "loss", "encode's and predict's outputs")
    except Exception:
        return None  # the step's own error says more
    return None


def _nonfinite(model, method: str, inputs: str) -> UsageError:
    return UsageError(
        f"model {model_name(model)}: {method} returned NaN or infinite values from finite {inputs}",
        hint=f"check {method} for a division by zero, a log of 0 or an overflow ({DOCS})",
    )
