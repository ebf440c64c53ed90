"""A run's logged figures: ``metrics.jsonl`` written (and to the loggers), trimmed on resume,
read back, and drawn as the loss curve.

``metrics.jsonl`` holds one JSON object of numbers per logged step and stays the source of
truth; a line cut short by a killed process (or damaged) is dropped when read. The loss curve is
matplotlib's (Agg), drawn at the end of training.
"""

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from swmcli.training.loggers import open_loggers

METRICS_FILE = "metrics.jsonl"
LOSS_CURVE_FILE = "loss_curve.png"


@contextmanager
def metrics_log(
    run_dir: Path, loggers: list[str], first_step: int, writes: bool
) -> Iterator[Callable[[int, dict], None]]:
    """``log(step, figures)``: one line of ``metrics.jsonl`` (flushed: a kill loses no logged
    step) and the same figures to ``loggers``; a rank that does not write (``writes`` False)
    logs nowhere."""
    path = run_dir / METRICS_FILE if writes else os.devnull
    with (
        open(path, "a") as metrics,
        open_loggers(loggers if writes else [], run_dir, first_step=first_step) as tools,
    ):

        def log(step: int, figures: dict) -> None:
            metrics.write(json.dumps({"step": step, **figures}) + "\n")
            metrics.flush()
            tools.scalars(step, figures)

        yield log


def trim_metrics(path: Path, last_step: int) -> int:
    """Keep the logged steps up to ``last_step``: later ones will be trained again.

    Unreadable lines are dropped: the last one cut short by a killed process, and any damaged
    line before it, whose number is returned (said by the caller: the logged history lost them).
    """
    if not path.exists():
        return 0
    rows, damaged = _metric_rows(path)
    kept = [json.dumps(row) + "\n" for row in rows if row["step"] <= last_step]
    path.write_text("".join(kept))
    return damaged


def _metric_rows(path: Path) -> tuple[list[dict], int]:
    """The readable rows of ``metrics.jsonl``, and how many lines before the last one are not
    (a last line cut short by a kill is no damage)."""
    lines = [line for line in path.read_bytes().decode(errors="replace").splitlines() if line]
    rows, damaged = [], 0
    for number, line in enumerate(lines):
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            row = None
        numbers = isinstance(row, dict) and all(
            isinstance(value, int | float) for value in row.values()
        )
        if numbers and isinstance(row.get("step"), int):
            rows.append(row)
        elif number < len(lines) - 1:
            damaged += 1
    return rows, damaged


def draw_loss_curve(metrics_path: Path, picture_path: Path) -> Path | None:
    """A PNG of the total and prediction losses against the step, from ``metrics.jsonl``.

    Log-scaled when every loss is positive (losses fall by orders of magnitude, then flatten),
    with labelled axes, a grid and a legend; nothing is drawn for fewer than two logged steps.
    """
    rows, _ = _metric_rows(metrics_path)
    if len(rows) < 2:
        return None
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=80)
    labels = {"loss": "total loss", "prediction": "prediction MSE (next latent)"}
    for key, label in labels.items():
        points = [(row["step"], row[key]) for row in rows if key in row]
        axes.plot(*zip(*points, strict=True), label=label, linewidth=1.5)
    if all(row[key] > 0 for row in rows for key in labels if key in row):
        axes.set_yscale("log")
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("training loss")
    axes.set_title(f"{picture_path.parent.name}: training loss")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(picture_path)
    plt.close(figure)
    return picture_path
