"""Streaming clips from disk: Lance, HDF5 and the in-RAM ReplayBuffer, side by side in one run.

    python3 benchmarks/loader.py                 # TwoRoom frames, 224x224, 4,000 steps
    python3 benchmarks/loader.py --pixels noise  # incompressible frames: the worst case

Same data for every row: 224x224 clips, history 4, frameskip 2, batch 64, 2 DataLoader workers
(the buffer is read in-process, as ``make_loader`` does for it). For each row it prints clips/s
after the first batch, the time to the first batch (worker start included), the rate at which
on-disk bytes were consumed next to the disk's sequential read bandwidth measured in the same run
(a cold read of a fresh file), and peak RSS: the loading process after the first batch and at the
end (flat when only the current batches are in memory), and the largest worker. The dataset files
are dropped from the page cache before each row, so the first epoch reads from the disk.

Reference: stable-worldmodel 0.1.1's Lance reader, about 560 clips/s on a 2-core machine (spec);
the target is 2x that. Every batch is checked equal across the three sources (lossless).
"""

import argparse
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from swmcli.core.buffer import ReplayBuffer
from swmcli.core.data import load_dataset, make_loader
from swmcli.core.memory import peak_rss_bytes
from swmcli.core.storage import nbytes_under, open_writer
from swmcli.envs.tworoom import draw
from swmcli.units import format_bytes

HISTORY_LEN, FRAMESKIP, BATCH, WORKERS = 4, 2, 64, 2
UPSTREAM_CLIPS_PER_S = 560  # stable-worldmodel 0.1.1, Lance, 2 cores (quoted by the spec)


def make_episode(index: int, length: int, resolution: int, pixels: str) -> dict[str, np.ndarray]:
    """A TwoRoom-like random walk (or random noise frames) with the keys collect writes."""
    rng = np.random.default_rng(index)
    steps = np.cumsum(rng.uniform(-0.03, 0.03, (length, 2)), axis=0)
    state = np.clip(0.3 + steps, 0.06, 0.94).astype(np.float32)
    if pixels == "noise":
        frames = rng.integers(0, 256, (length, resolution, resolution, 3), dtype=np.uint8)
    else:
        frames = np.stack([draw(resolution, float(x), float(y)) for x, y in state])
    action = rng.uniform(-1, 1, (length, 2)).astype(np.float32)
    action[-1] = np.nan
    return {
        "pixels": frames,
        "action": action,
        "reward": np.zeros(length, np.float32),
        "terminated": np.zeros(length, bool),
        "truncated": np.eye(1, length, length - 1, dtype=bool)[0],
        "state": state,
        "goal": np.tile(rng.uniform(0.1, 0.9, 2).astype(np.float32), (length, 1)),
    }


def drop_from_page_cache(path: Path) -> None:
    """Ask the kernel to forget a file's cached pages, so the next read comes from the disk."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for file in files:
        descriptor = os.open(file, os.O_RDONLY)
        try:
            os.fsync(descriptor)
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(descriptor)


def sequential_read_bandwidth(directory: Path, size: int = 512 * 2**20) -> float:
    """Bytes/s of a cold sequential read of a fresh file of ``size`` bytes (8 MiB reads)."""
    file = directory / "bandwidth.bin"
    block = np.random.default_rng(0).integers(0, 256, 8 * 2**20, dtype=np.uint8).tobytes()
    with file.open("wb") as handle:
        for _ in range(size // len(block)):
            handle.write(block)
    drop_from_page_cache(file)
    start = time.perf_counter()
    with file.open("rb", buffering=0) as handle:
        while handle.read(len(block)):
            pass
    seconds = time.perf_counter() - start
    file.unlink()
    return size / seconds


def write_datasets(args, paths: dict[str, Path]) -> None:
    """Write the same episodes to every format."""
    writers = {name: open_writer(path, mode="overwrite") for name, path in paths.items()}
    for index in range(args.steps // args.episode_len):
        episode = make_episode(index, args.episode_len, args.resolution, args.pixels)
        for writer in writers.values():
            writer.write_episode(episode)
    for writer in writers.values():
        writer.close()


def fill_buffer(args) -> ReplayBuffer:
    """The same episodes in an in-RAM ReplayBuffer."""
    buffer = ReplayBuffer(max_steps=args.steps, history_len=HISTORY_LEN, frameskip=FRAMESKIP)
    for index in range(args.steps // args.episode_len):
        buffer.add_episode(make_episode(index, args.episode_len, args.resolution, args.pixels))
    return buffer


def rss_of(pid: int, field: str = "VmHWM") -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def stream(open_source, batches: int) -> dict:
    """Time the first batch (from opening the source) and then ``batches`` more."""
    start = time.perf_counter()
    loader = make_loader(open_source(), batch_size=BATCH, num_workers=WORKERS, seed=0)
    iterator = iter(loader)
    first = next(iterator)
    first_seconds = time.perf_counter() - start
    rss_after_first = rss_of(os.getpid(), "VmRSS")
    start = time.perf_counter()
    for _ in range(batches):
        try:
            next(iterator)
        except StopIteration:  # next epoch (the workers persist)
            iterator = iter(loader)
            next(iterator)
    seconds = time.perf_counter() - start
    workers = [w.pid for w in getattr(iterator, "_workers", [])]
    worker_peak = max((rss_of(pid) for pid in workers), default=0)
    rss_at_end = rss_of(os.getpid(), "VmRSS")
    del iterator, loader
    return {
        "clips_per_s": batches * BATCH / seconds,
        "first_batch_s": first_seconds,
        "rss_after_first": rss_after_first,
        "rss_at_end": rss_at_end,
        "worker_peak": worker_peak,
        "first": first,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4000, help="rows in the dataset")
    parser.add_argument("--episode-len", type=int, default=100)
    parser.add_argument("--resolution", type=int, default=224)
    parser.add_argument("--batches", type=int, default=40, help="batches timed per row")
    parser.add_argument("--pixels", choices=["tworoom", "noise"], default="tworoom")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory on the disk")
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="swm-loader-", dir=args.dir))
    try:
        run(args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run(args, scratch: Path) -> None:
    episodes = args.steps // args.episode_len
    print(
        f"{episodes} episodes x {args.episode_len} steps, {args.resolution}x{args.resolution} "
        f"{args.pixels} frames; history {HISTORY_LEN}, frameskip {FRAMESKIP}, batch {BATCH}, "
        f"{WORKERS} workers; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    paths = {"lance": scratch / "data.lance", "hdf5": scratch / "data.h5"}
    # Written by another process, as `swm collect` does: this one has not opened Lance, so the
    # DataLoader may fork its workers (what a `swm train` process sees).
    writer = multiprocessing.get_context("fork").Process(target=write_datasets, args=(args, paths))
    writer.start()
    writer.join()

    bandwidth = sequential_read_bandwidth(scratch)
    print(f"disk sequential read (cold, 512 MiB): {format_bytes(bandwidth)}/s")
    header = (
        f"{'source':<8} {'clips/s':>8} {'x560':>5} {'first batch':>11} {'on disk/step':>12} "
        f"{'disk read':>11} {'RSS 1st':>9} {'RSS end':>9} {'worker peak':>11}"
    )
    print(header)
    rows, firsts = {}, {}
    for name in ("lance", "hdf5", "buffer"):
        if name == "buffer":
            buffer = fill_buffer(args)
            per_step = 0

            def open_source(buffer=buffer):
                return buffer
        else:
            drop_from_page_cache(paths[name])
            per_step = nbytes_under(paths[name]) / args.steps

            def open_source(path=paths[name]):
                return load_dataset(path, history_len=HISTORY_LEN, frameskip=FRAMESKIP)

        row = stream(open_source, args.batches)
        rows[name], firsts[name] = row, row.pop("first")
        read_rate = row["clips_per_s"] * HISTORY_LEN * per_step
        ratio = row["clips_per_s"] / UPSTREAM_CLIPS_PER_S
        print(
            f"{name:<8} {row['clips_per_s']:>8.0f} {ratio:>5.1f}"
            f" {row['first_batch_s']:>10.2f}s {format_bytes(per_step):>12}"
            f" {format_bytes(read_rate) + '/s' if per_step else '-':>11}"
            f" {format_bytes(row['rss_after_first']):>9} {format_bytes(row['rss_at_end']):>9}"
            f" {format_bytes(row['worker_peak']) if row['worker_peak'] else '-':>11}"
        )
    same = all(
        np.array_equal(firsts["lance"][k].numpy(), firsts[other][k].numpy(), equal_nan=True)
        for other in ("hdf5", "buffer")
        for k in firsts["lance"]
    )
    print(f"lossless: first batches identical across lance, hdf5 and buffer: {same}")
    print(f"peak RSS of this process: {format_bytes(peak_rss_bytes())}")
    convert_memory(paths["lance"], scratch / "converted.h5", args)


CONVERT = """
import sys, threading, time
from swmcli.core.memory import peak_rss_bytes
from swmcli.core.storage.copy import copy_dataset
samples, done = [], threading.Event()
def sample():  # the peak so far, every 20 ms
    while not done.wait(0.02):
        samples.append(peak_rss_bytes())
threading.Thread(target=sample, daemon=True).start()
start = time.perf_counter()
copy_dataset(sys.argv[1], sys.argv[2])
seconds = time.perf_counter() - start
done.set()
print(samples[len(samples) // 4], peak_rss_bytes(), seconds)
"""


def convert_memory(src: Path, dst: Path, args) -> None:
    """Peak RSS of ``convert`` in a fresh process: flat (a quarter of the way = the end) when it
    streams."""
    root = str(Path(__file__).resolve().parents[1])
    done = subprocess.run(
        [sys.executable, "-c", CONVERT, str(src), str(dst)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": root},
    )
    quarter, peak, seconds = (float(x) for x in done.stdout.split())
    step_bytes = args.resolution * args.resolution * 3
    print(
        f"convert lance -> hdf5 ({args.steps} steps, {format_bytes(args.steps * step_bytes)} raw,"
        f" episodes of {format_bytes(args.episode_len * step_bytes)}): {seconds:.1f} s;"
        f" peak RSS {format_bytes(quarter)} a quarter of the way, {format_bytes(peak)} at the end"
    )


if __name__ == "__main__":
    main()
