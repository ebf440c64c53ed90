"""The whole `swm train` step rate by where the clips come from, side by side in one run.

    python3 benchmarks/train_source.py                  # tworoom-64 model and data, 60 steps
    python3 benchmarks/train_source.py --steps 100 --episodes 500

Rows, on the same collected TwoRoom episodes (64x64, clips of history 4 and frameskip 2, batch 64,
the tworoom-64 model): ``swm train`` streaming from Lance (``--no-in-memory``, the preset's
one reader), ``swm train`` from the ReplayBuffer loaded with the same episodes
(``--in-memory``), and the trainer's ceiling: the same optimizer step on one constant batch, no
loader at all. Clips/s of training are the steady state (the first step, which also starts the
reader, is timed apart), and each row says what share of the ceiling it reaches. The first two
rows also check that both sources gave the same losses. A fourth row trains online, collecting
and recording episodes in the trainer's process (``--online --record``, the tworoom-64 preset's
updates per row): its share of the ceiling is what one process costs the trainer.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

COLLECT = """
import sys
from swmcli.commands.collect import run_collect
from swmcli.config import resolve_config
from swmcli.memory.measure import MemoryMonitor
flags = {"collect.out": sys.argv[1], "collect.episodes": int(sys.argv[2])}
run_collect(resolve_config("tworoom-64", flags=flags), MemoryMonitor())
"""


def collect(out: Path, episodes: int) -> None:
    """Collect in another process, as `swm collect` does: this one never opens Lance, so the
    streaming row's DataLoader may fork its worker (what a `swm train` process sees)."""
    root = str(Path(__file__).resolve().parents[1])
    subprocess.run(
        [sys.executable, "-c", COLLECT, str(out), str(episodes)],
        check=True,
        env={**os.environ, "PYTHONPATH": root},
        stderr=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )


def train_row(cfg, in_memory: bool | None, run_dir: Path) -> dict:
    """One `swm train` run: its steady clips/s, its wall time and its losses."""
    from swmcli.commands.train import run_train
    from swmcli.config import with_settings
    from swmcli.memory.measure import MemoryMonitor

    if not cfg.online.enabled:
        cfg = with_settings(cfg, {"data.in_memory": in_memory})
    cfg = with_settings(cfg, {"train.out": run_dir})
    start = time.perf_counter()
    fields = run_train(cfg, MemoryMonitor()).fields
    seconds = time.perf_counter() - start
    losses = [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").open()]
    return {
        "clips_per_s": fields["steady_clips_per_s"],
        "wall_s": seconds,
        "buffer_bytes": fields["buffer_bytes"],
        "losses": losses,
    }


def online_row(cfg, scratch: Path) -> dict:
    """`swm train --online --record`: collection and recording in the trainer's process, at the
    tworoom-64 preset's updates per row (after a warm-up of one batch's rows)."""
    from swmcli.config import with_settings

    flags = {
        "online.enabled": True,
        "online.record": scratch / "online.lance",
        "online.warmup_steps": cfg.train.batch_size,
        "data.newest_steps": 20_000,
    }
    return train_row(with_settings(cfg, flags), None, scratch / "online")


def ceiling_row(cfg) -> dict:
    """The same optimizer steps on one constant device batch: no loader, nothing to wait for."""
    from swmcli.data.streaming import make_loader
    from swmcli.memory.levers import build_model, make_optimizer
    from swmcli.models.interface import Objective
    from swmcli.models.runner import make_runner
    from swmcli.training.sources import load_clips, open_training_data
    from swmcli.training.step import optimizer_step

    dataset, _, metadata = open_training_data(cfg)
    buffer = load_clips(dataset, budget=2**40, seed=0)
    batch = next(iter(make_loader(buffer, cfg.train.batch_size, num_workers=0)))
    runner = make_runner(bf16=False, compile=False, cpu_threads=cfg.runtime.cpu_threads)
    model = runner.prepare(build_model(cfg, metadata))
    objective, optimizer = Objective(model, cfg.model), make_optimizer(model, cfg.train)
    model.train()
    device_batch = runner.to_device(batch)
    seconds = 0.0
    for step in range(cfg.train.steps):
        began = time.perf_counter()
        optimizer_step(objective, optimizer, [device_batch], runner, cfg.train.grad_clip, 1)
        if step > 0:  # the first step is timed apart, as `swm train` does
            seconds += time.perf_counter() - began
    return {"clips_per_s": (cfg.train.steps - 1) * cfg.train.batch_size / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=300, help="TwoRoom episodes collected")
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps per row")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="swm-train-source-", dir=args.dir))
    try:
        run(args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run(args, scratch: Path) -> None:
    from swmcli.config import resolve_config
    from swmcli.units import format_bytes

    data = scratch / "tworoom-64.lance"
    collect(data, args.episodes)
    flags = {
        "data.path": data,
        "train.steps": args.steps,
        "train.log_every": 1,
        "train.checkpoint_every": args.steps,
        "runtime.cpu_threads": args.threads,
    }
    cfg = resolve_config("tworoom-64", flags=flags)
    print(
        f"{args.episodes} TwoRoom episodes at 64x64, tworoom-64 model, batch "
        f"{cfg.train.batch_size}, history {cfg.data.history_len}, frameskip "
        f"{cfg.data.frameskip}, {args.steps} steps per row; {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    rows = {
        "swm train, streamed (Lance)": train_row(cfg, False, scratch / "streamed"),
        "swm train, in memory": train_row(cfg, True, scratch / "memory"),
        "swm train --online --record": online_row(cfg, scratch),
        "constant batch (ceiling)": ceiling_row(cfg),
    }
    ceiling = rows["constant batch (ceiling)"]["clips_per_s"]
    print(f"{'source':<28} {'clips/s':>8} {'of ceiling':>10} {'wall':>7} {'buffer':>11}")
    for name, row in rows.items():
        wall = f"{row['wall_s']:.1f}s" if "wall_s" in row else "-"
        held = format_bytes(row["buffer_bytes"]) if row.get("buffer_bytes") else "-"
        share = row["clips_per_s"] / ceiling
        print(f"{name:<28} {row['clips_per_s']:>8.0f} {share:>10.0%} {wall:>7} {held:>11}")
    same = rows["swm train, streamed (Lance)"]["losses"] == rows["swm train, in memory"]["losses"]
    print(f"same losses streamed and in memory: {same}")


if __name__ == "__main__":
    main()
