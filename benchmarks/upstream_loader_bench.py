"""stable-worldmodel's own writer and loader on the synthetic episodes, timed as swm's rows are.

Run with the interpreter of a separate venv that holds stable-worldmodel, never swm's::

    python -m venv UPVENV && UPVENV/bin/pip install torch==2.13.0 \\
        && UPVENV/bin/pip install stable-worldmodel==0.1.1 opencv-python-headless imageio h5py
    UPVENV/bin/python benchmarks/upstream_loader_bench.py --json upstream.json

``benchmarks/loader.py`` and ``benchmarks/import_speed.py`` run it for their upstream row
(``--upstream-python UPVENV/bin/python``). This script only imports the installed package and
contains none of its code; the episodes are ``make_episode(seed + i)`` of ``synth.py`` beside it
(pure numpy), the very ones the swm rows write.

1. **write**, in a fresh process: ``get_format("lance").open_writer(path, mode="overwrite")`` and
   ``write_episodes(...)``, the streaming path ``World.collect`` takes, each episode handed over
   as a dict of per-step lists (what ``World.collect`` produces; upstream's Lance writer refuses
   whole-episode arrays). Frames are stored as JPEG quality 95, upstream's default.
2. **load**, ``--repeats`` times, each in a fresh process with the dataset's pages dropped from
   the page cache first (cold, as swm's rows): ``load_dataset(path, num_steps=HISTORY,
   frameskip=FRAMESKIP)`` and ``torch.utils.data.DataLoader(ds, batch_size, shuffle=True,
   num_workers, generator=<seeded>)``. It times the first batch (workers' start-up included:
   upstream's Lance reader switches to ``spawn``, so each worker imports the package again), then
   ``--batches`` batches after ``--warmup``, and reports clips/s. The first batch is timed from
   ``load_dataset``, as swm's rows time theirs from opening the dataset.

``num_steps`` is upstream's name for the history length. Prints one JSON summary (also written
to ``--json``): ``write.disk_bytes`` and, per load, ``open_s``, ``first_batch_s``,
``clips_per_s`` and the multiprocessing start method.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def drop_from_page_cache(path: Path) -> None:
    """Ask the kernel to forget the dataset's cached pages (per file, no root needed)."""
    os.sync()
    for file in (p for p in path.rglob("*") if p.is_file()):
        descriptor = os.open(file, os.O_RDONLY)
        try:
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(descriptor)


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("stable-worldmodel", "torch", "torchvision", "lancedb", "pylance"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = None
    return found


def write(args) -> dict:
    """Upstream's streaming writer over the synthetic episodes; generation time left out."""
    from stable_worldmodel.data.format import get_format
    from synth import make_episode

    generating = 0.0

    def episodes():
        nonlocal generating
        for index in range(args.episodes):
            start = time.perf_counter()
            episode = make_episode(args.seed + index, length=args.length, res=args.res)
            episode = {key: list(column) for key, column in episode.items()}
            generating += time.perf_counter() - start
            yield episode

    path = Path(args.path)
    start = time.perf_counter()
    with get_format("lance").open_writer(path, mode="overwrite") as writer:
        writer.write_episodes(episodes())
    seconds = time.perf_counter() - start - generating
    os.sync()
    disk = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return {"write_s": round(seconds, 2), "disk_bytes": disk, "versions": versions()}


def load(args) -> dict:
    """Upstream's ``load_dataset`` + a DataLoader, from a cold page cache."""
    path = Path(args.path)
    drop_from_page_cache(path)
    import multiprocessing

    import torch
    from stable_worldmodel.data import load_dataset
    from torch.utils.data import DataLoader

    start = time.perf_counter()
    dataset = load_dataset(str(path), num_steps=args.history_len, frameskip=args.frameskip)
    opened = time.perf_counter()
    need = (args.warmup + args.batches) * args.batch
    if len(dataset) < need:
        raise SystemExit(f"the dataset has {len(dataset)} clips, {need} needed: add episodes")
    generator = torch.Generator()
    generator.manual_seed(args.seed)
    loader = DataLoader(
        dataset,
        batch_size=args.batch,
        shuffle=True,
        num_workers=args.workers,
        generator=generator,
        drop_last=True,
    )
    batches = iter(loader)
    next(batches)
    first = time.perf_counter()
    for _ in range(args.warmup - 1):
        next(batches)
    start_timed = time.perf_counter()
    for _ in range(args.batches):
        next(batches)
    timed = time.perf_counter() - start_timed
    return {
        "open_s": round(opened - start, 3),
        "first_batch_s": round(first - start, 3),  # from opening, as swm's rows count it
        "clips_per_s": round(args.batches * args.batch / timed, 1),
        "mp_start_method": multiprocessing.get_start_method(allow_none=True),
    }


def in_fresh_process(args, phase: str, path: Path) -> dict:
    """This script's ``--phase`` in a new interpreter: no import or start method leaks between
    measurements."""
    with tempfile.TemporaryDirectory() as scratch:
        result = Path(scratch) / "result.json"
        settings = [f"--{name.replace('_', '-')}={value}" for name, value in vars(args).items()]
        internal = ["--phase", phase, "--path", str(path), "--result", str(result)]
        command = [sys.executable, __file__, *settings, *internal]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0 or not result.is_file():
            tail = done.stderr[-2000:]
            raise SystemExit(f"upstream {phase} failed (exit {done.returncode}): {tail}")
        return json.loads(result.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=40)
    parser.add_argument("--length", type=int, default=100, help="steps per episode")
    parser.add_argument("--res", type=int, default=224)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--history-len", type=int, default=4)
    parser.add_argument("--frameskip", type=int, default=2)
    parser.add_argument("--batches", type=int, default=20, help="batches timed per load")
    parser.add_argument("--warmup", type=int, default=2, help="batches before the clock starts")
    parser.add_argument("--seed", type=int, default=0, help="episode i uses seed + i")
    parser.add_argument("--repeats", type=int, default=3, help="cold loads, each a new process")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="keep the dataset here (WORKDIR/bench.lance)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the summary here")
    for internal in ("--phase", "--path", "--result"):
        parser.add_argument(internal, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        result = write(args) if args.phase == "write" else load(args)
        Path(args.result).write_text(json.dumps(result))
        return 0
    internal = {"phase", "path", "result", "workdir", "json", "repeats"}
    settings = argparse.Namespace(**{k: v for k, v in vars(args).items() if k not in internal})
    with tempfile.TemporaryDirectory(prefix="swm-upstream-") as scratch:
        # keep the user's ~/.stable_worldmodel untouched
        os.environ["STABLEWM_HOME"] = str(Path(scratch) / "stablewm_home")
        path = (args.workdir or Path(scratch)) / "bench.lance"
        path.parent.mkdir(parents=True, exist_ok=True)
        summary = {
            "settings": vars(settings),
            "write": in_fresh_process(settings, "write", path),
            "loads": [in_fresh_process(settings, "load", path) for _ in range(args.repeats)],
        }
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
