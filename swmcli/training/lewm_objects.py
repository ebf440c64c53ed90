"""stable-worldmodel's object checkpoint (``NAME_object.ckpt``: ``torch.save`` of the trained
module, which its ``AutoCostModel`` unpickles) read without stable-worldmodel, transformers or
Lightning, and without running any of their code.

The pickle is read with an unpickler that builds tensors (torch's own rebuild functions) and
plain containers, and turns every other class into a ``Held`` record of its pickled state: a
module's ``_parameters``, ``_buffers``, ``_modules`` and attributes. The LeWM is the record of
class ``LeWM``; its state dict is gathered from the records, its factory's keywords from the
attributes its modules keep (the ViT's config, the predictor's sizes).
"""

import _compat_pickle
import pickle
from collections import OrderedDict
from pathlib import Path
from typing import Any, ClassVar

from swmcli.errors import CheckpointError

# What the unpickler builds for real: torch's tensor and storage rebuilding, plain containers.
TRUSTED = {
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("torch._utils", "_rebuild_tensor_v2"),
    ("torch._utils", "_rebuild_parameter"),
    ("torch._utils", "_rebuild_parameter_with_state"),
    ("torch", "Size"),
    ("torch", "device"),
    ("torch.serialization", "_get_layout"),
}


class Held:
    """An object of a class not built here: its class's name and its pickled state."""

    args: tuple = ()
    state: ClassVar[dict] = {}  # an instance's own replaces it (__setstate__); never changed

    def __init__(self, *args, **kwargs):
        self.args, self.state = args, {}

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2:  # (dict, slots)
            state = {**(state[0] or {}), **(state[1] or {})}
        self.state = state if isinstance(state, dict) else {"value": state}

    def __call__(self, *args, **kwargs) -> "Held":  # a class's __reduce__ callable
        return type(self)(*args, **kwargs)


def _held_class(module: str, name: str) -> type:
    return type(name, (Held,), {"origin": f"{module}.{name}"})


class Unpickler(pickle.Unpickler):
    """Builds what ``TRUSTED`` names and torch's storages; holds everything else."""

    def find_class(self, module: str, name: str):
        # protocol 2 (torch.save's) names Python 2's modules: __builtin__ for builtins
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        if (module, name) in TRUSTED or (module == "torch" and name.endswith("Storage")):
            return super().find_class(module, name)
        if module == "torch" and name in _DTYPE_NAMES:
            return super().find_class(module, name)
        return _held_class(module, name)


_DTYPE_NAMES = {"float32", "float16", "bfloat16", "float64", "int64", "int32", "uint8", "bool"}


class _PickleModule:
    """What ``torch.load(pickle_module=...)`` takes: this module's unpickler, pickle's rest."""

    Unpickler = Unpickler
    load = staticmethod(pickle.load)
    __name__ = "swm_lewm_objects"


def read_object_checkpoint(path: Path) -> tuple[dict, int, int, dict]:
    """What the LeWM an object checkpoint holds is made of: its factory keywords, the action
    embedder's inputs, the predictor's frames and its state dict (under the names it was saved
    with; ``lewm_checkpoints`` reads them as a model)."""
    import torch

    try:
        root = torch.load(path, map_location="cpu", weights_only=False, pickle_module=_PickleModule)
    except Exception as error:
        raise CheckpointError(
            f"{path} is not an object checkpoint swm reads ({type(error).__name__}: {error})",
            hint="pass the folder stable-worldmodel's save_pretrained writes (weights.pt + "
            "config.json)",
        ) from error
    lewm = _find(root, "LeWM")
    if lewm is None:
        raise CheckpointError(
            f"{path} holds no stable-worldmodel LeWM module",
            hint="swm reads LeWM's object checkpoints; for another model, export its weights",
        )
    weights = _state_dict(lewm)
    try:
        kwargs, action_inputs, num_frames = _architecture(lewm)
    except (KeyError, AttributeError, TypeError) as error:
        raise CheckpointError(
            f"{path}: its LeWM lacks a setting swm reads ({error!r})",
            hint="pass the folder save_pretrained writes (weights.pt + config.json)",
        ) from error
    return kwargs, action_inputs, num_frames, weights


def _find(node: Any, class_name: str, seen: set | None = None):
    """The first held object of ``class_name`` under ``node``, depth first."""
    seen = set() if seen is None else seen
    if id(node) in seen:
        return None
    seen.add(id(node))
    if isinstance(node, Held):
        if type(node).__name__ == class_name:
            return node
        children = node.state.values()
    elif isinstance(node, dict):
        children = node.values()
    elif isinstance(node, list | tuple):
        children = node
    else:
        return None
    for child in children:
        found = _find(child, class_name, seen)
        if found is not None:
            return found
    return None


def _state_dict(module: Held, prefix: str = "") -> dict[str, Any]:
    """A held module's state dict, as ``nn.Module.state_dict`` names it (persistent buffers)."""
    state = module.state
    out: dict[str, Any] = OrderedDict()
    for name, tensor in (state.get("_parameters") or {}).items():
        if tensor is not None:
            out[prefix + name] = tensor.detach()
    skipped = state.get("_non_persistent_buffers_set") or set()
    for name, tensor in (state.get("_buffers") or {}).items():
        if tensor is not None and name not in skipped:
            out[prefix + name] = tensor
    for name, child in (state.get("_modules") or {}).items():
        if isinstance(child, Held):
            out.update(_state_dict(child, f"{prefix}{name}."))
    return out


def _architecture(lewm: Held) -> tuple[dict[str, Any], int, int]:
    """The factory's keywords, action inputs and predictor frames a held LeWM's modules keep."""
    modules = lewm.state["_modules"]
    vit = modules["encoder"].state["config"].state
    predictor = modules["predictor"].state
    block = predictor["_modules"]["transformer"].state["_modules"]["layers"]
    first = next(iter(block.state["_modules"].values())).state["_modules"]
    dropout = first["attn"].state["dropout"]
    projector = modules["projector"].state
    kwargs = {
        "image_size": int(vit["image_size"]),
        "patch_size": int(vit["patch_size"]),
        "vit": [
            int(vit[key]) for key in ("hidden_size", "num_hidden_layers", "num_attention_heads")
        ],
        "embed_dim": int(predictor["input_dim"]),
        "hidden_dim": int(projector["hidden_dim"]),
        "depth": int(predictor["depth"]),
        "heads": int(predictor["heads"]),
        "dim_head": int(predictor["dim_head"]),
        "mlp_dim": int(predictor["mlp_dim"]),
        "dropout": float(dropout),
    }
    action_inputs = int(modules["action_encoder"].state["input_dim"])
    return kwargs, action_inputs, int(predictor["num_frames"])
