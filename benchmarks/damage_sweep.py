"""Flip one byte at a time in a small Lance data file and count what reading it does.

    python benchmarks/damage_sweep.py                 # every byte (~10,000 offsets; slow)
    python benchmarks/damage_sweep.py --stride 11     # every 11th byte, plus the file's footer

The dataset is the one ``tests/test_checksums.py`` sweeps (4 episodes of 6 steps at 8x8). Each
offset runs ``tests/flip_sweep.py`` (``swm info --verify``, then a full read compared with the
original) in a child process, 64 offsets per child; a child that dies (a decoder abort, a
traceback) is counted as a crash, its offset printed, and the sweep goes on after it. Prints the
counts of one-line errors, intact reads, silent changes and crashes.
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from test_storage import make_episode, write  # noqa: E402

CHUNK = 64
OUTCOMES = ("error", "intact", "SILENT")  # tests/flip_sweep.py's words


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stride", type=int, default=1, help="sweep every Nth byte")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="swm-sweep-") as scratch:
        source = Path(scratch) / "d.lance"
        write(source, [make_episode(seed, 6, resolution=8) for seed in range(4)], fmt="lance")
        (data,) = (source / "data").glob("*.lance")
        relative = str(data.relative_to(source))
        size = data.stat().st_size
        footer = range(max(size - 40, 0), size)  # where a flip once aborted pylance
        offsets = sorted(set(range(0, size, args.stride)) | set(footer))
        print(f"{relative}: {size} bytes, {len(offsets)} offsets", flush=True)
        counts = sweep(source, relative, Path(scratch) / "work", offsets)
    print(", ".join(f"{kind} {count}" for kind, count in sorted(counts.items())))


def sweep(source: Path, relative: str, work: Path, offsets: list[int]) -> dict[str, int]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    work.mkdir()
    counts: dict[str, int] = {}
    for first in range(0, len(offsets), CHUNK):
        todo = offsets[first : first + CHUNK]
        while todo:
            done = subprocess.run(
                [sys.executable, str(ROOT / "tests" / "flip_sweep.py"), str(source), relative,
                 str(work), *map(str, todo)],
                capture_output=True, text=True, env=env, timeout=1800,
            )  # fmt: skip
            lines = [line.split(" ", 2) for line in done.stdout.splitlines()]
            # A crash leaves its offset's line unfinished ("OFFSET " and nothing after).
            finished = [parts for parts in lines if len(parts) >= 2 and parts[1] in OUTCOMES]
            for parts in finished:
                counts[parts[1]] = counts.get(parts[1], 0) + 1
                if parts[1] == "SILENT":
                    print(f"silent change at offset {parts[0]}", flush=True)
            if done.returncode == 0:
                break
            crashed = todo[len(finished)]
            counts["crash"] = counts.get("crash", 0) + 1
            last = (done.stderr.strip().splitlines() or ["?"])[-1][:160]
            print(f"crash at offset {crashed} (exit {done.returncode}): {last}", flush=True)
            todo = todo[len(finished) + 1 :]
    return counts


if __name__ == "__main__":
    main()
