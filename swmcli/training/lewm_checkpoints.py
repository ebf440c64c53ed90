"""stable-worldmodel's LeWM checkpoints in and out: its folders read as a model swm evaluates
and trains from, and swm's LeWM runs written as such folders.

A stable-worldmodel checkpoint folder holds ``config.json`` (the hydra config its
``save_pretrained`` writes: the model's, ``_target_`` ``stable_worldmodel.wm.lewm.LeWM``, or the
whole training config with the model under ``model``) and one ``.pt`` file of the model's state
dict (``weights.pt``, ``weights_epoch_N.pt``); or the object checkpoint its eval loads,
``NAME_object.ckpt``, a pickled module holding the LeWM (read here without stable-worldmodel:
``lewm_objects``). swm's ``swmcli.zoo.lewm`` is that model with the same parameter names, so
the weights load as they are; its factory's keywords come from the config.

A folder names no dataset: the data's action size gives the frameskip (the action embedder
reads ``frameskip x action_dim`` values), the predictor's frames the history. ``init_from_run``
(``train.init_from``) starts a model from either kind of folder, an swm run's or this one.
"""

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swmcli.errors import CheckpointError, UsageError
from swmcli.training.checkpoints import load_checkpoint

UPSTREAM_LEWM = "stable_worldmodel.wm.lewm.LeWM"
UPSTREAM_MODULE = "stable_worldmodel.wm.lewm.module"
FACTORY = "swmcli.zoo.lewm:build"
CONFIG_FILE = "config.json"  # save_pretrained's
WEIGHTS_FILE = "weights.pt"
OBJECT_SUFFIX = "_object.ckpt"
DOCS = "docs/bring-your-model.md, 'stable-worldmodel's LeWM'"
VIT_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads")
LEWM_DATA_KEYS = ("data.history_len", "data.frameskip")  # the checkpoint's, from its model
# transformers 4's ViT layer names -> transformers 5's (``renamed_vit``)
VIT4_LAYER = re.compile(r"^encoder\.encoder\.layer\.(?P<index>\d+)\.(?P<rest>.+)$")
VIT4_NAMES = (
    ("attention.attention.query.", "attention.q_proj."),
    ("attention.attention.key.", "attention.k_proj."),
    ("attention.attention.value.", "attention.v_proj."),
    ("attention.output.dense.", "attention.o_proj."),
    ("intermediate.dense.", "mlp.fc1."),
    ("output.dense.", "mlp.fc2."),
)


@dataclass
class UpstreamLeWM:
    """What a folder holds: the factory's keywords, the action embedder's inputs, the
    predictor's frames, the weights, and the training settings a whole config names."""

    source: Path
    kwargs: dict[str, Any]
    action_inputs: int
    num_frames: int
    weights: dict[str, Any]
    train: dict[str, Any] = field(default_factory=dict)

    def frameskip(self, action_dim: int, data: str) -> int:
        """The frameskip that makes ``action_dim`` values a step the embedder's inputs."""
        frameskip, left = divmod(self.action_inputs, action_dim)
        if left or not frameskip:
            raise UsageError(
                f"{self.source}'s action embedder reads {self.action_inputs} values a step, "
                f"and {data}'s actions have {action_dim}: no frameskip fits",
                hint="pass the dataset the checkpoint was trained on (--set data.path=...)",
            )
        return frameskip


def is_lewm_folder(path: Path) -> bool:
    """True for a folder of stable-worldmodel's LeWM (a LeWM config.json or an object
    checkpoint), never for an swm run (which holds checkpoint.pt)."""
    path = Path(path)
    if not path.is_dir() or (path / "checkpoint.pt").exists():
        return False
    if any(path.glob(f"*{OBJECT_SUFFIX}")):
        return True
    return _model_config(_read_json(path / CONFIG_FILE)) is not None


def read_lewm_folder(path: Path) -> UpstreamLeWM:
    """The LeWM of a stable-worldmodel folder: config.json with its .pt weights, else its
    newest object checkpoint."""
    path = Path(path)
    config = _read_json(path / CONFIG_FILE)
    model = _model_config(config)
    if model is None:
        from swmcli.training.lewm_objects import read_object_checkpoint

        objects = sorted(path.glob(f"*{OBJECT_SUFFIX}"), key=lambda p: p.stat().st_mtime)
        kwargs, action_inputs, num_frames, weights = read_object_checkpoint(objects[-1])
        return UpstreamLeWM(path, kwargs, action_inputs, num_frames, renamed_vit(weights))
    import torch

    weights_file = _weights_file(path)
    try:
        weights = torch.load(weights_file, map_location="cpu", weights_only=True)
    except Exception as error:
        raise CheckpointError(
            f"{weights_file} is not a state dict torch can read ({error})",
            hint="download it again; stable-worldmodel's save_pretrained writes it",
        ) from error
    train = _train_settings(config) if "model" in config else {}
    return UpstreamLeWM(path, *_factory_kwargs(model, path), _unwrapped(weights), train)


def _read_json(path: Path) -> Any:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError) as error:
        raise CheckpointError(
            f"{path} is not a readable JSON config ({error})",
            hint="download the checkpoint folder again",
        ) from error


def _model_config(config: Any) -> dict | None:
    """The LeWM part of a config: itself, or its ``model`` (a whole training config)."""
    if not isinstance(config, dict):
        return None
    for candidate in (config, config.get("model")):
        if isinstance(candidate, dict) and candidate.get("_target_") == UPSTREAM_LEWM:
            return candidate
    return None


def _weights_file(path: Path) -> Path:
    """The folder's one ``.pt`` (as stable-worldmodel's ``load_pretrained``), ``weights.pt``
    when there are several."""
    found = sorted(path.glob("*.pt"))
    if (path / WEIGHTS_FILE).is_file():
        return path / WEIGHTS_FILE
    if len(found) == 1:
        return found[0]
    raise CheckpointError(
        f"{path} holds {len(found)} .pt files"
        + (f" ({', '.join(p.name for p in found)})" if found else ""),
        hint="keep one weights file beside config.json (stable-worldmodel loads one too)",
    )


def _unwrapped(weights: Any) -> dict:
    """The LeWM's own state dict: a Lightning module's ``model.`` prefix dropped."""
    if isinstance(weights, dict) and "state_dict" in weights:
        weights = weights["state_dict"]
    if not isinstance(weights, dict):
        raise CheckpointError(
            f"the weights file holds a {type(weights).__name__}, not a state dict",
            hint="pass the folder save_pretrained wrote (weights.pt + config.json)",
        )
    if weights and all(name.startswith("model.") for name in weights):
        weights = {name.removeprefix("model."): tensor for name, tensor in weights.items()}
    return renamed_vit(weights)


def renamed_vit(weights: dict[str, Any]) -> dict[str, Any]:
    """``weights`` with the encoder's transformers 4 names (``encoder.encoder.layer.N.attention.
    attention.query``, ...) as transformers 5 names them (``encoder.layers.N.attention.q_proj``),
    the names swm's LeWM and today's stable-pretraining use; other names as they are."""
    renamed = {}
    for name, tensor in weights.items():
        layer = VIT4_LAYER.match(name)
        if layer:
            rest = layer["rest"]
            for old, new in VIT4_NAMES:
                if rest.startswith(old):
                    rest = new + rest.removeprefix(old)
                    break
            name = f"encoder.layers.{layer['index']}.{rest}"
        renamed[name] = tensor
    return renamed


def _factory_kwargs(model: dict, path: Path) -> tuple[dict[str, Any], int, int]:
    """``swmcli.zoo.lewm:build``'s keywords, the action inputs and predictor frames of a LeWM
    config (``lewm.yaml``'s ``model`` section, resolved)."""
    try:
        encoder, predictor = model["encoder"], model["predictor"]
        projector, actions = model["projector"], model["action_encoder"]
        kwargs = {
            "image_size": int(encoder.get("image_size", 224)),
            "patch_size": int(encoder.get("patch_size", 16)),
            "encoder_scale": str(encoder.get("size", "tiny")),
            "embed_dim": int(predictor["input_dim"]),
            "hidden_dim": int(projector["hidden_dim"]),
            "depth": int(predictor["depth"]),
            "heads": int(predictor["heads"]),
            "dim_head": int(predictor.get("dim_head", 64)),
            "mlp_dim": int(predictor["mlp_dim"]),
            "dropout": float(predictor.get("dropout", 0.0)),
        }
        if "hidden_size" in encoder:  # vit_hf's ViTConfig keywords: another encoder than size's
            kwargs["vit"] = [int(encoder[key]) for key in VIT_KEYS]
        return kwargs, int(actions["input_dim"]), int(predictor["num_frames"])
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise CheckpointError(
            f"{path / CONFIG_FILE} is not a LeWM config swm reads ({error!r} missing or wrong)",
            hint=f"see {DOCS}",
        ) from error


def _train_settings(config: dict) -> dict[str, Any]:
    """The loss and optimizer settings a whole training config names, as swm's model kwargs
    and train settings."""
    settings: dict[str, Any] = {}
    sigreg = (config.get("loss") or {}).get("sigreg") or {}
    if "weight" in sigreg:
        settings["model.kwargs.sigreg_weight"] = float(sigreg["weight"])
    for name, key in (("knots", "sigreg_knots"), ("num_proj", "sigreg_projections")):
        if name in (sigreg.get("kwargs") or {}):
            settings[f"model.kwargs.{key}"] = int(sigreg["kwargs"][name])
    optimizer = config.get("optimizer") or {}
    for name, key in (("lr", "train.lr"), ("weight_decay", "train.weight_decay")):
        if name in optimizer:
            settings[key] = float(optimizer[name])
    return settings


def lewm_eval_config(path: Path, flags: dict[str, Any] | None, sets: list[str] | None):
    """The config ``swm eval FOLDER`` runs with: preset ``lewm-224``'s eval settings, the
    folder's model, the data ``--set data.path=`` names (its env, resolution and action size),
    then the flags and ``--set`` items (any but the model's)."""
    from swmcli.config import SwmConfig, resolve_config
    from swmcli.data.formats import open_reader

    keys = [item.partition("=")[0].strip() for item in sets or []]
    keys += [key for key, value in (flags or {}).items() if value is not None]
    if "data.path" not in keys:
        raise UsageError(
            f"{path} is a stable-worldmodel LeWM checkpoint: it names no dataset to plan on",
            hint=f"swm eval {path} --set data.path=DATASET (the data it was trained on, e.g. "
            "stable-worldmodel's pusht_expert_train.lance)",
        )
    fixed = [key for key in keys if key.startswith("model.") or key in LEWM_DATA_KEYS]
    if fixed:
        raise UsageError(
            f"swm eval cannot change {fixed[0]}: {path}'s model and its history are the "
            "checkpoint's",
            hint="set eval.*, runtime.*, env.* and data.path only",
        )
    upstream = read_lewm_folder(path)
    cfg = resolve_config(preset="lewm-224", sets=sets, flags=flags)
    reader = open_reader(cfg.data.path)  # metadata only: no rows are read
    try:
        metadata = dict(reader.metadata)
    finally:
        reader.close()
    tree = cfg.model_dump()
    tree["model"].update(factory=FACTORY, kwargs=upstream.kwargs)
    frameskip = upstream.frameskip(int(metadata["action_dim"]), str(cfg.data.path))
    tree["data"].update(history_len=upstream.num_frames + 1, frameskip=frameskip)
    tree["env"]["resolution"] = int(metadata["resolution"])
    if metadata.get("env_id") and "env.id" not in keys:
        tree["env"]["id"] = metadata["env_id"]
    return SwmConfig.model_validate(tree)


def load_lewm_model(path: Path, cfg) -> tuple[Any, dict[str, Any]]:
    """The LeWM of ``path`` with its weights, for ``cfg`` (``lewm_eval_config``'s), and the
    state ``swm eval`` reads of a checkpoint (the model's arguments; no step)."""
    from swmcli.data.formats import open_reader
    from swmcli.models.interface import build_model, model_args

    reader = open_reader(cfg.data.path)
    try:
        shape = model_args(cfg, dict(reader.metadata))
    finally:
        reader.close()
    model = build_model(cfg.model, shape)
    load_weights(model, read_lewm_folder(path).weights, path)
    return model, {"model_args": shape, "step": None}


def load_weights(model, weights: dict[str, Any], path: Path) -> None:
    """``weights`` into ``model``, every name and shape; one line naming the first difference."""
    own = model.state_dict()
    missing = sorted(set(own) - set(weights))
    unexpected = sorted(set(weights) - set(own))
    wrong = [name for name in own if name in weights and own[name].shape != weights[name].shape]
    for names, what in ((missing, "missing"), (unexpected, "unknown"), (wrong, "of another shape")):
        if names:
            raise CheckpointError(
                f"{path}'s weights do not fit its config: {len(names)} weight(s) {what}, "
                f"first {names[0]}",
                hint="keep the weights file and config.json of one save_pretrained together",
            )
    model.load_state_dict(weights)


def export_lewm_run(run_dir: Path, dst: Path, overwrite: bool = False) -> dict[str, Any]:
    """Write swm's LeWM run ``run_dir`` (its verified checkpoint) as a stable-worldmodel
    checkpoint folder ``dst``: ``weights.pt`` (the state dict) and ``config.json`` (the model's
    hydra config), which ``load_pretrained(dst)`` instantiates and loads. Written beside
    ``dst`` and renamed into place; returns what was written."""
    import shutil
    import tempfile

    import torch

    from swmcli.config import load_run_config

    run_dir, dst = Path(run_dir), Path(dst)
    cfg = load_run_config(run_dir)
    if cfg.model.factory != FACTORY:
        model = cfg.model.factory or "swm's own JEPA model"
        raise UsageError(
            f"{run_dir} trains {model}, and only LeWM ({FACTORY}) has a stable-worldmodel layout",
            hint="export a run of --preset lewm-224 (or model.factory=swmcli.zoo.lewm:build)",
        )
    if dst.exists() and not overwrite:
        raise UsageError(f"{dst} exists", hint="pass --overwrite to replace it, or another DST")
    state = load_checkpoint(run_dir)
    config = upstream_config(cfg.model.kwargs, state["model_args"])
    dst.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    try:
        torch.save(state["model"], staging / WEIGHTS_FILE)
        (staging / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        if dst.exists():
            shutil.rmtree(dst)
        staging.rename(dst)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {"src": str(run_dir), "dst": str(dst), "checkpoint_step": state["step"],
            "files": [WEIGHTS_FILE, CONFIG_FILE]}  # fmt: skip


def upstream_config(kwargs: dict[str, Any], shape: dict[str, int]) -> dict[str, Any]:
    """``lewm.yaml``'s ``model`` section, resolved, for the zoo's LeWM built with ``kwargs``
    (its factory's defaults for the rest) on clips of ``shape``."""
    import inspect

    from swmcli.models.interface import load_factory

    defaults = inspect.signature(load_factory(FACTORY)).parameters
    given = {name: p.default for name, p in defaults.items() if p.default is not p.empty}
    given.update(kwargs)
    width = given["embed_dim"]
    encoder = {
        "_target_": "stable_pretraining.backbone.utils.vit_hf",
        "size": given["encoder_scale"],
        "patch_size": given["patch_size"],
        "image_size": given["image_size"],
        "pretrained": False,
        "use_mask_token": False,
    }
    if given["vit"] is not None:
        vit_width, layers, heads = given["vit"]
        encoder.update(
            hidden_size=vit_width,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=4 * vit_width,
        )

    def mlp(inputs: int) -> dict[str, Any]:
        return {
            "_target_": f"{UPSTREAM_MODULE}.MLP",
            "input_dim": inputs,
            "output_dim": width,
            "hidden_dim": given["hidden_dim"],
            "norm_fn": {"_target_": "torch.nn.BatchNorm1d", "_partial_": True},
        }

    return {
        "_target_": UPSTREAM_LEWM,
        "encoder": encoder,
        "predictor": {
            "_target_": f"{UPSTREAM_MODULE}.Predictor",
            "num_frames": shape["history_len"] - 1,
            "input_dim": width,
            "hidden_dim": width,
            "output_dim": width,
            "depth": given["depth"],
            "heads": given["heads"],
            "mlp_dim": given["mlp_dim"],
            "dim_head": given["dim_head"],
            "dropout": given["dropout"],
            "emb_dropout": 0.0,
        },
        "action_encoder": {
            "_target_": f"{UPSTREAM_MODULE}.Embedder",
            "input_dim": shape["frameskip"] * shape["action_dim"],
            "emb_dim": width,
        },
        "projector": mlp(given["vit"][0] if given["vit"] else width),
        "pred_proj": mlp(width),
    }


def init_from_run(model, run_dir: Path) -> str:
    """Load into ``model`` every weight of ``run_dir``'s verified checkpoint (or of a
    stable-worldmodel LeWM folder's weights) whose name and shape match (``train.init_from``);
    returns a line for the log naming the parts whose weights were
    left as initialized. A checkpoint that gives the model nothing is a UsageError."""
    if not Path(run_dir).is_dir():
        raise UsageError(
            f"train.init_from: {run_dir} is not a run directory",
            hint="pass the directory of a trained run (it holds checkpoint.pt) or a "
            "stable-worldmodel LeWM checkpoint folder",
        )
    if is_lewm_folder(run_dir):
        saved = read_lewm_folder(Path(run_dir)).weights
    else:
        saved = load_checkpoint(Path(run_dir))["model"]
    own = model.state_dict()
    matching = {
        name: tensor
        for name, tensor in saved.items()
        if name in own and own[name].shape == tensor.shape
    }
    if not matching:
        raise UsageError(
            f"train.init_from: no weight of {run_dir} fits this model (names or shapes differ)",
            hint="start from a run of the same architecture, or drop --init-from",
        )
    model.load_state_dict(matching, strict=False)
    fresh = sorted(set(own) - set(matching))
    if not fresh:
        return f"weights from {run_dir}; every weight loaded"
    parts = dict.fromkeys(name.split(".")[0] for name in fresh)
    return f"weights from {run_dir}; {len(fresh)} weight(s) start fresh, in: {', '.join(parts)}"
