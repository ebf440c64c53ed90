"""A run directory before a run writes into it: the config the run trains with, the checks
that keep a run from writing over a trained run, a dataset or someone else's files, and what a
resume may change of the run (``RESUMABLE``).

A run directory holds ``config.json`` (the resolved config: ``swm eval RUN_DIR`` and ``swm
memprofile --run`` need nothing else), ``checkpoint.pt`` (``checkpoints``), ``metrics.jsonl`` and
``loss_curve.png`` (``metrics``).
"""

import json
from pathlib import Path

from swmcli import config
from swmcli.data.formats import detect
from swmcli.data.storage import location
from swmcli.errors import SwmError, UsageError
from swmcli.models.interface import portable_factory
from swmcli.report import info
from swmcli.training import checkpoints
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
