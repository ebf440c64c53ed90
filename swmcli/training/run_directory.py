"""A run directory before a run writes into it: the config the run trains with, the checks
that keep a run from writing over a trained run, a dataset or someone else's files, what a
resume may change of the run (``RESUMABLE``), and the writer lock under which a run that fails
before its first checkpoint leaves the directory as it found it.

A run directory holds ``config.json`` (the resolved config: ``swm eval RUN_DIR`` and ``swm
memprofile --run`` need nothing else), ``checkpoint.pt`` (``checkpoints``), ``metrics.jsonl`` and
``loss_curve.png`` (``metrics``).
"""

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from swmcli import config
from swmcli.data.formats import detect
from swmcli.data.storage import location
from swmcli.data.storage.lock import run_lock
from swmcli.errors import SwmError, UsageError
from swmcli.models.interface import portable_factory
from swmcli.report import info, warn
from swmcli.training import checkpoints
from swmcli.training.loggers import TENSORBOARD_DIR, WANDB_ID_FILE
from swmcli.training.metrics import LOSS_CURVE_FILE, METRICS_FILE
from swmcli.training.sources import env_of_training_data


def run_config(cfg: config.SwmConfig, resume: bool, world) -> config.SwmConfig:
    """The config this run trains with: ``cfg`` with the env its data came from, an absolute
    data path and a portable model factory (so ``swm eval RUN_DIR`` needs nothing else), saved
    into a fresh run's directory (rank 0). A fresh run refuses a directory that holds a trained
    run or someone else's files; a resumed one, changes its checkpoint's model cannot take
    (``check_resume``). A resumed run's config.json is rewritten with its next checkpoint.
    """
    run_dir = Path(cfg.train.out)
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"--out {run_dir} is a file", hint="pass a directory for the run")
    if _is_dataset(run_dir):
        raise UsageError(f"--out {run_dir} is a dataset", hint="pass a new directory for the run")
    if not resume and checkpoints.checkpoint_path(run_dir).exists():
        raise UsageError(
            f"{run_dir} already holds a trained run",
            hint="pass --resume to continue it, or --out for a new run directory",
        )
    if not resume and any(run_dir.glob("*")) and not _holds_a_run_config(run_dir):
        raise UsageError(
            f"--out {run_dir} is a directory that is not a swm run; its files would be overwritten",
            hint="pass a new or empty directory for the run",
        )
    if cfg.online.enabled and cfg.online.record is not None:
        # `swm eval RUN_DIR` reads held-out episodes from the data the run recorded.
        cfg = config.with_settings(cfg, {"data.path": cfg.online.record})
    if not cfg.online.enabled:  # the run plays the env its data came from
        cfg = env_of_training_data(cfg)
    settings = {
        "data.path": location.resolve(location.as_location(cfg.data.path)),
        "runtime.nproc": world.size,
        "model.factory": portable_factory(cfg.model.factory),
        "train.out": run_dir,  # where the run lives now (it may have been moved since)
    }
    cfg = config.with_settings(cfg, settings)
    if resume:
        check_resume(config.load_run_config(run_dir), cfg)
        info(f"resuming {run_dir} with its saved config, to step {cfg.train.steps}")
        if cfg.runtime.nproc != world.size:
            info(
                f"it trained on {cfg.runtime.nproc} rank(s), this run has {world.size}: the same "
                "global batches, losses equal up to float rounding (not bit for bit)"
            )
    elif world.is_main:
        config.save_config(cfg, run_dir)
    return cfg


#: What ``swm train --resume`` may change: how the run executes and how far it goes, not what it
#: trains (``data.path`` may move: the data's fingerprint must still match).
RESUMABLE = (
    "runtime.", "train.steps", "train.out", "train.checkpoint_every", "train.log_every",
    "train.loggers", "data.path", "data.in_memory", "data.num_workers", "data.worker_kind",
    "data.cache_dir", "data.prefetch_factor", "data.ram_budget", "data.ram_share",
)  # fmt: skip


def check_resume(saved: config.SwmConfig, cfg: config.SwmConfig) -> None:
    """Refuse to resume a run saved as ``saved`` with ``cfg`` where they differ in anything but
    what a resume may change (``RESUMABLE``): every such setting at once (exit 2), rather than
    dropped."""
    before = config.flat_settings(saved.model_dump(mode="json"))
    after = config.flat_settings(cfg.model_dump(mode="json"))
    refused = [key for key in before if before[key] != after[key] and not key.startswith(RESUMABLE)]
    if refused:
        changes = ", ".join(
            f"{key} ({before[key]!r} in the run, {after[key]!r} given)" for key in refused
        )
        raise UsageError(
            f"--resume cannot change {changes}: a resumed run keeps the model, data and "
            "schedule it started with",
            hint="drop those flags to resume (runtime flags such as --bf16, --compile, "
            "--in-memory and --steps apply), or train a new run (--out)",
        )


def resumable_items(cfg: config.SwmConfig) -> list[str]:
    """``cfg``'s settings that a resume may change, as ``--set`` items (``key=JSON value``, which
    TOML reads back): what makes ``config.load_run_config`` of its run give ``cfg`` again. Unset
    (None) ones are left out: no flag unsets a setting."""
    flat = config.flat_settings(cfg.model_dump(mode="json"))
    return [
        f"{key}={json.dumps(value)}"
        for key, value in flat.items()
        if key.startswith(RESUMABLE) and value is not None
    ]


def _holds_a_run_config(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a swm run's ``config.json`` (another tool's is not one)."""
    try:
        config.load_run_config(run_dir)
    except SwmError:
        return False
    return True


def _is_dataset(path: Path) -> bool:
    try:
        detect(path)
    except SwmError:
        return False
    return True


def stopped_after(step: int, run_dir: Path, world) -> None:
    """Leave after an interrupted ``step`` (checkpointed): rank 0 reports it for every rank."""
    if not world.is_main:
        raise SystemExit(130)
    raise SwmError(
        f"interrupted after step {step}: checkpoint saved in {run_dir}",
        hint=f"swm train --out {run_dir} --resume continues from step {step}",
        exit_code=130,
    )


# What a run writes into its directory before its first checkpoint: the only names a failed
# run removes, or puts back as they were.
_RUN_FILES = (config.CONFIG_FILE, checkpoints.DATA_FINGERPRINT_FILE, METRICS_FILE,
              LOSS_CURVE_FILE, WANDB_ID_FILE)  # fmt: skip
_RUN_FOLDERS = (TENSORBOARD_DIR, "wandb")


@contextmanager
def held_until_checkpointed(run_dir: Path, writes: bool) -> Iterator[None]:
    """The run directory's writer lock, held by the process that ``writes`` it (rank 0), and
    the file system as it was if the run fails before its first checkpoint: under the lock, the
    files and folders a run writes (``_RUN_FILES``, ``_RUN_FOLDERS``) that it added are removed
    and those it changed get their bytes back; then the folders this run made are removed where
    they are left empty. Nothing else in or around the directory is touched, and a run with a
    checkpoint (resumed, or past its first) is kept whatever happens."""
    if not writes:
        yield
        return
    run_dir = Path(run_dir).resolve()
    made = next((p for p in reversed((run_dir, *run_dir.parents)) if not p.exists()), None)
    try:
        with run_lock(run_dir):
            before = _run_files(run_dir)
            try:
                yield
            except BaseException:
                if not checkpoints.checkpoint_path(run_dir).exists():
                    _put_back(run_dir, before)
                raise
    except BaseException:
        if made is not None:
            _remove_empty(run_dir, made)
        raise


def _run_files(run_dir: Path) -> dict[str, bytes | None]:
    """The run's own entries in ``run_dir``: each file's bytes (small: a config, a log, a
    fingerprint), None for a folder."""
    if not run_dir.is_dir() or _is_dataset(run_dir):
        return {}
    found = {name: (run_dir / name).read_bytes() for name in _RUN_FILES
             if (run_dir / name).is_file()}  # fmt: skip
    return found | {name: None for name in _RUN_FOLDERS if (run_dir / name).is_dir()}


def _put_back(run_dir: Path, before: dict[str, bytes | None]) -> None:
    """The run's own entries of ``run_dir`` as they were ``before`` a run that failed; one that
    cannot be put back is said, never raised over the run's own error."""
    for name in (*_RUN_FILES, *_RUN_FOLDERS):
        path = run_dir / name
        try:
            if name in before:
                if before[name] is not None and path.read_bytes() != before[name]:
                    path.write_bytes(before[name])
            elif path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
        except OSError as error:
            warn(f"could not put back {path} after the failed run: {error}")


def _remove_empty(run_dir: Path, made: Path) -> None:
    """The folders from ``run_dir`` up to ``made`` (the first this run made), each removed if
    left empty; the first that is not stops it."""
    for folder in (run_dir, *run_dir.parents):
        if not folder.is_relative_to(made):
            return
        try:
            folder.rmdir()
        except OSError:  # not empty, not there, or not ours to remove
            return
