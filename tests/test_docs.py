"""The docs cannot drift from the code: every `swm ...` line in the README and in docs/ parses
against today's command line (the real Typer app, through click's own parser), every flag named
in the prose exists, and every script they name is in the repository.

`mkdocs build --strict` (in .ci/run) checks the links and the API reference.
"""

import re
import shlex
from pathlib import Path

import pytest
import typer
from typer.core import TyperCommand, TyperGroup
from typer.main import get_command

from swmcli.cli import app

ROOT = Path(__file__).parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
SHELL_SEPARATORS = {"&&", "||", ";", "|", ">", "2>", "&"}
SHELL_PREFIXES = {"do", "then", "else", "time", "nice", "exec"}
# click's usage error (bad option, missing or bad value), as the Typer in use ships click
ClickUsageError = typer.BadParameter.__base__


def _command_lines(text: str) -> list[str]:
    """Shell lines of the fenced bash/console blocks (a console block's lines after ``$``)."""
    found = []
    for language, body in FENCE.findall(text):
        if language not in ("bash", "sh", "shell", "console"):
            continue
        for line in body.replace("\\\n", " ").splitlines():
            if language == "console":
                if not line.startswith("$ "):
                    continue  # the command's output
                line = line[2:]
            found.append(line)
    return found


def swm_invocations(line: str) -> list[list[str]]:
    """The argument lists given to ``swm`` (or ``python -m swmcli``, ``torchrun -m swmcli``)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars="&|;>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    segments, current = [], []
    for token in lexer:
        if token in SHELL_SEPARATORS:
            segments.append(current)
            current = []
        else:
            current.append(token)
    segments.append(current)
    invocations = []
    for tokens in segments:
        # A shell variable (a loop's ``$seed``) stands for a value: 1 parses as any number or name.
        tokens = [re.sub(r"\$\{?\w+\}?", "1", token) for token in tokens]
        while tokens and (tokens[0] in SHELL_PREFIXES or re.match(r"^\w+=", tokens[0])):
            tokens = tokens[1:]  # `do swm ...`, `WANDB_MODE=offline swm ...`
        if tokens[:1] == ["swm"]:
            invocations.append(tokens[1:])
        elif "swmcli" in tokens and tokens[tokens.index("swmcli") - 1] == "-m":
            invocations.append(tokens[tokens.index("swmcli") + 1 :])
    return invocations


def _every_invocation() -> list[tuple[str, list[str]]]:
    return [
        (f"{page.relative_to(ROOT)}: {line.strip()}", args)
        for page in PAGES
        for line in _command_lines(page.read_text())
        for args in swm_invocations(line)
    ]


def visible_flags(command) -> set[str]:
    """The flags ``--help`` shows."""
    return {"--help"} | {opt for p in command.params for opt in p.opts + p.secondary_opts}


def parse(args: list[str]) -> None:
    """Parse ``swm ARGS`` as the real command line would, without running the command."""
    group = get_command(app)
    if not args or args[0].startswith("-"):
        TyperGroup.make_context(group, "swm", list(args))  # click's errors, not swm's line
        return
    command = group.commands.get(args[0])
    if command is None:
        raise ClickUsageError(f"no command {args[0]!r}")
    TyperCommand.make_context(command, args[0], list(args[1:]))


def test_every_swm_line_in_the_docs_parses_against_the_cli():
    invocations = _every_invocation()
    named = {args[0] for _, args in invocations if args}
    assert {"collect", "info", "convert", "train", "eval", "memprofile"} <= named
    failures = []
    for where, args in invocations:
        try:
            parse(args)
        except typer.Exit:
            pass  # --version
        except ClickUsageError as err:
            failures.append(f"{where}\n    {err.format_message()}")
    assert not failures, "\n".join(failures)


def test_the_parser_refuses_a_flag_that_does_not_exist():
    assert swm_invocations("cd x && swm train --preset tiny --stepz 3 | tee log  # note") == [
        ["train", "--preset", "tiny", "--stepz", "3"]
    ]
    assert swm_invocations("for s in 1 2; do swm collect --seed $s --out d$s.h5; done") == [
        ["collect", "--seed", "1", "--out", "d1.h5"]
    ]
    with pytest.raises(ClickUsageError, match="No such option: --stepz"):
        parse(["train", "--preset", "tiny", "--stepz", "3"])
    with pytest.raises(typer.BadParameter):
        parse(["collect", "--episodes", "N"])


def test_every_flag_named_in_the_prose_exists():
    """Inline mentions such as `swm train --online --record DATASET`: their flags exist."""
    group = get_command(app)
    missing = []
    for page in PAGES:
        for span in re.findall(r"`swm (\w+)((?: [^`]*)?)`", page.read_text()):
            name, rest = span
            command = group.commands.get(name)
            if command is None:
                missing.append(f"{page.name}: swm {name}")
                continue
            known = visible_flags(command)
            for flag in re.findall(r"(?<![\w-])(--[\w-]+)", rest):
                if flag not in known:
                    missing.append(f"{page.name}: swm {name}{rest} ({flag})")
    assert not missing, "\n".join(missing)


def test_every_command_page_lists_every_flag_of_its_help():
    """docs/commands/NAME.md names, in its tables, every flag `swm NAME --help` shows."""
    group = get_command(app)
    pages = {page.stem: page for page in (ROOT / "docs" / "commands").glob("*.md")}
    assert set(pages) == set(group.commands), "one page per command"
    missing = []
    for name, page in sorted(pages.items()):
        rows = "\n".join(line for line in page.read_text().splitlines() if line.startswith("|"))
        listed = set(re.findall(r"(?<![\w-])(--[\w-]+)", rows))
        flags = {flag for flag in visible_flags(group.commands[name]) if flag.startswith("--")}
        missing += [f"{page.name}: {flag}" for flag in sorted(flags - listed - {"--help"})]
    assert not missing, "\n".join(missing)


def test_every_script_the_docs_name_exists():
    for page in PAGES:
        for script in set(
            re.findall(r"(?:benchmarks|experiments|tests)/[\w./-]+\.(?:py|sh)", page.read_text())
        ):
            assert (ROOT / script).is_file(), f"{page.name}: {script}"
