"""The commands a preset's comment header gives its user, as the tests read them.

A header is the preset file's comment lines before its first table; a command is a comment line
indented by three spaces that starts with ``swm`` (``#   swm collect --preset tiny && ...``),
split at ``&&``, without a trailing note in parentheses (``   (its predicted peak fits ...)``).
"""

import re
import shlex
from pathlib import Path

PRESETS = Path(__file__).parents[1] / "presets"
_NOTE = re.compile(r"\s{2,}\(.*\)$")  # a note after the command, two spaces or more before it


def header(name: str) -> list[str]:
    """The comment lines at the top of preset ``name``, without their ``#``."""
    lines = []
    for line in (PRESETS / f"{name}.toml").read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:])
    return lines


def header_commands(name: str) -> list[list[str]]:
    """Every command of preset ``name``'s header, in order, as argument lists (``swm`` first)."""
    commands = []
    for line in header(name):
        if line.startswith("   ") and line.strip().startswith("swm "):
            for command in _NOTE.sub("", line.strip()).split("&&"):
                commands.append(shlex.split(command))
    return commands


def header_lines(name: str) -> list[str]:
    """The header's indented lines: each must be a command a user runs (``header_commands``)."""
    return [line.strip() for line in header(name) if line.startswith("   ")]
