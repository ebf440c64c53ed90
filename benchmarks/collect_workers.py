"""Collection steps/s with worker processes (``collect.workers``) against one process, same run.

    python benchmarks/collect_workers.py [--env ID] [--episodes 16] [--workers 1 2]

Each row collects the same episodes (same seeds, the same dataset) into a fresh Lance dataset and
reports env steps per second as ``swm collect`` measures them (worker start-up included), and the
ratio to the one-process row. The default env is Push-T (gym-pusht, ``swmcli[pusht]``), whose
step draws a 512 x 512 canvas; without it, TwoRoom at 224 x 224. On a shared machine the ratio
also depends on what else runs: the load average is printed with it.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from swmcli.commands.collect import run_collect
from swmcli.config import resolve_config
from swmcli.memory.measure import MemoryMonitor

PUSHT = "gym_pusht:gym_pusht/PushT-v0"


def steps_per_second(env_id: str, resolution: int, episodes: int, workers: int, root: Path):
    """steps/s of one ``swm collect`` of ``episodes`` episodes with ``workers`` processes."""
    flags = {
        "env.id": env_id,
        "env.resolution": resolution,
        "env.max_episode_steps": 100,
        "collect.episodes": episodes,
        "collect.policy": "expert",
        "collect.workers": workers,
        "collect.out": root / f"w{workers}.lance",
    }
    if env_id == PUSHT:
        flags["env.kwargs"] = {"observation_width": resolution, "observation_height": resolution}
    result = run_collect(resolve_config(flags=flags), MemoryMonitor())
    return result.fields["steps_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    has_pusht = importlib.util.find_spec("gym_pusht") is not None
    parser.add_argument("--env", default=PUSHT if has_pusht else "swm/TwoRoom-v0")
    parser.add_argument("--resolution", type=int, default=64 if has_pusht else 224)
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    print(f"{args.env} at {args.resolution}x{args.resolution}, {args.episodes} episodes")
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    baseline = None
    with tempfile.TemporaryDirectory() as root:
        for workers in args.workers:
            rate = steps_per_second(args.env, args.resolution, args.episodes, workers, Path(root))
            baseline = baseline or rate
            print(f"workers {workers}: {rate:8.1f} steps/s  ({rate / baseline:.2f}x one process)")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
