"""Time and peak memory of `swm preview` on a large dataset, next to `swm info` on the same one.

    python benchmarks/preview.py                         # 2,000 x 100 steps at 64x64: 200,000
    python benchmarks/preview.py --episodes 20 --data data/preview-small.lance  # 2,000 steps

Writes ``make_episode(seed)`` episodes of ``benchmarks/synth.py`` into a Lance dataset (kept in
``--data``, reused when it already holds them), then runs, each in a fresh process: ``swm info``
(what opening the dataset costs: the baseline), ``swm preview --episodes 4`` (one MP4 per episode)
and ``swm preview --episodes 16 --grid`` (one video of 16 episodes). Each row gives the seconds,
the process's peak RSS (the largest ``host peak RSS`` of its own memory report: ``VmHWM``, which
starts afresh at exec, where ``wait4``'s ``ru_maxrss`` would carry this script's RSS at the fork)
and what preview says it holds; the ratio column is each row's peak RSS over `swm info`'s,
measured in the same run.
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from synth import make_episode  # benchmarks/synth.py, beside this file

from swmcli.data.formats import open_reader, open_writer
from swmcli.units import format_bytes


def dataset(path: Path, episodes: int, length: int, res: int) -> Path:
    """The synthetic dataset at ``path``, written unless it already holds these episodes."""
    if path.exists():
        reader = open_reader(path)
        same = reader.num_episodes == episodes and reader.num_steps == episodes * length
        reader.close()
        if same:
            return path
    metadata = {"env_id": "synth", "resolution": res, "action_dim": 2}
    with open_writer(path, "lance", mode="overwrite", metadata=metadata) as writer:
        for seed in range(episodes):
            writer.write_episode(make_episode(seed, length=length, res=res))
    return path


def measured(args: list[str], out: Path) -> dict:
    """``swm ARGS --json`` in a fresh process: seconds, peak RSS, its JSON."""
    started = time.perf_counter()
    with open(out, "w") as stdout:
        done = subprocess.run(
            [sys.executable, "-m", "swmcli", *args, "--json"], stdout=stdout,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"swm {' '.join(args)} failed")
    result = json.loads(out.read_text())
    peak = max(phase["host_peak_rss_bytes"] for phase in result["memory"]["phases"])
    return {"seconds": seconds, "peak_rss": peak, "result": result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--length", type=int, default=100)
    parser.add_argument("--res", type=int, default=64)
    parser.add_argument("--data", type=Path, default=Path("data/preview-bench.lance"))
    args = parser.parse_args()
    started = time.perf_counter()
    path = dataset(args.data, args.episodes, args.length, args.res)
    print(f"dataset {path}: {args.episodes * args.length} steps at {args.res}x{args.res} "
          f"({time.perf_counter() - started:.0f} s to have it)")  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        rows = {
            "swm info": ["info", str(path)],
            "swm preview --episodes 4": ["preview", str(path), "--out", str(scratch / "a")],
            "swm preview --episodes 16 --grid": [
                "preview", str(path), "--episodes", "16", "--grid", "--out", str(scratch / "b"),
            ],
        }  # fmt: skip
        results = {name: measured(argv, scratch / "out.json") for name, argv in rows.items()}
    baseline = results["swm info"]["peak_rss"]
    print(f"{'command':36} {'seconds':>8} {'peak RSS':>12} {'x info':>7}  holds")
    for name, row in results.items():
        held = row["result"].get("held_in_memory_bytes")
        held = format_bytes(held) if held is not None else "-"
        print(f"{name:36} {row['seconds']:8.1f} {format_bytes(row['peak_rss']):>12} "
              f"{row['peak_rss'] / baseline:7.2f}  {held}")  # fmt: skip


if __name__ == "__main__":
    main()
