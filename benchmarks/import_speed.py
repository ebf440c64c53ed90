"""Bring your data, at swm's speed: a stable-worldmodel Lance dataset read by its own loader, by
swm directly, and by swm after ``swm convert``, on the very same episodes, in one run.

    python benchmarks/import_speed.py --upstream-python UPVENV/bin/python --repeats 2

The upstream row is ``benchmarks/upstream_loader_bench.py`` run with the interpreter of a
separate venv holding stable-worldmodel 0.1.1 (see ``benchmarks/loader.py``): it writes the
``benchmarks/synth.py`` episodes with upstream's own writer (frames as JPEG q95) and times its own
``load_dataset`` + DataLoader (history 4, frameskip 2, batch 64, 2 workers, cold cache). Then, on
the dataset upstream wrote: swm's reader streams it as it is ("swm, direct": JPEG decoded per
row), ``copy_dataset`` converts it into swm's Lance (timed, peak memory of the converting process
reported: it streams episode by episode), and swm streams the converted copy ("swm, converted":
raw frames, lossless from there on). Every swm row runs in a fresh forked process with the
dataset dropped from the page cache, as ``benchmarks/loader.py`` does. Without
``--upstream-python``, the episodes are written in upstream's layout by ``swm convert --layout
stable-worldmodel`` instead and the upstream row is absent.
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from loader import (  # benchmarks/loader.py: the same rows, the same settings
    drop_from_page_cache,
    median_and_range,
    run_upstream,
    stream_in_child,
)
from synth import make_episode

from swmcli.data.formats import open_writer
from swmcli.data.storage.location import nbytes_under
from swmcli.data.streaming import load_dataset
from swmcli.memory.measure import peak_rss_bytes


def write_upstream_layout(args, scratch: Path) -> Path:
    """The synth episodes in upstream's Lance layout, written by swm's export (no upstream)."""
    from swmcli.data.exports.layouts import export_dataset

    native = scratch / "native.lance"
    with open_writer(native, mode="error", metadata={}) as writer:
        for index in range(args.episodes):
            writer.write_episode(make_episode(args.seed + index, args.length, args.resolution))
    path = scratch / "upstream" / "bench.lance"
    export_dataset(native, path)
    return path


def in_child(function):
    """``function()``'s result, computed in a forked process (this one never opens Lance, so
    every row's DataLoader may fork), with that process's peak RSS."""
    import multiprocessing

    receive, send = multiprocessing.get_context("fork").Pipe(duplex=False)

    def child() -> None:
        send.send((function(), peak_rss_bytes()))

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    send.close()
    result = receive.recv()
    process.join()
    return result


def convert(src: Path, dst: Path) -> float:
    """``swm convert`` (``copy_dataset``): its seconds."""
    from swmcli.data.copy import copy_dataset

    start = time.perf_counter()
    copy_dataset(src, dst)
    return time.perf_counter() - start


def swm_row(path: Path, batches: int) -> dict:
    drop_from_page_cache(path)
    return stream_in_child(
        lambda: load_dataset(path, history_len=4, frameskip=2), batches, processes=False
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=40)
    parser.add_argument("--length", type=int, default=100, help="steps per episode")
    parser.add_argument("--resolution", type=int, default=224)
    parser.add_argument("--batches", type=int, default=40, help="batches timed per row")
    parser.add_argument("--repeats", type=int, default=2, help="rounds over every swm row")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--upstream-python", type=Path, default=None, help="upstream venv python")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory on the disk")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="swm-import-") as scratch:
        run(args, Path(scratch))


def run(args, scratch: Path) -> None:
    upstream = run_upstream(args, scratch)
    source = scratch / "upstream" / "bench.lance"  # where run_upstream keeps it
    if not upstream:
        source, _ = in_child(lambda: write_upstream_layout(args, scratch))
    converted = scratch / "converted.lance"
    convert_seconds, convert_peak = in_child(lambda: convert(source, converted))
    rows = {"swm, direct": [], "swm, converted": []}
    for _ in range(args.repeats):  # interleaved: the machine's load moves both rows together
        rows["swm, direct"].append(swm_row(source, args.batches))
        rows["swm, converted"].append(swm_row(converted, args.batches))
    speeds = {name: [r["clips_per_s"] for r in runs] for name, runs in rows.items()}
    if upstream:
        speeds["upstream (its loader)"] = [r["clips_per_s"] for r in upstream]
    base = statistics.median(speeds["upstream (its loader)"]) if upstream else None
    print(f"{args.episodes} episodes x {args.length} steps, {args.resolution}px, batch 64, "
          f"history 4, frameskip 2, 2 readers, cold cache, {args.repeats} rounds")  # fmt: skip
    print(f"{'source':<24} {'clips/s median (range)':>24} {'x upstream':>10}")
    for name, values in speeds.items():
        ratio = f"{statistics.median(values) / base:.2f}" if base else "-"
        print(f"{name:<24} {median_and_range(values, '.0f'):>24} {ratio:>10}")
    print(
        f"swm convert: {convert_seconds:.1f} s for {args.episodes * args.length} steps, "
        f"peak RSS {convert_peak / 2**20:.0f} MiB; on disk: upstream "
        f"{nbytes_under(source) / 2**20:.1f} MiB, "
        f"converted {nbytes_under(converted) / 2**20:.1f} MiB"
    )


if __name__ == "__main__":
    main()
