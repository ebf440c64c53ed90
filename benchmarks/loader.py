"""Streaming clips: swm's Lance and HDF5 loaders, the in-RAM ReplayBuffer and upstream's Lance
loader (stable-worldmodel 0.1.1), on the very same episodes, in one run.

    python benchmarks/loader.py                                   # swm rows only
    python benchmarks/loader.py --upstream-python UPVENV/bin/python --repeats 3

The episodes are ``make_episode(seed)`` of ``benchmarks/synth.py`` (40 x 100 steps of 224x224
frames that compress like a simple rendered scene); every row reads clips of history 4,
frameskip 2, batch 64, with 2 readers: reader threads (``make_loader``'s default, the rows named by
their format) or DataLoader worker processes (``data.worker_kind = "processes"``, the ", processes"
rows); the buffer is read in-process, as ``make_loader`` does for it. The ", unchecked" rows read
without checking each row against its checksum: the checked rows' cost is measured against them.
Each row runs in a fresh forked process (as a new ``swm train`` would) and prints clips/s after two
warm-up batches, the time to the first batch from opening the dataset (workers' start included),
bytes on disk per step. The dataset files are dropped from the page cache before every streamed
row (cold).

The upstream row runs ``benchmarks/upstream_loader_bench.py`` (it writes the same episodes with
upstream's own writer and times ``load_dataset`` + DataLoader with the same settings) with the
interpreter given by ``--upstream-python``: a separate venv, never swm's, made with

    python -m venv UPVENV && UPVENV/bin/pip install torch==2.13.0 \\
        && UPVENV/bin/pip install stable-worldmodel==0.1.1 opencv-python-headless imageio h5py

(upstream imports torchvision, whose PyPI wheels need the CUDA build of torch). Every ratio is
taken within this run: the machine's load moves all rows together. Rows are interleaved over
``--repeats`` rounds and the median is shown with the range.

Last, "where the time goes": one batch read in this process, split by key and stage.
"""

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from synth import make_episode  # benchmarks/synth.py, beside this file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from swmcli.data.buffer import ReplayBuffer  # noqa: E402
from swmcli.data.clips import action_rows, observation_rows  # noqa: E402
from swmcli.data.formats import open_reader, open_writer  # noqa: E402
from swmcli.data.storage.location import nbytes_under  # noqa: E402
from swmcli.data.streaming import ClipDataset, load_dataset, make_loader  # noqa: E402
from swmcli.memory.measure import peak_rss_bytes  # noqa: E402
from swmcli.units import format_bytes  # noqa: E402

HISTORY_LEN, FRAMESKIP, BATCH, WORKERS, WARMUP = 4, 2, 64, 2, 2


def drop_from_page_cache(path: Path) -> None:
    """Ask the kernel to forget a dataset's cached pages, so the next read comes from the disk."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for file in files:
        descriptor = os.open(file, os.O_RDONLY)
        try:
            os.fsync(descriptor)
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(descriptor)


def write_datasets(args, paths: dict[str, Path]) -> None:
    """Write the same episodes to every format (in a child: this process never opens Lance)."""
    writers = {name: open_writer(path, mode="overwrite") for name, path in paths.items()}
    for index in range(args.episodes):
        episode = make_episode(args.seed + index, length=args.length, res=args.resolution)
        for writer in writers.values():
            writer.write_episode(episode)
    for writer in writers.values():
        writer.close()


def fill_buffer(args) -> ReplayBuffer:
    """The same episodes in an in-RAM ReplayBuffer."""
    steps = args.episodes * args.length
    buffer = ReplayBuffer(max_steps=steps, history_len=HISTORY_LEN, frameskip=FRAMESKIP)
    for index in range(args.episodes):
        buffer.add_episode(make_episode(args.seed + index, length=args.length, res=args.resolution))
    return buffer


def stream(open_source, batches: int, processes: bool = False) -> dict:
    """Time the first batch (from opening the source), then ``batches`` after the warm-up."""
    start = time.perf_counter()
    loader = make_loader(
        open_source(), batch_size=BATCH, num_workers=WORKERS, seed=0, processes=processes
    )
    iterator = iter(loader)
    first = next(iterator)
    first_seconds = time.perf_counter() - start
    for _ in range(WARMUP - 1):
        next(iterator)
    start = time.perf_counter()
    for _ in range(batches):
        try:
            next(iterator)
        except StopIteration:  # next epoch (the workers persist)
            iterator = iter(loader)
            next(iterator)
    seconds = time.perf_counter() - start
    del iterator, loader
    return {
        "clips_per_s": batches * BATCH / seconds,
        "first_batch_s": first_seconds,
        "first": {key: value.numpy() for key, value in first.items()},
    }


def stream_in_child(open_source, batches: int, processes: bool) -> dict:
    """``stream`` in a forked child: each row starts as a fresh ``swm train`` process does, one
    that has not opened Lance (so worker processes fork), and no row inherits another's state."""
    receive, send = multiprocessing.get_context("fork").Pipe(duplex=False)

    def child() -> None:
        send.send(stream(open_source, batches, processes))

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    send.close()
    row = receive.recv()
    process.join()
    return row


def run_upstream(args, scratch: Path) -> list[dict]:
    """Upstream's own benchmark on the same episodes, ``--repeats`` cold loads; [] if not asked."""
    if args.upstream_python is None:
        return []
    result = scratch / "upstream.json"
    command = [
        str(args.upstream_python),
        str(Path(__file__).resolve().parent / "upstream_loader_bench.py"),
        *("--repeats", str(args.repeats)),
        *("--episodes", str(args.episodes), "--length", str(args.length)),
        *("--res", str(args.resolution), "--batch", str(BATCH), "--workers", str(WORKERS)),
        *("--history-len", str(HISTORY_LEN), "--frameskip", str(FRAMESKIP)),
        *("--batches", str(args.batches), "--warmup", str(WARMUP), "--seed", str(args.seed)),
        *("--workdir", str(scratch / "upstream"), "--json", str(result)),
    ]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # its venv, not swm's
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0 or not result.is_file():
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        print(f"upstream benchmark failed (exit {done.returncode}): {' | '.join(tail)}")
        return []
    summary = json.loads(result.read_text())
    per_step = summary["write"]["disk_bytes"] / (args.episodes * args.length)
    return [{**load, "per_step": per_step} for load in summary["loads"]]


def median_and_range(values: list[float], digits: str) -> str:
    low, high = min(values), max(values)
    middle = statistics.median(values)
    if len(values) == 1:
        return f"{middle:{digits}}"
    return f"{middle:{digits}} ({low:{digits}}-{high:{digits}})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=40)
    parser.add_argument("--length", type=int, default=100, help="steps per episode")
    parser.add_argument("--resolution", type=int, default=224)
    parser.add_argument("--batches", type=int, default=40, help="batches timed per row")
    parser.add_argument("--repeats", type=int, default=2, help="rounds over every row")
    parser.add_argument("--seed", type=int, default=0, help="episode i uses seed + i")
    parser.add_argument("--upstream-python", type=Path, default=None, help="upstream venv's python")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory on the disk")
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="swm-loader-", dir=args.dir))
    try:
        run(args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run(args, scratch: Path) -> None:
    print(
        f"{args.episodes} synth episodes x {args.length} steps,"
        f" {args.resolution}x{args.resolution};"
        f" history {HISTORY_LEN}, frameskip {FRAMESKIP}, batch {BATCH}, {WORKERS} workers;"
        f" {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    paths = {"lance": scratch / "data.lance", "hdf5": scratch / "data.h5"}
    # Written by another process, as `swm collect` does: this one has not opened Lance, so the
    # DataLoader may fork its workers (what a `swm train` process sees).
    writer = multiprocessing.get_context("fork").Process(target=write_datasets, args=(args, paths))
    writer.start()
    writer.join()
    steps = args.episodes * args.length
    upstream = run_upstream(args, scratch)
    buffer = fill_buffer(args)
    sources = {  # row -> (format, worker processes rather than threads, rows checked)
        "lance": ("lance", False, True),
        "hdf5": ("hdf5", False, True),
        "lance, unchecked": ("lance", False, False),
        "hdf5, unchecked": ("hdf5", False, False),
        "lance, processes": ("lance", True, True),
        "hdf5, processes": ("hdf5", True, True),
        "buffer": ("buffer", False, True),
    }
    rows = {name: [] for name in sources}
    firsts = {}
    for _ in range(args.repeats):
        for name, (fmt, processes, checked) in sources.items():
            if fmt == "buffer":

                def open_source():
                    return buffer
            else:
                drop_from_page_cache(paths[fmt])

                def open_source(path=paths[fmt], checked=checked):
                    clips = load_dataset(path, history_len=HISTORY_LEN, frameskip=FRAMESKIP)
                    if not checked:  # the baseline: rows read without their checksums checked
                        clips.__class__ = Unchecked
                    return clips

            row = stream_in_child(open_source, args.batches, processes)
            firsts[name] = row.pop("first")
            rows[name].append(row)
    per_step = {name: nbytes_under(paths[fmt]) / steps for name, (fmt, *_) in sources.items()
                if fmt != "buffer"}  # fmt: skip
    if upstream:
        rows["upstream lance"] = upstream
        per_step["upstream lance"] = upstream[0]["per_step"]
    print_table(rows, per_step)
    same = all(
        np.array_equal(firsts["lance"][k], firsts[other][k], equal_nan=True)
        for other in firsts
        for k in firsts["lance"]
    )
    print(f"lossless: first batches identical across every row: {same}")
    print(f"peak RSS of this process: {format_bytes(peak_rss_bytes())}")
    for name, path in paths.items():
        where_time_goes(name, path, args.seed)
    convert_memory(paths["lance"], scratch / "converted.h5", args)


class Unchecked(ClipDataset):
    """Clips read without checking their rows' checksums: what the checks cost is the
    difference with the checked row (each row is checked the first time a process reads it)."""

    def _open(self):
        reader = super()._open()
        self._checks = None  # as for another tool's dataset, which carries no checksums
        return reader


def print_table(rows: dict[str, list[dict]], per_step: dict[str, float]) -> None:
    """One line per source: median (range) clips/s, ratios, first batch, bytes on disk."""
    median = {
        name: statistics.median(r["clips_per_s"] for r in runs) for name, runs in rows.items()
    }
    base = median.get("upstream lance")
    print(
        f"{'source':<17} {'clips/s median (range)':>24} {'x upstream':>10} {'x lance':>8}"
        f" {'first batch':>18} {'on disk/step':>12}"
    )
    for name, runs in rows.items():
        clips = median_and_range([r["clips_per_s"] for r in runs], ".0f")
        first = median_and_range([r["first_batch_s"] for r in runs], ".2f")
        versus = f"{median[name] / base:.2f}" if base else "-"
        stored = format_bytes(per_step[name]) if name in per_step else "in RAM"
        print(
            f"{name:<17} {clips:>24} {versus:>10} {median[name] / median['lance']:>8.2f}"
            f" {first + ' s':>18} {stored:>12}"
        )


def where_time_goes(name: str, path: Path, seed: int) -> None:
    """A batch's rows read by key in this process (one Python thread), after a warm-up batch:
    where a worker spends its time, without the DataLoader's IPC."""
    reader = open_reader(path)
    rng = np.random.default_rng(seed)
    span = HISTORY_LEN * FRAMESKIP
    batches = [rng.integers(0, reader.num_steps - span, BATCH) for _ in range(6)]
    parts = []
    for key in reader.keys:
        rows = [
            action_rows(b, HISTORY_LEN, FRAMESKIP)
            if key == "action"
            else observation_rows(b, HISTORY_LEN, FRAMESKIP)
            for b in batches
        ]
        reader.read_rows(key, rows[0].reshape(-1))
        start, cpu = time.perf_counter(), time.process_time()
        for batch_rows in rows[1:]:
            reader.read_rows(key, batch_rows.reshape(-1))
        count = len(rows) - 1
        wall = (time.perf_counter() - start) / count * 1e3
        parts.append(f"{key} {wall:.1f} ms ({(time.process_time() - cpu) / count * 1e3:.1f} CPU)")
    reader.close()
    print(f"{name}, one batch read in-process by key: " + ", ".join(parts))


CONVERT = """
import sys, threading, time
from swmcli.memory.measure import peak_rss_bytes
from swmcli.data.copy import copy_dataset
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
    """Peak RSS of converting Lance to HDF5 in a fresh process: flat (a quarter of the way = the
    end) when it streams."""
    done = subprocess.run(
        [sys.executable, "-c", CONVERT, str(src), str(dst)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    quarter, peak, seconds = (float(x) for x in done.stdout.split())
    steps = args.episodes * args.length
    raw = steps * args.resolution * args.resolution * 3
    print(
        f"convert lance -> hdf5 ({steps} steps, {format_bytes(raw)} of frames): {seconds:.1f} s;"
        f" peak RSS {format_bytes(quarter)} a quarter of the way, {format_bytes(peak)} at the end"
    )


if __name__ == "__main__":
    main()
