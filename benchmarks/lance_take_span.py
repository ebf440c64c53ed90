"""What one Lance take of a batch's rows costs as the rows it scatters over grow: the cost behind
Lance's loader rows of ``benchmarks/scale.py`` at 10,000 and 100,000 episodes.

    python benchmarks/lance_take_span.py
    python benchmarks/lance_take_span.py --rows 10000 40960 327680 --takes 50
    python benchmarks/lance_take_span.py --rows 1000000 --fragments 1 8 32
    python benchmarks/lance_take_span.py --rows 1920 --resolution 224 --fragments 1 8 64 --takes 30

For each size, one Lance file (one fragment, written by ``lance.write_dataset``; ``--fragments``
equal ones, each count in turn) holds that many rows of the scale benchmark's frames (8x8x3, or
``--resolution``; each an LZ4 frame as swm stores them); then the same kind of take as the
loader's, 64 clips of 3 consecutive rows at random starts (sorted), ``--takes`` times: the median
time of one take of the frames, and the CPU time the process spent a take (every thread's),
through Lance's plain local store (``file://``) and through its io_uring store
(``file+uring://``, what swm's readers use where the kernel allows it), and the
median time of a take of the small columns (action and reward) for comparison. The rows and their
bytes are the same at every size; only how far apart they lie changes. The last column is the floor
under any reader: 64 ``os.pread`` of 4 KiB at random offsets of the same file, from the page cache
(a small file's pages sit in the CPU's caches, a large one's do not). ``--datasets`` times the same
takes on existing swm Lance datasets too (those ``scale.py --keep DIR`` leaves, written episode by
episode and merged).
"""

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
from synth import make_episode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from swmcli.data.storage.lance import _image_field, _to_arrow, io_uring_allowed  # noqa: E402

CLIPS, HISTORY, LENGTH = 64, 3, 10


def table(rows: int, resolution: int):
    """``rows`` rows of the benchmark's episodes (each its own, as in ``scale.py``): pixels
    (LZ4 frames, in the column swm writes: no dictionary of a page's repeated frames), action,
    reward."""
    import pyarrow as pa

    episodes = [
        make_episode(seed, length=LENGTH, res=resolution) for seed in range(-(-rows // LENGTH))
    ]
    columns = {
        key: np.concatenate([episode[key] for episode in episodes])[:rows]
        for key in ("pixels", "action", "reward")
    }
    action, reward = _to_arrow(columns["action"], (2,)), _to_arrow(columns["reward"], ())
    schema = pa.schema(
        [_image_field("pixels"), pa.field("action", action.type), pa.field("reward", reward.type)]
    )
    pixels = _to_arrow(columns["pixels"], (resolution, resolution, 3))
    return pa.Table.from_arrays([pixels, action, reward], schema=schema)


def pread_ms(path: Path, takes: int, seed: int) -> float:
    """Median ms of 64 reads of 4 KiB at random 4 KiB-aligned offsets of the Lance data files
    under ``path`` (one file drawn per read, by its size), after 10 unmeasured rounds."""
    files = sorted((path / "data").glob("*.lance"))
    sizes = np.array([file.stat().st_size for file in files])
    descriptors = [os.open(file, os.O_RDONLY) for file in files]
    rng = np.random.default_rng(seed)
    times = []
    try:
        for index in range(takes + 10):
            which = rng.choice(len(files), CLIPS, p=sizes / sizes.sum())
            offsets = rng.integers(0, np.maximum(sizes[which] - 4096, 1)) // 4096 * 4096
            start = time.perf_counter()
            for file, offset in zip(which.tolist(), offsets.tolist(), strict=True):
                os.pread(descriptors[file], 4096, offset)
            if index >= 10:
                times.append(time.perf_counter() - start)
    finally:
        for descriptor in descriptors:
            os.close(descriptor)
    return 1000 * statistics.median(times)


def measure(lance, path: Path, takes: int) -> list[float]:
    """One table row's figures for the Lance dataset at ``path``."""
    plain = lance.dataset(str(path.absolute()))
    rows = plain.count_rows()
    frames = [take_ms(plain, rows, ["pixels"], takes, seed=0)]
    uring = None
    if io_uring_allowed():
        uring = lance.dataset("file+uring://" + str(path.absolute()))
        frames.append(take_ms(uring, rows, ["pixels"], takes, seed=0))
    else:
        frames.append((math.nan, math.nan))
    small, _ = take_ms(uring or plain, rows, ["action", "reward"], takes, seed=1)
    return [*(ms for pair in frames for ms in pair), small, pread_ms(path, takes, seed=2)]


def take_ms(dataset, rows: int, columns: list[str], takes: int, seed: int) -> tuple[float, float]:
    """Median ms of one take of 64 clips' rows at random starts, after 10 unmeasured takes, and
    the CPU ms the process (every thread of it, Lance's own) spent a take on average."""
    rng = np.random.default_rng(seed)
    batches = [
        np.unique(np.sort(rng.integers(0, rows - HISTORY, CLIPS))[:, None] + np.arange(HISTORY))
        for _ in range(takes + 10)
    ]
    times = []
    for index, batch in enumerate(batches):
        if index == 10:
            cpu = time.process_time()
        start = time.perf_counter()
        dataset.take(batch, columns=columns)
        if index >= 10:
            times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times), 1000 * (time.process_time() - cpu) / takes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--takes", type=int, default=200, help="takes timed per size and kind")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory on the disk")
    parser.add_argument("--datasets", type=Path, nargs="*", default=[], help="Lance datasets")
    parser.add_argument(
        "--fragments", type=int, nargs="+", default=[1],
        help="write each size as this many equal fragments, each count in turn (a take pays "
        "for each fragment it touches)",
    )  # fmt: skip
    parser.add_argument("--resolution", type=int, default=8, help="frames' height and width")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="lance is not fork-safe")
    import lance

    print(f"{CLIPS} clips of {HISTORY} rows a take, median of {args.takes}; (ratio to the first)")
    if not io_uring_allowed():
        print("io_uring: refused by this kernel or container (no figures through it)")
    print(
        "| rows | frames take, file:// | its CPU | frames take, file+uring:// | its CPU "
        f"| action + reward take | {CLIPS} preads of 4 KiB |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    base = None
    with tempfile.TemporaryDirectory(prefix="swm-take-span-", dir=args.dir) as scratch:
        for rows in args.rows:
            rows_table = table(rows, args.resolution)
            for fragments in args.fragments:
                path = Path(scratch) / f"span-{rows}-{fragments}.lance"
                lance.write_dataset(
                    rows_table,
                    str(path),
                    data_storage_version="2.1",
                    max_rows_per_file=-(-rows // fragments),
                )
                name = f"{rows:,}" + (f" in {fragments} fragments" if fragments > 1 else "")
                base = print_row(name, measure(lance, path, args.takes), base)
                shutil.rmtree(path)
    for path in args.datasets:
        rows = lance.dataset(str(path.absolute())).count_rows()
        base = print_row(f"{rows:,} ({path.name})", measure(lance, path, args.takes), base)


def print_row(name: str, row: list[float], base: list[float] | None) -> list[float]:
    """One table line, with the ratio to ``base`` (the first line's); returns the base."""
    base = base or row
    cells = [
        "-" if math.isnan(ms) else f"{ms:.2f} ms ({ms / first:.2f}x)"
        for ms, first in zip(row, base, strict=True)
    ]
    print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    return base


if __name__ == "__main__":
    main()
