"""Checkpoints of a run: written atomically, read back with a clear error when missing or bad.

A checkpoint holds everything ``--resume`` needs to continue bit for bit: the plain (uncompiled)
model's state, the optimizer's state, the step reached, and torch's RNG state (SIGReg's random
directions come from it). It is written to a temporary file, flushed to disk, then renamed over
the previous one, so a process killed at any moment leaves the last complete checkpoint.
"""

import os
from pathlib import Path
from typing import Any

from swmcli.errors import CheckpointError, first_line

CHECKPOINT_FILE = "checkpoint.pt"
FORMAT_VERSION = 1


def checkpoint_path(run_dir: Path) -> Path:
    """Where a run directory keeps its (latest) checkpoint."""
    return Path(run_dir) / CHECKPOINT_FILE


def save_checkpoint(
    run_dir: Path, *, model: dict, optimizer: dict | None, step: int, model_args: dict[str, int]
) -> Path:
    """Write the model's and optimizer's state dicts, step and RNG state atomically; returns the
    checkpoint's path.

    ``model_args`` are the clip shape ``protocol.build_model`` takes besides the config
    (resolution, action_dim, frameskip, history_len), so eval rebuilds the model from the run alone.
    """
    import torch

    state = {
        "format": FORMAT_VERSION,
        "step": step,
        "model_args": dict(model_args),
        "model": model,
        "optimizer": optimizer,
        "rng_torch": torch.get_rng_state(),
        "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    path = checkpoint_path(run_dir)
    partial = path.with_name(path.name + ".partial")
    try:
        with open(partial, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
    except (OSError, RuntimeError) as error:  # torch.save reports a full disk as RuntimeError
        partial.unlink(missing_ok=True)
        raise CheckpointError(
            f"cannot write the checkpoint {path}: {first_line(error)}",
            hint=f"free disk space under {run_dir}; the previous checkpoint is intact",
        ) from error
    os.replace(partial, path)
    _sync_directory(path.parent)
    return path


def load_checkpoint(run_dir: Path) -> dict[str, Any]:
    """The checkpoint of ``run_dir`` as a dict (tensors on the CPU), or a CheckpointError."""
    import torch

    path = checkpoint_path(run_dir)
    if not path.is_file():
        raise CheckpointError(
            f"{run_dir} has no checkpoint ({CHECKPOINT_FILE})",
            hint="train first (swm train --out RUN_DIR), or check the run directory",
        )
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
    return state


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
