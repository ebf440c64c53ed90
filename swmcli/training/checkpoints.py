"""Checkpoints of a run: verified, written atomically, read back with a clear error when bad.

A checkpoint holds everything ``--resume`` needs to continue bit for bit: the plain (uncompiled)
model's state, the optimizer's state, the step reached, and torch's RNG state (SIGReg's random
directions come from it). It also holds the run's ``config.json`` text and the fingerprint of
its data (``data.json``), and a SHA-256 of all of that (tensor bytes, dtypes, shapes and every
other value): a flipped byte anywhere is found on load, and the config and data fingerprint
beside it are checked against the copies it holds.

Saving refuses non-finite weights or optimizer state (training diverged: the last checkpoint
stays). The new checkpoint is written to a temporary file, flushed, read back and verified; only
then does the previous one become ``checkpoint.prev.pt`` (the last good one, named when the
latest is found damaged) and the new one ``checkpoint.pt``, so a process killed at any moment
leaves a complete checkpoint. ``config.json`` follows the checkpoint it belongs to.
"""

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from swmcli.config import CONFIG_FILE, flat_settings
from swmcli.errors import CheckpointError, UsageError, first_line
from swmcli.report import warn

CHECKPOINT_FILE = "checkpoint.pt"
PREVIOUS_FILE = "checkpoint.prev.pt"
DATA_FINGERPRINT_FILE = "data.json"
FORMAT_VERSION = 1
CHECKSUM_KEY = "checksum"  # sha256 of everything else in the checkpoint
RELOCATABLE = {"data.path"}  # settings config.json may change after training (a moved dataset)


def checkpoint_path(run_dir: Path) -> Path:
    """Where a run directory keeps its (latest) checkpoint."""
    return Path(run_dir) / CHECKPOINT_FILE


def save_checkpoint(
    run_dir: Path,
    *,
    model: dict,
    optimizer: dict | None,
    step: int,
    model_args: dict[str, int],
    config_text: str,
    data_fingerprint: dict | None = None,
) -> Path:
    """Write the model's and optimizer's state dicts, step, RNG state, config and data
    fingerprint, verified and atomically; returns the checkpoint's path.

    ``model_args`` are the clip shape ``interface.build_model`` takes besides the config
    (resolution, action_dim, frameskip, history_len), so eval rebuilds the model from the run
    alone. ``config_text`` is what ``config.json`` holds (written after the checkpoint when it
    differs). Non-finite weights or optimizer state are refused: the last checkpoint is kept.
    """
    import torch

    path = checkpoint_path(run_dir)
    state = {
        "format": FORMAT_VERSION,
        "step": step,
        "model_args": dict(model_args),
        "model": _to_cpu(model),
        "optimizer": _to_cpu(optimizer) if optimizer is not None else None,
        "rng_torch": torch.get_rng_state(),
        "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "config": config_text,
        "data": data_fingerprint,
    }
    where = _non_finite(state)
    if where is not None:
        kept = f"the checkpoint of step {_step_of(path)} is kept" if path.exists() else "not saved"
        raise CheckpointError(
            f"training diverged: step {step} has non-finite values in {where}; {kept}",
            hint="lower the learning rate (--set train.lr=...) or the gradient clip, then "
            "resume or retrain",
        )
    state[CHECKSUM_KEY] = state_digest(state)
    partial = path.with_name(path.name + ".partial")
    try:
        with open(partial, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        _read_verified(partial)  # what is on disk reads back to what was meant
        _keep_as_previous(path)
        os.replace(partial, path)
        _sync_directory(path.parent)
        config_path = Path(run_dir) / CONFIG_FILE
        if not config_path.is_file() or config_path.read_text() != config_text:
            write_atomically(config_path, config_text)
    except (OSError, RuntimeError, CheckpointError) as error:  # a full disk: RuntimeError too
        partial.unlink(missing_ok=True)
        raise CheckpointError(
            f"cannot write the checkpoint {path}: {first_line(error)}",
            hint=f"free disk space under {run_dir}; the previous checkpoint is intact",
        ) from error
    return path


def load_checkpoint(run_dir: Path) -> dict[str, Any]:
    """The verified checkpoint of ``run_dir`` as a dict (tensors on the CPU), or a
    CheckpointError naming the damaged file (and the last good checkpoint, if one is kept).

    Checks its checksum, that ``config.json`` is the config it was written with, and that every
    weight and optimizer value is finite.
    """
    path = checkpoint_path(run_dir)
    if not path.is_file():
        previous = _last_good(run_dir)
        raise CheckpointError(
            f"{run_dir} has no checkpoint ({CHECKPOINT_FILE})",
            hint=f"{previous}: copy it to {path} to use it"
            if previous
            else "train first (swm train --out RUN_DIR), or check the run directory",
        )
    try:
        state = _read_verified(path)
    except CheckpointError as error:
        previous = _last_good(run_dir)
        if previous:
            error.message += f"; {previous}"
            error.hint = f"copy {Path(run_dir) / PREVIOUS_FILE} to {path} to use it"
        raise
    _check_config(run_dir, state)
    where = _non_finite(state)
    if where is not None:
        raise CheckpointError(
            f"checkpoint {path} holds non-finite values in {where}",
            hint="the run diverged before this checkpoint was written: retrain it, "
            "with a lower learning rate (--set train.lr=...)",
        )
    return state


def _read_verified(path: Path) -> dict[str, Any]:
    """The checkpoint at ``path``, its checksum checked."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many kinds (pickle, zip, EOF) for a damaged file
        raise CheckpointError(
            f"checkpoint {path} is corrupted or truncated ({type(err).__name__})",
            hint="delete it and retrain, or restore it from a backup",
        ) from err
    if not isinstance(state, dict) or state.get("format") != FORMAT_VERSION:
        raise CheckpointError(
            f"{path} is not an swm checkpoint (format {FORMAT_VERSION})",
            hint="pass a run directory written by `swm train`",
        )
    saved = state.pop(CHECKSUM_KEY, None)
    if not isinstance(saved, str) or saved != state_digest(state):
        raise CheckpointError(
            f"checkpoint {path} is damaged: its contents do not match their checksum",
            hint="delete it and retrain, or restore it from a backup",
        )
    state[CHECKSUM_KEY] = saved
    return state


def _last_good(run_dir: Path) -> str | None:
    """'the last good checkpoint is ... (step N)' when a verified previous checkpoint is kept."""
    previous = Path(run_dir) / PREVIOUS_FILE
    if not previous.is_file():
        return None
    try:
        state = _read_verified(previous)
    except CheckpointError:
        return None
    if _non_finite(state) is not None:
        return None
    return f"the last good checkpoint is {previous} (step {state['step']})"


def _step_of(path: Path) -> str:
    try:
        return str(_read_verified(path)["step"])
    except CheckpointError:
        return "?"


def _check_config(run_dir: Path, state: dict[str, Any]) -> None:
    """``config.json`` must hold the settings the checkpoint was written with, but for
    ``RELOCATABLE`` ones (a moved dataset: eval checks its frames, a resume its fingerprint)."""
    config_path = Path(run_dir) / CONFIG_FILE
    try:
        text = config_path.read_text()
        if text == state["config"]:
            return
        now = flat_settings(json.loads(text))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise CheckpointError(
            f"{config_path} is damaged ({first_line(err)})", hint=_config_hint(config_path)
        ) from err
    trained = flat_settings(json.loads(state["config"]))
    changed = sorted(
        key
        for key in trained.keys() | now.keys()
        if trained.get(key) != now.get(key) and key not in RELOCATABLE
    )
    if changed:
        words = ", ".join(f"{k} {trained.get(k)!r} -> {now.get(k)!r}" for k in changed[:3])
        raise CheckpointError(
            f"{config_path} is not the config {CHECKPOINT_FILE} was trained with "
            f"(damaged or edited: {words})",
            hint=_config_hint(config_path),
        )


def _config_hint(config_path: Path) -> str:
    return (
        f"restore {config_path.name}: {CHECKPOINT_FILE} holds its text "
        "(torch.load(...)['config']); eval settings change with flags or --set, not by editing it"
    )


def check_data_fingerprint(
    run_dir: Path, fingerprint: dict, state: dict[str, Any] | None, write: bool
) -> None:
    """A resumed run (``state``: its checkpoint) refuses data that changed since it started (its
    held-out split and batches would differ). A fresh one saves the fingerprint (``write``:
    rank 0).

    The checkpoint holds the fingerprint too, so a damaged or deleted ``data.json`` never skips
    the check: it is rewritten from the checkpoint's copy, and that is said.
    """
    path = Path(run_dir) / DATA_FINGERPRINT_FILE
    if state is None:
        if write:
            write_atomically(path, json.dumps(fingerprint) + "\n")
        return
    saved = state["data"]
    on_disk = _read_fingerprint(path)
    if on_disk != saved:
        words = "missing" if on_disk is None else "damaged"
        warn(f"{path} was {words}: rewritten from the fingerprint its checkpoint holds")
        if write:
            write_atomically(path, json.dumps(saved) + "\n")
    if saved != fingerprint:
        raise UsageError(
            f"the dataset changed since {run_dir} started: "
            f"{fingerprint_change(saved, fingerprint)}",
            hint="resume with the data it started with, or train a new run (--out)",
        )


def fingerprint_change(then: dict, now: dict) -> str:
    """How the data of fingerprint ``now`` differs from ``then``'s, in words."""
    counts = f"{then.get('episodes')} episodes ({then.get('steps')} steps)"
    if (then.get("episodes"), then.get("steps")) == (now["episodes"], now["steps"]):
        return f"{counts} both times, in episodes of other lengths"
    return f"{counts} then, {now['episodes']} ({now['steps']} steps) now"


def _read_fingerprint(path: Path) -> dict | None:
    """``data.json`` as a dict; None when it is missing or damaged."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(saved, dict) or not {"episodes", "steps"} <= saved.keys():
        return None
    return saved


def restore_model(model, state: dict[str, Any], path_for_errors: Path) -> None:
    """Load a checkpoint's weights into ``model``; a shape mismatch is a CheckpointError."""
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as err:
        raise CheckpointError(
            f"{path_for_errors} does not match the run's model config",
            hint="the config.json next to it was changed after training; restore it",
        ) from err


def restore_rng(state: dict[str, Any]) -> None:
    """Put torch's generators back where the checkpoint left them."""
    import torch

    torch.set_rng_state(state["rng_torch"])
    if state["rng_cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng_cuda"])


def state_digest(state: Any) -> str:
    """SHA-256 of a checkpoint's contents: every key, value, tensor dtype, shape and byte."""
    digest = hashlib.sha256()
    _feed(digest, state)
    return digest.hexdigest()


def _feed(digest, value: Any) -> None:
    import torch

    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous().reshape(-1)
        digest.update(f"T{tensor.dtype}{tuple(value.shape)}".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes())
    elif isinstance(value, dict):
        digest.update(f"D{len(value)}".encode())
        for key in sorted(value, key=repr):
            digest.update(f"K{key!r}".encode())
            _feed(digest, value[key])
    elif isinstance(value, list | tuple):
        digest.update(f"L{len(value)}".encode())
        for item in value:
            _feed(digest, item)
    else:
        digest.update(f"V{type(value).__name__}:{value!r};".encode())


def _to_cpu(tree: Any) -> Any:
    """A state dict with every tensor on the CPU (hashed, checked and saved from there)."""
    import torch

    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu()
    if isinstance(tree, dict):
        return {key: _to_cpu(value) for key, value in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_to_cpu(value) for value in tree)
    return tree


def check_starts_finite(model) -> None:
    """Refuse a model that holds NaN or infinity before its first training step: what built it
    (the model's factory, ``train.init_from``) made those values; no training diverged."""
    where = _non_finite({"model": model.state_dict()})
    if where is not None:
        raise UsageError(
            f"the model holds non-finite values in {where} before its first training step",
            hint="they come from the model's factory (or the run of train.init_from): give "
            "every weight and buffer a finite value",
        )


def _non_finite(state: dict[str, Any]) -> str | None:
    """The first weight or optimizer value that is NaN or infinite, in words; None if all are
    finite."""
    import torch

    def search(tree: Any, where: str) -> str | None:
        if isinstance(tree, torch.Tensor):
            finite = not tree.is_floating_point() or bool(torch.isfinite(tree).all())
            return None if finite else where
        if isinstance(tree, dict):
            items = tree.items()
        elif isinstance(tree, list | tuple):
            items = enumerate(tree)
        else:
            return None
        for key, value in items:
            found = search(value, f"{where}.{key}")
            if found is not None:
                return found
        return None

    for part in ("model", "optimizer"):
        found = search(state.get(part), part)
        if found is not None:
            return found
    return None


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a flushed temporary file renamed over it."""
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)
    _sync_directory(path.parent)


def _keep_as_previous(path: Path) -> None:
    """Make the current checkpoint ``checkpoint.prev.pt`` (a hard link: ``path`` stays whole)."""
    if not path.exists():
        return
    previous = path.with_name(PREVIOUS_FILE)
    linked = previous.with_name(previous.name + ".partial")
    linked.unlink(missing_ok=True)
    try:
        os.link(path, linked)
    except OSError:
        return  # a file system without hard links: no previous checkpoint is kept
    os.replace(linked, previous)


def _sync_directory(directory: Path) -> None:
    # The rename is durable only once the directory entry is on disk.
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def data_fingerprint(lengths) -> dict:
    """What the run's data looks like: a resumed run refuses data that changed since (its
    held-out split and batches would differ, and the result would no longer be bit-exact)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    return {
        "episodes": len(lengths),
        "steps": int(lengths.sum()),
        "episode_lengths_sha1": hashlib.sha1(lengths.tobytes()).hexdigest(),
    }
