"""The `swm` command line.

Thin commands: parse, build one validated config, call the command's job (imported inside the
function, so that `swm --help` imports no torch), render its result. A command's settings
options are generated from the config fields it sets (``options.py``; ``swmcli/config.py`` is
their one source); adding one is adding its key to the command's list. ``reported`` is the one
error boundary: known errors become one line and a hint, and the job's result is rendered with
the memory panel.
"""

import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from swmcli import __version__
from swmcli.cli.options import Sets, SwmGroup, add_command, given
from swmcli.errors import SwmError, UsageError, blame_user, describe_unexpected
from swmcli.host import keep_freed_memory

app = typer.Typer(
    name="swm",
    cls=SwmGroup,
    help="Collect pixel experience, store and stream it, train and evaluate world models, "
    "and know their memory needs — inside one 24 GB GPU.",
    epilog="Quick start: swm collect --preset tiny && swm train --preset tiny "
    "&& swm eval runs/tiny",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

Json = Annotated[bool, typer.Option("--json", help="print the result as one JSON object")]
# Any dataset's column COLUMN read as the key KEY (another tool's, or swm's own: on an export it
# chooses the name written).
MapOption = Annotated[
    list[str] | None,
    typer.Option(
        "--map", help="COLUMN=KEY: the dataset's column COLUMN read as key KEY (COLUMN= drops it)"
    ),
]


def command(name: str, *examples: str, **how: Any) -> Callable:
    """Register a function as the command ``name`` (``options.add_command``)."""
    return lambda func: add_command(app, name, func, examples, **how)


@dataclass
class Job:
    """What a command's job is given (the memory monitor) and gives back (its result; None when
    another process reports, as data-parallel ranks do)."""

    monitor: Any
    result: Any = None


@contextmanager
def reported(as_json: bool, track_tensors: bool = False) -> Iterator[Job]:
    """The error boundary around a command, and its report.

    Known errors become one line and a hint with their exit code; ^C exits 130; an error (or a
    ``sys.exit``) in the user's own code names their function, file and line (exit 1); anything
    unexpected is one line too, unless SWM_DEBUG=1 asks for the traceback. On success the job's
    result is rendered with the memory panel (or as JSON).
    """
    from swmcli import report
    from swmcli.memory.measure import MemoryMonitor

    _quiet_torch_internals()
    try:
        job = Job(MemoryMonitor(track_tensors=track_tensors))
        yield job
        if job.result is not None:
            report.emit(job.result, job.monitor.report, as_json)
    except SwmError as err:
        report.error(err.message, err.hint)
        raise typer.Exit(err.exit_code) from None
    except KeyboardInterrupt:
        report.error("interrupted", "finished episodes and checkpoints already written are kept")
        raise typer.Exit(130) from None
    except (typer.Exit, typer.Abort):
        raise
    except SystemExit as err:  # sys.exit() in the user's model, policy or env: their error
        blamed = blame_user(err)
        if blamed is None or os.environ.get("SWM_DEBUG") == "1":
            raise
        report.error(blamed.message, blamed.hint)
        raise typer.Exit(blamed.exit_code) from None
    except Exception as err:
        if os.environ.get("SWM_DEBUG") == "1":
            raise
        report.error(*describe_unexpected(err))
        raise typer.Exit(1) from None


# torch loggers that print their own traceback of an error swm then reports in one line (a model
# that fails while memprofile's preflight traces it on fake tensors).
_TORCH_INTERNAL_LOGS = ("torch._subclasses.fake_tensor", "torch._subclasses.fake_impls")


def _quiet_torch_internals() -> None:
    """Keep torch's internal error logs off the terminal (SWM_DEBUG=1 shows them)."""
    import logging

    for name in _TORCH_INTERNAL_LOGS:
        logging.getLogger(name).disabled = os.environ.get("SWM_DEBUG") != "1"


def _version(value: bool) -> None:
    if value:
        typer.echo(f"swm {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version")
    ] = False,
) -> None:
    """swm: world models inside a memory budget."""


@command(
    "collect",
    "swm collect --preset tiny",
    "swm collect --max-steps 200000",
    "swm collect --episodes 200 --resolution 64 --out data/tworoom.lance",
    "swm collect --env CartPole-v1 --policy random --steps 5000 --format hdf5 --out data/cp.h5",
    "swm collect --preset tiny --out s3://swm-bucket/tworoom/tiny.lance",
)
def collect(as_json: Json = False, **options: Any) -> None:
    """Roll out a policy through the capped ReplayBuffer; append finished episodes to a dataset."""
    from swmcli.commands.collect import run_collect

    with reported(as_json) as job:
        job.result = run_collect(given("collect", options).resolve(), job.monitor)


@command(
    "convert",
    "swm convert data/tworoom.lance data/tworoom.h5",
    "swm convert data/tworoom.h5 data/frames --to folder --keys pixels,action",
    "swm convert data/a.lance data/a.h5 --overwrite",
    "swm convert s3://swm-bucket/tworoom/tiny.lance data/tiny.h5",
    "swm convert data/pusht_expert.lance data/pusht.lance   # stable-worldmodel's, into swm",
    "swm convert data/tiny.lance data/tiny-upstream.h5 --layout stable-worldmodel",
    "swm convert data/tiny.lance data/tiny-lerobot --layout lerobot",
    "swm convert data/tiny.lance data/tiny-lerobot --layout lerobot --map goal=observation.goal_xy",
    "swm convert data/tiny.lance ~/.minari/datasets/swm/tiny-v0 --layout minari",
    "swm convert runs/lewm-224 exports/lewm-224 --layout stable-worldmodel  # a LeWM run",
)
def convert(
    src: Annotated[
        str,
        typer.Argument(
            help="dataset (path or s3:// URI) to read, never modified; or a LeWM run directory "
            "(with --layout stable-worldmodel: its checkpoint as weights.pt + config.json)"
        ),
    ],
    dst: Annotated[str, typer.Argument(help="dataset (path or s3:// URI) to write")],
    to: Annotated[
        str | None, typer.Option(help="lance, hdf5 (or h5) or folder (default: DST suffix)")
    ] = None,
    keys: Annotated[str | None, typer.Option(help="comma-separated keys to keep")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="replace DST if present")] = False,
    map_: MapOption = None,
    layout: Annotated[
        str,
        typer.Option(
            help="swm; stable-worldmodel (Lance or HDF5, by DST suffix); lerobot v3; minari"
        ),
    ] = "swm",
    skip_damaged: Annotated[
        bool, typer.Option("--skip-damaged", help="leave out episodes that fail their checksum")
    ] = False,
    as_json: Json = False,
) -> None:
    """Convert a dataset between formats: streamed, verified by checksums, renamed into place."""
    from swmcli.commands.convert import run_convert

    key_list = [k.strip() for k in keys.split(",") if k.strip()] if keys is not None else None
    with reported(as_json) as job:
        job.result = run_convert(
            src, dst, to=to, keys=key_list, overwrite=overwrite, mapping=map_, layout=layout,
            skip_damaged=skip_damaged, monitor=job.monitor,
        )  # fmt: skip


@command(
    "merge",
    "swm merge data/a.lance data/b.lance data/ab.lance",
    "swm merge data/pusht-64.lance data/pusht-noisy.lance data/pusht-64-mixed.lance --heldout 50",
    "swm merge data/tiny.lance data/rgb.lance data/mix.h5 --map rgb=pixels",
    "swm merge data/a.h5 data/b data/ab --to folder --overwrite",
)
def merge(
    paths: Annotated[
        list[str],
        typer.Argument(
            help="two or more datasets to read (any format swm reads, never modified), then "
            "the dataset to write",
            metavar="SRC... DST",
        ),
    ],
    to: Annotated[
        str | None, typer.Option(help="lance, hdf5 (or h5) or folder (default: DST suffix)")
    ] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="replace DST if present")] = False,
    map_: MapOption = None,
    heldout: Annotated[
        int,
        typer.Option(
            min=0,
            help="write the first source's last N episodes last, so `swm eval` holds out the "
            "same episodes as on that source",
        ),
    ] = 0,
    as_json: Json = False,
) -> None:
    """Merge datasets into one, episodes in the order given: checked alike first, then streamed,
    verified by checksums and renamed into place."""
    from swmcli.commands.convert import run_merge

    with reported(as_json) as job:
        if len(paths) < 3:
            raise UsageError(
                f"swm merge got {len(paths)} path(s): it needs two or more sources, then the "
                "destination",
                hint="swm merge SRC SRC... DST, e.g. swm merge data/a.lance data/b.lance "
                "data/ab.lance",
            )
        job.result = run_merge(
            paths[:-1], paths[-1], to=to, overwrite=overwrite, mapping=map_, heldout=heldout,
            monitor=job.monitor,
        )  # fmt: skip


@command(
    "info",
    "swm info data/tworoom.lance",
    "swm info data/tworoom.h5 --verify",
    "swm info s3://swm-bucket/tworoom/tiny.lance",
)
def info(
    path: Annotated[str, typer.Argument(help="a dataset (lance, hdf5 or folder; path or s3://)")],
    verify: Annotated[
        bool, typer.Option("--verify", help="read every episode against its checksums")
    ] = False,
    map_: MapOption = None,
    as_json: Json = False,
) -> None:
    """Show a dataset: format, episodes, steps, keys with dtypes and shapes, bytes on disk."""
    from swmcli.commands.convert import run_info

    with reported(as_json) as job:
        job.result = run_info(path, verify=verify, mapping=map_, monitor=job.monitor)


@command(
    "preview",
    "swm preview data/tiny.lance",
    "swm preview data/tworoom.h5 --episodes 8 --seed 1 --grid",
    "swm preview data/tworoom.lance --index 0,7 --gif --out previews/tworoom",
    "swm preview tests/fixtures/lerobot/dots --episodes 1",
)
def preview(
    path: Annotated[str, typer.Argument(help="a dataset: swm's or another tool's (path or s3://)")],
    episodes: Annotated[
        int | None, typer.Option(help="episodes drawn at random (default 4)")
    ] = None,
    seed: Annotated[int, typer.Option(help="seed of the episodes drawn")] = 0,
    index: Annotated[
        str | None, typer.Option(help="comma-separated episode numbers, instead of a draw")
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="folder of the videos (default: previews/DATASET_NAME)")
    ] = None,
    gif: Annotated[bool, typer.Option("--gif", help="write GIFs instead of MP4s")] = False,
    grid: Annotated[
        bool, typer.Option("--grid", help="one video of every episode in a grid")
    ] = False,
    fps: Annotated[int, typer.Option(help="frames a second")] = 10,
    map_: MapOption = None,
    as_json: Json = False,
) -> None:
    """Watch a dataset: a sample of its episodes as videos, every pixel key side by side, the
    step and the action under each frame."""
    from swmcli.commands.preview import run_preview

    name = Path(path.rstrip("/")).name.split(".")[0] or "dataset"
    with reported(as_json) as job:
        job.result = run_preview(
            path, out or Path("previews") / name, episodes=episodes, seed=seed, index=index,
            gif=gif, as_grid=grid, fps=fps, mapping=map_, monitor=job.monitor,
        )  # fmt: skip


@command(
    "envs",
    "swm envs",
    "swm envs 'CartPole*'",
    "swm envs --json",
)
def envs(
    pattern: Annotated[
        str | None, typer.Argument(help="only ids matching this shell pattern, e.g. 'swm/*'")
    ] = None,
    as_json: Json = False,
) -> None:
    """List the envs --env accepts (swm's, gymnasium's registry, installed plugins): their
    spaces, their frame size, and whether each renders here (why not, when it does not)."""
    from swmcli.commands.catalog import run_envs

    with reported(as_json) as job:
        job.result = run_envs(pattern, monitor=job.monitor)


@command(
    "train",
    "swm train --preset tiny",
    "swm train --bf16 --compile",
    "swm train --data data/tworoom.lance --steps 3000 --batch-size 64 --out runs/tr64",
    "swm train --preset gpu24-224-bf16 --bf16 --compile",
    "swm train --preset tiny --resume",
    "swm train --preset tworoom-64 --in-memory --newest-steps 20000",
    "swm train --preset tworoom-64 --online --env swm/TwoRoom-v0 --record data/online.lance",
    "swm train --preset tiny --nproc 2",
    "swm train --preset tiny --model tests/models/mlp_world_model.py:build",
    "swm train --preset vit-b-224 --bf16 --activation-checkpointing layers",
    "swm train --preset tiny --nproc 2 --shard",
    "swm train --preset tiny --data s3://swm-bucket/tworoom/tiny.lance --out runs/tiny-s3",
)
def train(
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="continue from the run's checkpoint with its saved config (--steps may extend it)",
        ),
    ] = False,
    as_json: Json = False,
    **options: Any,
) -> None:
    """Train a world model from clips streamed from disk, held in memory, or collected online;
    checkpoints are atomic and resumable. Also runs data-parallel under torchrun
    (torchrun --nproc-per-node N -m swmcli train), which --nproc N launches on this machine."""
    from swmcli.commands.train import run_train
    from swmcli.config import load_run_config

    settings = given("train", options)
    with reported(as_json, track_tensors=True) as job:
        cfg = settings.resolve()
        if resume:  # the run's saved config, with what these flags change (checked by the job)
            out = {**settings.settings, "train.out": cfg.train.out}
            cfg = load_run_config(cfg.train.out, out, settings.sets)
        job.result = run_train(cfg, job.monitor, resume=resume, as_json=as_json)


@command(
    "eval",
    "swm eval runs/tiny",
    "swm eval runs/tworoom-64 --protocol dataset --goal-offset 25 --step-budget 50 --episodes 50",
    "swm eval runs/tworoom-64 --protocol random-goal --samples 300 --iterations 10",
    "swm eval runs/tworoom-64 --set eval.noise_beta=2 --set eval.cost=trajectory --json",
    "swm eval runs/gpu24-224-bf16 --bf16 --compile --json",
    "swm eval runs/tiny --video",
    "swm eval lewm-pusht --set data.path=data/pusht_expert_train.lance  # stable-worldmodel's LeWM",
    default_note="the run's setting",  # eval starts from the run's saved config
    sources=(),
)
def eval_(
    run_dir: Annotated[
        Path,
        typer.Argument(
            help="a run directory written by swm train, or a stable-worldmodel LeWM checkpoint "
            "folder (weights.pt + config.json, or NAME_object.ckpt; with --set data.path=...)"
        ),
    ],
    set_: Sets = None,
    video: Annotated[
        bool,
        typer.Option(
            "--video", help="each planned episode as an MP4 beside its goal (RUN_DIR/eval/videos)"
        ),
    ] = False,
    as_json: Json = False,
    **options: Any,
) -> None:
    """Evaluate a run: open-loop prediction error and goal-reaching success with a planner.

    Flags not given keep the run's settings; --set eval.KEY=VALUE changes any other eval setting.
    """
    from swmcli.commands.evaluate import run_eval

    settings = given("eval", options).settings
    with reported(as_json, track_tensors=True) as job:
        job.result = run_eval(run_dir, job.monitor, flags=settings, sets=set_, video=video)


@command(
    "memprofile",
    "swm memprofile --resolution 224",
    "swm memprofile --resolution 224 --budget 24GiB",
    "swm memprofile --preset gpu24-224-bf16 --budget 24GiB --ram-budget 64GB --json",
    "swm memprofile --run runs/tiny",
    "swm memprofile --preset gpu24-224-bf16 --nproc 8",
    "swm memprofile --preset vit-b-224 --budget 24GiB --picture memprofile.png",
    "swm memprofile --model tests/models/mlp_world_model.py:build --budget 24GiB",
)
def memprofile(
    run: Annotated[Path | None, typer.Option(help="profile a trained run's config")] = None,
    snapshot: Annotated[Path | None, typer.Option(help="write a CUDA memory snapshot")] = None,
    as_json: Json = False,
    **options: Any,
) -> None:
    """Predict (CPU) and measure (GPU) peak memory per technique; the largest batch that fits."""
    from swmcli.commands.memprofile import run_memprofile

    run_config = run / "config.json" if run is not None else None
    with reported(as_json) as job:
        cfg = given("memprofile", options).resolve(run_config)
        job.result = run_memprofile(cfg, job.monitor, snapshot=snapshot)


def main() -> None:
    """Console-script entry point. SIGTERM stops as Ctrl-C does: finished work is kept, exit 130.

    The process keeps the memory it frees for reuse (``host.keep_freed_memory``) from its start:
    every step of every command frees and reallocates the same buffers, which glibc would
    otherwise hand back to the kernel and fault in again (benchmarks/overhead.py).
    """
    keep_freed_memory()
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        app()
    except SystemExit as done:
        _leave_despite_threads(done.code)
        raise
    finally:
        # Leaving already (its result or error shown): a late SIGTERM, such as torchrun stopping
        # the other ranks once one has failed, must not break the exit with a traceback.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


THREAD_GRACE_SECONDS = 5.0  # what a thread still running at the end has to finish on its own


def _leave_despite_threads(code: Any) -> None:
    """A thread the user's code started and never ended (a model factory's non-daemon thread)
    would keep the process alive after its work is saved and reported: a watcher gives such
    threads ``THREAD_GRACE_SECONDS``, then says so in one line and ends the process with its
    exit code."""
    import sys
    import threading
    import time

    def running() -> list[threading.Thread]:
        main = threading.main_thread()
        return [t for t in threading.enumerate() if t is not main and not t.daemon and t.is_alive()]

    def watch() -> None:
        time.sleep(THREAD_GRACE_SECONDS)
        if left := running():
            names = ", ".join(sorted({thread.name for thread in left}))
            sys.stdout.flush()
            print(f"swm: the work is saved; exiting past {len(left)} thread(s) that would keep "
                  f"this process alive ({names}, started by your code)", file=sys.stderr,
                  flush=True)  # fmt: skip
            os._exit(code if isinstance(code, int) else int(code is not None))

    if running():
        threading.Thread(target=watch, name="swm-exit-watch", daemon=True).start()
