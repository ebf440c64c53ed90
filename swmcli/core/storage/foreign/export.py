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

import io
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from swmcli.core.storage import is_image, open_reader, schema_to_json
from swmcli.core.storage import location as loc
from swmcli.core.storage.copy import Copied, check_source, destination_lock, write_into_place
from swmcli.core.storage.foreign import LEROBOT, UPSTREAM_HDF5, UPSTREAM_LANCE
from swmcli.core.storage.foreign.upstream import EXPORT_KEY
from swmcli.errors import UsageError

LAYOUTS = ("swm", "stable-worldmodel", "lerobot")
_DESTINATIONS = {"stable-worldmodel": ".lance directory or .h5 file", "lerobot": "directory"}
JPEG_QUALITY = 95  # stable-worldmodel's own default
_FLUSH_BYTES = 64 * 2**20  # encoded episodes held before they are appended to the Lance table
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
    from swmcli.core.storage.foreign.lerobot_export import ARRIVAL_KEYS, LeRobotExport

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


def _export_metadata(schema) -> str:
    import swmcli

    return json.dumps({"keys": schema_to_json(schema), "swm_version": swmcli.__version__})


class LanceExport:
    """Upstream's Lance table, written in one Lance commit from a stream of episode batches."""

    def __init__(self, path: Path, schema):
        import pyarrow as pa

        self.path, self.schema = path, schema
        fields = [pa.field("episode_idx", pa.int32()), pa.field("step_idx", pa.int32())]
        for key, (_, shape) in schema.items():
            if is_image(shape):
                fields.append(pa.field(key, pa.binary()))
            else:
                fields.append(pa.field(key, pa.list_(pa.float32(), int(np.prod(shape)))))
        self._arrow = pa.schema(fields, metadata={EXPORT_KEY: _export_metadata(schema)})
        self._batches: list = []
        self._buffered = 0
        self.num_episodes = self.num_steps = 0

    def write_episode(self, episode) -> int:
        """Encode one episode into a record batch (written at ``close``, in one commit)."""
        import pyarrow as pa

        length = len(next(iter(episode.values())))
        arrays = [
            pa.array(np.full(length, self.num_episodes, np.int32)),
            pa.array(np.arange(length, dtype=np.int32)),
        ]
        for key, (_, shape) in self.schema.items():
            values = np.asarray(episode[key])
            if is_image(shape):
                arrays.append(pa.array([_jpeg(frame) for frame in values], pa.binary()))
            else:
                flat = values.reshape(length, -1).astype(np.float32).reshape(-1)
                arrays.append(
                    pa.FixedSizeListArray.from_arrays(pa.array(flat), flat.size // length)
                )
        batch = pa.record_batch(arrays, schema=self._arrow)
        self._batches.append(batch)
        self._buffered += batch.nbytes
        if self._buffered >= _FLUSH_BYTES:
            self._flush()
        self.num_episodes += 1
        self.num_steps += length
        return self.num_episodes - 1

    def _flush(self) -> None:
        """Append the buffered episodes as one Lance commit (memory stays under _FLUSH_BYTES)."""
        import lance
        import pyarrow as pa

        from swmcli.core.storage.lance import _mark_opened

        if not self._batches:
            return
        _mark_opened()
        stream = pa.RecordBatchReader.from_batches(self._arrow, iter(self._batches))
        mode = "append" if self.path.exists() else "create"
        lance.write_dataset(stream, str(self.path.absolute()), schema=self._arrow, mode=mode)
        self._batches, self._buffered = [], 0

    def __enter__(self):
        return self

    def __exit__(self, kind, *_):
        if kind is None:
            self.close()

    def close(self) -> None:
        self._flush()


def _jpeg(frame: np.ndarray) -> bytes:
    from PIL import Image

    if frame.ndim == 3 and frame.shape[-1] == 1:
        frame = frame[..., 0]
    buffer = io.BytesIO()
    Image.fromarray(np.asarray(frame, dtype=np.uint8)).save(buffer, "JPEG", quality=JPEG_QUALITY)
    return buffer.getvalue()


class Hdf5Export:
    """Upstream's HDF5 file: a resizable dataset per column (one row a chunk), ep_len/ep_offset."""

    def __init__(self, path: Path, schema):
        import h5py

        self.path, self.schema = path, schema
        self._file = h5py.File(path, "w", libver="latest")
        for key, (dtype, shape) in schema.items():
            self._file.create_dataset(
                key, shape=(0, *shape), maxshape=(None, *shape), dtype=dtype, chunks=(1, *shape)
            )
        self._file.create_dataset("ep_len", shape=(0,), maxshape=(None,), dtype=np.int32)
        self._file.create_dataset("ep_offset", shape=(0,), maxshape=(None,), dtype=np.int64)
        self._file.attrs[EXPORT_KEY] = _export_metadata(schema)
        self.num_episodes = self.num_steps = 0

    def write_episode(self, episode) -> int:
        length = len(next(iter(episode.values())))
        for key in self.schema:
            column = self._file[key]
            column.resize(self.num_steps + length, axis=0)
            column[self.num_steps :] = episode[key]
        for name, value in (("ep_len", length), ("ep_offset", self.num_steps)):
            self._file[name].resize(self.num_episodes + 1, axis=0)
            self._file[name][self.num_episodes] = value
        self.num_episodes += 1
        self.num_steps += length
        return self.num_episodes - 1

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
