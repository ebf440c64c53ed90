"""Reading colder than the page cache: the loader's clips/s on a dataset of incompressible
224x224 frames read from the disk, as a fraction of the disk's own random-read bandwidth.

    python benchmarks/cold_read.py                                  # 30 GB, lance then hdf5
    python benchmarks/cold_read.py --gb 4 --formats hdf5 --seconds 10
    python benchmarks/cold_read.py --compare /path/to/other          # and other checkouts' loaders

Per format, one dataset at a time (deleted before the next unless ``--keep``):

- write: ``--gb`` GB (10^9 bytes) of 224x224x3 uint8 frames through ``open_writer``, episodes of
  ``--length`` steps with an action column, one ``write_episode`` each, then ``close``: MB/s of
  pixels (10^6 bytes) over the write's wall time. The frames are noise no codec shrinks: a pool
  of random frames, each row's first pixel row drawn afresh (no two rows alike);
- cold: every file of the dataset fsynced, then dropped from the page cache with
  ``posix_fadvise(POSIX_FADV_DONTNEED)`` (the page cache's size, from /proc/meminfo, is printed
  beside it): the first read of each frame then comes from the disk;
- the disk: ``os.pread`` of blocks of one stored frame's size (the dataset's bytes on disk per
  frame) at 4 KiB-aligned slots of the dataset's own files, in a random order and each slot
  once (no read finds another's pages cached), by ``--threads`` threads (the loader's), then by
  ``--disk-threads`` threads, each for ``--disk-seconds``: MB/s; the files are made cold before
  and after;
- the loader: ``load_dataset(history_len=4, frameskip=2)`` and ``make_loader(batch_size=64,
  num_workers=2)``, in a fresh process (a new ``swm train``), timed from its second batch for
  ``--seconds``: clips/s, MB/s of pixels delivered, and that as a fraction of the disk's
  bandwidth at the same number of threads (and at ``--disk-threads``); then the same for what
  the process read from the disk ("from disk": ``read_bytes`` of /proc/self/io), the pixels
  the page cache did not serve (a clip's frames recur in three other clips: the longer the read
  against the dataset's size, the more of them the page cache still holds). ``--compare``: other
  checkouts' loaders on the same data, interleaved over ``--rounds``, each read from cold.

A dataset smaller than an eighth of the available memory is read ahead into the page cache when the
loader opens it (``read_ahead``): the read is then not cold, and the script says so. Compare the
ratios within one run: the machine's load moves every row.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from loader import drop_from_page_cache  # benchmarks/loader.py, beside this file
from scale import SUFFIXES, import_readers_and_writers, in_child, remove

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from swmcli.data.formats import open_writer  # noqa: E402
from swmcli.data.storage.location import nbytes_under  # noqa: E402
from swmcli.host import available_host_bytes  # noqa: E402

RESOLUTION, HISTORY_LEN, FRAMESKIP, BATCH = 224, 4, 2, 64
FRAME_BYTES = RESOLUTION * RESOLUTION * 3
POOL = 64  # random frames that the rows are drawn from
MB = 1e6


def noise_frames(episodes: int, length: int):
    """``episodes`` episodes of incompressible frames with an action column, made cheaply: each
    row is a frame of a random pool with its first pixel row drawn afresh."""
    rng = np.random.default_rng(0)
    pool = rng.integers(0, 256, (POOL, RESOLUTION, RESOLUTION, 3), dtype=np.uint8)
    for index in range(episodes):
        pixels = pool[(index * length + np.arange(length)) % POOL]
        pixels[:, 0] = rng.integers(0, 256, (length, RESOLUTION, 3), dtype=np.uint8)
        action = rng.uniform(-1, 1, (length, 2)).astype(np.float32)
        yield {"pixels": pixels, "action": action}


def write(path: Path, fmt: str, episodes: int, length: int) -> dict:
    """The dataset, written through ``open_writer``; MB/s of pixels over the whole write."""
    made = noise_frames(episodes, length)
    start = time.perf_counter()
    writer = open_writer(path, format=fmt, mode="overwrite")
    for episode in made:
        writer.write_episode(episode)
    writer.close()
    seconds = time.perf_counter() - start
    return {"write_mb_s": episodes * length * FRAME_BYTES / MB / seconds}


def page_cache_bytes() -> int:
    """The page cache's size now (``Cached`` in /proc/meminfo)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Cached:"):
            return int(line.split()[1]) * 1024
    return 0


def disk_bandwidth(path: Path, block: int, threads: int, seconds: float) -> float:
    """MB/s of ``threads`` threads ``os.pread``-ing ``block`` bytes each at 4 KiB-aligned slots of
    the files under ``path``, taken in a random order, each slot once (no read finds another's
    pages in the cache), for ``seconds`` or until every slot is read."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    stride = -(-block // 4096) * 4096
    slots = [
        (file, start) for file in files for start in range(0, file.stat().st_size - block, stride)
    ]
    order = iter(np.random.default_rng(0).permutation(len(slots)).tolist())
    taking = threading.Lock()
    descriptors = {file: os.open(file, os.O_RDONLY) for file in files}
    totals = [0] * threads
    deadline = time.perf_counter() + seconds

    def reader(number: int) -> None:
        while time.perf_counter() < deadline:
            with taking:
                slot = next(order, None)
            if slot is None:
                return
            file, start = slots[slot]
            totals[number] += len(os.pread(descriptors[file], block, start))

    start = time.perf_counter()
    workers = [threading.Thread(target=reader, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - start
    for descriptor in descriptors.values():
        os.close(descriptor)
    return sum(totals) / MB / elapsed


READ = """
import json, sys, time, warnings
warnings.filterwarnings("ignore", message="lance is not fork-safe")
import h5py, lance, PIL.Image  # what any reader imports, before the clock starts
from swmcli.data.streaming import load_dataset, make_loader
path, threads, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
history, frameskip, batch = (int(value) for value in sys.argv[4:7])
start = time.perf_counter()
dataset = load_dataset(path, history_len=history, frameskip=frameskip)
loader = make_loader(dataset, batch_size=batch, num_workers=threads, seed=0)
if not len(loader):
    raise SystemExit(f"{dataset.num_clips} clips: fewer than one batch of {batch}")
def batches():
    while True:
        yield from loader
read = batches()
next(read)
first = time.perf_counter() - start
def disk_bytes():  # what this process read from the disk (the page cache's hits excluded)
    with open("/proc/self/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("read_bytes"))
count, start, disk = 0, time.perf_counter(), disk_bytes()
while time.perf_counter() - start < seconds:
    pixels = next(read)["pixels"]
    count += 1
elapsed = time.perf_counter() - start
disk = disk_bytes() - disk
import swmcli
print(json.dumps({"swmcli": swmcli.__file__, "clips_per_s": count * batch / elapsed,
                  "first_batch_s": first,
                  "pixels_mb_s": count * pixels.numel() / 1e6 / elapsed,
                  "from_disk": disk / (count * pixels.numel())}))
"""


def read(tree: Path, path: Path, args) -> dict:
    """The loader of the checkout at ``tree`` reading ``path`` from cold, in a fresh process."""
    drop_from_page_cache(path)
    command = [
        sys.executable, "-c", READ, str(path), str(args.threads), str(args.seconds),
        str(HISTORY_LEN), str(FRAMESKIP), str(args.batch),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree)}
    # Run in ``tree``: a ``-c`` script's path starts with its working directory.
    done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"the read by {tree} failed:\n{done.stderr}")
    got = json.loads(done.stdout.splitlines()[-1])
    if not got.pop("swmcli").startswith(str(tree)):
        raise SystemExit(f"the read meant for {tree} imported another swmcli")
    return got


def measure(scratch: Path, fmt: str, trees: list[Path], args) -> dict:
    """One format's figures: the write, the disk at both thread counts, each checkout's reads."""
    path = scratch / f"cold{SUFFIXES[fmt]}"
    episodes = max(1, round(args.gb * 1e9 / (args.length * FRAME_BYTES)))
    record = path.with_name(path.name + ".json")
    if args.keep and record.exists() and path.exists():
        row = json.loads(record.read_text())
    else:
        remove(path)
        row = in_child(write, path, fmt, episodes, args.length)
        if args.keep:
            record.write_text(json.dumps(row))
    stored = nbytes_under(path)
    block = stored // (episodes * args.length)
    drop_from_page_cache(path)
    free = available_host_bytes()
    print(
        f"{fmt}: {stored / 1e9:.1f} GB on disk ({block:,} B a frame); page cache"
        f" {page_cache_bytes() / 1e9:.1f} GB once it is dropped, {free / 1e9:.1f} GB available",
        flush=True,
    )
    if stored < free // 8:
        print(f"{fmt}: under an eighth of the available memory: read ahead by the loader, not cold")
    for threads in (args.threads, args.disk_threads):
        row[f"disk_{threads}"] = disk_bandwidth(path, block, threads, args.disk_seconds)
        drop_from_page_cache(path)
    reads = {tree: [] for tree in trees}
    for _ in range(args.rounds):
        for tree in trees:
            reads[tree].append(read(tree, path, args))
    row["reads"] = {
        tree: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        for tree, runs in reads.items()
    }
    row["stored"] = stored
    if not args.keep:
        remove(path)
    return row


def print_rows(fmt: str, row: dict, args) -> None:
    """One line per checkout: the loader's MB/s, delivered and read from the disk, each as a
    fraction of the disk's own bandwidth at the loader's threads and at ``--disk-threads``."""
    t, d = args.threads, args.disk_threads
    print(
        f"| format | checkout | write MB/s | disk {t} thr MB/s | disk {d} thr MB/s | clips/s"
        f" | pixels MB/s | x disk {t} thr | x disk {d} thr | from disk MB/s | x disk {t} thr"
        f" | x disk {d} thr | 1st batch s |"
    )
    print("| --- " * 13 + "|")
    near, far = row[f"disk_{t}"], row[f"disk_{d}"]
    for tree, got in row["reads"].items():
        delivered = got["pixels_mb_s"]
        read = delivered * got["from_disk"]
        cells = [fmt, str(tree), f"{row['write_mb_s']:.0f}", f"{near:.0f}", f"{far:.0f}"]
        cells += [f"{got['clips_per_s']:.0f}", f"{delivered:.0f}"]
        cells += [f"{delivered / near:.2f}", f"{delivered / far:.2f}", f"{read:.0f}"]
        cells += [f"{read / near:.2f}", f"{read / far:.2f}", f"{got['first_batch_s']:.2f}"]
        print("| " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=30, help="pixels per dataset, 10^9 bytes")
    parser.add_argument("--length", type=int, default=100, help="steps per episode")
    parser.add_argument(
        "--formats", nargs="+", default=["lance", "hdf5"], choices=["lance", "hdf5"]
    )
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--threads", type=int, default=2, help="the loader's reader threads")
    parser.add_argument("--disk-threads", type=int, default=8, help="the disk's second measure")
    parser.add_argument("--seconds", type=float, default=15, help="each loader read, timed")
    parser.add_argument("--disk-seconds", type=float, default=10, help="each disk measure")
    parser.add_argument("--rounds", type=int, default=1, help="cold reads per checkout")
    parser.add_argument("--compare", type=Path, nargs="*", default=[], help="other checkouts")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory on the disk")
    parser.add_argument(
        "--keep", type=Path, default=None,
        help="keep the datasets in this directory and reuse them in later runs (no rewrite)",
    )  # fmt: skip
    args = parser.parse_args()
    import_readers_and_writers()
    trees = [ROOT, *(tree.resolve() for tree in args.compare)]
    print(
        f"{args.gb:g} GB of {RESOLUTION}x{RESOLUTION}x3 noise frames per format, episodes of"
        f" {args.length} steps; history {HISTORY_LEN}, frameskip {FRAMESKIP}, batch {args.batch},"
        f" {args.threads} reader threads; {os.cpu_count()} CPUs, load average"
        f" {os.getloadavg()[0]:.1f}; page cache {page_cache_bytes() / 1e9:.1f} GB; MB = 10^6 B"
    )
    scratch = args.keep or Path(tempfile.mkdtemp(prefix="swm-cold-", dir=args.dir))
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        for fmt in args.formats:  # each format's table as soon as it is measured
            row = measure(scratch, fmt, trees, args)
            print_rows(fmt, row, args)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
