"""A run directory before a run writes into it: the config the run trains with, the checks
that keep a run from writing over a trained run, a dataset or someone else's files, and what a
resume may change of the run (``RESUMABLE``).

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
from swmcli.report import info
from swmcli.training import checkpoints
from swmcli.training.metrics import METRICS_FILE
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
    if not resume and any(run_dir.glob("*")) and not (run_dir / config.CONFIG_FILE).exists():
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
RESUMABLE = ("runtime.", "train.steps", "train.out", "train.checkpoint_every", "train.log_every")
RESUMABLE += ("train.loggers",)
RESUMABLE += ("data.path", "data.in_memory", "data.num_workers", "data.worker_kind")
RESUMABLE += ("data.cache_dir",)
RESUMABLE += ("data.prefetch_factor", "data.ram_budget", "data.ram_share")


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


# The files a run writes into its directory before its first checkpoint.
_EARLY_FILES = (config.CONFIG_FILE, METRICS_FILE, checkpoints.DATA_FINGERPRINT_FILE)


@contextmanager
def held_until_checkpointed(run_dir: Path, writes: bool) -> Iterator[None]:
    """The run directory's writer lock, held by the process that ``writes`` it (rank 0), and
    the file system as it was if the run fails before its first checkpoint: a run directory this
    run made is removed, an untrained one that was there gets back what it held (what the run
    added removed, its files as they were), under the lock; the lock file goes, and then the
    empty folders this run made above the directory. A run with a checkpoint (resumed, or past
    its first) is kept whatever happens, and a path that is no run directory (a file, a
    dataset, someone else's folder: ``run_config`` refuses them) is never touched."""
    if not writes:
        yield
        return
    run_dir = Path(run_dir).resolve()
    made = next((p for p in reversed((run_dir, *run_dir.parents)) if not p.exists()), None)
    untrained = made is None and _untrained_run(run_dir)
    before = _entries(run_dir) if untrained else {}
    try:
        with run_lock(run_dir):
            try:
                yield
            except BaseException:
                if (made or untrained) and not checkpoints.checkpoint_path(run_dir).exists():
                    _put_back(run_dir, made, before)
                raise
    except BaseException:
        if made is not None and not run_dir.exists():
            for folder in run_dir.parents:  # up to the first this run made, if left empty
                if not folder.is_relative_to(made) or any(folder.iterdir()):
                    break
                folder.rmdir()
        raise


def _untrained_run(run_dir: Path) -> bool:
    """An empty folder, or one holding a run's config and no checkpoint: what a fresh run
    writes into (and nothing else it is pointed at)."""
    if not run_dir.is_dir() or _is_dataset(run_dir):
        return False
    if checkpoints.checkpoint_path(run_dir).exists():
        return False
    return not any(run_dir.iterdir()) or (run_dir / config.CONFIG_FILE).is_file()


def _entries(run_dir: Path) -> dict[str, bytes | None]:
    """The name of each entry of an untrained run directory, with the bytes of the run's own
    early files (small: a config, a metrics log, a data fingerprint)."""
    return {
        p.name: p.read_bytes() if p.name in _EARLY_FILES and p.is_file() else None
        for p in run_dir.iterdir()
    }


def _put_back(run_dir: Path, made: Path | None, before: dict[str, bytes | None]) -> None:
    """``run_dir`` as it was before a run that failed: gone if the run made it, else without
    the entries the run added and with its early files' bytes as they were."""
    if made is not None:
        shutil.rmtree(run_dir, ignore_errors=True)
        return
    for path in run_dir.iterdir():
        if path.name in before:
            if before[path.name] is not None and path.read_bytes() != before[path.name]:
                path.write_bytes(before[path.name])
        elif path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)  # a logger's folder (tensorboard/)
        else:
            path.unlink()
