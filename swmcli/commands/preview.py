"""``swm preview DATASET``: a sample of a dataset's episodes as videos a person watches.

Every pixel key side by side, enlarged, with the episode, the step and the action written under
each frame (``data/videos.py``), one MP4 (or GIF) per episode or one grid of them all. Any
dataset swm reads works, another tool's included (``open_reader``). Rows are read in chunks of
``CHUNK_STEPS`` steps, so what is held is one chunk per episode shown, whatever the episodes'
lengths; the memory panel's phase says how much that is.
"""

import time
from pathlib import Path

import numpy as np

from swmcli.data.formats import open_reader
from swmcli.data.mapping import parse_mapping
from swmcli.data.videos import (
    BLACK,
    VideoWriter,
    grid,
    is_frame,
    require_av,
    side_by_side,
    stacked,
    text_strip,
)
from swmcli.errors import UsageError
from swmcli.report import CommandResult, progress
from swmcli.units import format_bytes

CHUNK_STEPS = 64  # rows of one episode read at once
ACTION_VALUES_SHOWN = 6  # an action's first values written under its frame
LABEL_MIN_WIDTH = 256  # pixels: room for six action values


def run_preview(
    path: str | Path,
    out: Path,
    episodes: int | None = None,
    seed: int = 0,
    index: str | None = None,
    gif: bool = False,
    as_grid: bool = False,
    fps: int = 10,
    mapping: list[str] | None = None,
    monitor=None,
) -> CommandResult:
    """Write videos of the episodes of the dataset at ``path`` into the folder ``out``: the
    episodes ``index`` ("3,17"), or ``episodes`` drawn with ``seed`` (4 by default); a GIF
    instead of an MP4 with ``gif``; one video of them all in a grid with ``as_grid``; ``fps``
    frames a second. ``mapping`` (``COLUMN=KEY``) renames columns as ``--map`` does elsewhere."""
    require_av("swm preview")
    if index is not None and episodes is not None:
        raise UsageError("--index and --episodes together", hint="give one of them")
    if fps < 1:
        raise UsageError(f"--fps {fps}", hint="give 1 frame a second or more (10 is usual)")
    started = time.perf_counter()
    reader = open_reader(path, parse_mapping(mapping))
    try:
        pixel_keys = _pixel_keys(reader, path)
        chosen = _chosen(reader, index, 4 if episodes is None else episodes, seed)
        keys = pixel_keys + (["action"] if "action" in reader.keys else [])
        held = _row_bytes(reader, keys) * CHUNK_STEPS * (len(chosen) if as_grid else 1)
        shown = f"{len(chosen)} episodes" if as_grid else "one episode"
        phase = f"preview (holds {CHUNK_STEPS} rows of {shown}: {format_bytes(held)})"
        frames = int(sum(reader.episode_lengths[e] for e in chosen))
        with _phase(monitor, phase), progress("preview", total=frames) as advance:
            suffix = ".gif" if gif else ".mp4"
            if as_grid:
                written = [_write_grid(reader, chosen, keys, out / f"grid{suffix}", fps, gif,
                                       advance)]  # fmt: skip
            else:
                written = [
                    _write_episode(reader, e, keys, out / f"episode_{e}{suffix}", fps, gif, advance)
                    for e in chosen
                ]
    finally:
        reader.close()
    fields = {
        "dataset": str(path),
        "format": reader.format,
        "episodes": chosen,
        "pixel_keys": pixel_keys,
        "frames": frames,
        "videos": [str(p) for p in written],
        "held_in_memory_bytes": held,
        "seconds": round(time.perf_counter() - started, 2),
    }
    return CommandResult(title="swm preview", fields=fields)


def _pixel_keys(reader, path) -> list[str]:
    """The keys holding pictures, ``pixels`` first; a clear error when there is none."""
    keys = [key for key, (dtype, shape) in reader.keys.items() if is_frame(dtype, shape)]
    if not keys:
        raise UsageError(
            f"{path} holds no pictures (uint8 (H, W) or (H, W, C) rows) to preview",
            hint=f"swm info {path} lists its keys; --map COLUMN=pixels names the frames' column",
        )
    return sorted(keys, key=lambda key: (key != "pixels", key))


def _chosen(reader, index: str | None, count: int, seed: int) -> list[int]:
    """The episodes ``index`` names, or ``count`` of them drawn with ``seed`` (in order)."""
    total = reader.num_episodes
    if total == 0:
        raise UsageError("the dataset holds no episode", hint="collect some first (swm collect)")
    if index is None:
        if count < 1:
            raise UsageError(f"--episodes {count}", hint="give 1 or more")
        drawn = np.random.default_rng(seed).choice(total, min(count, total), replace=False)
        return sorted(int(e) for e in drawn)
    try:
        named = [int(part) for part in index.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--index {index!r}", hint="episode numbers, e.g. --index 0,7") from None
    outside = [e for e in named if not 0 <= e < total]
    if outside or not named:
        raise UsageError(
            f"--index {index}: the dataset holds episodes 0 to {total - 1}",
            hint=f"give episode numbers from 0 to {total - 1}",
        )
    return named


def _row_bytes(reader, keys: list[str]) -> int:
    return sum(np.dtype(reader.keys[k][0]).itemsize * int(np.prod(reader.keys[k][1])) for k in keys)


def _chunks(reader, episode: int, keys: list[str]):
    """The episode's rows of ``keys``, ``CHUNK_STEPS`` steps at a time: (first step, rows)."""
    start, length = int(reader.episode_offsets[episode]), int(reader.episode_lengths[episode])
    for first in range(0, length, CHUNK_STEPS):
        rows = np.arange(start + first, start + min(first + CHUNK_STEPS, length))
        yield first, reader.read_columns(keys, rows)


def _frame(rows: dict, at: int, keys: list[str], episode: int, step: int, length: int):
    """One episode's picture at ``step``: its pixel keys side by side, the label under them."""
    panels = [(key, rows[key][at]) for key in keys if key != "action"]
    row = side_by_side(panels)
    lines = [(f"episode {episode}   step {step} / {length - 1}", BLACK)]
    if "action" in rows:
        lines.append((_action_text(rows["action"][at]), BLACK))
    return stacked(row, text_strip(max(row.shape[1], LABEL_MIN_WIDTH), lines))


def _action_text(action: np.ndarray) -> str:
    values = np.asarray(action, dtype=np.float64).reshape(-1)
    if np.isnan(values).all():
        return "action: none (the episode's last row)"
    shown = ", ".join(f"{v:+.2f}" for v in values[:ACTION_VALUES_SHOWN])
    more = f", ... ({len(values)} values)" if len(values) > ACTION_VALUES_SHOWN else ""
    return f"action: [{shown}{more}]"


def _write_episode(reader, episode, keys, path: Path, fps, gif, advance) -> Path:
    length = int(reader.episode_lengths[episode])
    with VideoWriter(path, fps, gif) as video:
        for first, rows in _chunks(reader, episode, keys):
            for at in range(len(rows[keys[0]])):
                video.write(_frame(rows, at, keys, episode, first + at, length))
                advance(1)
    return path


def _write_grid(reader, chosen: list[int], keys, path: Path, fps, gif, advance) -> Path:
    """Every chosen episode in one video, a tile each, in step; an episode that has ended
    holds its last frame."""
    lengths = [int(reader.episode_lengths[e]) for e in chosen]
    columns = int(np.ceil(np.sqrt(len(chosen))))
    streams = [_chunks(reader, e, keys) for e in chosen]
    current = [next(stream) for stream in streams]  # (first step, rows) of each episode
    with VideoWriter(path, fps, gif) as video:
        for step in range(max(lengths)):
            tiles = []
            for number, episode in enumerate(chosen):
                shown = min(step, lengths[number] - 1)
                first, rows = current[number]
                if shown >= first + len(rows[keys[0]]):
                    current[number] = first, rows = next(streams[number])
                tiles.append(_frame(rows, shown - first, keys, episode, shown, lengths[number]))
                if step < lengths[number]:
                    advance(1)
            video.write(grid(tiles, columns))
    return path


def _phase(monitor, name: str):
    from contextlib import nullcontext

    return monitor.phase(name) if monitor is not None else nullcontext()
