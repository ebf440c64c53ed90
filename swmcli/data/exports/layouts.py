"""``swm convert SRC DST --layout stable-worldmodel``: any dataset swm reads, written in
stable-worldmodel's own Lance or HDF5 layout (by DST's suffix) so its ``load_dataset`` trains on it
(``--layout lerobot``: a LeRobot v3 dataset, see ``lerobot_export.py``).

swm's rows are already main's convention (reset frame + T steps, NaN last action), so rows are
written as they are. HDF5 keeps every column's dtype and shape: the round trip swm -> upstream ->
swm is bit-exact. Lance is upstream's: frames as JPEG (quality 95, its default: lossy), numbers
as ``fixed_size_list<float32>``; swm's schema rides along in the table's metadata (upstream
ignores it), so a re-import restores dtypes and shapes, exact for every column float32 holds.
Streams episode by episode into a hidden temporary path, re-reads it, compares counts and every
lossless column's checksum, then renames it into place (like ``copy_dataset``).
"""

from collections.abc import Callable
from pathlib import Path

import numpy as np

from swmcli.data.copy import Copied, check_source, destination_lock, write_into_place
from swmcli.data.exports.lerobot import ARRIVAL_KEYS, LeRobotExport
from swmcli.data.exports.upstream import Hdf5Export, LanceExport
from swmcli.data.foreign.common import LEROBOT, UPSTREAM_HDF5, UPSTREAM_LANCE
from swmcli.data.formats import open_reader
from swmcli.data.storage import location as loc
from swmcli.data.storage.schema import is_image
from swmcli.errors import UsageError

LAYOUTS = ("swm", "stable-worldmodel", "lerobot")
_DESTINATIONS = {"stable-worldmodel": ".lance directory or .h5 file", "lerobot": "directory"}
# dtypes whose every value float32 holds exactly: these round-trip bit-exact through Lance
_EXACT_IN_FLOAT32 = {"float32", "bool", "uint8", "int8", "uint16", "int16"}


def lossless_keys(schema, lossy_frames: bool, frames_only: bool = False) -> list[str]:
    """The keys an export keeps bit-exact: all in HDF5; no frames in Lance or LeRobot (JPEG,
    h264), and in Lance only the numbers float32 holds (LeRobot's parquet keeps every dtype)."""
    if not lossy_frames:
        return list(schema)
    return [
        key
        for key, (dtype, shape) in schema.items()
        if not is_image(shape) and (frames_only or np.dtype(dtype).name in _EXACT_IN_FLOAT32)
    ]


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
    ``.lance`` or ``.h5``, or a LeRobot v3 directory), streamed, verified and renamed into
    place; returns what ``copy_dataset`` does."""
    src, dst = loc.as_location(src), loc.as_location(dst)
    suffix = Path(loc.name(dst)).suffix.lower()
    if loc.is_remote(dst) or (layout != "lerobot" and suffix not in (".lance", ".h5", ".hdf5")):
        raise UsageError(
            f"--layout {layout} writes a local {_DESTINATIONS[layout]}, not {dst}",
            hint="e.g. data/pusht.lance or data/pusht.h5 (stable-worldmodel), data/pusht (lerobot)",
        )
    lance = layout != "lerobot" and suffix == ".lance"
    with destination_lock(dst):  # held until the copy is in place
        reader = open_reader(src, mapping)
        try:
            keys = check_source(reader, src, dst, keys, overwrite)
            schema = {key: reader.keys[key] for key in keys}
            writer = {".lance": LanceExport, ".h5": Hdf5Export, ".hdf5": Hdf5Export}.get(suffix)
            writer = LeRobotExport if layout == "lerobot" else writer
            exact = lossless_keys(schema, lance or layout == "lerobot", frames_only=not lance)
            if layout == "lerobot":  # a first row's reward/flags have no frame to go to
                exact = [key for key in exact if key not in ARRIVAL_KEYS]
            fmt = LEROBOT if layout == "lerobot" else UPSTREAM_LANCE if lance else UPSTREAM_HDF5

            def open_temporary(temporary):
                return writer(temporary, schema)

            return write_into_place(reader, src, dst, keys, open_temporary, fmt, on_episode, exact)
        finally:
            reader.close()
