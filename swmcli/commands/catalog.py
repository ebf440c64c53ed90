"""``swm envs``: every env ``--env`` accepts, with its spaces and frame size, and whether it
renders here (``envs/catalog.py`` builds each once)."""

import time

from swmcli.envs.catalog import env_catalog
from swmcli.errors import UsageError
from swmcli.report import CommandResult, Table


def run_envs(pattern: str | None = None, monitor=None) -> CommandResult:
    """The envs whose id matches ``pattern`` (all when None) as one table; ``monitor`` (a
    MemoryMonitor) measures the building as the phase "build envs"."""
    from contextlib import nullcontext

    started = time.perf_counter()
    with monitor.phase("build envs") if monitor is not None else nullcontext():
        entries = env_catalog(pattern)
    if not entries:
        raise UsageError(
            f"no env id matches {pattern!r}",
            hint="swm envs with no pattern lists them all; patterns are shell-style: 'CartPole*'",
        )
    rows = [
        [e.id, e.source, e.observation or "-", e.action or "-", e.render_size or "-", e.renders]
        for e in entries
    ]
    columns = ["--env", "from", "observation space", "action space", "frame", "renders here"]
    rendering = sum(e.renders == "yes" for e in entries)
    fields = {
        "envs": len(entries),
        "rendering_here": rendering,
        "seconds": round(time.perf_counter() - started, 2),
    }
    notes = [
        "swm draws each env's frames at --resolution (resized where the env renders another "
        "size) and gives the planners its Box actions rescaled to [-1, 1]"
    ]
    return CommandResult("swm envs", fields, [Table("envs", columns, rows)], notes)
