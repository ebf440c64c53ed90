"""``swm convert SRC DST --layout stable-worldmodel|lerobot|minari``: any dataset swm reads,
written as another tool lays out its own, so that tool trains on it.

Each target has its own convention for what swm stores as NaN (the last row's action: no action
was taken from the final observation), and ``CONVENTIONS`` says it in the one line
``swm convert`` prints; no export carries that NaN, and swm's import of each gives swm's rows
back exactly (the last row's action NaN again):

- stable-worldmodel (``upstream.py``): its own Lance or HDF5 layout, by DST's suffix. HDF5
  keeps every column's dtype and shape: bit-exact. Lance is upstream's: frames as JPEG
  (quality 95, its default: lossy), numbers as ``fixed_size_list<float32>``; swm's schema rides
  along in the table's metadata (upstream ignores it), so a re-import restores dtypes and shapes,
  exact for every column float32 holds.
- LeRobot v3 (``lerobot.py``): frames, videos, stats, each episode's last row aside.
- Minari (``minari.py``): T+1 observations, T actions, rewards and flags; raw frames: exact.

Every export streams episode by episode into a hidden temporary path, re-reads it with swm's own
reader of that layout, compares counts and every lossless column's checksum, then renames it into
place (like ``copy_dataset``).
"""

from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from swmcli.data.copy import Copied, check_source, destination_lock, write_into_place
from swmcli.data.exports import lerobot, minari
from swmcli.data.exports.upstream import Hdf5Export, LanceExport
from swmcli.data.foreign.common import LEROBOT, MINARI, UPSTREAM_HDF5, UPSTREAM_LANCE
from swmcli.data.formats import open_reader
from swmcli.data.storage import location as loc
from swmcli.data.storage.checksums import check_episode
from swmcli.data.storage.schema import is_image
from swmcli.errors import UsageError

LAYOUTS = ("swm", "stable-worldmodel", "lerobot", "minari")
CONVENTIONS = {
    "stable-worldmodel": (
        "last row's action (none taken there; NaN in swm) = the episode's first action, as "
        "stable-worldmodel 0.1.1's World.collect writes it: no NaN in its batches"
    ),
    "lerobot": (
        "each episode's last row (the final observation: no action taken there) is not a "
        "LeRobot frame: T frames, each with the action taken at it; LeRobot pads past an "
        "episode's end (action_is_pad); the row is kept in meta/swm_last_rows.parquet for swm"
    ),
    "minari": (
        "T+1 observations, T actions (the last row has none: nothing written, no NaN), "
        "rewards and flags of the T steps"
    ),
}
_DESTINATIONS = {
    "stable-worldmodel": ".lance directory or .h5 file",
    "lerobot": "directory",
    "minari": "directory named NAME-vN",
}
# dtypes whose every value float32 holds exactly: these round-trip bit-exact through Lance
_EXACT_IN_FLOAT32 = {"float32", "bool", "uint8", "int8", "uint16", "int16"}


def lossless_keys(schema, layout: str, lance: bool) -> list[str]:
    """The keys an export keeps bit-exact: all in stable-worldmodel's HDF5; no frames in its
    Lance (JPEG) or in LeRobot's videos (h264), and in Lance only the numbers float32 holds;
    in LeRobot and Minari not the reward and flags (their first row has no slot there)."""
    exact = []
    for key, (dtype, shape) in schema.items():
        if layout in ("lerobot", "minari") and key in minari.ARRIVAL_KEYS:
            continue
        if (lance or layout == "lerobot") and is_image(shape):
            continue
        if lance and np.dtype(dtype).name not in _EXACT_IN_FLOAT32:
            continue
        exact.append(key)
    return exact


def _check_frames(schema, layout: str, lance: bool, src) -> None:
    """Refuse, before anything is written, frames a layout cannot carry: other than uint8 in
    Lance (JPEG) and LeRobot (h264 video); floats in any (swm reads another tool's float frames
    as uint8, so the copy would not read back as its source)."""
    for key, (dtype, shape) in schema.items():
        dtype = np.dtype(dtype)
        if not is_image(shape) or dtype == np.uint8:
            continue
        if dtype.kind == "f":
            why = "swm reads another tool's float frames as uint8 (x 255), not as they are"
        elif lance or layout == "lerobot":
            why = f"{_FRAMES[layout if not lance else 'lance']} holds 8-bit frames"
        else:
            continue
        raise UsageError(
            f"{src}: {key} holds {dtype} frames; a --layout {layout} export cannot keep them: "
            f"{why}",
            hint="store the frames as uint8 (0..255), or leave them out (--keys)"
            + ("" if dtype.kind == "f" or layout == "lerobot" else "; a .h5 path keeps them"),
        )


_FRAMES = {"lance": "stable-worldmodel's Lance layout (JPEG)", "lerobot": "LeRobot's h264 video"}


class _Exported:
    """The source as every export writes it: each episode checked against its own checksums,
    then its last row's action NaN (swm's convention: no action is taken from the final
    observation, and no layout keeps one there, so the re-read that verifies the export gives
    NaN back whatever the source held)."""

    def __init__(self, reader):
        self._reader = reader

    def __getattr__(self, name: str):
        return getattr(self._reader, name)

    def read_episode(self, index: int, keys=None) -> dict[str, np.ndarray]:
        episode = self._reader.read_episode(index, keys)
        check_episode(self._reader, index, episode)
        action = episode.get("action")
        if action is not None and action.dtype.kind == "f" and not np.isnan(action[-1]).all():
            action = action.copy()
            action[-1] = np.nan
            episode = {**episode, "action": action}
        return episode

    def read_checksums(self, index: int) -> None:
        return None  # read_episode checked them before it set the last action


def _writer(layout: str, dst: Path):
    """How to open the export's writer on its temporary path, and the format it writes."""
    suffix = dst.suffix.lower()
    if layout == "lerobot":
        return lerobot.LeRobotExport, LEROBOT
    if layout == "minari":
        minari.check_destination(dst)
        return partial(_minari_export, dataset_id=minari.dataset_id(dst)), MINARI
    if suffix not in (".lance", ".h5", ".hdf5"):
        raise UsageError(
            f"--layout {layout} writes a local {_DESTINATIONS[layout]}, not {dst}",
            hint="e.g. data/pusht.lance or data/pusht.h5",
        )
    lance = suffix == ".lance"
    return (LanceExport, UPSTREAM_LANCE) if lance else (Hdf5Export, UPSTREAM_HDF5)


def _minari_export(path: Path, schema, dataset_id: str):
    return minari.MinariExport(path, schema, dataset_id)


def export_dataset(
    src: str | Path,
    dst: str | Path,
    keys: list[str] | None = None,
    overwrite: bool = False,
    on_episode: Callable[[int, int], None] | None = None,
    mapping: dict[str, str] | None = None,
    layout: str = "stable-worldmodel",
) -> Copied:
    """Write the dataset at ``src`` to ``dst`` in another tool's ``layout`` (stable-worldmodel's
    ``.lance`` or ``.h5``, a LeRobot v3 directory, a Minari dataset directory), streamed,
    verified and renamed into place; ``mapping`` (``--map``) renames the source's columns, and
    so chooses the exported names. Returns what ``copy_dataset`` does."""
    src, dst = loc.as_location(src), loc.as_location(dst)
    if loc.is_remote(dst):
        raise UsageError(
            f"--layout {layout} writes a local {_DESTINATIONS[layout]}, not {dst}",
            hint="write it locally, then upload it",
        )
    writer, fmt = _writer(layout, Path(dst))
    with destination_lock(dst, [src]):  # held until the copy is in place
        reader = open_reader(src, mapping)
        try:
            keys = check_source(reader, src, dst, keys, overwrite)
            schema = {key: reader.keys[key] for key in keys}
            _check_frames(schema, layout, fmt == UPSTREAM_LANCE, src)
            exact = lossless_keys(schema, layout, fmt == UPSTREAM_LANCE)

            def open_temporary(temporary):
                return writer(temporary, schema)

            return write_into_place(
                _Exported(reader), src, dst, keys, open_temporary, fmt, on_episode, exact
            )
        finally:
            reader.close()
