"""The `swm` command line.

Thin commands (parse, build one validated config, make one library call, render) behind one error
boundary. Heavy imports happen inside the commands, so `swm --help` stays fast.
"""

import importlib
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

from swmcli import __version__
from swmcli.errors import SwmError, first_line

app = typer.Typer(
    name="swm",
    help="Collect pixel experience, store and stream it, train and evaluate world models, "
    "and know their memory needs — inside one 24 GB GPU.",
    epilog="Quick start: swm collect --preset tiny && swm train --preset tiny "
    "&& swm eval runs/tiny",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

Preset = Annotated[
    str | None, typer.Option("--preset", help="a preset from presets/: tiny, tworoom-64, ...")
]
ConfigFile = Annotated[
    Path | None, typer.Option("--config", help="a TOML (or config.json) file of settings")
]
Sets = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="SECTION.KEY=VALUE",
        help="override one setting, e.g. --set train.lr=1e-3 (repeatable)",
    ),
]
Json = Annotated[bool, typer.Option("--json", help="print the result as one JSON object")]
Resolution = Annotated[int | None, typer.Option(help="square frame side in pixels")]
MaxSteps = Annotated[
    int | None,
    typer.Option(
        help="ReplayBuffer cap in steps (host RAM); without --episodes or --steps, "
        "collect stops once this many steps are written"
    ),
]
BatchSize = Annotated[
    int | None,
    typer.Option(help="clips per micro-batch, all ranks together (each reads its share)"),
]
Nproc = Annotated[
    int | None,
    typer.Option(
        help="data-parallel processes, one per GPU (or CPU processes): swm train launches them "
        "with torchrun"
    ),
]
HistoryLen = Annotated[int | None, typer.Option(help="observations per clip")]
Frameskip = Annotated[int | None, typer.Option(help="observation stride; actions stay dense")]
Bf16 = Annotated[
    bool | None, typer.Option("--bf16/--fp32", help="bf16 autocast: True reduces activation memory")
]
Compile = Annotated[
    bool | None,
    typer.Option("--compile/--eager", help="torch.compile encoder and predictor separately"),
]
ActivationCheckpointing = Annotated[
    str | None,
    typer.Option(
        help="recompute these modules' activations in backward instead of keeping them: "
        "'blocks' (the transformer blocks) or module class names, comma-separated; saves most "
        "activation memory, costs about a third more compute",
    ),
]
OptimizerInBackward = Annotated[
    bool | None,
    typer.Option(
        "--optimizer-in-backward",
        help="step AdamW per parameter inside backward and free each gradient at once: saves "
        "the gradients' memory; no gradient clipping or accumulation, one process",
    ),
]
Shard = Annotated[
    bool | None,
    typer.Option(
        "--shard",
        help="fully shard parameters, gradients and AdamW state over the data-parallel ranks "
        "(FSDP2, torchrun): divides their memory by the ranks; costs an all-gather of each "
        "block's weights in forward and backward",
    ),
]
Model = Annotated[
    str | None,
    typer.Option(
        "--model",
        help="your world model: module:function or path/to/file.py:function returning a module "
        "with encode and predict (optional loss); default: swm's JEPA model",
    ),
]
# Another tool's dataset (stable-worldmodel, Minari): its column SRC read as swm's key DST.
MapOption = Annotated[
    list[str] | None,
    typer.Option("--map", help="SRC=DST: another tool's column SRC as key DST (SRC= drops it)"),
]


# The setting each command's flags set (flag parameter -> section.key); --help shows its default.
FLAG_SETTINGS: dict[str, dict[str, str]] = {
    "collect": {
        "env": "env.id",
        "resolution": "env.resolution",
        "episodes": "collect.episodes",
        "steps": "collect.steps",
        "max_steps": "collect.max_steps",
        "policy": "collect.policy",
        "out": "collect.out",
        "format": "collect.format",
        "seed": "collect.seed",
    },
    "train": {
        "data": "data.path",
        "history_len": "data.history_len",
        "frameskip": "data.frameskip",
        "steps": "train.steps",
        "batch_size": "train.batch_size",
        "bf16": "runtime.bf16",
        "compile": "runtime.compile",
        "out": "train.out",
        "seed": "train.seed",
        "in_memory": "data.in_memory",
        "ram_budget": "data.ram_budget",
        "max_steps": "data.max_steps",
        "online": "online.enabled",
        "env": "env.id",
        "policy": "online.policy",
        "updates_per_step": "online.updates_per_step",
        "warmup_steps": "online.warmup_steps",
        "record": "online.record",
        "nproc": "runtime.nproc",
        "model": "model.factory",
        "activation_checkpointing": "runtime.activation_checkpointing",
        "optimizer_in_backward": "runtime.optimizer_in_backward",
        "shard": "runtime.shard",
        "logger": "train.loggers",
    },
    "eval": {
        "protocol": "eval.protocol",
        "episodes": "eval.episodes",
        "goal_offset": "eval.goal_offset",
        "budget": "eval.max_steps",
        "planner": "eval.planner",
        "horizon": "eval.horizon",
        "samples": "eval.samples",
        "iterations": "eval.iterations",
        "elites": "eval.elites",
        "bf16": "runtime.bf16",
        "compile": "runtime.compile",
        "model": "model.factory",
    },
    "memprofile": {
        "resolution": "env.resolution",
        "batch_size": "train.batch_size",
        "history_len": "data.history_len",
        "frameskip": "data.frameskip",
        "max_steps": "collect.max_steps",
        "bf16": "runtime.bf16",
        "budget": "memprofile.budget",
        "ram_budget": "memprofile.ram_budget",
        "picture": "memprofile.picture",
        "nproc": "runtime.nproc",
        "model": "model.factory",
        "activation_checkpointing": "runtime.activation_checkpointing",
        "optimizer_in_backward": "runtime.optimizer_in_backward",
        "shard": "runtime.shard",
    },
}
TYPE_WORDS = {"int": "INTEGER", "float": "NUMBER", "Path": "PATH", "str": "TEXT", "bool": ""}


def _flags(command: str, values: dict[str, Any]) -> dict[str, Any]:
    """``{section.key: value}`` of a command's flags, from its parameters' ``values``."""
    return {key: values[name] for name, key in FLAG_SETTINGS[command].items()}


class _HelpInWords(TyperCommand):
    """``--help`` that names each option's type in words and shows the default of the setting a
    flag sets (read from the config models only when help is shown, so startup stays light)."""

    def format_help(self, ctx, formatter) -> None:
        from swmcli.config import SwmConfig

        defaults = SwmConfig()
        settings = FLAG_SETTINGS.get(self.name or "", {})
        for param in self.get_params(ctx):
            if param.metavar is None:  # typer's own column reads <int>, <path>, <bool>
                word = TYPE_WORDS.get(param.bare_type(), "TEXT")
                param.display_type_rich = lambda ctx, word=word: word
                if param.param_type_name == "argument":  # the usage line reads {run_dir}
                    param.metavar = param.name.upper()
            if param.name in settings and param.help and "(default:" not in param.help:
                section, key = settings[param.name].split(".")
                value = getattr(getattr(defaults, section), key)
                if self.name == "eval":  # eval starts from the run's saved config
                    param.help += " (default: the run's setting)"
                elif value is not None:
                    param.help += f" (default: {_shown(param, value)})"
        super().format_help(ctx, formatter)

    def collect_usage_pieces(self, ctx) -> list[str]:
        """``[OPTIONS] SRC DST``: arguments by name, as a shell user reads them."""
        names = [p.name.upper() for p in self.get_params(ctx) if p.param_type_name == "argument"]
        return [self.options_metavar, *names]


def _shown(param, value: Any) -> str:
    """A default as the user would type it: ``--fp32`` for a False ``--bf16/--fp32``."""
    if isinstance(value, bool):
        names = param.opts if value else param.secondary_opts
        return names[0] if names else str(value).lower()
    return str(value)


def _examples(*commands: str) -> str:
    """A command's --help epilog: real examples, one per paragraph."""
    return "Examples:\n\n" + "\n\n".join(f"  {command}" for command in commands)


@contextmanager
def error_boundary() -> Iterator[None]:
    """Known errors become one line and a hint with their exit code; ^C exits 130.

    Anything unexpected is one line too, unless SWM_DEBUG=1 asks for the traceback.
    """
    from swmcli import report

    try:
        yield
    except SwmError as err:
        report.error(err.message, err.hint)
        raise typer.Exit(err.exit_code) from None
    except KeyboardInterrupt:
        report.error("interrupted", "finished episodes and checkpoints already written are kept")
        raise typer.Exit(130) from None
    except (typer.Exit, typer.Abort):
        raise
    except Exception as err:
        if os.environ.get("SWM_DEBUG") == "1":
            raise
        report.error(*_describe_unexpected(err))
        raise typer.Exit(1) from None


def _describe_unexpected(err: Exception) -> tuple[str, str]:
    """One line and a hint for an error no swm code anticipated: the machine's, or a bug."""
    message = first_line(err)
    if isinstance(err, MemoryError):
        return (
            f"out of memory: {message}",
            "lower --resolution, --batch-size or --max-steps (`swm memprofile` shows what fits)",
        )
    if isinstance(err, OSError):
        where = f"{err.filename}: " if err.filename else ""
        return (
            f"{where}{err.strerror or message}",
            "check the path, its permissions and the free disk space",
        )
    return (
        f"{type(err).__name__}: {message}",
        "this is a bug in swm: rerun with SWM_DEBUG=1 and report the traceback",
    )


def _run(
    job: Callable[..., Any] | str,
    *,
    as_json: bool,
    preset: str | None,
    config: Path | None,
    sets: list[str] | None,
    flags: dict[str, Any],
    track_tensors: bool = False,
    **kwargs: Any,
) -> None:
    """Resolve the config, run ``job(cfg, monitor, **kwargs)`` and render its result.

    ``job`` may be "module:function", imported inside the error boundary (heavy imports stay lazy).
    """
    from swmcli import report
    from swmcli.config import resolve_config
    from swmcli.memory.measure import MemoryMonitor

    with error_boundary():
        cfg = resolve_config(preset, config, sets, flags)
        if isinstance(job, str):
            module, _, name = job.partition(":")
            job = getattr(importlib.import_module(module), name)
        monitor = MemoryMonitor(track_tensors=track_tensors)
        result = job(cfg, monitor, **kwargs)
        if result is not None:  # None: another process reported (data-parallel ranks)
            report.emit(result, monitor.report, as_json)


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


@app.command(
    cls=_HelpInWords,
    epilog=_examples(
        "swm collect --preset tiny",
        "swm collect --episodes 200 --resolution 64 --out data/tworoom.lance",
        "swm collect --env CartPole-v1 --policy random --steps 5000 --format hdf5 --out data/cp.h5",
        "swm collect --preset tiny --out s3://swm-bucket/tworoom/tiny.lance",
    ),
)
def collect(
    env: Annotated[str | None, typer.Option(help="gymnasium env id")] = None,
    episodes: Annotated[
        int | None, typer.Option(help="finished episodes to collect; default: fill --max-steps")
    ] = None,
    steps: Annotated[
        int | None, typer.Option(help="collect exactly this many steps; default: --max-steps")
    ] = None,
    max_steps: MaxSteps = None,
    resolution: Resolution = None,
    policy: Annotated[
        str | None, typer.Option(help="who picks the actions: expert or random")
    ] = None,
    out: Annotated[
        str | None, typer.Option(help="dataset (path or s3:// URI) to write or append to")
    ] = None,
    format: Annotated[
        str | None,
        typer.Option(help="lance, hdf5 or folder; default: from the --out suffix, else lance"),
    ] = None,
    seed: Annotated[int | None, typer.Option(help="seed of the env resets and the policy")] = None,
    preset: Preset = None,
    config: ConfigFile = None,
    set_: Sets = None,
    as_json: Json = False,
) -> None:
    """Roll out a policy through the capped ReplayBuffer; append finished episodes to a dataset."""
    flags = _flags("collect", locals())
    _run(
        "swmcli.collect:run_collect",
        as_json=as_json,
        preset=preset,
        config=config,
        sets=set_,
        flags=flags,
    )


@app.command(
    cls=_HelpInWords,
    epilog=_examples(
        "swm convert data/tworoom.lance data/tworoom.h5",
        "swm convert data/tworoom.h5 data/frames --to folder --keys pixels,action",
        "swm convert data/a.lance data/a.h5 --overwrite",
        "swm convert s3://swm-bucket/tworoom/tiny.lance data/tiny.h5",
        "swm convert data/pusht_expert.lance data/pusht.lance   # stable-worldmodel's, into swm",
        "swm convert data/tiny.lance data/tiny-upstream.h5 --layout stable-worldmodel",
    ),
)
def convert(
    src: Annotated[str, typer.Argument(help="dataset (path or s3:// URI) to read, never modified")],
    dst: Annotated[str, typer.Argument(help="dataset (path or s3:// URI) to write")],
    to: Annotated[
        str | None, typer.Option(help="lance, hdf5 or folder (default: DST suffix)")
    ] = None,
    keys: Annotated[str | None, typer.Option(help="comma-separated keys to keep")] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="replace DST if it exists")
    ] = False,
    map_: MapOption = None,
    layout: Annotated[
        str,
        typer.Option(help="swm, or stable-worldmodel (its Lance or HDF5 layout, by DST suffix)"),
    ] = "swm",
    as_json: Json = False,
) -> None:
    """Convert a dataset between formats: streamed, verified by checksums, renamed into place."""
    key_list = [k.strip() for k in keys.split(",") if k.strip()] if keys else None

    def job(_cfg, monitor):
        from swmcli.convert import run_convert

        with monitor.phase("convert"):
            return run_convert(
                src, dst, to=to, keys=key_list, overwrite=overwrite, mapping=map_, layout=layout
            )

    _run(job, as_json=as_json, preset=None, config=None, sets=None, flags={})


@app.command(
    cls=_HelpInWords,
    epilog=_examples(
        "swm info data/tworoom.lance",
        "swm info data/tworoom.h5 --verify",
        "swm info s3://swm-bucket/tworoom/tiny.lance",
    ),
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

    def job(_cfg, monitor):
        from swmcli.convert import run_info

        with monitor.phase("inspect"):
            return run_info(path, verify=verify, mapping=map_)

    _run(job, as_json=as_json, preset=None, config=None, sets=None, flags={})


@app.command(
    cls=_HelpInWords,
    epilog=_examples(
        "swm train --preset tiny",
        "swm train --data data/tworoom.lance --steps 3000 --batch-size 64 --out runs/tr64",
        "swm train --preset gpu24-224-bf16 --bf16 --compile",
        "swm train --preset tiny --resume",
        "swm train --preset tworoom-64 --in-memory --max-steps 20000",
        "swm train --preset tworoom-64 --online --env swm/TwoRoom-v0 --record data/online.lance",
        "swm train --preset tiny --nproc 2",
        "swm train --preset tiny --data s3://swm-bucket/tworoom/tiny.lance --out runs/tiny-s3",
    ),
)
def train(
    data: Annotated[
        str | None, typer.Option(help="dataset (path or s3:// URI) to stream clips from")
    ] = None,
    steps: Annotated[int | None, typer.Option(help="optimizer steps to train to")] = None,
    batch_size: BatchSize = None,
    history_len: HistoryLen = None,
    frameskip: Frameskip = None,
    bf16: Bf16 = None,
    compile: Compile = None,
    out: Annotated[Path | None, typer.Option(help="run directory")] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="continue from the run's checkpoint with its saved config (--steps may extend it)",
        ),
    ] = False,
    seed: Annotated[int | None, typer.Option(help="seed of init, sampling and shuffling")] = None,
    in_memory: Annotated[
        bool | None,
        typer.Option(
            "--in-memory/--no-in-memory",
            help="train from a ReplayBuffer loaded with the training episodes (--in-memory) or "
            "stream them from disk (--no-in-memory); default: in memory when they fit --ram-budget",
        ),
    ] = None,
    ram_budget: Annotated[
        str | None,
        typer.Option(
            help="host RAM the training ReplayBuffer may take, e.g. 8GiB; "
            "default: data.ram_share of the RAM available when training starts"
        ),
    ] = None,
    max_steps: Annotated[
        int | None,
        typer.Option(
            help="ReplayBuffer cap in steps for training: in memory, the newest training "
            "episodes that fit (default: all); online, the ring (default: collect.max_steps)"
        ),
    ] = None,
    online: Annotated[
        bool | None,
        typer.Option("--online", help="collect in the env while training (--env ID)"),
    ] = None,
    env: Annotated[str | None, typer.Option(help="gymnasium env id")] = None,
    policy: Annotated[
        str | None,
        typer.Option(
            help="who picks the actions online: expert, random, or planner (the model being "
            "trained plans toward the env's goal with the [eval] planner settings, plus noise)"
        ),
    ] = None,
    updates_per_step: Annotated[
        float | None,
        typer.Option(help="optimizer steps per env step collected (0.1: one every 10)"),
    ] = None,
    warmup_steps: Annotated[
        int | None, typer.Option(help="env steps collected before the first optimizer step")
    ] = None,
    record: Annotated[
        Path | None,
        typer.Option(
            help="append every finished episode to this dataset; --resume refills the "
            "buffer from it"
        ),
    ] = None,
    nproc: Nproc = None,
    model: Model = None,
    activation_checkpointing: ActivationCheckpointing = None,
    optimizer_in_backward: OptimizerInBackward = None,
    shard: Shard = None,
    logger: Annotated[
        list[str] | None,
        typer.Option(
            help="also log to tensorboard and/or wandb (repeat the flag, or a comma list); "
            "metrics.jsonl is always written"
        ),
    ] = None,
    preset: Preset = None,
    config: ConfigFile = None,
    set_: Sets = None,
    as_json: Json = False,
) -> None:
    """Train a world model from clips streamed from disk, held in memory, or collected online;
    checkpoints are atomic and resumable. Also runs data-parallel under torchrun
    (torchrun --nproc-per-node N -m swmcli train), which --nproc N launches on this machine."""
    flags = _flags("train", locals())
    _run(
        "swmcli.train:run_train",
        as_json=as_json,
        preset=preset,
        config=config,
        sets=set_,
        flags=flags,
        track_tensors=True,
        resume=resume,
        steps=steps,
        json_output=as_json,
    )


@app.command(
    cls=_HelpInWords,
    name="eval",
    epilog=_examples(
        "swm eval runs/tiny",
        "swm eval runs/tworoom-64 --protocol dataset --goal-offset 25 --budget 50 --episodes 50",
        "swm eval runs/tworoom-64 --protocol random-goal --samples 300 --iterations 10",
        "swm eval runs/tworoom-64 --set eval.noise_beta=2 --set eval.cost=trajectory --json",
        "swm eval runs/gpu24-224-bf16 --bf16 --compile --json",
    ),
)
def eval_(
    run_dir: Annotated[Path, typer.Argument(help="a run directory written by swm train")],
    protocol: Annotated[
        str | None,
        typer.Option(
            help="random-goal (a fresh random start and goal) or dataset (start state and goal "
            "image from held-out episodes, goal_offset env steps apart)"
        ),
    ] = None,
    episodes: Annotated[int | None, typer.Option(help="planning episodes (seeded)")] = None,
    goal_offset: Annotated[
        int | None,
        typer.Option(help="dataset protocol: env steps from the start state to the goal"),
    ] = None,
    budget: Annotated[
        int | None,
        typer.Option(
            "--budget",
            "--max-steps",
            help="env steps per planning episode (the budget); default: twice goal_offset "
            "for the dataset protocol, env.max_episode_steps for random goals",
        ),
    ] = None,
    planner: Annotated[str | None, typer.Option(help="latent-space planner: cem or mppi")] = None,
    horizon: Annotated[int | None, typer.Option(help="planned action blocks")] = None,
    samples: Annotated[
        int | None, typer.Option(help="action sequences per planner iteration")
    ] = None,
    iterations: Annotated[
        int | None, typer.Option(help="planner iterations per replanning")
    ] = None,
    elites: Annotated[int | None, typer.Option(help="best sequences CEM refits to")] = None,
    bf16: Bf16 = None,
    compile: Compile = None,
    model: Model = None,
    set_: Sets = None,
    as_json: Json = False,
) -> None:
    """Evaluate a run: open-loop prediction error and goal-reaching success with a planner.

    Flags not given keep the run's settings; --set eval.KEY=VALUE changes any other eval setting.
    """
    flags = _flags("eval", locals())

    def job(_cfg, monitor):
        from swmcli.evaluate import run_eval

        return run_eval(run_dir, monitor, flags=flags, sets=set_)

    _run(job, as_json=as_json, preset=None, config=None, sets=None, flags={}, track_tensors=True)


@app.command(
    cls=_HelpInWords,
    epilog=_examples(
        "swm memprofile --resolution 224 --budget 24GiB",
        "swm memprofile --preset vit-b-224 --budget 24GiB --picture memprofile.png",
        "swm memprofile --model tests/models/mlp_world_model.py:build --budget 24GiB",
        "swm memprofile --preset gpu24-224-bf16 --budget 24GiB --ram-budget 64GB --json",
        "swm memprofile --run runs/tiny",
        "swm memprofile --preset gpu24-224-bf16 --nproc 8",
    ),
)
def memprofile(
    run: Annotated[Path | None, typer.Option(help="profile a trained run's config")] = None,
    resolution: Resolution = None,
    batch_size: BatchSize = None,
    history_len: HistoryLen = None,
    frameskip: Frameskip = None,
    max_steps: MaxSteps = None,
    bf16: Bf16 = None,
    budget: Annotated[str | None, typer.Option(help="GPU memory budget, e.g. 24GiB")] = None,
    ram_budget: Annotated[str | None, typer.Option(help="host RAM budget, e.g. 64GB")] = None,
    snapshot: Annotated[
        Path | None, typer.Option(help="write a CUDA memory snapshot (GPU)")
    ] = None,
    picture: Annotated[
        Path | None,
        typer.Option(
            help="draw the predicted peaks as stacked bars by category (per combination of "
            "levers with --budget, else per technique) with the budget line, into this PNG"
        ),
    ] = None,
    nproc: Nproc = None,
    model: Model = None,
    activation_checkpointing: ActivationCheckpointing = None,
    optimizer_in_backward: OptimizerInBackward = None,
    shard: Shard = None,
    preset: Preset = None,
    config: ConfigFile = None,
    set_: Sets = None,
    as_json: Json = False,
) -> None:
    """Predict (CPU) and measure (GPU) peak memory per technique; the largest batch that fits."""
    if run is not None:
        config = run / "config.json"
    flags = _flags("memprofile", locals())
    _run(
        "swmcli.memprofile:run_memprofile",
        as_json=as_json,
        preset=preset,
        config=config,
        sets=set_,
        flags=flags,
        snapshot=snapshot,
    )


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main() -> None:
    """Console-script entry point. SIGTERM stops as Ctrl-C does: finished work is kept, exit 130."""
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        app()
    finally:
        # Leaving already (its result or error shown): a late SIGTERM, such as torchrun stopping
        # the other ranks once one has failed, must not break the exit with a traceback.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
