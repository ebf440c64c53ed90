"""Step time of data-parallel training: 1 process vs ``--nproc 2`` (torchrun, gloo), same global
batch, same data, measured side by side in one run.

    python3 benchmarks/data_parallel.py                      # tiny model, 32x32, batch 64
    python3 benchmarks/data_parallel.py --resolution 64 --batch-size 32

Rows: one process with 1 CPU thread, one process with 2 threads, and 2 ranks of 1 thread each
(what ``swm train --nproc 2`` runs on a 2-core machine). Each row is ``swm train --json`` in a
fresh process; the figure is its steady-state time per optimizer step (the first step, which
builds everything, excluded) and clips/s. On a CPU, DDP adds an all-reduce of the gradients and
an all-gather of the latents per step; it pays where the per-step compute is large enough.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def swm(*arguments: str) -> dict:
    """Run ``python -m swmcli ARGUMENTS --json``; its result."""
    done = subprocess.run(
        [sys.executable, "-m", "swmcli", *arguments, "--json"],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        sys.exit(f"swm {' '.join(arguments)} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resolution", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--episodes", type=int, default=40)
    args = parser.parse_args()
    common = ["--preset", "tiny", "--resolution", str(args.resolution)]
    with tempfile.TemporaryDirectory(prefix="swm-ddp-") as scratch:
        data = f"{scratch}/data.lance"
        swm("collect", *common, "--episodes", str(args.episodes), "--out", data)
        train = ["train", "--preset", "tiny", "--data", data, "--steps", str(args.steps)]
        train += ["--batch-size", str(args.batch_size)]
        rows = {
            "1 process, 1 thread": ["--set", "runtime.cpu_threads=1"],
            "1 process, 2 threads": ["--set", "runtime.cpu_threads=2"],
            "2 ranks x 1 thread": ["--set", "runtime.cpu_threads=1", "--nproc", "2"],
        }
        print(
            f"tiny model, {args.resolution}x{args.resolution}, global batch {args.batch_size}, "
            f"{args.steps} steps; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
        )
        print(f"{'run':<22} {'s/step':>8} {'clips/s':>8} {'final loss':>11}")
        baseline = None
        for index, (name, extra) in enumerate(rows.items()):
            result = swm(*train, "--out", f"{scratch}/run{index}", *extra)
            per_step = result["steady_seconds"] / (args.steps - 1)
            baseline = baseline or per_step
            print(
                f"{name:<22} {per_step:>8.3f} {result['steady_clips_per_s']:>8.0f}"
                f" {result['final_loss']:>11.4f}  ({baseline / per_step:.2f}x the first row)"
            )


if __name__ == "__main__":
    main()
