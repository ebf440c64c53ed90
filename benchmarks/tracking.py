"""What measuring costs the steps it measures: live-tensor tracking on every step or the first two.

    python3 benchmarks/tracking.py                 # tworoom-64 model at 64x64, batch 64, 12 steps
    python3 benchmarks/tracking.py --steps 20 --batch-size 32

On a CPU, `swm train` and `swm eval` count live tensor bytes with a dispatch mode (the memory
panel's "peak live tensors"), which makes every operator dearer. Rows, the same optimizer steps on
one constant batch, interleaved round by round so that a busy machine loads them alike:

- ``untracked``: the steady state, nothing counted (the ceiling);
- ``every step tracked``: the dispatch mode on every step;
- ``first steps tracked``: what `swm train` does (``MemoryMonitor.stop_tracking`` after the
  second step of a phase: the first sees the weights and AdamW state only as it touches them),
  with the peak it reports (equal to the every-step row's: the steps are alike).

Each row gives its seconds per step and its ratio to the untracked row.
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def build(args):
    """The tworoom-64 model, its objective, optimizer, runner and one constant batch."""
    import numpy as np
    import torch

    from swmcli.config import resolve_config
    from swmcli.models.interface import Objective, build_model
    from swmcli.models.runner import make_runner
    from swmcli.training.recipe import make_optimizer

    cfg = resolve_config("tworoom-64", flags={"train.batch_size": args.batch_size})
    shape = {"resolution": 64, "action_dim": 2, "frameskip": cfg.data.frameskip}
    shape["history_len"] = cfg.data.history_len
    torch.manual_seed(0)
    model = build_model(cfg.model, shape)
    rng = np.random.default_rng(0)
    clips = (args.batch_size, cfg.data.history_len)
    batch = {
        "pixels": torch.from_numpy(rng.integers(0, 256, (*clips, 64, 64, 3), dtype=np.uint8)),
        "action": torch.from_numpy(rng.uniform(-1, 1, (*clips, 2 * cfg.data.frameskip))).float(),
    }
    optimizer = make_optimizer(model, cfg.train)
    runner = make_runner(cpu_threads=args.threads)
    return cfg, Objective(model, cfg.model), optimizer, runner, batch


def timed(name, steps, cfg, objective, optimizer, runner, batch):
    """Seconds per step of ``steps`` steps in one monitored phase, and its live-tensor peak."""
    from swmcli.commands.train import TRACKED_STEADY_STEPS
    from swmcli.memory.measure import MemoryMonitor
    from swmcli.training.step import optimizer_step

    tracked = TRACKED_STEADY_STEPS if name == "first steps tracked" else steps
    monitor = MemoryMonitor(track_tensors=name != "untracked")
    began = time.perf_counter()
    with monitor.phase(name):
        for step in range(steps):
            optimizer_step(objective, optimizer, [batch], runner, cfg.train.grad_clip, 1)
            if step + 1 == tracked:
                monitor.stop_tracking()
    seconds = (time.perf_counter() - began) / steps
    return seconds, monitor.report.phases[-1].live_tensor_peak_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12, help="steps per row and round")
    parser.add_argument("--rounds", type=int, default=3, help="rows interleaved this many times")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    from swmcli.units import format_bytes

    cfg, objective, optimizer, runner, batch = build(args)
    timed("untracked", 1, cfg, objective, optimizer, runner, batch)  # warm-up: AdamW state
    rows = ["untracked", "every step tracked", "first steps tracked"]
    seconds = {row: [] for row in rows}
    peaks = {}
    for _ in range(args.rounds):
        for row in rows:
            spent, peaks[row] = timed(row, args.steps, cfg, objective, optimizer, runner, batch)
            seconds[row].append(spent)
    base = min(seconds["untracked"])
    print(f"tworoom-64 model, 64x64, batch {args.batch_size}, {args.steps} steps x {args.rounds}")
    print(f"{'row':<22}{'s/step (best round)':>22}{'vs untracked':>14}{'live peak':>14}")
    for row in rows:
        best = min(seconds[row])
        peak = format_bytes(peaks[row]) if peaks[row] else "-"
        print(f"{row:<22}{best:>22.4f}{best / base:>13.2f}x{peak:>14}")
    same = peaks["every step tracked"] == peaks["first steps tracked"]
    print(f"same live peak reported by both tracked rows: {same}")
    ratio = min(seconds["every step tracked"]) / min(seconds["first steps tracked"])
    print(f"tracking the first steps only is {ratio:.2f}x faster than tracking every step")


if __name__ == "__main__":
    main()
