"""All of swm's terminal output: progress bars (stderr), result tables and the memory panel
(stdout), one-line errors (stderr), and the same figures as one JSON object with ``--json``.

Library entry points return a ``CommandResult``; the CLI renders it here. Keys (and table columns)
ending in ``_bytes`` are shown with units in tables and kept as plain integers in JSON.
"""

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from swmcli.units import format_bytes


@dataclass
class Table:
    """A titled table of already formatted cells."""

    title: str
    columns: list[str]
    rows: list[list[Any]]


@dataclass
class CommandResult:
    """What a command produced: key figures (JSON-able), extra tables, notes for the reader, and
    the warnings already shown while it ran (kept for ``--json``)."""

    title: str
    fields: dict[str, Any]
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


_silenced = False  # set on data-parallel ranks other than 0: rank 0 speaks for the run


def silence() -> None:
    """From now on show no progress, log lines or warnings (errors still show)."""
    global _silenced
    _silenced = True


def _stderr_console(errors: bool = False):
    from rich.console import Console

    return Console(stderr=True, quiet=_silenced and not errors, emoji=False)  # :x: as typed


def _stdout_console():
    from rich.console import Console

    return Console(emoji=False)


PLAIN_PROGRESS_SECONDS = 10.0  # off a terminal, a plain progress line at least this often
PLAIN_PROGRESS_FRACTION = 0.05  # ... or every 5% of the total, whichever comes first


@contextmanager
def progress(description: str, total: int | None) -> Iterator[Callable[..., None]]:
    """Progress on stderr; yields ``advance(n=1, **fields)`` (fields: status text).

    A Rich bar on a terminal; where stderr is not one (CI logs, ``nohup``, pipes) a plain line
    every ~10 s or 5% (count, rate, ETA), so a long run is never silent.
    """
    console = _stderr_console()
    if not console.is_terminal:
        with _plain_progress(console, description, total) as advance:
            yield advance
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = [
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[status]}"),
    ]
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(description, total=total, status="")

        def advance(n: int = 1, **status: Any) -> None:
            bar.update(task, advance=n, status=_status_text(status))

        yield advance


@contextmanager
def _plain_progress(console, description: str, total: int | None):
    """Plain progress lines for a non-terminal stderr: ``train 120/2000 (6%) 11.2/s ETA 2m48s``.

    The rate is the one since the previous line, so a slow start (compilation, first batch)
    does not inflate the ETA for the rest of the run.
    """
    import time

    last_time = time.monotonic()
    done = last_done = 0
    text = ""

    def line(now: float) -> str:
        rate = (done - last_done) / max(now - last_time, 1e-9)
        count = f"{done}/{total} ({100 * done / total:.0f}%)" if total else str(done)
        eta = ""
        if total and rate > 0:
            eta = f" ETA {format_seconds((total - done) / rate)}"
        return f"{description} {count} {rate:.3g}/s{eta} {text}".rstrip()

    def advance(n: int = 1, **status: Any) -> None:
        nonlocal done, last_time, last_done, text
        done += n
        text = _status_text(status) or text
        now = time.monotonic()
        step = PLAIN_PROGRESS_FRACTION * total if total else float("inf")
        if now - last_time >= PLAIN_PROGRESS_SECONDS or done - last_done >= step:
            console.print(line(now), highlight=False, soft_wrap=True)
            last_time, last_done = now, done

    yield advance
    if done != last_done:
        console.print(line(time.monotonic()), highlight=False, soft_wrap=True)


def format_seconds(seconds: float) -> str:
    """A duration a person reads at a glance: ``42s``, ``2m48s``, ``1h05m``."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _status_text(status: dict[str, Any]) -> str:
    return "  ".join(f"{k} {_cell(k, v)}" for k, v in status.items())


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key.endswith("_bytes") and isinstance(value, int | float):
        return format_bytes(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _label(key: str) -> str:
    return key.removesuffix("_bytes").replace("_", " ")


def _fields_table(result: CommandResult):
    from rich.table import Table as RichTable
    from rich.text import Text

    table = RichTable(title=result.title, show_header=False, title_justify="left")
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for key, value in result.fields.items():
        table.add_row(_label(key), Text(_cell(key, value)))
    return table


def _fitted_table(
    title: str | None,
    headers: list[str],
    rows: list[list[str]],
    width: int,
    *,
    justify: str = "left",
    show_edge: bool = True,
):
    """A table whose first column (the row names) stays whole within ``width`` columns.

    Rich's table where the names fit beside the other columns at their narrowest (each wrapped
    at its longest word); else rows that wrap under their name (``_stacked``), so a 9-column
    table piped to a log file reads ``gradient-free eval`` and not ``gradi…``.
    """
    from rich.table import Table as RichTable
    from rich.text import Text

    names = max(len(cell) for cell in [headers[0], *(row[0] for row in rows)])
    narrowest = [_longest_word([header, *cells]) for header, cells in _value_columns(headers, rows)]
    borders = 3 * len(headers) + (1 if show_edge else -1)
    if names + sum(narrowest) + borders > width:
        return _stacked(title, headers, rows, width)
    table = RichTable(title=title, title_justify="left", show_edge=show_edge)
    table.add_column(headers[0], no_wrap=True)
    for header in headers[1:]:
        table.add_column(header, justify=justify)
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    return table


def _value_columns(headers: list[str], rows: list[list[str]]) -> list[tuple[str, list[str]]]:
    """(header, cells) of every column but the first."""
    return [(header, [row[i] for row in rows]) for i, header in enumerate(headers) if i]


def _longest_word(cells: list[str]) -> int:
    return max(len(word) for cell in cells for word in [*cell.split(), ""])


_GAP = "  "  # between the columns of a stacked table


def _stacked(title: str | None, headers: list[str], rows: list[list[str]], width: int):
    """Rows that wrap under their name: the values right-aligned in columns at the right edge,
    a name too long for the room left of them on its own line above its values. Where even the
    values do not fit ``width``, each value goes on its own line as ``header: value``."""
    import textwrap

    from rich.text import Text

    text = Text()
    if title:
        text.append(title + "\n", style="italic")
    # Values stay on one line; a header wraps at its words.
    widths = [
        max([_longest_word([header]), *(len(cell) for cell in cells)])
        for header, cells in _value_columns(headers, rows)
    ]
    values_width = len(_GAP.join(" " * w for w in widths))
    if values_width > width:
        for row in rows:
            text.append(row[0] + "\n", style="bold")
            for header, cell in zip(headers[1:], row[1:], strict=True):
                text.append(f"  {header}: {cell}\n")
        text.rstrip()
        return text
    room = width - values_width - len(_GAP)
    wrapped = [
        textwrap.wrap(header, w) or [""] for header, w in zip(headers[1:], widths, strict=True)
    ]
    depth = max(len(lines) for lines in wrapped)
    for line in range(depth):
        cells = [
            lines[line - depth + len(lines)] if line >= depth - len(lines) else ""
            for lines in wrapped
        ]
        first = headers[0] if line == depth - 1 and len(headers[0]) <= room else ""
        values = _GAP.join(cell.rjust(w) for cell, w in zip(cells, widths, strict=True))
        text.append(first.ljust(room) + _GAP + values + "\n", style="bold")
    for row in rows:
        values = _GAP.join(cell.rjust(w) for cell, w in zip(row[1:], widths, strict=True))
        if len(row[0]) > room:
            text.append(row[0] + "\n", style="bold")
            text.append(" " * room + _GAP + values + "\n")
        else:
            text.append(row[0], style="bold")
            text.append(" " * (room - len(row[0])) + _GAP + values + "\n")
    text.rstrip()
    return text


def _rich_table(spec: Table, width: int):
    cells = [[_cell(c, v) for c, v in zip(spec.columns, row, strict=True)] for row in spec.rows]
    return _fitted_table(spec.title, [_label(c) for c in spec.columns], cells, width)


def memory_panel(report, width: int = 80) -> Any:
    """The memory report: CUDA peaks per phase, or "no CUDA device" plus host and tensor peaks."""
    from rich.panel import Panel

    on_cuda = report.cuda == "cuda"
    headers = ["phase", "seconds"]
    if on_cuda:
        headers += ["peak allocated", "peak reserved", "% of device", "retries", "OOMs"]
    headers.append("host peak RSS")
    if not on_cuda:
        headers.append("peak live tensors")
    rows = []
    for phase in report.phases:
        row = [phase.name, f"{phase.seconds:.1f}"]
        if on_cuda:
            share = 100 * phase.cuda_reserved_bytes / phase.cuda_device_bytes
            row += [
                format_bytes(phase.cuda_allocated_bytes),
                format_bytes(phase.cuda_reserved_bytes),
                f"{share:.1f}%",
                str(phase.cuda_alloc_retries),
                str(phase.cuda_ooms),
            ]
        row.append(format_bytes(phase.host_peak_rss_bytes))
        if not on_cuda:
            live = phase.live_tensor_peak_bytes
            row.append("not tracked" if live is None else format_bytes(live))
        rows.append(row)
    inside = width - 4  # the panel's border and padding
    table = _fitted_table(None, headers, rows, inside, justify="right", show_edge=False)
    title = "memory: peak CUDA per phase" if on_cuda else f"memory: {report.cuda} — host figures"
    return Panel(table, title=title, title_align="left", border_style="cyan")


def emit(result: CommandResult, memory, as_json: bool) -> None:
    """Print a command's result and its memory report: Rich on stdout, or one JSON object."""
    if as_json:
        payload = {
            "command": result.title,
            **result.fields,
            "tables": [asdict(t) for t in result.tables],
            "notes": result.notes,
            "warnings": result.warnings,
            "memory": memory.to_dict(),
        }
        sys.stdout.write(json.dumps(payload, default=_json_value) + "\n")
        return
    console = _stdout_console()
    console.print(_fields_table(result))
    for spec in result.tables:
        console.print(_rich_table(spec, console.width))
    from rich.markup import escape

    for note in result.notes:
        console.print(f"[dim]{escape(note)}[/dim]")
    console.print(memory_panel(memory, console.width))


def _json_value(value: Any) -> Any:
    """JSON for what ``json`` does not know: numpy numbers stay numbers, arrays and shapes lists."""
    if hasattr(value, "tolist"):  # numpy scalars and arrays, torch.Size, torch tensors
        return value.tolist()
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    return str(value)  # paths, dtypes


def error(message: str, hint: str | None) -> None:
    """One line saying what went wrong and, below it, what to do (stderr)."""
    from rich.markup import escape

    console = _stderr_console(errors=True)
    message, hint = _shorten(message), _shorten(hint) if hint else hint
    console.print(f"[bold red]error:[/bold red] {escape(message)}", highlight=False, soft_wrap=True)
    if hint:
        console.print(f"[yellow]hint:[/yellow] {escape(hint)}", highlight=False, soft_wrap=True)


_MESSAGE_CHARS = 500


def _shorten(text: str) -> str:
    """An error line stays a line: a huge path or value in it is cut, saying how much."""
    if len(text) <= _MESSAGE_CHARS:
        return text
    return f"{text[:_MESSAGE_CHARS]}... ({len(text) - _MESSAGE_CHARS:,} more characters)"


def warn(message: str) -> str:
    """A warning on stderr, shown once when it arises; returns it for ``CommandResult.warnings``."""
    from rich.markup import escape

    _stderr_console().print(
        f"[bold yellow]warning:[/bold yellow] {escape(message)}", highlight=False
    )
    return message


def info(message: str) -> None:
    """A log line on stderr (e.g. the dtype chosen and why)."""
    _stderr_console().print(message, highlight=False)
