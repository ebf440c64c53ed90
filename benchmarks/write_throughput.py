"""Write throughput per format and kind of frame: MB of raw pixels written per second.

    python benchmarks/write_throughput.py                          # this checkout
    python benchmarks/write_throughput.py --compare /path/to/other  # and another, same run

Writes ``--episodes`` episodes of ``--length`` frames at ``--res`` x ``--res`` x 3 through
``open_writer`` (one ``write_episode`` each, then ``close``), in two kinds:

- ``noise``: uniform random bytes, which no codec shrinks (camera sensor noise, the worst case);
- ``synthetic``: ``benchmarks/synth.py``'s episodes (a gradient and a moving square: compressible).

and prints, per checkout, format and kind, the pixels' MB/s (raw bytes over the write's wall
time, median of ``--rounds``) and the bytes on disk per frame. Each write runs in a fresh
process that imports the checkout it measures (``--compare``: a second checkout, its rounds
interleaved with this one's, so that the machine's load moves both alike).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = {"lance": ".lance", "hdf5": ".h5"}
KINDS = ("noise", "synthetic")


def episodes(kind: str, count: int, length: int, res: int):
    """The episodes of one kind, made before the clock starts."""
    sys.path.insert(0, str(Path(__file__).parent))
    from synth import make_episode

    made = [make_episode(seed, length=length, res=res) for seed in range(count)]
    if kind == "noise":
        rng = np.random.default_rng(0)
        for episode in made:
            episode["pixels"] = rng.integers(0, 256, episode["pixels"].shape, dtype=np.uint8)
    return made


def child(args) -> None:
    """One write, in the process the parent started with the measured checkout on its path."""
    import h5py  # noqa: F401 - imported before the clock starts, as a collecting process has
    import lance  # noqa: F401

    from swmcli.data.formats import open_writer
    from swmcli.data.storage.location import nbytes_under

    made = episodes(args.kind, args.episodes, args.length, args.res)
    path = Path(args.scratch) / f"data{SUFFIXES[args.format]}"
    start = time.perf_counter()
    writer = open_writer(path, format=args.format, mode="overwrite")
    for episode in made:
        writer.write_episode(episode)
    writer.close()
    seconds = time.perf_counter() - start
    frames = args.episodes * args.length
    pixels = sum(episode["pixels"].nbytes for episode in made)
    print(json.dumps({"mb_s": pixels / 2**20 / seconds, "disk": nbytes_under(path) / frames}))


def measure(tree: Path, fmt: str, kind: str, args, scratch: Path) -> dict:
    command = [
        sys.executable, __file__, "--child", "--format", fmt, "--kind", kind,
        "--episodes", str(args.episodes), "--length", str(args.length), "--res", str(args.res),
        "--scratch", str(scratch),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"the write from {tree} failed:\n{done.stderr}")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--length", type=int, default=50, help="frames per episode")
    parser.add_argument("--res", type=int, default=224)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--formats", nargs="+", default=list(SUFFIXES), choices=list(SUFFIXES))
    parser.add_argument("--compare", type=Path, default=None, help="another checkout's root")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory on the disk")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--format", choices=list(SUFFIXES), help=argparse.SUPPRESS)
    parser.add_argument("--kind", choices=KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    trees = [ROOT, *([args.compare.resolve()] if args.compare else [])]
    raw = args.episodes * args.length * args.res * args.res * 3
    print(
        f"{args.episodes} episodes of {args.length} frames of {args.res}x{args.res}x3"
        f" ({raw / 2**20:.0f} MB of pixels); {os.cpu_count()} CPUs, load average"
        f" {os.getloadavg()[0]:.1f}; median of {args.rounds} rounds"
    )
    print("| checkout | format | frames | MB/s | disk B/frame |")
    print("| --- | --- | --- | --- | --- |")
    scratch = Path(tempfile.mkdtemp(prefix="swm-write-", dir=args.dir)) / "w"
    scratch.mkdir()
    try:
        for fmt in args.formats:
            for kind in KINDS:
                rows = {tree: [] for tree in trees}
                for _ in range(args.rounds):
                    for tree in trees:
                        rows[tree].append(measure(tree, fmt, kind, args, scratch))
                for tree, measured in rows.items():
                    speed = statistics.median(m["mb_s"] for m in measured)
                    disk = measured[-1]["disk"]
                    print(f"| {tree} | {fmt} | {kind} | {speed:.0f} | {disk:,.0f} |", flush=True)
    finally:
        shutil.rmtree(scratch.parent, ignore_errors=True)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
