"""ReplayBuffer add and sample speed, side by side with plain numpy copies of the same bytes.

    python3 benchmarks/buffer.py            # 64x64 and 224x224, history 4, frameskip 2, batch 64
    python3 benchmarks/buffer.py --resolutions 32 --max-steps 2000   # a smoke run

Each row measures the buffer and a baseline in the same run and prints their ratio:

- add: the buffer's ``add`` (one step dict per call, the ring full so every episode evicts one)
  against a Python loop that copies the same step's arrays into preallocated, already-touched
  arrays; the first fill (fresh pages) against the same loop into fresh arrays.
- add_episode: whole 200-step episodes against one slice copy per key.
- sample(64): the bytes of one batch per second against ``ndarray.copy()`` of as many contiguous
  bytes (both allocate their output); ``sample(64, out=...)`` against ``np.copyto`` into a
  preallocated array (neither allocates); and a naive gather (a fancy index per clip, then
  ``np.stack``) against ``ndarray.copy()``.

Timings are medians over repeats, after one warm-up call. The buffer holds ``--max-steps`` steps
(20,000: 3.0 GB at 224x224), fewer where the host cannot spare twice that.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from swmcli.data.buffer import ReplayBuffer
from swmcli.host import available_host_bytes

HISTORY_LEN, FRAMESKIP, BATCH, EPISODE_LEN, ACTION_DIM = 4, 2, 64, 200, 2


def median_seconds(fn, repeats: int = 7, min_time: float = 0.05) -> float:
    """Median seconds per call of ``fn``, each repeat running it until ``min_time`` has passed."""
    fn()
    times = []
    for _ in range(repeats):
        calls, start = 0, time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_time:
                break
        times.append(elapsed / calls)
    return statistics.median(times)


def make_episode(res: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One episode with the keys collect writes, random pixels."""
    return {
        "pixels": rng.integers(0, 256, (EPISODE_LEN, res, res, 3), dtype=np.uint8),
        "action": rng.standard_normal((EPISODE_LEN, ACTION_DIM)).astype(np.float32),
        "reward": np.zeros(EPISODE_LEN, np.float32),
        "terminated": np.zeros(EPISODE_LEN, bool),
        "truncated": np.zeros(EPISODE_LEN, bool),
        "state": rng.standard_normal((EPISODE_LEN, 2)).astype(np.float32),
        "goal": rng.standard_normal((EPISODE_LEN, 2)).astype(np.float32),
    }


def add_steps(buf: ReplayBuffer, steps: list[dict], episodes: int) -> float:
    """Seconds to add ``episodes`` episodes of ``steps`` row by row."""
    start = time.perf_counter()
    for _ in range(episodes):
        for step in steps:
            buf.add(step)
        buf.end_episode()
    return time.perf_counter() - start


def copy_rows(targets: dict[str, np.ndarray], steps: list[dict], episodes: int) -> float:
    """Seconds for the baseline: the same rows copied key by key into ``targets``."""
    rows = len(next(iter(targets.values())))
    start = time.perf_counter()
    row = 0
    for _ in range(episodes):
        for step in steps:
            for key, target in targets.items():
                target[row % rows] = step[key]
            row += 1
    return time.perf_counter() - start


def naive_gather(rings: dict[str, np.ndarray], starts: np.ndarray) -> dict[str, np.ndarray]:
    """The naive clip gather: a fancy index per clip and key, then one stack per key."""
    strided = np.arange(HISTORY_LEN) * FRAMESKIP
    dense = np.arange(HISTORY_LEN * FRAMESKIP)
    clips = [
        {
            key: ring[s + dense].reshape(HISTORY_LEN, -1) if key == "action" else ring[s + strided]
            for key, ring in rings.items()
        }
        for s in starts
    ]
    return {key: np.stack([clip[key] for clip in clips]) for key in rings}


def bench_add(buf: ReplayBuffer, episode: dict[str, np.ndarray]) -> list[tuple]:
    """Fill ``buf`` (fresh pages), then add with the ring full; each against numpy row copies."""
    steps = [{key: value[t] for key, value in episode.items()} for t in range(EPISODE_LEN)]
    fill_episodes = buf.max_steps // EPISODE_LEN
    seconds = add_steps(buf, steps, fill_episodes)
    # The baseline writes a tenth as many rows into fresh arrays (the same page faults per row).
    fresh_rows = fill_episodes // 10 * EPISODE_LEN
    fresh = {k: np.empty((fresh_rows, *v.shape[1:]), v.dtype) for k, v in episode.items()}
    base = copy_rows(fresh, steps, fill_episodes // 10)
    rows = [
        (
            "add, first fill (fresh pages)",
            buf.max_steps / seconds,
            fresh_rows / base,
            "steps/s",
            "numpy row copy, fresh",
        ),
    ]
    # Steady state: the ring is full, each episode evicts the oldest.
    warm = {k: np.zeros((2_000, *v.shape[1:]), v.dtype) for k, v in episode.items()}
    add_time = median_seconds(lambda: add_steps(buf, steps, 1), repeats=5, min_time=0.2)
    copy_time = median_seconds(lambda: copy_rows(warm, steps, 1), repeats=5, min_time=0.2)
    rows.append(
        (
            "add (ring full, evicting)",
            EPISODE_LEN / add_time,
            EPISODE_LEN / copy_time,
            "steps/s",
            "numpy row copy",
        )
    )
    bulk_time = median_seconds(lambda: buf.add_episode(episode), repeats=5, min_time=0.2)
    slab_time = median_seconds(
        lambda: [np.copyto(warm[k][:EPISODE_LEN], v) for k, v in episode.items()],
        repeats=5,
        min_time=0.2,
    )
    rows.append(
        (
            "add_episode (200 steps)",
            EPISODE_LEN / bulk_time,
            EPISODE_LEN / slab_time,
            "steps/s",
            "numpy slice copy",
        )
    )
    return rows


def bench_sample(buf: ReplayBuffer, rng: np.random.Generator) -> list[tuple]:
    """sample(64) against numpy copies of as many bytes, read from random places of the rings."""
    batch = buf.sample(BATCH)
    batch_bytes = sum(v.nbytes for v in batch.values())
    # The baselines copy the batch's bytes as contiguous row ranges of the very same rings, from a
    # random offset each call, so their source is in RAM (not cache) just as the gather's is.
    rings = buf._rings
    counts = {key: batch[key].size // int(np.prod(ring.shape[1:])) for key, ring in rings.items()}
    targets = {
        key: np.empty((n, *rings[key].shape[1:]), rings[key].dtype) for key, n in counts.items()
    }

    def sources():
        offset = int(rng.integers(0, buf.max_steps - max(counts.values())))
        return {key: rings[key][offset : offset + n] for key, n in counts.items()}

    copy_fresh = median_seconds(lambda: [src.copy() for src in sources().values()])
    copy_into = median_seconds(lambda: [np.copyto(targets[k], s) for k, s in sources().items()])
    sample_fresh = median_seconds(lambda: buf.sample(BATCH))
    sample_into = median_seconds(lambda: buf.sample(BATCH, out=batch))
    last_start = buf.max_steps - HISTORY_LEN * FRAMESKIP
    naive = median_seconds(lambda: naive_gather(rings, rng.integers(0, last_start, BATCH)))

    def gbps(seconds: float) -> float:
        return batch_bytes / seconds / 1e9

    return [
        ("sample(64)", gbps(sample_fresh), gbps(copy_fresh), "GB/s", "ndarray.copy()"),
        ("sample(64, out=)", gbps(sample_into), gbps(copy_into), "GB/s", "np.copyto"),
        ("naive per-clip gather", gbps(naive), gbps(copy_fresh), "GB/s", "ndarray.copy()"),
        ("sample(64)", BATCH / sample_fresh, BATCH / copy_fresh, "clips/s", "ndarray.copy()"),
        ("sample(64, out=)", BATCH / sample_into, BATCH / copy_into, "clips/s", "np.copyto"),
    ]


def bench_resolution(res: int, max_steps: int) -> list[tuple]:
    """Rows (measure, swm figure, baseline figure, unit, baseline name) at one resolution."""
    rng = np.random.default_rng(0)
    buf = ReplayBuffer(max_steps, history_len=HISTORY_LEN, frameskip=FRAMESKIP, seed=0)
    rows = bench_add(buf, make_episode(res, rng))
    rows += bench_sample(buf, rng)
    buf.release()
    return rows


def number(value: float) -> str:
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def main() -> None:
    from rich.console import Console
    from rich.table import Table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resolutions", type=int, nargs="+", default=[64, 224])
    parser.add_argument("--max-steps", type=int, default=20_000, help="the buffer's capacity")
    args = parser.parse_args()
    available = available_host_bytes()
    table = Table(
        title=f"ReplayBuffer, history {HISTORY_LEN}, frameskip {FRAMESKIP}, batch {BATCH}"
    )
    for column in ("res", "measure", "swm", "baseline", "unit", "baseline is", "ratio"):
        table.add_column(
            column, justify="left" if column in ("measure", "baseline is") else "right"
        )
    headline = {}
    for res in args.resolutions:
        row_bytes = res * res * 3 + 4 * ACTION_DIM + 4 + 2 + 16
        fits = int(available / 2 / row_bytes)
        max_steps = min(args.max_steps, fits) // EPISODE_LEN * EPISODE_LEN
        for measure, swm, base, unit, name in bench_resolution(res, max_steps):
            table.add_row(
                f"{res}x{res}", measure, number(swm), number(base), unit, name, f"{swm / base:.2f}"
            )
            headline[res, measure, unit] = (swm, base)
        table.add_section()
    console = Console(width=120)
    console.print(table)
    res = args.resolutions[-1]
    swm, base = headline[res, "sample(64)", "GB/s"]
    adding = headline[res, "add (ring full, evicting)", "steps/s"][0]
    console.print(
        f"{res}x{res} sample(64): {swm / base:.0%} of a numpy copy of the same bytes (target >= "
        f"60% at 224x224); add with the ring full: {adding:,.0f} steps/s (target >= 39,000 at "
        f"224x224). Buffer: {max_steps:,} steps; RAM available {available / 1e9:.1f} GB; load "
        f"average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs."
    )


if __name__ == "__main__":
    main()
