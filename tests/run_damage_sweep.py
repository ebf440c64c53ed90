"""Flip one bit at a time in every file of a small run directory and count what eval and
``--resume`` make of it.

    python tests/run_damage_sweep.py            # text files: every byte; others: every 499th
    python tests/run_damage_sweep.py --stride 7 --binary-stride 2000

The run is the tiny preset's (6 episodes collected, 4 steps trained with a checkpoint every 2, so
``checkpoint.prev.pt`` is kept, then ``swm eval``, whose pictures join the sweep). Each flip runs
``tests/run_flip_sweep.py`` (the configs eval and a resume run with, the checkpoint, the data
fingerprint check, the metrics a resume trims and draws, all compared with the intact run) in a
child process, 64 flips per child, through ``damage_sweep.sweep``: a child that dies or hangs is
counted as a crash or a hang, its flip printed, and the sweep goes on after it. Prints the counts
per file and in total.
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from damage_sweep import ENV, ROOT, sweep  # the same crash-tolerant loop, beside this file


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
            child = [sys.executable, str(ROOT / "tests" / "run_flip_sweep.py"), str(run_dir),
                     str(Path(scratch) / "work")]  # fmt: skip
            counts = sweep(child, flips, ENV)
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


if __name__ == "__main__":
    main()
