"""The recipe of a run: the model it trains and the optimizer that trains it, as ``swm train``
builds them; ``swm memprofile`` traces the same parts (``build_model``, ``freeze_parts``, the
techniques, ``make_optimizer``) for every variant it predicts.

``model_to_train`` is the world model (``models.interface.build_model``: swm's JEPA or
``model.factory``'s), seeded by ``train.seed``, its ``train.freeze`` parts frozen and its memory
techniques switched on (``techniques``); ``net_to_train`` is what a step runs, the model's
``Objective`` whole, data-parallel (DDP) or sharded (FSDP2); ``make_optimizer`` is AdamW, or one
AdamW per parameter stepped in backward.

A frozen part (``train.freeze``) saves memory too: its weights get no gradient and no AdamW
state, and autograd keeps no activation for it when nothing before it is trained.
"""

from typing import Any

import torch
from torch import nn

from swmcli.config import SwmConfig
from swmcli.errors import UsageError
from swmcli.models.interface import Objective, build_model, model_args
from swmcli.training import distributed
from swmcli.training.techniques import (
    InBackwardOptimizer,
    checkpoint_activations,
    comma_names,
    shard,
)


def model_to_train(cfg: SwmConfig, metadata: dict[str, Any]) -> nn.Module:
    """The world model for this config and dataset (swm's or ``model.factory``'s, seeded by
    ``train.seed``), its ``train.freeze`` parts frozen, its memory techniques on."""
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, model_args(cfg, metadata))
    if cfg.train.freeze:
        freeze_parts(model, cfg.train.freeze)
    if cfg.runtime.activation_checkpointing:
        checkpoint_activations(model, cfg.runtime.activation_checkpointing)
    return model


def net_to_train(model: nn.Module, cfg: SwmConfig, world, device: torch.device) -> nn.Module:
    """What a training step runs: ``model``'s ``Objective``, fully sharded over the ranks with
    ``runtime.shard``, else under DDP when there are several (the objective itself in one)."""
    objective = Objective(model, cfg.model)
    if cfg.runtime.shard:
        return shard(objective, device)
    return distributed.wrap(objective, world, device)


#: torch's AdamW arguments for each ``train.optimizer_impl``: set on every device (torch's own
#: default differs by device), so ``swm memprofile`` traces the very optimizer training runs.
OPTIMIZER_IMPLS = {
    "foreach": {"foreach": True},
    "for-loop": {"foreach": False},
    "fused": {"fused": True},
}


def make_optimizer(model: nn.Module, train_cfg, in_backward: bool = False):
    """AdamW in the implementation ``train_cfg.optimizer_impl`` names (foreach by default, the
    update CUDA uses by default), on every device alike; with ``in_backward`` one per parameter,
    stepped in backward (``InBackwardOptimizer``)."""
    impl = OPTIMIZER_IMPLS[train_cfg.optimizer_impl]

    def adamw(parameters):
        return torch.optim.AdamW(
            parameters, lr=train_cfg.lr, weight_decay=train_cfg.weight_decay, **impl
        )

    return InBackwardOptimizer(model, adamw) if in_backward else adamw(model.parameters())


def freeze_parts(model: nn.Module, names: str) -> None:
    """Leave the modules ``names`` (their names in ``model``, comma-separated: ``encoder``,
    ``proprio_norm``) as they are through training: no gradient for their weights, and eval
    mode on every call whatever the model's mode (a BatchNorm's statistics stay as loaded)."""
    parts = dict(model.named_modules())
    wanted = comma_names(names)
    if missing := [name for name in wanted if name not in parts]:
        children = ", ".join(name for name, _ in model.named_children())
        raise UsageError(
            f"train.freeze names {', '.join(missing)}, which this model does not have",
            hint=f"its parts: {children}",
        )
    for name in wanted:
        parts[name].requires_grad_(False)
        parts[name].register_forward_pre_hook(_run_in_eval_mode)
    if not any(parameter.requires_grad for parameter in model.parameters()):
        raise UsageError(
            f"train.freeze={names} leaves nothing of the model to train",
            hint="freeze fewer parts (e.g. --freeze encoder)",
        )


def _run_in_eval_mode(module: nn.Module, _inputs) -> None:
    module.eval()
