"""Flip one bit at a time in every file of a small run directory and count what eval and
``--resume`` make of it.

    python benchmarks/run_damage_sweep.py            # text files: every byte; others: every 499th
    python benchmarks/run_damage_sweep.py --stride 7 --binary-stride 2000

The run is the tiny preset's (6 episodes collected, 4 steps trained with a checkpoint every 2, so
``checkpoint.prev.pt`` is kept, then ``swm eval``, whose pictures join the sweep). Each flip runs
``tests/run_flip_sweep.py`` (the configs eval and a resume run with, the checkpoint, the data
fingerprint check, the metrics a resume trims and draws, all compared with the intact run) in a
child process, 64 flips per child; a child that dies or hangs is counted as a crash, its flip
printed, and the sweep goes on after it. Prints the counts per file and in total.
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHUNK = 64
OUTCOMES = ("error", "intact", "SILENT")  # tests/run_flip_sweep.py's words
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stride", type=int, default=1, help="every Nth byte of text files")
    parser.add_argument(
        "--binary-stride", type=int, default=499, help="every Nth byte of the other files"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="swm-run-sweep-") as scratch:
        run_dir = make_run(Path(scratch))
        total: dict[str, int] = {}
        for file in sorted(p for p in run_dir.rglob("*") if p.is_file()):
            relative = str(file.relative_to(run_dir))
            text = file.suffix in (".json", ".jsonl")
            stride = args.stride if text else args.binary_stride
            size = file.stat().st_size
            flips = [f"{relative}:{offset}" for offset in range(0, size, stride)]
            counts = sweep(run_dir, Path(scratch) / "work", flips)
            words = ", ".join(f"{kind} {count}" for kind, count in sorted(counts.items()))
            print(f"{relative} ({size:,} bytes, {len(flips)} flips): {words}", flush=True)
            for kind, count in counts.items():
                total[kind] = total.get(kind, 0) + count
    print("total:", ", ".join(f"{kind} {count}" for kind, count in sorted(total.items())))


def make_run(scratch: Path) -> Path:
    """A tiny dataset, a 4-step run of it and its eval, through the real command line."""
    data, run_dir = scratch / "tiny.lance", scratch / "run"
    swm = [sys.executable, "-m", "swmcli"]
    for command in (
        ["collect", "--preset", "tiny", "--episodes", "6", "--out", str(data)],
        ["train", "--preset", "tiny", "--data", str(data), "--out", str(run_dir), "--steps", "4",
         "--set", "train.checkpoint_every=2"],
        ["eval", str(run_dir), "--episodes", "1"],
    ):  # fmt: skip
        subprocess.run([*swm, *command], env=ENV, check=True, capture_output=True)
    return run_dir


def sweep(run_dir: Path, work: Path, flips: list[str]) -> dict[str, int]:
    """``{outcome: count}`` of ``flips`` ("FILE:OFFSET"), a child process per ``CHUNK``."""
    script = str(ROOT / "tests" / "run_flip_sweep.py")
    counts: dict[str, int] = {}
    for first in range(0, len(flips), CHUNK):
        todo = flips[first : first + CHUNK]
        while todo:
            command = [sys.executable, script, str(run_dir), str(work), *todo]
            try:
                done = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=600)
                stdout, failed = done.stdout, done.returncode != 0
            except subprocess.TimeoutExpired as hung:
                stdout, failed = (hung.stdout or b"").decode(), True
            lines = [line.split(" ", 2) for line in stdout.splitlines()]
            # A crash leaves its flip's line unfinished ("FILE:OFFSET " and nothing after).
            finished = [parts for parts in lines if len(parts) >= 2 and parts[1] in OUTCOMES]
            for parts in finished:
                counts[parts[1]] = counts.get(parts[1], 0) + 1
                if parts[1] == "SILENT":
                    print(f"silent change at {parts[0]}", flush=True)
            if not failed:
                break
            counts["crash"] = counts.get("crash", 0) + 1
            print(f"crash or hang at {todo[len(finished)]}", flush=True)
            todo = todo[len(finished) + 1 :]
    return counts


if __name__ == "__main__":
    main()
