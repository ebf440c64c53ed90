"""How the `swm` commands are built: settings options generated from the config fields they set.

A setting's flag, type, help and default come from its field in ``swmcli/config.py`` (its
description; ``config.flag`` where the flag is not ``--key``); a command lists the settings it
takes in ``SETTINGS``. Adding a flag is adding a key to that list. Also here: ``--help`` that
names types in words, and bad usage as swm's own one-line error.
"""

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import NoneType, UnionType
from typing import Annotated, Any, Union, get_args, get_origin

import typer
from typer.core import TyperCommand, TyperGroup

from swmcli.config import SwmConfig, resolve_config

# The settings each command's options set, in --help order.
SETTINGS = {
    "collect": (
        "env.id", "collect.episodes", "collect.steps", "collect.max_steps", "env.resolution",
        "collect.policy", "collect.out", "collect.format", "collect.seed", "collect.workers",
    ),
    "train": (
        "data.path", "train.steps", "train.batch_size", "data.history_len", "data.frameskip",
        "runtime.bf16", "runtime.compile", "train.out", "train.seed", "data.in_memory",
        "data.ram_budget", "data.newest_steps", "online.enabled", "env.id", "online.policy",
        "online.updates_per_step", "online.warmup_steps", "online.max_steps", "online.record",
        "runtime.nproc", "train.loggers", "data.skip_damaged", "model.factory",
        "runtime.activation_checkpointing", "runtime.optimizer_in_backward", "runtime.shard",
        "train.grad_clip", "train.init_from", "train.freeze", "train.optimizer_impl",
    ),
    "eval": (
        "eval.protocol", "eval.episodes", "eval.goal_offset", "eval.step_budget", "eval.planner",
        "eval.horizon", "eval.samples", "eval.iterations", "eval.elites", "runtime.bf16",
        "runtime.compile", "model.factory",
    ),
    "memprofile": (
        "env.resolution", "train.batch_size", "data.history_len", "data.frameskip",
        "collect.max_steps", "runtime.bf16", "memprofile.budget", "memprofile.ram_budget",
        "runtime.nproc", "model.factory", "runtime.activation_checkpointing",
        "runtime.optimizer_in_backward", "runtime.shard", "train.grad_clip",
        "train.freeze", "train.optimizer_impl", "memprofile.picture", "memprofile.predict_for",
    ),
}  # fmt: skip


def settings_options(command: str, default_note: str | None) -> dict[str, inspect.Parameter]:
    """``{section.key: keyword parameter}``: the options of ``command``'s settings;
    ``default_note`` replaces each default in the help (e.g. "the run's setting")."""
    return {dotted: _setting_option(dotted, command, default_note) for dotted in SETTINGS[command]}


def _field(dotted: str):
    section, key = dotted.split(".")
    return SwmConfig.model_fields[section].annotation.model_fields[key]


def _value_type(field) -> type:
    """What the command line reads for ``field``: bool, int, float or Path, else text (a
    choice, a size such as 8GiB, a path or s3:// URI alike); the config validates it."""
    annotation = field.annotation
    if get_origin(annotation) is list:  # a repeatable flag
        return list[str]
    union = get_origin(annotation) in (Union, UnionType)
    kinds = set(get_args(annotation)) - {NoneType} if union else {annotation}
    kinds = {get_args(k)[0] if get_origin(k) is Annotated else k for k in kinds}  # PositiveInt
    if len(kinds) == 1 and (kind := kinds.pop()) in (bool, int, float, Path):
        return str if (field.json_schema_extra or {}).get("metavar") else kind
    return str


def _setting_option(dotted: str, command: str, default_note: str | None) -> inspect.Parameter:
    """The option that sets ``dotted`` in ``command``, from its config field: flag, type, help
    (the command's own where the field has one) and default."""
    field = _field(dotted)
    extra = field.json_schema_extra or {}
    kind = _value_type(field)
    name = "--" + dotted.split(".")[1].replace("_", "-")
    spelled = extra.get("flag") or (f"{name}/--no-{name[2:]}" if kind is bool else name)
    if default_note is None and field.default not in (None, []):
        on, _, off = spelled.partition("/")  # a switch's default reads as its flag: --fp32
        default_note = (on if field.default else off) if kind is bool else str(field.default)
    note = f" (default: {default_note})" if default_note else ""
    described = extra.get("help_in", {}).get(command, field.description)
    option = typer.Option(spelled, help=described + note, metavar=extra.get("metavar"))
    return _keyword(dotted, Annotated[kind | None, option])


def _keyword(dotted: str, annotation: Any) -> inspect.Parameter:
    name = dotted.replace(".", "__")
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation
    )


# Where a command's settings come from, for a function that takes ``sources``: they reach it as
# the tuple (preset, config file, --set items); an eval only takes --set.
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
SOURCES = {"preset": Preset, "config": ConfigFile, "set_": Sets}
TYPE_WORDS = {"int": "INTEGER", "float": "NUMBER", "Path": "PATH", "str": "TEXT", "bool": ""}


class SwmGroup(TyperGroup):
    """Bad usage (an unknown command or flag, a missing argument) is swm's one `error:` line
    with a `hint:`, exit 2, as every other bad input is. Caught where it is raised, while the
    command line is parsed, so that no frame of this class stays under the running command."""

    def make_context(self, *args, **kwargs):
        with _usage_errors():
            return super().make_context(*args, **kwargs)

    def resolve_command(self, ctx, args):  # an unknown command's name
        with _usage_errors():
            return super().resolve_command(ctx, args)


@contextmanager
def _usage_errors() -> Iterator[None]:
    try:
        yield
    except typer.BadParameter.__base__ as err:  # click's UsageError, vendored by new typers
        from swmcli import report

        path = err.ctx.command_path if err.ctx else "swm"
        report.error(err.format_message(), f"see `{path} --help`")
        raise typer.Exit(2) from None


class _HelpInWords(TyperCommand):
    """``--help`` that names each option's type in words; bad flags as swm's usage error."""

    def make_context(self, *args, **kwargs):  # parses the command's own flags
        with _usage_errors():
            return super().make_context(*args, **kwargs)

    def format_help(self, ctx, formatter) -> None:
        for param in self.get_params(ctx):
            argument = param.param_type_name == "argument"
            if param.metavar is None or argument:  # typer's column reads <int>, <list[str]>
                word = TYPE_WORDS.get(param.bare_type(), "TEXT")
                param.display_type_rich = lambda ctx, word=word: word
            if param.metavar is None and argument:  # the usage line reads {run_dir}
                param.metavar = param.name.upper()
        super().format_help(ctx, formatter)

    def collect_usage_pieces(self, ctx) -> list[str]:
        """``[OPTIONS] SRC DST``: arguments by name, as a shell user reads them."""
        params = self.get_params(ctx)
        names = [p.metavar or p.name.upper() for p in params if p.param_type_name == "argument"]
        return [self.options_metavar, *names]


@dataclass(frozen=True)
class Given:
    """What one invocation of a command gave: its settings flags (``{"section.key": value}``,
    None where not given), and where the rest of its settings come from (``--preset``,
    ``--config``, ``--set``)."""

    settings: dict[str, Any]
    preset: str | None = None
    config: Path | None = None
    sets: list[str] = field(default_factory=list)

    def resolve(self, config: Path | None = None) -> SwmConfig:
        """The one validated config (``config.resolve_config``); ``config`` stands for
        ``--config`` (a run's config.json)."""
        return resolve_config(self.preset, config or self.config, self.sets, self.settings)


def add_command(
    app: typer.Typer,
    name: str,
    func: Callable,
    examples: tuple[str, ...],
    default_note: str | None = None,
    sources: tuple[str, ...] = tuple(SOURCES),
) -> Callable:
    """Register ``func`` as ``app``'s command ``name``: its own parameters plus, when ``func``
    takes ``**options``, one option per setting of ``SETTINGS[name]`` and the ``sources``
    options (``--preset``, ``--config``, ``--set``); ``examples`` end its ``--help``. Typer
    calls ``func`` itself (no wrapper frame under the command); ``given(name, options)`` reads
    what its ``**options`` received."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    parameters = inspect.signature(func).parameters
    own = [p.replace(kind=keyword) for p in parameters.values() if p.kind != p.VAR_KEYWORD]
    arguments = [p for p in own if p.default is inspect.Parameter.empty]
    takes_options = any(p.kind == p.VAR_KEYWORD for p in parameters.values())
    settings = settings_options(name, default_note) if takes_options and name in SETTINGS else {}
    sources = (
        [inspect.Parameter(key, keyword, default=None, annotation=SOURCES[key]) for key in
         sources]
        if takes_options
        else []
    )  # fmt: skip
    rest = [p for p in own if p not in arguments]
    func.__signature__ = inspect.Signature([*arguments, *settings.values(), *sources, *rest])
    epilog = "Examples:\n\n" + "\n\n".join(f"  {example}" for example in examples)
    app.command(name, cls=_HelpInWords, epilog=epilog)(func)
    return func


def given(command: str, options: dict[str, Any]) -> Given:
    """The ``Given`` of ``command``'s invocation, from the keyword arguments Typer passed its
    ``**options`` (``env__id=...``, ``preset=...``)."""
    settings = {dotted: options.get(dotted.replace(".", "__")) for dotted in SETTINGS[command]}
    return Given(settings, options.get("preset"), options.get("config"), options.get("set_") or [])
