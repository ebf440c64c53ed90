"""Run by test_run_integrity and tests/run_damage_sweep.py: flip one bit (bit ``offset % 8``,
so text stays text as often as not) at each given offset of one file of a copy of a run
directory, then read the run as eval and ``--resume`` do.

Prints one line per flip: ``FILE:OFFSET error MESSAGE`` (a clean one-line SwmError),
``FILE:OFFSET intact`` (everything read back equal to the intact run: config, weights, optimizer,
step, data check), or ``FILE:OFFSET SILENT`` (read without an error, but something differs).
``metrics.jsonl`` is a log, not verified: it is trimmed and drawn as a resume does (no error may
escape), not compared. Dying or hanging is what the caller watches for.

    python tests/run_flip_sweep.py RUN_DIR WORK_DIR FILE:OFFSET...
"""

import shutil
import sys
from pathlib import Path

from swmcli.config import load_run_config
from swmcli.data.formats import open_reader
from swmcli.errors import SwmError
from swmcli.training.checkpoints import check_data_fingerprint, load_checkpoint
from swmcli.training.metrics import METRICS_FILE, draw_loss_curve, trim_metrics


def read_run(run_dir: Path, fingerprint: dict, metrics: bool) -> tuple:
    """What eval and a resume read from ``run_dir``: the configs they run with, the checkpoint
    (tensors, step), the data fingerprint check against the intact run's data, and (``metrics``)
    the metrics a resume trims and draws."""
    evaluated = load_run_config(run_dir).model_dump(exclude={"train": {"out"}})
    resumed = load_run_config(run_dir, {"train.out": run_dir})  # what `--resume` reads
    resumed = resumed.model_dump(exclude={"train": {"out"}})
    state = load_checkpoint(run_dir)
    open_reader(evaluated["data"]["path"]).close()  # eval and resume open the run's data
    check_data_fingerprint(run_dir, fingerprint, state, write=False)
    if metrics:
        trimmed = run_dir.parent / "metrics-copy"
        trimmed.mkdir(exist_ok=True)
        shutil.copy(run_dir / METRICS_FILE, trimmed / METRICS_FILE)
        trim_metrics(trimmed / METRICS_FILE, state["step"])
        draw_loss_curve(trimmed / METRICS_FILE, trimmed / "curve.png")
    return evaluated, resumed, state


def same(a, b) -> bool:
    import torch

    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def main() -> None:
    import json

    source, work = Path(sys.argv[1]), Path(sys.argv[2])
    fingerprint = json.loads((source / "data.json").read_text())
    original = read_run(source, fingerprint, metrics=False)
    copy = work / source.name
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(source, copy)
    for flip in sys.argv[3:]:
        relative, _, offset = flip.rpartition(":")
        target, offset = copy / relative, int(offset)
        with target.open("r+b") as handle:
            handle.seek(offset)
            byte = handle.read(1)[0]
            handle.seek(offset)
            handle.write(bytes([byte ^ (1 << offset % 8)]))
        print(flip, end=" ", flush=True)
        try:
            now = read_run(copy, fingerprint, metrics=relative == METRICS_FILE)
            print("intact" if same(now, original) else "SILENT", flush=True)
        except SwmError as error:
            print("error", error.message.replace("\n", " ")[:200], flush=True)
        with target.open("r+b") as handle:  # back to the intact byte for the next offset
            handle.seek(offset)
            handle.write(bytes([byte]))


if __name__ == "__main__":
    main()
