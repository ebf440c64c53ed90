"""The world-model protocol every command uses: swm's own JEPA model and any model you bring.

A world model is any ``torch.nn.Module`` with two methods (stable-worldmodel's ``Dynamics`` in
spirit)::

    encode(pixels)            uint8 (B, T, H, W, 3) or (B, H, W, 3) -> latents (B, T, D) / (B, D)
    predict(latents, actions) latents (B, T, D), action blocks (B, T, A) -> next latents (B, T, D)

``predict``'s position ``t`` is the latent after observation ``t`` and its action block
(``A = frameskip * action_dim``; an episode's last block is NaN, read it as 0). Optional:

    loss(batch) -> dict       {"loss": scalar to minimize, other scalars to log}; replaces swm's
                              JEPA loss (``losses.jepa_loss``) when present. ``batch`` holds
                              ``pixels`` uint8 (B, T, H, W, 3) and ``action`` (B, T, A).
    context_len               the longest history ``predict`` takes; rollouts cut to it.
    encode(pixels, proprio)   with ``model.proprio``: the agent's state (B, T, P) as well,
                              its part of the latent the last ``proprio_dims`` values.
    initial_state(batch_size) a recurrent model's state before a first frame; swm then carries
                              it: ``encode(pixels, state=, action=)`` and ``predict(latents,
                              actions, state=)`` return ``(output, state after)`` (``rollout``:
                              one ``predict`` step per planned block).

Training calls the loss through ``Objective`` (the module DDP and FSDP wrap), planning and eval
call ``encode`` and ``rollout`` (below, built on ``predict``), memprofile traces the same step.
``build_model`` makes swm's model (``model.factory`` unset) or calls ``model.factory``
("module:function" or "path/to/file.py:function") with ``model.kwargs`` plus whichever of
``resolution``, ``action_dim``, ``frameskip``, ``history_len`` (and ``proprio_dim``, with
``model.proprio``) its signature names.
"""

import importlib
import importlib.util
import inspect
import math
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from swmcli.config import SwmConfig
from swmcli.errors import UsageError, remember_user_file
from swmcli.models.losses import jepa_loss
from swmcli.models.outputs import check_trainable, loss_checked
from swmcli.models.world_model import build_jepa

REQUIRED_METHODS = {
    "encode": "encode(pixels) -> latents",
    "predict": "predict(latents, actions) -> next latents",
}
DOCS = "see docs/bring-your-model.md for the protocol"


def load_factory(spec: str):
    """The callable ``spec`` names: ``package.module:function`` or ``path/to/file.py:function``."""
    source, _, name = spec.rpartition(":")
    if not source or not name:
        raise UsageError(
            f"--model {spec!r} is not module:function or file.py:function",
            hint="e.g. --model my_models.mlp:build or --model models/mine.py:build",
        )
    module = _import_file(Path(source)) if source.endswith(".py") else _import_module(source)
    factory = getattr(module, name, None)
    if not callable(factory):
        raise UsageError(
            f"--model {spec!r}: {source} has no function {name!r}",
            hint=f"define {name}(**kwargs) returning the model there, or name another function",
        )
    return factory


def _import_module(name: str):
    try:
        spec = importlib.util.find_spec(name)
        remember_user_file(spec.origin if spec else None)  # a failing import is theirs too
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        raise UsageError(
            f"--model: cannot import {name!r} ({error})",
            hint="install the package, put it on PYTHONPATH, or pass a path to its .py file",
        ) from error


def _import_file(path: Path):
    if not path.is_file():
        raise UsageError(f"--model: {path} does not exist", hint="check the path to the .py file")
    # A stable name per file, so every rank, the fake-tensor tracer and copies see one module.
    name = "swm_model_" + "_".join(path.resolve().with_suffix("").parts[1:])
    if name not in sys.modules:
        remember_user_file(str(path))
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


def portable_factory(spec: str | None) -> str | None:
    """``spec`` with a file factory's path made absolute: a run's saved config then finds the
    model from any directory (``swm eval RUN_DIR``)."""
    source, _, name = (spec or "").rpartition(":")
    if not source.endswith(".py"):
        return spec
    return f"{Path(source).resolve()}:{name}"


def build_model(model_cfg, shape: dict[str, int]) -> nn.Module:
    """The world model ``model_cfg`` names, for clips of ``shape`` (resolution, action_dim,
    frameskip, history_len): swm's own, or what ``model_cfg.factory`` returns; checked against
    the protocol."""
    if model_cfg.factory is None:
        return build_jepa(model_cfg, **shape)
    factory = load_factory(model_cfg.factory)
    parameters = inspect.signature(factory).parameters
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    offered = {key: value for key, value in shape.items() if takes_all or key in parameters}
    arguments = {**offered, **model_cfg.kwargs}
    try:
        inspect.signature(factory).bind(**arguments)
    except TypeError as error:
        raise UsageError(
            f"--model {model_cfg.factory}: {factory.__name__}() cannot be called with "
            f"{sorted(arguments)}: {error}",
            hint="give model.kwargs only the arguments it takes (--set model.kwargs.NAME=...); "
            "swm offers resolution, action_dim, frameskip and history_len to those that name them",
        ) from None
    model = factory(**arguments)
    check_protocol(model, model_cfg.factory)
    check_trainable(model)
    return model


def check_protocol(model: Any, name: str) -> None:
    """One line naming what ``model`` lacks to be a world model swm can train and plan with."""
    if not isinstance(model, nn.Module):
        raise UsageError(
            f"model {name} returned {type(model).__name__}, not a torch.nn.Module", hint=DOCS
        )
    for method, signature in REQUIRED_METHODS.items():
        if not callable(getattr(model, method, None)):
            raise UsageError(f"model {name} has no method {signature}", hint=DOCS)


class Objective(nn.Module):
    """What training minimizes: ``model.loss(batch)`` when the model has one, else swm's JEPA
    loss on its ``encode``/``predict``. The module data-parallel wrappers wrap (their hooks run on
    ``forward``); the model inside is the one saved."""

    def __init__(self, model: nn.Module, model_cfg):
        super().__init__()
        self.model = model
        self.jepa = {
            "regularizer": model_cfg.regularizer,
            "weight": model_cfg.regularizer_weight,
            "rollout_weight": model_cfg.rollout_weight,
            "reconstruction_weight": model_cfg.reconstruction_weight,
            "state_weight": model_cfg.state_weight,
        }
        # swm's loss terms that call a method of swm's own model (a model with a loss skips them)
        own_loss = getattr(model, "loss", None) is not None
        for setting, method, what in (
            ("reconstruction_weight", "reconstruction_error(latents, pixels)", "a decoder"),
            ("state_weight", "state_error(latents, state)", "a readout of the recorded state"),
        ):
            wanted = getattr(model_cfg, setting) > 0 and not own_loss
            if wanted and not callable(getattr(model, method.partition("(")[0], None)):
                raise UsageError(
                    f"model.{setting} trains {what} that swm's own model has, and "
                    f"{type(model).__name__} has no {method}",
                    hint=f"drop model.{setting}, or give your model a loss of its own "
                    "(docs/bring-your-model.md)",
                )

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The loss terms of a device batch; ``loss`` is the one minimized."""
        own_loss = getattr(self.model, "loss", None)
        if own_loss is None:
            return jepa_loss(self.model, batch, **self.jepa)
        return loss_checked(self.model, own_loss(batch))


def model_args(cfg: SwmConfig, metadata: dict[str, Any]) -> dict[str, int]:
    """The clip shape ``build_model`` takes, for this config and dataset (with
    ``model.proprio``, also ``proprio_dim``: the size of the data's ``proprio`` key; with
    ``model.state_weight``, ``state_size``: its ``state`` key's)."""
    args = {
        "resolution": int(metadata["resolution"]),
        "action_dim": int(metadata["action_dim"]),
        "frameskip": cfg.data.frameskip,
        "history_len": cfg.data.history_len,
    }
    if cfg.model.proprio:
        args["proprio_dim"] = _key_size(
            cfg,
            metadata,
            "proprio",
            "model.proprio",
            "feeds the agent's state to the model",
            "collect it again with this swm (gym-pusht and swm/PushT-v1 record proprio)",
        )
    if cfg.model.state_weight > 0:
        args["state_size"] = _key_size(
            cfg,
            metadata,
            "state",
            "model.state_weight",
            "trains the latent to read the env's recorded state",
            "collect from an env whose observation holds its state (swm/TwoRoom-v0, gym-pusht)",
        )
    return args


def _key_size(
    cfg: SwmConfig, metadata: dict[str, Any], key: str, setting: str, why: str, hint: str
) -> int:
    """Values per row of the data's ``key``, which ``setting`` reads; one line when it has none."""
    keys = metadata.get("keys") or {}
    if key not in keys:
        raise UsageError(
            f"{setting} {why}, and {cfg.data.path} records no '{key}' (its keys: "
            f"{', '.join(keys) or 'unknown'})",
            hint=f"{hint}, or drop {setting}",
        )
    return int(math.prod(keys[key][1]))
