"""The memory techniques a training step switches on past precision: each trades time or a
feature for bytes, each one switch (``runtime`` settings).

- **Activation checkpointing** (``runtime.activation_checkpointing``): the chosen modules keep
  only their inputs in forward and run again in backward (PyTorch's non-reentrant
  ``torch.utils.checkpoint`` through ``checkpoint_wrapper``). Saves most activations of those
  modules; costs about one more forward of them per step (~20-30% more compute for transformer
  layers). ``layers`` picks every child of every ``nn.ModuleList`` (the repeated layers of a
  transformer: swm's ViT and predictor layers), or name module classes
  (``TransformerEncoderLayer,Conv2d``). Weights are saved without the wrapper's prefix.
- **Optimizer step in backward** (``runtime.optimizer_in_backward``): each parameter is updated by
  its own AdamW as soon as its gradient is complete (``register_post_accumulate_grad_hook``) and
  its gradient is freed at once, so the step never holds every gradient. Same updates as an
  unclipped step; costs gradient clipping (the global norm is known only once every parameter
  is updated: a run asking for both is refused, ``train.grad_clip=0`` switches clipping off)
  and gradient accumulation, and runs in one process (data-parallel averaging happens after the
  hooks). The gradient norm it reports is the true one: each gradient's norm is taken before it
  is freed.
- **Fully sharded data parallel** (``runtime.shard``, under torchrun): PyTorch's own FSDP2
  ``fully_shard`` on each layer, then on the whole model; every rank keeps ``1/ranks`` of the
  parameters, gradients and AdamW state and all-gathers one layer's weights at a time. Same
  losses as one process on the global batch; costs an all-gather per layer in forward and in
  backward and a reduce-scatter of its gradients. Checkpoints hold the full (unsharded) state
  (``training_state``, ``restore_optimizer``).

``check_combination`` refuses, before any work, techniques that cannot go together with the
other settings. ``recipe`` switches them on for the model a run trains; ``swm memprofile``
predicts each (``memory.predict``, ``memory.fitting``).
"""

from typing import Any

import torch
from torch import nn

from swmcli.errors import UsageError

LAYERS = "layers"


def comma_names(text: str) -> list[str]:
    """The names of a comma-separated setting (``"encoder, proprio_norm"``), blanks dropped."""
    return [name.strip() for name in text.split(",") if name.strip()]


def layers(model: nn.Module) -> list[nn.Module]:
    """The repeated layers of ``model``: every child of every ``nn.ModuleList`` that runs (a list
    held in a list, as DINO-WM's ``[attention, feed_forward]`` per layer, gives its children)."""
    lists = [module for module in model.modules() if isinstance(module, nn.ModuleList)]
    return [child for module_list in lists for child in module_list
            if not isinstance(child, nn.ModuleList)]  # fmt: skip


def checkpointed_modules(model: nn.Module, choice: str) -> set[nn.Module]:
    """The modules of ``model`` that ``choice`` names: ``layers`` or class names, comma-separated.

    Nested picks are dropped (a module inside another picked one is recomputed with it).
    """
    if choice == LAYERS:
        picked = set(layers(model))
    else:
        names = set(comma_names(choice))
        picked = {module for module in model.modules() if type(module).__name__ in names}
        present = {type(module).__name__ for module in model.modules()}
        if missing := sorted(names - present):
            raise UsageError(
                f"--activation-checkpointing {choice!r}: the model has no {', '.join(missing)}",
                hint=f"use {LAYERS!r} or module classes it has, e.g. "
                f"{', '.join(sorted(present)[:6])}",
            )
    if not picked:
        raise UsageError(
            f"--activation-checkpointing {choice}: the model has no module to checkpoint",
            hint="name module classes instead, e.g. --activation-checkpointing Linear",
        )
    inner = {child for module in picked for child in module.modules() if child is not module}
    return picked - inner


def checkpoint_activations(model: nn.Module, choice: str) -> int:
    """Wrap the modules ``choice`` names so that backward recomputes their activations; returns
    how many were wrapped."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
    )

    picked = checkpointed_modules(model, choice)
    apply_activation_checkpointing(model, check_fn=lambda module: module in picked)
    return len(picked)


class InBackwardOptimizer:
    """One AdamW per parameter, stepped by a hook as the parameter's gradient is complete.

    Looks like the optimizer training drives: ``param_groups`` (the learning-rate schedule sets
    each), ``state`` (memory accounting), ``state_dict``/``load_state_dict`` (checkpoints);
    ``zero_grad`` starts a new step and ``step`` has nothing left to do. ``grad_norm`` is the
    step's global gradient norm, from each gradient's norm taken before it was freed.
    """

    def __init__(self, model: nn.Module, make_one):
        self.optimizers: dict[nn.Parameter, torch.optim.Optimizer] = {}
        self._hooks = []
        self._norms: list[torch.Tensor] = []
        for parameter in model.parameters():
            if parameter.requires_grad:
                self.optimizers[parameter] = make_one([parameter])
                self._hooks.append(parameter.register_post_accumulate_grad_hook(self._step))

    def _step(self, parameter: nn.Parameter) -> None:
        self._norms.append(torch.linalg.vector_norm(parameter.grad.detach()))
        self.optimizers[parameter].step()
        parameter.grad = None  # the point: no gradient outlives its update

    def grad_norm(self) -> torch.Tensor:
        """The 2-norm of every gradient of this step together (as ``clip_grad_norm_`` takes it)."""
        if not self._norms:
            return torch.zeros(())
        return torch.linalg.vector_norm(torch.stack(self._norms))

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [group for opt in self.optimizers.values() for group in opt.param_groups]

    @property
    def state(self) -> dict:
        return {p: s for opt in self.optimizers.values() for p, s in opt.state.items()}

    def zero_grad(self, set_to_none: bool = True) -> None:
        """A new step: no gradient to free (each went with its update), the norms to forget."""
        self._norms.clear()

    def step(self) -> None:
        """Nothing to do: every parameter was updated in backward."""

    def state_dict(self) -> dict[str, Any]:
        return {"in_backward": [opt.state_dict() for opt in self.optimizers.values()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state.get("in_backward")
        if saved is None or len(saved) != len(self.optimizers):
            raise UsageError(
                "the checkpoint's optimizer state was saved without --optimizer-in-backward",
                hint="resume with the run's saved settings (runtime.optimizer_in_backward)",
            )
        for optimizer, one in zip(self.optimizers.values(), saved, strict=True):
            optimizer.load_state_dict(one)


def check_combination(cfg, ranks: int | None = None) -> None:
    """Refuse, before any work, techniques that cannot go together with the other settings;
    ``ranks``: the data-parallel processes (torchrun's, else ``runtime.nproc``)."""
    ranks = ranks or cfg.runtime.nproc
    if cfg.runtime.shard and ranks == 1:
        raise UsageError(
            "--shard splits the model over data-parallel ranks and this run has one",
            hint="add --nproc 2 (or run under torchrun --nproc-per-node N), or drop --shard",
        )
    if cfg.runtime.optimizer_in_backward:
        if cfg.train.grad_clip > 0:
            raise UsageError(
                "--optimizer-in-backward updates each parameter as its gradient is complete, "
                "before the global gradient norm exists: it cannot clip it "
                f"(train.grad_clip is {cfg.train.grad_clip:g})",
                hint="switch clipping off with --grad-clip 0 (--set train.grad_clip=0), or drop "
                "--optimizer-in-backward",
            )
        if cfg.train.grad_accum > 1:
            raise UsageError(
                "--optimizer-in-backward updates each parameter as its gradient is complete: "
                "there is no accumulated gradient to step on",
                hint="drop --optimizer-in-backward or set train.grad_accum=1",
            )
        if ranks > 1:
            raise UsageError(
                "--optimizer-in-backward updates before data-parallel ranks average the gradients",
                hint="drop --optimizer-in-backward, or use --shard across ranks",
            )


def shard(objective: nn.Module, device: torch.device) -> nn.Module:
    """``objective`` fully sharded over every rank (FSDP2): each layer, then the whole; returns
    it (``fully_shard`` works in place). Make the optimizer after this: it must see the shards."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in layers(objective):
        fully_shard(layer, mesh=mesh)
    return fully_shard(objective, mesh=mesh)


def training_state(model: nn.Module, net: nn.Module, optimizer, sharded: bool):
    """The model's and the optimizer's state to checkpoint, whole: ``(model_state,
    optimizer_state)``. ``net`` is what the step runs (the sharded ``Objective`` when
    ``sharded``: then this is a collective on every rank, the shards gathered to rank 0's CPU)."""
    if not sharded:
        return model.state_dict(), optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state, optimizer_state = get_state_dict(net, optimizer, options=options)
    prefix = "model."  # the checkpoint holds the model's own keys, as an unsharded run's does
    return {key.removeprefix(prefix): value for key, value in model_state.items()}, optimizer_state


def restore_optimizer(net: nn.Module, optimizer, state: dict, sharded: bool) -> None:
    """Load a checkpoint's (whole) optimizer state into ``optimizer``; ``net`` is the sharded
    ``Objective`` when ``sharded``."""
    if not sharded:
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True)
    set_optimizer_state_dict(net, optimizer, state, options=options)
