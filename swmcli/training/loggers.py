"""A run's figures in the tools users already watch: TensorBoard and Weights & Biases.

``metrics.jsonl`` in the run directory is always written and stays the source of truth; the
loggers named in ``train.loggers`` (``--logger tensorboard --logger wandb``, or a comma list) get
the same figures at the same steps: every metric of every logged step, the loss-curve picture at
the end of training, and, when ``swm eval`` runs on the run, its success rates, open-loop errors
and the episode strip. TensorBoard's event files go under ``RUN_DIR/tensorboard``; W&B keeps its
files under ``RUN_DIR/wandb`` and its run id in ``RUN_DIR/wandb-run-id``, so a resumed run and
its evaluations log to the same W&B run (``WANDB_MODE=offline`` works without a network).
"""

import importlib.util
import json
import os
import secrets
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from swmcli.config import CONFIG_FILE
from swmcli.errors import SwmError, first_line

TENSORBOARD_DIR = "tensorboard"
WANDB_ID_FILE = "wandb-run-id"
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}  # logger -> the module it needs


def check_installed(names: list[str]) -> None:
    """Refuse, before any work, a logger whose package is missing: one line, the ``pip install``."""
    for name in names:
        if not _installed(PACKAGES[name]):
            raise SwmError(
                f"--logger {name} needs the {PACKAGES[name]} package, which is not installed",
                hint=f"pip install 'swmcli[{name}]'  (or: pip install {PACKAGES[name]})",
            )


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # sys.modules[module] is None: its import is blocked
        return False


class _TensorBoard:
    def __init__(self, run_dir: Path, first_step: int):
        from torch.utils.tensorboard import SummaryWriter

        # A run resumed from step ``first_step`` logs the steps after it again: TensorBoard shows
        # those, not the ones an interrupted run logged after its checkpoint.
        purge = first_step + 1 if first_step else None
        self.writer = SummaryWriter(run_dir / TENSORBOARD_DIR, purge_step=purge)

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def picture(self, tag: str, pixels, step: int) -> None:
        self.writer.add_image(tag, pixels, step, dataformats="HWC")

    def close(self) -> None:
        self.writer.close()


class _WandB:
    def __init__(self, run_dir: Path, first_step: int):
        import wandb

        id_file = run_dir / WANDB_ID_FILE
        if not id_file.is_file():
            id_file.write_text(secrets.token_hex(4) + "\n")
        self.wandb = wandb
        config = run_dir / CONFIG_FILE  # the run's resolved settings, as W&B's run config
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "swm"),
            name=run_dir.name,
            id=id_file.read_text().strip(),
            resume="allow",
            dir=run_dir,
            config=json.loads(config.read_text()) if config.is_file() else None,
            # console off: W&B would wrap stdout, where --json prints one JSON object
            settings=wandb.Settings(console="off", quiet=True),
        )

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def picture(self, tag: str, pixels, step: int) -> None:
        self.run.log({tag: self.wandb.Image(pixels)}, step=step)

    def close(self) -> None:
        self.run.finish()


_BACKENDS = {"tensorboard": _TensorBoard, "wandb": _WandB}


class RunLoggers:
    """The loggers of one run directory; with none named, every call does nothing."""

    def __init__(self, backends: list):
        self.backends = backends

    def scalars(self, step: int, values: Mapping[str, Any], prefix: str = "train") -> None:
        """Every number in ``values`` (a metrics.jsonl row, a result's fields) as ``prefix/key``."""
        numbers = {
            f"{prefix}/{key}": float(value)
            for key, value in values.items()
            if isinstance(value, int | float) and not isinstance(value, bool) and key != "step"
        }
        for backend in self.backends:
            backend.scalars(step, numbers)

    def picture(self, tag: str, path: str | Path | None, step: int) -> None:
        """A PNG (the loss curve, eval's strip) as an image; nothing when ``path`` is None."""
        if path is None or not self.backends:
            return
        import numpy as np
        from PIL import Image

        with Image.open(path) as image:
            pixels = np.asarray(image.convert("RGB"))
        for backend in self.backends:
            backend.picture(tag, pixels, step)


@contextmanager
def open_loggers(
    names: list[str],
    run_dir: Path,
    *,
    first_step: int = 0,
) -> Iterator[RunLoggers]:
    """The loggers ``names`` for ``run_dir``, closed (flushed, W&B run finished) on the way out."""
    check_installed(names)
    backends = []
    try:
        for name in names:
            with logger_errors(name, "start"):
                backends.append(_BACKENDS[name](Path(run_dir), first_step))
        yield RunLoggers(backends)
    finally:
        for name, backend in zip(names, backends, strict=False):
            with logger_errors(name, "finish"):
                backend.close()


_LOGGER_HINTS = {
    "wandb": "run `wandb login` (or set WANDB_API_KEY); WANDB_MODE=offline logs without an "
    "account; or drop --logger wandb",
    "tensorboard": "check that the run directory is writable, or drop --logger tensorboard",
}


@contextmanager
def logger_errors(name: str, doing: str) -> Iterator[None]:
    """An error of the logging package (W&B without a key, a full disk) as one line naming it,
    never as a bug in swm; metrics.jsonl holds every figure whatever the logger does."""
    try:
        yield
    except SwmError:
        raise
    except Exception as error:
        raise SwmError(
            f"--logger {name} could not {doing}: {type(error).__name__}: {first_line(error)}",
            hint=_LOGGER_HINTS[name],
        ) from error


def log_once(
    names: list[str],
    run_dir: Path,
    step: int,
    *,
    values: Mapping[str, Any] | None = None,
    pictures: Mapping[str, str | Path | None] | None = None,
    prefix: str = "eval",
) -> None:
    """Log ``values`` under ``prefix/`` and ``pictures`` (tag -> PNG) at ``step``, then close:
    the loss curve after training, an evaluation's results."""
    if not names:
        return
    with open_loggers(names, run_dir) as loggers:
        loggers.scalars(step, values or {}, prefix=prefix)
        for tag, path in (pictures or {}).items():
            loggers.picture(tag, path, step)
