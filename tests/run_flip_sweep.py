"""Run by test_run_integrity and benchmarks/run_damage_sweep.py: flip one bit (bit ``offset % 8``,
so text stays text as often as not) at each given offset of one file of a copy of a run
directory, then read the run as eval and ``--resume`` do.

Prints one line per offset: ``OFFSET error MESSAGE`` (a clean one-line SwmError), ``OFFSET intact``
(everything read back equal to the intact run: config, weights, optimizer, step, data check), or
``OFFSET SILENT`` (read without an error, but something differs). ``metrics.jsonl`` is a log, not
verified: it is trimmed and drawn as a resume does (no error may escape), not compared. Dying or
hanging is what the caller watches for.

    python tests/run_flip_sweep.py RUN_DIR FILE WORK_DIR OFFSET...
"""

import shutil
import sys
from pathlib import Path

from swmcli.config import load_run_config, resume_config
from swmcli.errors import SwmError
from swmcli.models.checkpoint import check_data_fingerprint, load_checkpoint
from swmcli.train import METRICS_FILE, draw_loss_curve, trim_metrics


def read_run(run_dir: Path, fingerprint: dict | None) -> tuple:
    """What eval and a resume read from ``run_dir``: the configs they run with, the checkpoint
    (tensors, step), and the data fingerprint check against the intact run's data."""
    evaluated = load_run_config(run_dir).model_dump(exclude={"train": {"out"}})
    resumed = resume_config(run_dir, {"train.out": run_dir}).model_dump(exclude={"train": {"out"}})
    state = load_checkpoint(run_dir)
    if fingerprint is not None:
        check_data_fingerprint(run_dir, fingerprint, state, write=False)
    metrics = run_dir.parent / "metrics-copy"
    metrics.mkdir(exist_ok=True)
    shutil.copy(run_dir / METRICS_FILE, metrics / METRICS_FILE)
    trim_metrics(metrics / METRICS_FILE, state["step"])
    draw_loss_curve(metrics / METRICS_FILE, metrics / "curve.png")
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

    source, relative, work = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    fingerprint = json.loads((source / "data.json").read_text())
    original = read_run(source, fingerprint)
    copy = work / source.name
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(source, copy)
    target = copy / relative
    for offset in map(int, sys.argv[4:]):
        with target.open("r+b") as handle:
            handle.seek(offset)
            byte = handle.read(1)[0]
            handle.seek(offset)
            handle.write(bytes([byte ^ (1 << offset % 8)]))
        print(offset, end=" ", flush=True)
        try:
            print("intact" if same(read_run(copy, fingerprint), original) else "SILENT", flush=True)
        except SwmError as error:
            print("error", error.message.replace("\n", " ")[:200], flush=True)
        with target.open("r+b") as handle:  # back to the intact byte for the next offset
            handle.seek(offset)
            handle.write(bytes([byte]))


if __name__ == "__main__":
    main()
