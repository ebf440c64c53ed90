"""Streaming clips from a local Lance dataset vs the same dataset on S3-compatible object storage.

    python3 benchmarks/object_store.py                  # a moto server on loopback, started here
    AWS_ENDPOINT_URL=... python3 benchmarks/object_store.py --uri s3://bucket/prefix  # your store

Same episodes (``make_episode`` of ``benchmarks/synth.py``, as benchmarks/loader.py), same
loader for both rows (``load_dataset`` + ``make_loader``: batch 64, 2 reader threads, history 4,
frameskip 2). Prints clips/s after the warm-up batches, the time to the first batch, and the
object store's rate as a fraction of the local one; checks the first batches are identical.
Loopback moto measures swm's and Lance's per-request overhead (and moto's own, a Python server on
the same cores), not a network: a real store adds its latency, which more readers hide.
"""

import argparse
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from loader import BATCH, FRAMESKIP, HISTORY_LEN, WORKERS, stream
from synth import make_episode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from swmcli.data.formats import open_writer
from swmcli.data.storage.location import as_location, filesystem, nbytes_under
from swmcli.data.streaming import load_dataset


@contextmanager
def loopback_s3(bucket: str):
    """A moto S3 server on a free loopback port with ``bucket`` made, and the AWS variables set."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="test",
        AWS_SECRET_ACCESS_KEY="test",
        AWS_DEFAULT_REGION="us-east-1",
    )
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        filesystem().mkdir(bucket)
        yield f"s3://{bucket}/bench"
    finally:
        server.terminate()
        server.wait()


def write_both(args, locations) -> None:
    """The same episodes to every location (run in a child: this process stays fork-safe)."""
    writers = [open_writer(where, mode="overwrite") for where in locations]
    for index in range(args.steps // args.episode_len):
        episode = make_episode(index, args.episode_len, args.resolution)
        for writer in writers:
            writer.write_episode(episode)
    for writer in writers:
        writer.close()


def run(args, prefix: str, scratch: Path) -> None:
    print(
        f"{args.steps // args.episode_len} episodes x {args.episode_len} steps, "
        f"{args.resolution}x{args.resolution}; history {HISTORY_LEN}, frameskip {FRAMESKIP}, "
        f"batch {BATCH}, {WORKERS} workers; {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f}; object store {os.environ['AWS_ENDPOINT_URL']}"
    )
    sources = {"local": scratch / "data.lance", "object store": f"{prefix}/data.lance"}
    writer = multiprocessing.get_context("fork").Process(
        target=write_both, args=(args, list(sources.values()))
    )
    writer.start()
    writer.join()
    print(f"{'source':<13} {'clips/s':>8} {'first batch':>11} {'stored':>10}")
    rows, firsts = {}, {}
    for name, where in sources.items():

        def open_source(where=where):
            return load_dataset(where, history_len=HISTORY_LEN, frameskip=FRAMESKIP)

        rows[name] = stream(open_source, args.batches)
        firsts[name] = rows[name].pop("first")
        print(
            f"{name:<13} {rows[name]['clips_per_s']:>8.0f} {rows[name]['first_batch_s']:>10.2f}s"
            f" {nbytes_under(as_location(where)) / 2**20:>7.1f} MiB"
        )
    ratio = rows["object store"]["clips_per_s"] / rows["local"]["clips_per_s"]
    local, remote = firsts["local"], firsts["object store"]
    same = all(np.array_equal(local[k], remote[k], equal_nan=True) for k in local)
    print(f"object store / local clips/s: {ratio:.2f}; first batches identical: {same}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000, help="rows in the dataset")
    parser.add_argument("--episode-len", type=int, default=100)
    parser.add_argument("--resolution", type=int, default=224)
    parser.add_argument("--batches", type=int, default=20, help="batches timed per row")
    parser.add_argument("--uri", default=None, help="s3://bucket/prefix (default: moto here)")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="swm-object-store-"))
    try:
        if args.uri:
            run(args, args.uri.rstrip("/"), scratch)
        else:
            with loopback_s3("swm-bench") as prefix:
                run(args, prefix, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
