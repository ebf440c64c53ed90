"""Lance datasets: one row per observation, each frame an LZ4 frame in a binary column.

Images (rows with two or more dimensions) go in a ``large_binary`` column, one value per frame: its
raw bytes as one standard LZ4 frame (the ``lz4`` command's format, high-compression mode), with
Lance's own compression and page dictionaries off for that column (``swm:codec = lz4-frame`` in the
field's metadata). A column whose first episode's frames LZ4 shrinks by less than ``RAW_BELOW``
(noise, camera sensor data) stores its frames' raw bytes instead (``swm:codec = raw``): LZ4's
high-compression mode costs its encode time whatever it saves. Lance's zstd over raw frames would
cost ~50 ms of CPU per batch of 256 frames at 224x224, nearly all of it in Lance's take; LZ4 frames
cost ~17 ms, take and decoding together, for 1.35x the bytes on disk on the benchmark frames. Plain
readers decode a frame with ``pyarrow.Codec("lz4").decompress(value, nbytes)`` (or
``lz4.frame.decompress``) and reshape it by the ``keys`` entry of the swm metadata. Vectors are
``fixed_size_list`` columns, scalars plain columns; the swm metadata (schema, env id, ...) is JSON
in the Arrow schema metadata under ``swm``, so plain ``lance``, ``lancedb`` and ``pyarrow`` read
the dataset without swm.

Each ``write_episode`` is one Lance commit, so an episode is on disk or not at all. Many small
commits make many small fragments, which slow reads down; the writer merges them by tiers, so an
append costs the same on a dataset of any size: ``MERGE_FAN_IN`` fragments of one tier (rows
within a factor ``MERGE_FAN_IN``) that follow one another are merged into one, the last fragments
are merged into one once they hold ``_FRAGMENT_BYTES`` on disk, which is merged no more, and on
close the fragments under ``_SMALL_BYTES`` are merged. Each row is rewritten about once per tier
(a few times), and a dataset holds at most ``MERGE_FAN_IN`` fragments per tier below the largest.
A merge the disk has no room for waits (the free space is checked first). The versions a merge
supersedes are deleted at once, but for those a reader holds.

On object storage (``s3://``) a commit writes the episode's data file, then the manifest that
names it: a writer killed in between leaves an unreferenced file and the dataset at its last
episode.

A reader of a local dataset reads through Linux's io_uring (Lance's ``file+uring://`` store) where
this process may set one up (``io_uring_allowed``): Lance's plain local store hands each read to
a thread, and a batch of a large dataset is one read per clip; through io_uring a take of 64
clips from a million rows costs about half the time and CPU. Writers and deletes always go
through the plain store (Lance commits through ``file+uring://`` without its safe commit
handler).

Lance is not fork-safe: a process forked after this one opened a dataset may crash when it reads.
``opened_in_this_process()`` tells the DataLoader factory whether it may still fork, and a reader
opened in such a forked child refuses with a clear error instead of crashing at random.
"""

import ctypes
import functools
import json
import os
import struct
import sys
import threading
from datetime import timedelta

import numpy as np

from swmcli.data.storage import location as loc
from swmcli.data.storage.checksums import CHECKSUM_COLUMN, row_checksums
from swmcli.data.storage.location import Location, nbytes_under
from swmcli.data.storage.lock import ReaderLock, no_readers, pinned_versions
from swmcli.data.storage.schema import (
    build_metadata,
    check_index,
    check_keys,
    check_metadata,
    check_schema,
    episode_schema,
    is_image,
    offsets_from_lengths,
    read_metadata,
    take_rows,
)
from swmcli.errors import DatasetError, UsageError, first_line
from swmcli.host import available_host_bytes

# Fragments of one tier merged into one (a tier's sizes are within this factor).
MERGE_FAN_IN = 8
PIXEL_ENCODING = "raw uint8, one LZ4 frame per row (raw bytes where the column's swm:codec is raw)"
# Field metadata of an image column: the codec of its frames.
CODEC = "swm:codec"
LZ4_FRAME = "lz4-frame"
RAW = "raw"
# An image column whose first episode's frames LZ4 leaves above this fraction of their bytes is
# stored raw (choose_codec).
RAW_BELOW = 0.9
_CODEC_SAMPLE = 8
# LZ4's high-compression mode at its cheapest level: frames decode as fast as (or faster than)
# plain LZ4's, 1.5x smaller on the benchmark frames and 3.5x on TwoRoom's, for 2-5x its encode time.
_LZ4_LEVEL = 3
_STORAGE_VERSION = "2.1"
# Lance stores a page of values as a dictionary of its distinct values where they repeat (still
# frames do) and reads a page's whole dictionary the first time a take touches the page, then
# holds it: a loader's scattered takes read and hold every page's dictionary (2.7 MB each of the
# scale benchmark's frames, 100 MB of a reader's memory at 100,000 episodes), and a take costs
# 2.3x as much at 100,000 episodes as at 1,000, against 1.4x without. Image columns opt out
# (Lance uses a dictionary where distinct values <= values / this divisor: never); repeated
# frames cost their bytes on disk instead.
_NO_DICTIONARY = {"lance-encoding:dict-divisor": str(2**32)}
# Fragments grow to this many bytes on disk (half of it at least) and are merged no more (of 64x64
# frames LZ4 shrinks as the benchmark's: ~200,000 rows; of 64x64 noise: ~44,000; of 224x224 noise:
# ~3,500); those under _SMALL_BYTES of rows before compression are merged on close too. A take
# pays for each fragment it touches (tens of µs, more than a small frame's bytes), and the append
# that fills a fragment rewrites it whole, in time and memory that grow with its bytes on disk.
_FRAGMENT_BYTES = 512 * 2**20
_SMALL_BYTES = 2**20
_FOOTER = struct.Struct("<QQQII2H4s")  # the end of a Lance data file: see _check_footer
# Frames (decoded bytes) per take: LZ4 frames are a small fraction of that in the take, so a
# batch is one or two takes.
_TAKE_BYTES = 64 * 2**20
# A reader holds the small columns (every key but the images, and the checksums) in memory from
# their first read where they take at most this share of the host's available memory (a few
# dozen bytes a step: 42 MB for a million steps of the benchmark's episodes). Lance reads a
# scattered row by decoding its column's block: 64 clips of a large dataset touch 64 blocks a
# column (about 5x a batch of a 1,000-episode dataset, whose columns are a few blocks each).
_RESIDENT_SHARE = 1 / 32
# Reading the small columns whole: rows a batch. A scan reads ahead a batch, a fragment and this
# many bytes at most (Lance's default, gigabytes, held 0.2 GB more of a reader's memory at ten
# million rows, and a merge's 0.25 GB more, for no speed).
_SCAN_ROWS = 2**16
_READ_AHEAD = {"batch_readahead": 1, "fragment_readahead": 1, "io_buffer_size": 32 * 2**20}
# io_uring_setup(2) (the same number on every Linux architecture) and the queue depth Lance's
# io_uring threads ask for (LANCE_URING_QUEUE_DEPTH): the probe sets up a ring that size.
_IO_URING_SETUP = 425
_URING_ENTRIES = 16 * 1024
_DAMAGED_HINT = "the dataset is damaged (a missing or truncated file): restore it or collect again"
_opened_by: int | None = None  # the pid that first opened a Lance dataset (inherited by a fork)


def opened_in_this_process() -> bool:
    """True once this process has opened a Lance dataset (forking is unsafe from then on)."""
    return _opened_by == os.getpid()


def _uri(path: Location) -> str:
    """What Lance is given: an s3:// URI, or an absolute path, so ``file:x`` or ``memory:x`` name
    a local directory like any other (Lance would read a relative one as a URI)."""
    return path if loc.is_remote(path) else str(path.absolute())


def _mark_opened() -> None:
    """Note that this process uses Lance; refuse if it is a fork of a process that did already."""
    global _opened_by
    if _opened_by is not None and _opened_by != os.getpid():
        raise UsageError(
            "this process was forked from one that had already opened a Lance dataset, and Lance "
            "is not fork-safe: start DataLoader workers with multiprocessing_context='forkserver'",
            hint="give the DataLoader multiprocessing_context='forkserver' (or 'spawn'), or use "
            "swmcli's make_loader, which picks it for you",
        )
    _opened_by = os.getpid()


def _check_column_names(schema) -> None:
    """Lance reads a '.' in a column name as a struct's field: such a key is refused up front."""
    dotted = [key for key in schema if "." in key]
    if dotted:
        raise UsageError(
            f"a Lance dataset takes no '.' in a key: {', '.join(map(repr, dotted))}",
            hint="name it without '.' (--map COLUMN=NAME), or write HDF5 (an .h5 destination)",
        )


def _arrow_schema(schema, metadata: dict, codecs: dict[str, str] | None = None):
    import pyarrow as pa

    fields = [pa.field("episode_idx", pa.int64()), pa.field("step_idx", pa.int32())]
    for key, (dtype, shape) in schema.items():
        if is_image(shape):
            fields.append(_image_field(key, (codecs or {}).get(key, LZ4_FRAME)))
        elif shape:
            item = pa.from_numpy_dtype(dtype)
            fields.append(pa.field(key, pa.list_(item, int(np.prod(shape)))))
        else:
            fields.append(pa.field(key, pa.from_numpy_dtype(dtype)))
    fields.append(pa.field(CHECKSUM_COLUMN, pa.list_(pa.uint32(), len(schema))))
    return pa.schema(fields, metadata={"swm": json.dumps(metadata)})


def _image_field(key: str, codec: str = LZ4_FRAME):
    """An image column: frames in ``codec`` that Lance stores as they are, never as a dictionary
    of a page's distinct frames (``_NO_DICTIONARY``). Lance keeps the ``swm:codec`` entry in the
    dataset's schema but not its own ``lance-encoding`` hints, so an appending writer sets them
    again."""
    import pyarrow as pa

    hints = {"lance-encoding:compression": "none", **_NO_DICTIONARY, CODEC: codec}
    return pa.field(key, pa.large_binary(), metadata=hints)


def choose_codec(frames: np.ndarray) -> str:
    """LZ4_FRAME for frames LZ4 shrinks below ``RAW_BELOW`` of their bytes, else RAW (judged
    on ``_CODEC_SAMPLE`` frames spread over ``frames``: the choice costs a few frames' encode)."""
    picked = np.unique(np.linspace(0, len(frames) - 1, _CODEC_SAMPLE).astype(np.int64))
    flat = np.ascontiguousarray(frames[picked]).reshape(len(picked), -1).view(np.uint8)
    packed = sum(len(_lz4().compress(frame, asbytes=True)) for frame in flat)
    return LZ4_FRAME if packed < RAW_BELOW * flat.nbytes else RAW


def _to_arrow(values: np.ndarray, shape: tuple[int, ...], codec: str = LZ4_FRAME):
    import pyarrow as pa

    rows = len(values)
    values = np.ascontiguousarray(values)
    if is_image(shape):
        frames = values.reshape(rows, -1).view(np.uint8)
        if codec == RAW:  # one value per frame over the frames' own bytes: no copy
            offsets = np.arange(rows + 1, dtype=np.int64) * frames.shape[1]
            buffers = [None, pa.py_buffer(offsets), pa.py_buffer(frames)]
            return pa.Array.from_buffers(pa.large_binary(), rows, buffers)
        encoded = [_lz4().compress(frame, asbytes=True) for frame in frames]
        return pa.array(encoded, pa.large_binary())
    if shape:
        return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), int(np.prod(shape)))
    return pa.array(values)


@functools.cache
def _lz4():
    import pyarrow as pa

    return pa.Codec("lz4", compression_level=_LZ4_LEVEL)  # one-shot calls are thread-safe


def _codec_of(field) -> str | None:
    """The codec of an image column's frames (None: the column names none)."""
    codec = (field.metadata or {}).get(CODEC.encode())
    return None if codec is None else codec.decode()


def _from_arrow(column, dtype: np.dtype, shape: tuple[int, ...], codec: str | None = None):
    """Arrow column -> ``(rows, *shape)`` array of ``dtype`` (copies only what Arrow must)."""
    array = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    rows = len(array)
    if is_image(shape):
        out = np.empty((rows, *shape), dtype)
        _decode_frames(array, out, np.arange(rows), codec)
        return out
    if shape:
        return array.flatten().to_numpy(zero_copy_only=False).astype(dtype).reshape(rows, *shape)
    return array.to_numpy(zero_copy_only=False).astype(dtype, copy=False)


def _decode_frames(array, out: np.ndarray, positions: np.ndarray, codec: str) -> None:
    """Value ``i`` of ``array`` (frames in ``codec``) decoded into ``out[positions[i]]``."""
    flat = out.reshape(len(out), -1).view(np.uint8)
    nbytes = flat.shape[1]
    first = array.offset
    offsets = np.frombuffer(array.buffers()[1], np.int64)[first : first + len(array) + 1].tolist()
    data = array.buffers()[2]
    lz4 = _lz4()
    for index, position in enumerate(positions.tolist()):
        start, stop = offsets[index], offsets[index + 1]
        value = data.slice(start, stop - start)
        frame = value if codec == RAW else lz4.decompress(value, nbytes)
        if frame.size != nbytes:
            raise ValueError(f"a frame decodes to {frame.size} bytes, not {nbytes}")
        flat[position] = np.frombuffer(frame, np.uint8)


class LanceReader:
    """Reads a swm Lance dataset; rows are fetched with ``take`` (only the rows asked for)."""

    format = "lance"
    metadata_sealed = True  # checked on open

    def __init__(self, path: Location, uring: bool = True):
        """``uring``: read through io_uring where this process may (see the module's notes);
        a writer's reader does not, as a writer reuses its dataset to commit."""
        self.path = path
        _mark_opened()
        # Held while open: a writer deletes no file this reader's version may still use (a local
        # lock file; object storage has none).
        self._lock = None if loc.is_remote(self.path) else ReaderLock(self.path)
        try:
            self._dataset = _open_dataset(self.path, uring)
            if self._lock is not None:
                self._lock.pin(self._dataset.version)
            raw = (self._dataset.schema.metadata or {}).get(b"swm")
        except Exception as error:
            self.close()
            raise DatasetError(
                f"cannot open Lance dataset {self.path}: {first_line(error)}", _DAMAGED_HINT
            ) from error
        if raw is None:
            self.close()
            raise DatasetError(
                f"{self.path} is a Lance dataset but was not written by swm (no swm metadata)",
                hint="write it with swmcli.open_writer or `swm collect`",
            )
        try:
            self.metadata, self.keys = read_metadata(raw, self.path)
            _check_arrow_types(self.path, self._dataset.schema, self.keys)
        except DatasetError:
            self.close()
            raise
        fields = self._dataset.schema
        images = [key for key, (_, shape) in self.keys.items() if is_image(shape)]
        codecs = {key: _codec_of(fields.field(key)) for key in images}
        if unnamed := [key for key, codec in codecs.items() if codec is None]:
            self.close()
            raise DatasetError(
                f"{self.path}: the image column(s) {', '.join(unnamed)} record no codec: the "
                "dataset was not written by swm, or its schema is damaged",
                hint="restore the dataset from a copy or collect it again",
            )
        unknown = {k: c for k, c in codecs.items() if c not in (LZ4_FRAME, RAW)}
        if unknown:
            self.close()
            raise DatasetError(
                f"{self.path} stores frames in a codec this swm does not read: {unknown}",
                hint="upgrade swmcli (pip install -U swmcli)",
            )
        self._codecs = codecs
        self._check_files()
        self.num_steps = self._dataset.count_rows()
        self._lengths: np.ndarray | None = None
        self._resident: dict[str, np.ndarray] | None = None  # see _small_columns
        self._resident_lock = threading.Lock()

    def _check_files(self) -> None:
        """Refuse at open, not mid-training, a dataset whose manifest names a missing file or a
        file whose footer is damaged."""
        present = _data_files(self.path)
        used = {}
        for fragment in self._dataset.get_fragments():
            for data_file in fragment.data_files():
                if data_file.path not in present:
                    raise DatasetError(
                        f"{self.path} is missing its data file {data_file.path}", _DAMAGED_HINT
                    )
                used[loc.join(self.path, "data", data_file.path)] = present[data_file.path]
        for data_file, tail in loc.read_tails(used, _FOOTER.size).items():
            _check_footer(data_file, tail, used[data_file])

    @property
    def index_token(self) -> str:
        """Changes whenever the dataset does: keys the episode-index cache."""
        if loc.is_remote(self.path):
            stamp = self._dataset.versions()[-1]["timestamp"].isoformat()
        else:
            stamp = (self.path / "_versions").stat().st_mtime_ns
        return f"lance:{self._dataset.version}:{self.num_steps}:{stamp}"

    @property
    def episode_lengths(self) -> np.ndarray:
        """Rows of each episode (scans the small ``episode_idx`` column once)."""
        if self._lengths is None:
            columns = ["episode_idx", "step_idx"]
            table = self._guard(lambda: self._dataset.to_table(columns=columns))
            ids, steps = (table.column(name).to_numpy() for name in columns)
            lengths = _lengths_from_ids(ids, self.path)
            check_index(lengths, ids, steps, self.path, _DAMAGED_HINT)
            self.set_episode_lengths(lengths)
        return self._lengths

    def set_episode_lengths(self, lengths: np.ndarray) -> None:
        """Use a cached episode index instead of scanning."""
        lengths = np.asarray(lengths, dtype=np.int64)
        if int(lengths.sum()) != self.num_steps:
            raise DatasetError(f"episode index of {self.path} does not match its rows")
        self._lengths = lengths
        self._offsets = offsets_from_lengths(lengths)

    @property
    def episode_offsets(self) -> np.ndarray:
        """First global row of each episode."""
        self.episode_lengths  # noqa: B018 - builds the index on first use
        return self._offsets

    @property
    def num_episodes(self) -> int:
        return len(self.episode_lengths)

    @property
    def nbytes_on_disk(self) -> int:
        return nbytes_under(self.path)

    def _guard(self, read):
        try:
            return read()
        except Exception as error:
            raise DatasetError(
                f"cannot read {self.path}: {first_line(error)}", _DAMAGED_HINT
            ) from error

    def _take(self, rows: np.ndarray, columns: list[str]):
        return self._guard(lambda: self._dataset.take(rows, columns=columns))

    def _decode(self, key: str, column) -> np.ndarray:
        """``key``'s column as numpy; one whose sizes disagree with the schema is damage."""
        return self._guard(lambda: _from_arrow(column, *self.keys[key], self._codecs.get(key)))

    def read_rows(self, key: str, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``rows`` (global, any order, repeats allowed) of ``key``, in that order (into
        ``out`` when given)."""
        check_keys(self.keys, [key], self.path)
        rows = self._checked(rows)
        dtype, shape = self.keys[key]
        if not is_image(shape):
            if resident := self._small_columns():
                return take_rows(resident[key], rows, out)
            values = self._decode(key, self._take(rows, [key]).column(0))
            return take_rows(values, None, out)
        if out is None:
            out = np.empty((len(rows), *shape), dtype)
        # Takes in row order (Lance takes sorted rows in about 60% of the time of shuffled ones);
        # each frame is written straight into its row of ``out``.
        order = np.argsort(rows, kind="stable")
        piece = max(1, _TAKE_BYTES // (np.dtype(dtype).itemsize * int(np.prod(shape))))
        for start in range(0, len(rows), piece):
            positions = order[start : start + piece]
            # Chunk by chunk (a take returns one per fragment it touched): combining them first
            # would copy every value once more.
            done = 0
            for chunk in self._take(rows[positions], [key]).column(0).chunks:
                into = positions[done : done + len(chunk)]
                codec = self._codecs[key]
                self._guard(lambda c=chunk, i=into, k=codec: _decode_frames(c, out, i, k))
                done += len(chunk)
        return out

    def read_columns(self, keys: list[str], rows: np.ndarray, checksums: bool = False) -> dict:
        """Rows ``rows`` of several keys, from memory where the small columns are held there
        (``_small_columns``), else in one take (each costs ~0.7 ms whatever its width); with
        ``checksums``, the rows' stored CRC-32s too, under ``CHECKSUM_COLUMN``."""
        check_keys(self.keys, keys, self.path)
        rows = self._checked(rows)
        columns = [*keys, CHECKSUM_COLUMN] if checksums else keys
        resident = self._small_columns()
        if resident and all(key in resident for key in keys):
            return {column: resident[column][rows] for column in columns}
        table = self._take(rows, columns)
        values = {key: self._decode(key, table.column(key)) for key in keys}
        if checksums:
            values[CHECKSUM_COLUMN] = self._sums(table.column(CHECKSUM_COLUMN))
        return values

    def _small_columns(self) -> dict[str, np.ndarray] | None:
        """The small columns and the checksums, ``{column: values}``, read whole on the first
        call where they fit ``_RESIDENT_SHARE`` of the available memory (None: they do not, and
        are read per batch). Reader threads share them; the first call reads, the others wait."""
        with self._resident_lock:
            if self._resident is None:
                small = [key for key, (_, shape) in self.keys.items() if not is_image(shape)]
                row_bytes = 4 * len(self.keys) + sum(
                    np.dtype(self.keys[key][0]).itemsize * int(np.prod(self.keys[key][1]))
                    for key in small
                )
                self._resident = {}
                if row_bytes * self.num_steps <= _RESIDENT_SHARE * available_host_bytes():
                    self._resident = self._guard(lambda: self._read_whole(small))
            return self._resident or None

    def _read_whole(self, keys: list[str]) -> dict[str, np.ndarray]:
        """Every row of ``keys`` and of the checksums, ``{column: values}``, read in batches of
        ``_SCAN_ROWS`` rows into arrays made once: the reader's memory holds these arrays and a
        few batches, never a whole column's Arrow copy beside them."""
        shapes = {key: self.keys[key] for key in keys}
        shapes[CHECKSUM_COLUMN] = (np.dtype(np.uint32), (len(self.keys),))
        out = {
            column: np.empty((self.num_steps, *shape), d) for column, (d, shape) in shapes.items()
        }
        done = 0
        scanner = self._dataset.scanner(
            columns=list(shapes),
            scan_in_order=True,
            batch_size=_SCAN_ROWS,
            **_READ_AHEAD,
        )
        for batch in scanner.to_batches():
            for column, (dtype, shape) in shapes.items():
                values = _from_arrow(batch.column(column), dtype, shape, self._codecs.get(column))
                out[column][done : done + batch.num_rows] = values
            done += batch.num_rows
        if done != self.num_steps:
            raise ValueError(f"{done} rows scanned, not {self.num_steps}")
        return out

    def _checked(self, rows) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if rows.size and (rows.min() < 0 or rows.max() >= self.num_steps):
            raise IndexError(f"rows out of range 0..{self.num_steps - 1}")
        return rows

    def read_episode(self, index: int, keys=None) -> dict[str, np.ndarray]:
        """Episode ``index`` as ``{key: (length, ...)}`` (all keys unless ``keys`` is given)."""
        keys = check_keys(self.keys, keys, self.path)
        table = self._take(self._episode_rows(index), keys)
        return {k: self._decode(k, table.column(k)).copy() for k in keys}

    def _episode_rows(self, index: int) -> np.ndarray:
        start, length = int(self.episode_offsets[index]), int(self.episode_lengths[index])
        return np.arange(start, start + length, dtype=np.int64)

    def read_checksums(self, index: int) -> np.ndarray:
        """Episode ``index``'s stored ``(rows, keys)`` CRC-32s."""
        return self.read_row_checksums(self._episode_rows(index))

    def read_row_checksums(self, rows: np.ndarray) -> np.ndarray:
        """The stored ``(len(rows), keys)`` CRC-32s of global ``rows``."""
        rows = self._checked(rows)
        if resident := self._small_columns():
            return resident[CHECKSUM_COLUMN][rows]
        return self._sums(self._take(rows, [CHECKSUM_COLUMN]).column(0))

    def _sums(self, column) -> np.ndarray:
        shape = (len(self.keys),)
        return self._guard(lambda: _from_arrow(column, np.dtype(np.uint32), shape))

    def close(self) -> None:
        self._dataset = None
        if self._lock is not None:
            self._lock.release()


def _open_dataset(path: Location, uring: bool = False):
    """The dataset at ``path``; ``uring``: read through io_uring where this process may (for
    reading only: Lance commits through that store without its safe commit handler)."""
    import lance

    uri = _uri(path)
    if uring and not loc.is_remote(path) and io_uring_allowed():
        uri = "file+uring://" + uri
    return lance.dataset(uri, storage_options=loc.lance_storage_options(path))


@functools.cache
def io_uring_allowed() -> bool:
    """Whether this process may set up an io_uring as large as Lance's (Linux 5.1 or later, and
    not refused by a container's seccomp filter, ``kernel.io_uring_disabled`` or a locked-memory
    limit): asked once, of the kernel itself, as Lance's reader would fail otherwise."""
    if sys.platform != "linux":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    params = ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed: the defaults
    ring = libc.syscall(ctypes.c_long(_IO_URING_SETUP), ctypes.c_uint(_URING_ENTRIES), params)
    if ring < 0:
        return False
    os.close(ring)
    return True


def _check_arrow_types(where: Location, fields, schema) -> None:
    """The columns Lance stores must have the types the swm schema implies (a damaged manifest
    could give a vector another length, or a column another type)."""
    expected = _arrow_schema(schema, {})
    for field in expected:
        if field.name not in fields.names:
            raise DatasetError(f"{where}: column {field.name} is missing", _DAMAGED_HINT)
        stored = fields.field(field.name).type
        if stored != field.type:
            raise DatasetError(
                f"{where}: column {field.name} is stored as {stored}, its schema says {field.type}",
                _DAMAGED_HINT,
            )


def _data_files(path: Location) -> dict[str, int]:
    """Name -> size of the files under ``path/data`` (one listing, local or on object storage)."""
    data = loc.join(path, "data")
    if loc.is_remote(path):
        found = loc.filesystem().find(data, detail=True)
        return {key.rsplit("/", 1)[-1]: info["size"] for key, info in found.items()}
    found = {}
    for file in data.iterdir() if data.is_dir() else ():
        try:  # a writer's compaction may delete an old file between the listing and the stat
            found[file.name] = file.stat().st_size
        except FileNotFoundError:
            continue
    return found


def _check_footer(data_file: Location, tail: bytes, size: int) -> None:
    """Refuse a data file of ``size`` bytes whose footer (``tail``, its last bytes) points
    outside the file.

    A Lance file (format 2.x) ends in a 40-byte footer: the starts of the column metadata, of
    its offsets table and of the global buffers' offsets table (u64 each), the number of global
    buffers and of columns (u32 each), the format version (u16 x 2) and ``LANC``; each table
    entry is 16 bytes. pylance trusts those counts: a flipped byte in one made it abort the
    process on a 68 GB allocation, where this is one error. Older (0.1) files end differently
    and are left to Lance.
    """
    fits = len(tail) == _FOOTER.size
    if fits:
        meta, meta_offsets, buffer_offsets, buffers, columns, major, minor, magic = _FOOTER.unpack(
            tail
        )
        if magic == b"LANC" and (major, minor) < (0, 3):
            return  # a format 0.1 file (2.0 is written 0.3): Lance checks it
        end = size - _FOOTER.size
        fits = (
            magic == b"LANC"
            and max(meta, meta_offsets, buffer_offsets) <= end
            and meta_offsets + 16 * columns <= end
            and buffer_offsets + 16 * buffers <= end
        )
    if not fits:
        raise DatasetError(
            f"{data_file} is damaged: its footer is cut or points outside it", _DAMAGED_HINT
        )


def _lengths_from_ids(ids: np.ndarray, where: Location) -> np.ndarray:
    if ids.size == 0:
        return np.zeros(0, dtype=np.int64)
    if ids[0] != 0 or np.any(ids[1:] < ids[:-1]):
        raise DatasetError(f"{where}: episode_idx is not in episode order", _DAMAGED_HINT)
    if ids[-1] >= ids.size:  # a damaged id would make bincount allocate ids[-1] counts
        raise DatasetError(f"{where}: episodes are missing from episode_idx", _DAMAGED_HINT)
    lengths = np.bincount(ids).astype(np.int64)
    if np.any(lengths == 0):
        raise DatasetError(f"{where}: episodes are missing from episode_idx", _DAMAGED_HINT)
    return lengths


class LanceWriter:
    """Appends whole episodes, one Lance commit each; merges fragments by tiers as it goes."""

    format = "lance"

    def __init__(self, path: Location, metadata: dict, append: bool):
        self.path = path
        self._user_metadata = metadata
        self.schema = None
        self._arrow = None
        self._codecs: dict[str, str] = {}  # image column -> its frames' codec
        self.num_episodes = 0
        self.num_steps = 0
        self._dataset = None  # the latest version this writer committed or opened
        if append:
            self._resume()
            if not loc.is_remote(self.path):
                self._cleanup()  # versions a killed writer left behind

    def _resume(self) -> None:
        reader = LanceReader(self.path, uring=False)
        check_metadata(reader.metadata, self._user_metadata, self.path)
        self.schema = reader.keys
        self._arrow = reader._dataset.schema
        self._codecs = reader._codecs
        for key, codec in self._codecs.items():
            field = _image_field(key, codec)
            self._arrow = self._arrow.set(self._arrow.get_field_index(key), field)
        self.num_steps = reader.num_steps
        if self.num_steps:
            last = reader._take(np.array([self.num_steps - 1]), ["episode_idx"]).column(0)
            self.num_episodes = int(last[0].as_py()) + 1
        self._dataset = reader._dataset
        reader.close()

    def write_episode(self, episode) -> int:
        """Append one episode in a single commit; returns its episode_idx."""
        import lance

        _mark_opened()
        if self.schema is None:
            self._start(episode)
        check_schema(self.schema, episode, self.path)
        table = self._table(episode, self.num_episodes)
        self._dataset = lance.write_dataset(
            table,
            _uri(self.path),
            mode="append" if self._created() else "create",
            data_storage_version=_STORAGE_VERSION,
            storage_options=loc.lance_storage_options(self.path),
        )
        self.num_steps += table.num_rows
        self.num_episodes += 1
        self.compact()
        return self.num_episodes - 1

    def _start(self, episode) -> None:
        """The dataset's schema, from its first episode: keys, and a codec per image column."""
        self.schema = episode_schema(episode)
        _check_column_names(self.schema)
        meta = build_metadata(self._user_metadata, self.schema, PIXEL_ENCODING)
        images = [key for key, (_, shape) in self.schema.items() if is_image(shape)]
        self._codecs = {key: choose_codec(np.asarray(episode[key])) for key in images}
        self._arrow = _arrow_schema(self.schema, meta, self._codecs)

    def _table(self, episode, index: int):
        """Episode ``index``'s rows as an Arrow table of the dataset's schema."""
        import pyarrow as pa

        length = len(next(iter(episode.values())))
        columns = [
            pa.array(np.full(length, index, dtype=np.int64)),
            pa.array(np.arange(length, dtype=np.int32)),
            *(
                _to_arrow(np.asarray(episode[k]), shape, self._codecs.get(k))
                for k, (_, shape) in self.schema.items()
            ),
            _to_arrow(row_checksums(episode, list(self.schema)), (len(self.schema),)),
        ]
        return pa.Table.from_arrays(columns, schema=self._arrow)

    def _merge_limits(self, fragments) -> tuple[int, int]:
        """``(small, large)`` in rows (``_merge_group``): fragments under ``small`` rows are merged
        on close (``_SMALL_BYTES`` of rows before compression); the last fragments are merged into
        one once they hold ``large`` rows (``_FRAGMENT_BYTES`` on disk at the bytes a row takes in
        the files of ``fragments``, or before compression where the manifest lacks a size)."""
        row_bytes = sum(np.dtype(d).itemsize * int(np.prod(s)) for d, s in self.schema.values())
        row_bytes = max(row_bytes, 1)
        rows = sum(fragment.metadata.physical_rows for fragment in fragments)
        stored = _stored_bytes(fragments)
        stored_row_bytes = stored / rows if stored and rows else row_bytes
        return max(1, _SMALL_BYTES // row_bytes), max(1024, int(_FRAGMENT_BYTES / stored_row_bytes))

    def compact(self, closing: bool = False) -> None:
        """Merge what the tiers call for (one commit each), then delete superseded versions: on
        a local disk all but those readers hold, on object storage (no readers' lock there) all
        of them, only when the writer closes."""
        if self._dataset is None:
            return
        fragments = self._dataset.get_fragments()
        small, large = self._merge_limits(fragments)
        merged = False
        while group := _merge_group(
            [fragment.metadata.physical_rows for fragment in fragments], small, large, closing
        ):
            if not self._room_to_merge(fragments[group]):
                break
            self._merge(fragments[group])
            fragments = self._dataset.get_fragments()
            merged = True
        if not loc.is_remote(self.path):
            if merged or closing:
                self._cleanup()
        elif closing:
            self._dataset.cleanup_old_versions(older_than=timedelta(0))

    def _room_to_merge(self, old: list) -> bool:
        """Whether the disk holds the fragments ``old`` written anew beside them (and the margin
        every write leaves free). A merge it cannot hold waits for a later append or close: the
        fragments stay as they are, readable."""
        if loc.is_remote(self.path):
            return True
        stored = _stored_bytes(old)
        if stored is None:  # the manifest lacks a file's size: the files' own
            stored = sum(
                os.path.getsize(loc.join(self.path, "data", data_file.path))
                for fragment in old
                for data_file in fragment.data_files()
            )
        return loc.free_bytes(self.path) >= stored + loc.FREE_SPACE_MARGIN_BYTES

    def _merge(self, old: list) -> None:
        """Rewrite the fragments ``old`` as one (rows in order), in one commit. They must be the
        dataset's last: Lance puts a rewritten fragment after all the others."""
        import lance

        dataset = self._dataset
        rows = dataset.scanner(
            columns=self._arrow.names, fragments=old, scan_in_order=True, **_READ_AHEAD
        ).to_reader()
        options = loc.lance_storage_options(self.path)
        new = lance.fragment.write_fragments(
            rows,
            dataset,
            schema=self._arrow,
            max_rows_per_file=sum(fragment.metadata.physical_rows for fragment in old),
            data_storage_version=_STORAGE_VERSION,
            storage_options=options,
        )
        rewrite = lance.LanceOperation.RewriteGroup([f.metadata for f in old], new)
        self._dataset = lance.LanceDataset.commit(
            _uri(self.path),
            lance.LanceOperation.Rewrite([rewrite], []),
            read_version=dataset.version,
            storage_options=options,
        )

    def _cleanup(self) -> None:
        """Delete old versions and the files only they use, but for the versions readers hold
        (their files stay), and nothing while a reader is opening the dataset."""
        hold = no_readers(self.path)
        if hold is None:
            return
        try:
            dataset = _open_dataset(self.path)
            held = pinned_versions(self.path)
            if not held:
                # Under the writer lock no other process writes: an unreferenced file is what a
                # killed writer left half-written, and goes too.
                dataset.cleanup_old_versions(older_than=timedelta(0), delete_unverified=True)
                return
            old = [v["version"] for v in dataset.versions()]
            old = [v for v in old if v not in held and v != dataset.version]
            if old:
                dataset.cleanup_old_versions(older_than=timedelta(0), versions=old)
        finally:
            hold.close()

    def _created(self) -> bool:
        return self._dataset is not None or loc.is_dir(loc.join(self.path, "_versions"))

    def close(self) -> None:
        """Merge the smallest fragments and free superseded files."""
        self.compact(closing=True)
        self._dataset = None

    def __enter__(self) -> "LanceWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _merge_group(rows: list[int], small: int, large: int, closing: bool) -> slice | None:
    """The trailing fragments to merge into one, of fragments of ``rows`` rows each (None: none).

    A fragment of ``large // 2`` rows or more is finished: merged no more (half, so that a
    finished fragment stays finished where ``large``, an estimate, grows a little). The trailing
    unfinished fragments are merged into one once they hold ``large`` rows, the fewest of them
    that do (one fragment of ``large`` rows and less than an episode more). Else by tiers, the
    lowest first: a fragment's tier is ``floor(log(rows, MERGE_FAN_IN))``, and the trailing run
    of unfinished fragments of that tier or lower is merged once it holds ``MERGE_FAN_IN`` of
    that tier. On close, the trailing fragments under ``small`` rows are merged too."""
    finished = [count >= large // 2 for count in rows]
    held = 0
    for run in range(1, _trailing(finished, lambda done: not done) + 1):
        held += rows[-run]
        if held >= large:
            return slice(len(rows) - run, len(rows))
    tiers = [None if done else _tier(count) for count, done in zip(rows, finished, strict=True)]
    for tier in sorted({t for t in tiers if t is not None}):
        run = _trailing(tiers, lambda t, tier=tier: t is not None and t <= tier)
        if tiers[len(tiers) - run :].count(tier) >= MERGE_FAN_IN:
            return slice(len(rows) - run, len(rows))
    run = _trailing(rows, lambda count: count < small)
    return slice(len(rows) - run, len(rows)) if closing and run >= 2 else None


def _stored_bytes(fragments) -> int | None:
    """The bytes of the data files of ``fragments``, as the manifest records them (None where it
    lacks one: a dataset written by an old Lance)."""
    sizes = [
        data_file.file_size_bytes for fragment in fragments for data_file in fragment.data_files()
    ]
    return sum(sizes) if sizes and all(sizes) else None


def _tier(rows: int) -> int:
    tier = 0
    while rows >= MERGE_FAN_IN ** (tier + 1):
        tier += 1
    return tier


def _trailing(values: list, keep) -> int:
    """How many of the last ``values`` in a row ``keep`` holds for."""
    run = 0
    while run < len(values) and keep(values[-1 - run]):
        run += 1
    return run


def open_reader(path: Location) -> LanceReader:
    """Open a Lance dataset for reading."""
    return LanceReader(path)


def open_writer(path: Location, metadata: dict, append: bool) -> LanceWriter:
    """Open a Lance dataset for episode-atomic appends."""
    if any(ord(character) < 32 or character == "\x7f" for character in str(path)):
        raise UsageError(
            f"{str(path)!r} holds a control character (a newline, a tab): Lance cannot write "
            "such a path",
            hint="choose a name without one",
        )
    return LanceWriter(path, metadata, append)
