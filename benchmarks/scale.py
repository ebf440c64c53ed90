"""Cost per item as a dataset grows: the same short episodes at 1k, 10k, 100k (1M) episodes, per
format, with every figure's ratio to the smallest size.

    python benchmarks/scale.py                                     # 1k and 10k, every format
    python benchmarks/scale.py --sizes 1000 10000 100000 --formats lance hdf5
    python benchmarks/scale.py --formats                           # the ReplayBuffer rows only
    python benchmarks/scale.py --formats lance --resolution 64     # frames of 64x64 pixels

For each format and size, in fresh forked processes (this one imports the libraries, so that
no figure includes an import, and never opens a dataset):

- write: the episodes (``make_episode(i, length=10, res=8)`` of ``benchmarks/synth.py``;
  ``--resolution`` sets ``res``) through ``open_writer``, one ``write_episode`` each, then
  ``close``: ms per episode, the longest ``write_episode`` (one that merged the most fragments)
  and the writer's peak RSS;
- append: ``open_writer`` on the finished dataset, one episode, ``close`` (what ``swm collect``
  pays per episode on an existing dataset);
- read: ``load_dataset`` (history 3) is the open time, ``make_loader`` (batch 64, 2 reader
  threads) to its first batch the first-batch time, then clips/s over the rest of that first
  epoch (every clip once: a row is checked against its checksum the first time a process reads
  it, so an epoch pays each row's check once whatever the size, where a fixed number of batches
  would pay more of them the larger the dataset; ``--checked-batches`` caps it, for folder
  datasets, whose PNG frames make an epoch of 10,000 episodes take minutes), then over
  ``--batches`` batches (or as many as ``--seconds`` allow: folder datasets decode PNGs) of a
  loader that skips the checks (the loader's own cost), each with the CPU time the process spent a
  clip (all its threads: what a busy machine moves less than clips/s), and the reader's peak RSS;
- bytes on disk per step.

``--assemble`` sizes (Lance and HDF5; a million episodes one ``write_episode`` at a time take
hours here) are written in one go instead, the same episodes in the layout the writer leaves
after writing them one at a time. Lance: in the fragments the writer's tiers leave
(``LanceWriter``'s own merge rule, played on the row counts, its largest fragments sized by the
bytes on disk of the first 1,000 episodes' rows), each fragment one Lance write of the rows a
writer would have merged into it. HDF5: the rows of 1,000 episodes at a time written by the
writer as one episode, then the index entries that make them the episodes they are (the same
datasets, chunks and values; the chunks lie in the file in another order). Their write figures
are left out (``-``).

The appends and reads run in ``--rounds`` rounds, each over every size, so that the machine's
load moves the sizes together; a figure is the median of the rounds (RSS: the largest).

Then the ReplayBuffer (``--buffer-steps``): filled to capacity with the same episodes, the time of
one ``add_episode`` (which evicts the oldest) and one ``sample(64)`` after it, what online training
pays per collected episode, the median of ``--buffer-rounds``.

A format's datasets are deleted before the next format. Compare ratios within one run (the
machine's load moves every row), and run two checkouts one after the other on the same machine
to compare them.
"""

import argparse
import json
import math
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

from loader import Unchecked  # benchmarks/loader.py, beside this file
from synth import make_episode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from swmcli.data.buffer import ReplayBuffer  # noqa: E402
from swmcli.data.formats import open_reader, open_writer  # noqa: E402
from swmcli.data.storage.location import nbytes_under  # noqa: E402
from swmcli.data.streaming import load_dataset, make_loader  # noqa: E402
from swmcli.memory.measure import peak_rss_bytes, reset_peak_rss  # noqa: E402

LENGTH, RESOLUTION, HISTORY_LEN, BATCH, WORKERS = 10, 8, 3, 64, 2
SUFFIXES = {"lance": ".lance", "hdf5": ".h5", "folder": ""}
EPISODES_A_WRITE = 1000  # episodes an assembling write holds (Arrow batch, HDF5 write)


def in_child(function, *args):
    """``function(*args)`` in a forked child (fresh state, its own peak RSS); its result."""
    receive, send = multiprocessing.get_context("fork").Pipe(duplex=False)

    def child() -> None:
        reset_peak_rss()
        try:
            send.send(function(*args))
        except BaseException as error:  # reported, not hidden: the row shows it
            send.send({"error": f"{type(error).__name__}: {error}"})

    process = multiprocessing.get_context("fork").Process(target=child)
    for wait in (1, 2, 4, 0):  # a shared machine can be out of processes for a moment
        try:
            process.start()
            break
        except BlockingIOError:
            if not wait:
                raise
            time.sleep(wait)
    send.close()
    result = receive.recv()
    process.join()
    if "error" in result:
        raise RuntimeError(result["error"])
    return result


def import_readers_and_writers() -> None:
    """What a process imports once whatever the dataset's size (``lance``, ``h5py``, PIL), here,
    before any child forks: a child's figures are then the cost of the dataset, not of imports.
    (Importing Lance is fork-safe; opening a dataset is not, and only children open them.)"""
    import h5py  # noqa: F401
    import lance  # noqa: F401
    import PIL.Image  # noqa: F401

    warnings.filterwarnings("ignore", message="lance is not fork-safe")


def write(path: Path, fmt: str, episodes: int) -> dict:
    start = time.perf_counter()
    writer = open_writer(path, format=fmt, mode="overwrite")
    longest = 0.0
    for index in range(episodes):
        episode = make_episode(index, length=LENGTH, res=RESOLUTION)
        began = time.perf_counter()
        writer.write_episode(episode)
        longest = max(longest, time.perf_counter() - began)
    writer.close()
    seconds = time.perf_counter() - start
    return {
        "write_ms": 1000 * seconds / episodes,
        "longest_write_s": longest,
        "write_rss": peak_rss_bytes(),
    }


def assemble(path: Path, fmt: str, episodes: int) -> dict:
    """``episodes`` episodes written in one go in the layout the writer leaves; no write
    figures."""
    {"lance": assemble_lance, "hdf5": assemble_hdf5}[fmt](path, episodes)
    return {"write_ms": None, "longest_write_s": None, "write_rss": None}


def assemble_lance(path: Path, episodes: int) -> None:
    """``episodes`` episodes as a Lance dataset in the fragments the writer's tiers leave after
    writing them one at a time."""
    import lance
    import pyarrow as pa

    from swmcli.data.storage.lance import _STORAGE_VERSION, _merge_group, _uri

    guarded = open_writer(path, format="lance", mode="overwrite")  # holds the writer lock
    writer = guarded._writer
    writer._start(make_episode(0, length=LENGTH, res=RESOLUTION))
    # The writer sizes its largest fragments by the bytes a row takes on disk: those of the first
    # 1,000 episodes, written here as one fragment.
    probe = path.with_name(path.name + ".probe")
    lance.write_dataset(
        pa.RecordBatchReader.from_batches(writer._arrow, rows_of(writer, 0, min(episodes, 1000))),
        _uri(probe),
        data_storage_version=_STORAGE_VERSION,
    )
    small, large = writer._merge_limits(lance.dataset(_uri(probe)).get_fragments())
    shutil.rmtree(probe)
    fragments: list[int] = []  # episodes a fragment
    for index in range(episodes):
        fragments.append(1)
        for closing in (False, True) if index == episodes - 1 else (False,):
            while group := _merge_group([n * LENGTH for n in fragments], small, large, closing):
                fragments[group] = [sum(fragments[group])]
    first = 0
    for count in fragments:
        lance.write_dataset(
            pa.RecordBatchReader.from_batches(writer._arrow, rows_of(writer, first, count)),
            _uri(path),
            mode="append" if first else "create",
            max_rows_per_file=count * LENGTH,
            data_storage_version=_STORAGE_VERSION,
        )
        first += count
    guarded.close()


def assemble_hdf5(path: Path, episodes: int) -> None:
    """``episodes`` episodes as an HDF5 file: the rows of 1,000 episodes at a time written as one
    episode, then the index entries of the episodes they are."""
    import numpy as np

    guarded = open_writer(path, format="hdf5", mode="overwrite")  # holds the writer lock
    writer = guarded._writer
    for first in range(0, episodes, EPISODES_A_WRITE):
        stop = min(first + EPISODES_A_WRITE, episodes)
        block = [make_episode(i, length=LENGTH, res=RESOLUTION) for i in range(first, stop)]
        lengths = np.array([len(episode["action"]) for episode in block])
        start = writer.num_steps
        writer.write_episode({key: np.concatenate([e[key] for e in block]) for key in block[0]})
        file = writer._file
        file["episode_idx"][start:] = np.repeat(np.arange(first, stop), lengths)
        file["step_idx"][start:] = np.concatenate([np.arange(length) for length in lengths])
        offsets = start + np.cumsum(lengths) - lengths
        for name, values in (("episode_offsets", offsets), ("episode_lengths", lengths)):
            file[name].resize(stop, axis=0)
            file[name][first:] = values
        file.flush()
        writer.num_episodes = stop
    guarded.close()


def rows_of(writer, first: int, count: int):
    """Episodes ``first .. first + count - 1`` as the writer builds their rows, in Arrow
    batches of up to ``EPISODES_A_WRITE`` episodes."""
    import pyarrow as pa

    for start in range(first, first + count, EPISODES_A_WRITE):
        indices = range(start, min(start + EPISODES_A_WRITE, first + count))
        episodes = (make_episode(i, length=LENGTH, res=RESOLUTION) for i in indices)
        yield from pa.concat_tables(
            [writer._table(episode, i) for i, episode in zip(indices, episodes, strict=True)]
        ).to_batches()


def append(path: Path, seed: int) -> dict:
    episode = make_episode(seed, length=LENGTH, res=RESOLUTION)
    start = time.perf_counter()
    writer = open_writer(path, mode="append")
    writer.write_episode(episode)
    writer.close()
    seconds = time.perf_counter() - start
    reader = open_reader(path)
    steps = int(reader.episode_lengths.sum())
    reader.close()
    return {"append_s": seconds, "steps": steps}


def read(path: Path, batches: int, checked_batches: int, seconds: float = math.inf) -> dict:
    start = time.perf_counter()
    dataset = load_dataset(path, history_len=HISTORY_LEN)
    opened = time.perf_counter()
    loader = make_loader(dataset, batch_size=BATCH, num_workers=WORKERS, seed=0)
    batches_of = iter_batches(loader)
    next(batches_of)
    first = time.perf_counter()
    # The rest of the first epoch (at least one batch: a toy dataset's epoch can be one batch).
    checked, checked_cpu = time_batches(
        batches_of, checked_batches or max(1, len(loader) - 1), math.inf
    )
    dataset.__class__ = Unchecked
    batches_of = iter_batches(make_loader(dataset, batch_size=BATCH, num_workers=WORKERS, seed=1))
    next(batches_of)
    unchecked, unchecked_cpu = time_batches(batches_of, batches, seconds)
    return {
        "open_s": opened - start,
        "first_batch_s": first - opened,
        "clips_per_s": checked,
        "clip_cpu_us": checked_cpu,
        "unchecked_per_s": unchecked,
        "unchecked_cpu_us": unchecked_cpu,
        "read_rss": peak_rss_bytes(),
    }


def iter_batches(loader):
    """The loader's batches, epoch after epoch."""
    while True:
        yield from loader


def time_batches(batches_of, batches: int, seconds: float) -> tuple[float, float]:
    """Clips/s over the next ``batches`` batches (fewer where ``seconds`` pass first), and the
    CPU time the process (every thread of it: the reader threads, Lance's own) spent a clip, in
    µs: less moved by a busy machine."""
    start, cpu = time.perf_counter(), time.process_time()
    done = 0
    while done < batches and (done == 0 or time.perf_counter() - start < seconds):
        next(batches_of)
        done += 1
    clips = done * BATCH
    return clips / (time.perf_counter() - start), 1e6 * (time.process_time() - cpu) / clips


def buffer_round(steps: int, rounds: int) -> dict:
    episodes = [make_episode(seed, length=LENGTH, res=RESOLUTION) for seed in range(64)]
    buffer = ReplayBuffer(max_steps=steps, history_len=HISTORY_LEN)
    for index in range(steps // LENGTH):
        buffer.add_episode(episodes[index % len(episodes)])
    times = []
    for index in range(rounds):
        start = time.perf_counter()
        buffer.add_episode(episodes[index % len(episodes)])
        buffer.sample(BATCH)
        times.append(time.perf_counter() - start)
    return {"us": 1e6 * statistics.median(times), "rss": peak_rss_bytes() / 2**20}


COLUMNS = [  # (key, heading, format)
    ("write_ms", "write ms/ep", "{:.2f}"),
    ("longest_write_s", "longest write_episode s", "{:.2f}"),
    ("write_rss", "write RSS MB", "{:.0f}"),
    ("append_s", "append s", "{:.3f}"),
    ("open_s", "open s", "{:.3f}"),
    ("first_batch_s", "1st batch s", "{:.3f}"),
    ("clips_per_s", "epoch clips/s", "{:.0f}"),
    ("clip_cpu_us", "epoch CPU µs/clip", "{:.1f}"),
    ("unchecked_per_s", "unchecked clips/s", "{:.0f}"),
    ("unchecked_cpu_us", "unchecked CPU µs/clip", "{:.1f}"),
    ("read_rss", "read RSS MB", "{:.0f}"),
    ("disk_per_step", "disk B/step", "{:.0f}"),
]


def measure(scratch: Path, fmt: str, sizes: list[int], args) -> dict[int, dict]:
    """Every size's row: the writes one after the other, then the appends and reads in rounds,
    each round over every size (the machine's load moves them together), medians of the rounds."""
    name = "data-{}" if RESOLUTION == 8 else f"data-{{}}-{RESOLUTION}px"
    paths = {size: scratch / (name.format(size) + SUFFIXES[fmt]) for size in sizes}
    rows = {
        size: written(paths[size], fmt, size, args.keep, size in args.assemble) for size in sizes
    }
    rounds = {size: [] for size in sizes}
    for number in range(args.rounds):
        for size in sizes:
            measured = in_child(append, paths[size], size + number)
            reading = (paths[size], args.batches, args.checked_batches, args.seconds)
            measured.update(in_child(read, *reading))
            rounds[size].append(measured)
    for size, row in rows.items():
        for key in rounds[size][0]:
            values = [measured[key] for measured in rounds[size]]
            row[key] = max(values) if key == "read_rss" else statistics.median(values)
        row["disk_per_step"] = nbytes_under(paths[size]) / (rounds[size][-1]["steps"])
        for key in ("write_rss", "read_rss"):
            row[key] = None if row[key] is None else row[key] / 2**20
        if not args.keep:
            remove(paths[size])
    return rows


def written(path: Path, fmt: str, episodes: int, keep: bool, assembled: bool) -> dict:
    """The write's row: written now (``assembled``: by ``assemble``), or (``--keep``) read back
    from the record of an earlier run that wrote this dataset (its appends since then are in its
    episode count)."""
    record = path.with_name(path.name + ".json")
    if keep and record.exists() and path.exists():
        return json.loads(record.read_text())
    remove(path)
    row = in_child(assemble if assembled else write, path, fmt, episodes)
    if keep:
        record.write_text(json.dumps(row))
    return row


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def print_row(fmt: str, size: int, row: dict, base: dict) -> None:
    cells = []
    for key, _, spec in COLUMNS:
        value, reference = row.get(key), base.get(key)  # a kept record may predate a column
        if value is None or reference is None:
            cells.append("-" if value is None else spec.format(value))
            continue
        cell = spec.format(value)
        if base is not row:
            cell += f" ({value / reference:.2f}x)"
        cells.append(cell)
    print(f"| {fmt} | {size:,} | " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    global RESOLUTION  # read by the forked children that write and read the episodes
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000], help="episodes")
    parser.add_argument("--formats", nargs="*", default=list(SUFFIXES), choices=list(SUFFIXES))
    # 100 batches of small frames pass in a fifth of a second, where this VM's speed moves.
    parser.add_argument("--batches", type=int, default=1000, help="unchecked batches timed")
    parser.add_argument(
        "--seconds", type=float, default=5.0, help="at most this long timing unchecked batches"
    )
    parser.add_argument(
        "--checked-batches", type=int, default=0,
        help="checked batches timed (0: the rest of the first epoch)",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3, help="appends and reads per size")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory on the disk")
    parser.add_argument(
        "--assemble", type=int, nargs="*", default=[],
        help="sizes (Lance, HDF5) written in one go in the writer's layout, not episode by episode",
    )  # fmt: skip
    parser.add_argument(
        "--keep", type=Path, default=None,
        help="keep the datasets in this directory and reuse them in later runs (no rewrite)",
    )  # fmt: skip
    parser.add_argument(
        "--buffer-steps", type=int, nargs="*", default=[10_000, 100_000, 1_000_000],
        help="ReplayBuffer capacities (none: no buffer rows)",
    )  # fmt: skip
    parser.add_argument("--buffer-rounds", type=int, default=3000, help="add + sample timed")
    parser.add_argument("--resolution", type=int, default=RESOLUTION, help="frames' side")
    args = parser.parse_args()
    RESOLUTION = args.resolution
    if args.assemble and not set(args.formats) <= {"lance", "hdf5"}:
        parser.error("--assemble writes Lance and HDF5 datasets: give --formats lance hdf5")
    import_readers_and_writers()
    print(
        f"episodes of {LENGTH} steps, {RESOLUTION}x{RESOLUTION} frames; history {HISTORY_LEN},"
        f" batch {BATCH}, {WORKERS} reader threads; {os.cpu_count()} CPUs, load average"
        f" {os.getloadavg()[0]:.1f}; swmcli from {ROOT}; (ratio to the smallest size)"
    )
    if args.formats:
        print("| format | episodes | " + " | ".join(h for _, h, _ in COLUMNS) + " |")
        print("| --- " * (len(COLUMNS) + 2) + "|")
    scratch = args.keep or Path(tempfile.mkdtemp(prefix="swm-scale-", dir=args.dir))
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        for fmt in args.formats:
            rows = measure(scratch, fmt, sorted(args.sizes), args)
            base = rows[min(rows)]
            for size, row in rows.items():
                print_row(fmt, size, row, base)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    base = None
    for steps in sorted(args.buffer_steps):
        row = in_child(buffer_round, steps, args.buffer_rounds)
        base = base or row
        print(
            f"buffer of {steps:,} steps: add_episode + sample({BATCH}) {row['us']:.0f} us"
            f" ({row['us'] / base['us']:.2f}x), peak RSS {row['rss']:.0f} MB",
            flush=True,
        )
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
