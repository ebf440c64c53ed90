"""Flip one byte at a time in every file of a small dataset of each format and count the outcomes.

    python tests/damage_sweep.py                  # every byte of every file (slow)
    python tests/damage_sweep.py --stride 7       # every 7th byte, plus all of the metadata
    python tests/damage_sweep.py --formats lance  # one format

The datasets are the ones ``tests/test_checksums.py`` sweeps (4 episodes of 6 steps at 8x8). The
flips cover every file: Lance's data files, manifest, transaction and version hint; the HDF5 file
(its attribute and index included); the folder's metadata, arrays and PNGs; every byte of the
swm metadata's JSON wherever it lies. Each flip runs ``tests/flip_sweep.py`` (``swm info
--verify``, then the metadata, schema and every episode compared with the intact copy's) in a child
process, 64 flips per child; a child that dies (a decoder abort, a traceback) is counted as a
crash (one still running after 5 minutes as a hang), its flip printed, and the sweep goes on
after it. Prints per format the counts of one-line
errors, intact reads, silent changes and crashes.
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flip_sweep import dataset_files, metadata_span  # noqa: E402 (beside this file, in tests/)
from test_storage import make_episode, write  # noqa: E402

CHUNK = 64
CHUNK_SECONDS = 300  # 64 flips take seconds: a child still running then has hung
OUTCOMES = ("error", "intact", "SILENT")  # tests/flip_sweep.py's words
NAMES = {"lance": "d.lance", "hdf5": "d.h5", "folder": "d"}
ENV = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stride", type=int, default=1, help="flip every Nth byte of each file")
    parser.add_argument("--formats", default="lance,hdf5,folder", help="comma-separated")
    args = parser.parse_args()
    totals: dict[str, int] = {}
    for fmt in args.formats.split(","):
        with tempfile.TemporaryDirectory(prefix="swm-sweep-") as scratch:
            source = Path(scratch) / NAMES[fmt]
            write(source, [make_episode(seed, 6, resolution=8) for seed in range(4)], fmt=fmt)
            targets = _every_nth(source, args.stride)
            child = [sys.executable, str(ROOT / "tests" / "flip_sweep.py"), str(source),
                     str(Path(scratch) / "work")]  # fmt: skip
            counts = sweep(child, targets, ENV)
        files = len({target.rsplit(":", 1)[0] for target in targets})
        print(f"{fmt}: {files} files, {len(targets)} flips: {_words(counts)}", flush=True)
        for kind, count in counts.items():
            totals[kind] = totals.get(kind, 0) + count
    print(f"total: {_words(totals)}")


def _every_nth(source: Path, stride: int) -> list[str]:
    """Every ``stride``-th byte of every file, and every byte of the metadata's JSON."""
    targets = []
    for relative, data in dataset_files(source).items():
        offsets = set(range(0, len(data), stride)) | set(metadata_span(data))
        targets += [f"{relative}:{offset}" for offset in sorted(offsets)]
    return targets


def _words(counts: dict[str, int]) -> str:
    return ", ".join(f"{kind} {count}" for kind, count in sorted(counts.items())) or "nothing"


def sweep(child: list[str], targets: list[str], env: dict[str, str]) -> dict[str, int]:
    """``{outcome: count}`` of ``targets`` ("FILE:OFFSET"), each chunk flipped by one child process
    (``child + chunk``, printing one "FILE:OFFSET OUTCOME" line a flip). A child that dies or is
    still running after ``CHUNK_SECONDS`` counts its flip as a crash or a hang; the sweep goes on
    after it. ``tests/run_damage_sweep.py`` sweeps run directories with the same loop."""
    counts: dict[str, int] = {}
    for first in range(0, len(targets), CHUNK):
        todo = targets[first : first + CHUNK]
        while todo:
            try:
                done = subprocess.run(
                    [*child, *todo], capture_output=True, text=True, errors="replace", env=env,
                    timeout=CHUNK_SECONDS,
                )  # fmt: skip
                stdout, returncode, stderr = done.stdout, done.returncode, done.stderr
            except subprocess.TimeoutExpired as expired:  # the child was killed: a hang
                stdout = (expired.stdout or b"").decode(errors="replace")
                returncode, stderr = None, "hung"
            lines = [line.split(" ", 2) for line in stdout.splitlines()]
            # A crash or a hang leaves its flip's line unfinished ("FILE:OFFSET " and nothing).
            finished = [parts for parts in lines if len(parts) >= 2 and parts[1] in OUTCOMES]
            for parts in finished:
                counts[parts[1]] = counts.get(parts[1], 0) + 1
                if parts[1] == "SILENT":
                    print(f"silent change at {parts[0]}", flush=True)
            if returncode == 0:
                break
            stopped = todo[len(finished)]
            kind = "hang" if returncode is None else "crash"
            counts[kind] = counts.get(kind, 0) + 1
            last = (stderr.strip().splitlines() or ["?"])[-1][:160]
            print(f"{kind} at {stopped} (exit {returncode}): {last}", flush=True)
            todo = todo[len(finished) + 1 :]
    return counts


if __name__ == "__main__":
    main()
