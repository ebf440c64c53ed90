"""HDF5 datasets: flat per-key datasets plus episode offsets, readable by h5py, h5ls and h5dump.

Every key is one dataset of shape ``(rows, ...)``; ``episode_offsets`` and ``episode_lengths`` hold
the episode index. Images are chunked one frame per chunk (a random read decodes only the frame it
needs) with LZ4, HDF5's registered filter 32004: it decodes ~10x faster than gzip (inflating was
~85% of a batch's read) at about the same size. h5py reads it after ``import hdf5plugin``, and
h5dump once Debian's ``hdf5-filter-plugin`` (or any LZ4 plugin on ``HDF5_PLUGIN_PATH``) is there;
swm itself needs no plugin (it writes and reads the chunks directly). Other keys are stored
uncompressed, in chunks of ``_SMALL_CHUNK_ROWS`` rows: a compressed chunk grows with every episode
appended to it and moves, and a SWMR writer never reuses the space it leaves (short episodes make
a file many times its data), while an uncompressed chunk is rewritten in place. A reader gathers
a batch's small rows from a memory map of the file at those chunks' addresses, one numpy gather
whatever the number of chunks the rows touch. (Files whose small keys are gzip-compressed read
through h5py; appending to one keeps its codec.)

Episode-atomic writes use HDF5's single-writer/multiple-reader mode (SWMR): metadata reaches the
file in an order that keeps it readable at every instant. An episode's rows are written and
flushed first; its entry in ``episode_lengths`` comes last and is the commit. A reader trusts only
committed episodes. A writer killed mid-run leaves the superblock's "open for write" flag set;
appending clears it (what ``h5clear -s`` does) under the dataset's writer lock.

An HDF5 file on object storage (``s3://``) is read through fsspec, a few MiB per ranged request;
writing HDF5 needs a local file (SWMR and the locks are local-filesystem features).
"""

import contextlib
import functools
import json
import os
import struct
import threading
from pathlib import Path

import numpy as np

from swmcli.data.storage import location as loc
from swmcli.data.storage.checksums import CHECKSUM_COLUMN, columns_apart, row_checksums
from swmcli.data.storage.containment import check_hdf5
from swmcli.data.storage.location import Location
from swmcli.data.storage.schema import (
    INDEX_COLUMNS,
    build_metadata,
    check_index,
    check_keys,
    check_metadata,
    check_schema,
    check_stored_schema,
    episode_schema,
    is_image,
    offsets_from_lengths,
    read_metadata,
)
from swmcli.errors import DatasetError, first_line

PIXEL_ENCODING = "raw uint8, LZ4 (HDF5 filter 32004), one frame per chunk"
# The HDF5 1.10 file format: the oldest with SWMR, and what h5dump/h5ls 1.10 (Debian 12) read.
_LIBVER = ("v110", "v110")
_CHUNK_CACHE_BYTES = 64 * 2**20
_CHUNK_CACHE_SLOTS = 100_003  # a prime well above the chunks that fit the cache
_SMALL_CHUNK_ROWS = 4096
_PAGE = 4096  # the kernel's page: ranges asked ahead are merged at this grain
_TAIL = 4  # index entries an open reads: a killed writer leaves at most the last two unfinished
H5Z_LZ4 = 32004  # LZ4, registered with the HDF Group (read with `hdf5plugin` or its plugin)
_READ_ATTEMPTS = 25  # sleeps of 1, 2, 4, ... ns: at most 2**25 ns (34 ms) in all
_DAMAGED_HINT = "the file is damaged or truncated: restore it or collect again"
# Ranged reads of an HDF5 object on object storage: one request brings this many bytes.
_REMOTE_BLOCK_BYTES = 4 * 2**20


def _open(path: Path, mode: str, **kwargs):
    import h5py

    try:
        return h5py.File(
            path,
            mode,
            rdcc_nbytes=_CHUNK_CACHE_BYTES,
            rdcc_nslots=_CHUNK_CACHE_SLOTS,
            # swm's own writer lock keeps writers apart; HDF5's flock would let a reader
            # block a writer (and a writer's reopen fail while anything reads).
            locking=False,
            **kwargs,
        )
    except OSError as error:
        message = f"cannot open HDF5 file {path}: {first_line(error)}"
        # Reading, the file is the problem; creating, the place it goes is.
        hint = _DAMAGED_HINT if mode in ("r", "r+", "a") else "check that --out is writable"
        raise DatasetError(message, hint) from error


def _open_to_read(path: Path):
    """Open for SWMR reading with HDF5's metadata retries bounded.

    A SWMR reader retries a metadata read whose checksum fails (a writer may be mid-update),
    sleeping twice as long each time, 100 times by default: on a damaged file, a hang that
    ignores signals. ``_READ_ATTEMPTS`` retries end within 34 ms.
    h5py does not expose the setting: it is set on the file-access list through the HDF5
    library h5py loaded.
    """
    import h5py
    from h5py._hl.files import make_fapl

    fapl = make_fapl(
        None, rdcc_nslots=_CHUNK_CACHE_SLOTS, rdcc_nbytes=_CHUNK_CACHE_BYTES, locking=False
    )
    _hdf5_library().H5Pset_metadata_read_attempts(fapl.id, _READ_ATTEMPTS)
    flags = h5py.h5f.ACC_RDONLY | h5py.h5f.ACC_SWMR_READ
    try:
        return h5py.File(h5py.h5f.open(str(path).encode(), flags, fapl=fapl))
    except OSError as error:
        message = f"cannot open HDF5 file {path}: {first_line(error)}"
        raise DatasetError(message, _DAMAGED_HINT) from error


@functools.cache
def _hdf5_library():
    """The HDF5 shared library this process loaded (h5py's), for the one call h5py lacks."""
    import ctypes

    import h5py  # noqa: F401 - loads the library

    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "/libhdf5" in line and "_hl" not in line}
    library = ctypes.CDLL(paths.pop())
    library.H5Pset_metadata_read_attempts.argtypes = [ctypes.c_int64, ctypes.c_uint]
    return library


def _open_remote(uri: str):
    """An HDF5 object on object storage, opened read-only through an fsspec file."""
    import h5py

    handle = loc.filesystem().open(uri, "rb", block_size=_REMOTE_BLOCK_BYTES)
    try:
        return h5py.File(
            handle, "r", rdcc_nbytes=_CHUNK_CACHE_BYTES, rdcc_nslots=_CHUNK_CACHE_SLOTS
        )
    except OSError as error:
        handle.close()
        raise DatasetError(
            f"cannot open HDF5 object {uri}: {first_line(error)}", _DAMAGED_HINT
        ) from error


def _check_length(path: Location) -> None:
    """Refuse a file shorter than the end address its superblock records.

    SWMR readers skip HDF5's own end-of-file check (a live writer may be ahead of the reader),
    and on a truncated file the library then retries reads forever: check it here, first.
    """
    head = loc.read_head(path, 64)
    if len(head) < 12 or head[:8] != b"\x89HDF\r\n\x1a\n" or head[8] < 2:
        return  # not a version 2/3 superblock: h5py's own checks apply
    offset_size = head[9]
    start = 12 + 2 * offset_size
    end_address = int.from_bytes(head[start : start + offset_size], "little")
    size = loc.nbytes_under(path)
    if size < end_address:
        raise DatasetError(
            f"{path} is truncated: {size:,} of its {end_address:,} bytes are there",
            _DAMAGED_HINT,
        )


class Hdf5Reader:
    """Reads a swm HDF5 file; opens in SWMR mode so a file being written (or crashed) reads."""

    format = "hdf5"
    metadata_sealed = True  # checked on open

    def __init__(self, path: Location):
        # LZ4 frames decode with pyarrow: import it with the file, not on the first batch, so
        # forked DataLoader workers inherit it (importing it there doubled the first batch's time).
        import pyarrow  # noqa: F401

        self.path = path
        _check_length(self.path)
        if loc.is_remote(path):
            self._file = _open_remote(path)
        else:
            self._file = _open_to_read(self.path)
        try:
            raw = self._guard(lambda: self._file.attrs.get("swm"))
            if raw is None:
                raise DatasetError(
                    f"{self.path} is an HDF5 file but was not written by swm (no swm metadata)",
                    hint="write it with swmcli.open_writer or `swm collect`",
                )
            self.metadata, self.keys = read_metadata(raw, self.path)
            check_hdf5(self._file, self.path)
            self._check_columns()
            # The index's last entries (where a killed writer stops) give the counts: opening
            # and appending read no more of it at any size; the whole is read on first use.
            self.num_episodes, self.num_steps, last = _committed_tail(
                self._file, self.keys, self.path
            )
            self._index: tuple[np.ndarray, np.ndarray] | None = None
            self._index_lock = threading.Lock()
            self._check_rows_of(self.num_episodes - 1, self.num_steps - last, last)
        except BaseException:
            self._file.close()
            raise
        self.index_token = None  # the index lives in the file: nothing to cache
        self._chunks: dict[str, _FrameChunks | _RowChunks | None] = {}
        self._chunks_lock = threading.Lock()

    def _check_columns(self) -> None:
        """Each key's dataset holds the dtype and row shape the schema says."""
        names = [*self.keys, *INDEX_COLUMNS, CHECKSUM_COLUMN]
        found = self._guard(lambda: {n: self._file[n] for n in names if n in self._file})
        stored = {name: (data.dtype, data.shape[1:]) for name, data in found.items()}
        check_stored_schema(self.path, stored, self.keys)
        index = {
            "episode_idx": (np.dtype(np.int64), ()),
            "step_idx": (np.dtype(np.int32), ()),
            CHECKSUM_COLUMN: (np.dtype(np.uint32), (len(self.keys),)),
        }
        check_stored_schema(self.path, stored, index)

    @property
    def episode_lengths(self) -> np.ndarray:
        """Rows of each episode (the whole index, read and checked on first use)."""
        return self._whole_index()[0]

    @property
    def episode_offsets(self) -> np.ndarray:
        """First global row of each episode."""
        return self._whole_index()[1]

    def _whole_index(self) -> tuple[np.ndarray, np.ndarray]:
        """Every episode's length and offset, checked against each other and against the counts
        the open read from the index's end (reader threads share it; the first reads)."""
        with self._index_lock:
            if self._index is None:
                lengths = _committed_lengths(self._file, self.keys, self.path)
                lengths = lengths[: self.num_episodes]
                if len(lengths) != self.num_episodes or int(lengths.sum()) != self.num_steps:
                    raise DatasetError(
                        f"{self.path}: episode_lengths disagree with the index's last entries",
                        _DAMAGED_HINT,
                    )
                offsets = offsets_from_lengths(lengths)
                episodes = self.num_episodes
                stored = self._guard(lambda: self._file["episode_offsets"][:episodes])
                if np.any(np.asarray(stored) != offsets):
                    raise DatasetError(f"{self.path}: episode_offsets do not match", _DAMAGED_HINT)
                self._index = (lengths, offsets)
            return self._index

    def _check_index(self, index: int) -> None:
        """Episode ``index``'s rows carry its episode_idx and step_idx (a damaged index is an
        error): checked for each episode read whole (``swm info --verify`` reads every one)."""
        start, length = int(self.episode_offsets[index]), int(self.episode_lengths[index])
        self._check_rows_of(index, start, length)

    def _check_rows_of(self, index: int, start: int, length: int) -> None:
        """Rows ``start`` to ``start + length`` carry episode ``index``'s ids and steps. Checked
        for the last episode on open (where a killed writer stops), so opening reads no row of
        the others and costs the same at any size."""
        if index < 0:
            return
        ids = self._guard(lambda: self._file["episode_idx"][start : start + length])
        steps = self._guard(lambda: self._file["step_idx"][start : start + length])
        check_index(np.array([length]), ids - index, steps, self.path, _DAMAGED_HINT)

    @property
    def nbytes_on_disk(self) -> int:
        return loc.nbytes_under(self.path)

    def _guard(self, read):
        try:
            return read()
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as error:
            raise DatasetError(
                f"cannot read {self.path}: {first_line(error)}", _DAMAGED_HINT
            ) from error

    def read_rows(self, key: str, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``rows`` (global, any order, repeats allowed) of ``key``, in that order (into
        ``out`` when given)."""
        check_keys(self.keys, [key], self.path)
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if rows.size and (rows.min() < 0 or rows.max() >= self.num_steps):
            raise IndexError(f"rows out of range 0..{self.num_steps - 1}")
        dataset = self._file[key]
        dtype, shape = self.keys[key]
        if out is None:
            out = np.empty((len(rows), *shape), dtype=dtype)
        chunks = self._chunk_index(key, dataset)
        if is_image(shape):
            self._guard(lambda: _read_each(dataset, rows, out, chunks))
        else:
            self._guard(lambda: _read_small(dataset, rows, out, chunks))
        return out

    def read_columns(self, keys: list[str], rows: np.ndarray, checksums: bool = False) -> dict:
        """Rows ``rows`` of several keys (one ``read_rows`` each; with ``checksums``, the rows'
        stored CRC-32s under ``CHECKSUM_COLUMN``)."""
        return columns_apart(self, keys, rows, checksums)

    def _chunk_index(self, key: str, dataset) -> "_FrameChunks | _RowChunks | None":
        """``key``'s chunk index, built on its first read (once, whichever thread asks)."""
        with self._chunks_lock:
            if key not in self._chunks:
                index = _FrameChunks if is_image(dataset.shape[1:]) else _RowChunks
                self._chunks[key] = self._guard(
                    lambda: index.of(self.path, dataset, self.num_steps)
                )
            return self._chunks[key]

    def read_episode(self, index: int, keys=None) -> dict[str, np.ndarray]:
        """Episode ``index`` as ``{key: (length, ...)}`` (all keys unless ``keys`` is given)."""
        keys = check_keys(self.keys, keys, self.path)
        self._check_index(index)
        start = int(self.episode_offsets[index])
        stop = start + int(self.episode_lengths[index])
        episode = {}
        for key in keys:
            if is_image(self.keys[key][1]):  # frame by frame: LZ4 needs no HDF5 plugin here
                episode[key] = self.read_rows(key, np.arange(start, stop))
            else:
                episode[key] = self._guard(lambda key=key: self._file[key][start:stop])
        return episode

    def read_checksums(self, index: int) -> np.ndarray:
        """Episode ``index``'s stored ``(rows, keys)`` CRC-32s."""
        start = int(self.episode_offsets[index])
        stop = start + int(self.episode_lengths[index])
        return self._guard(lambda: self._file[CHECKSUM_COLUMN][start:stop])

    def read_row_checksums(self, rows: np.ndarray) -> np.ndarray:
        """The stored ``(len(rows), keys)`` CRC-32s of global ``rows``."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        out = np.empty((len(rows), len(self.keys)), dtype=np.uint32)
        dataset = self._file[CHECKSUM_COLUMN]
        chunks = self._chunk_index(CHECKSUM_COLUMN, dataset)
        self._guard(lambda: _read_small(dataset, rows, out, chunks))
        return out

    def close(self) -> None:
        for chunks in self._chunks.values():
            if chunks is not None:
                chunks.close()
        self._chunks = {}
        self._file.close()


class _FrameChunks:
    """Where each frame's chunk lies in a local file, read once with ``chunk_iter``: a frame is
    then one ``os.pread``, which releases the GIL, instead of an HDF5 call, which holds it, so
    reader threads read and decode frames in parallel (a batch's chunk reads were the one part
    of it that two threads could not share).

    From a cold disk, the kernel reads exactly the chunks asked for: the file is read as random
    access (its read-ahead around each frame read 1.2-1.4x the bytes a batch used), and a batch's
    chunks are asked for together (``will_need``) before the first is read, so the disk works on
    all of them while the thread decodes (``benchmarks/cold_read.py``)."""

    def __init__(self, path: Path, offsets: np.ndarray, sizes: np.ndarray, masks: np.ndarray):
        self.offsets, self.sizes, self.masks = offsets, sizes, masks
        self.descriptor = os.open(path, os.O_RDONLY)
        os.posix_fadvise(self.descriptor, 0, 0, os.POSIX_FADV_RANDOM)

    @classmethod
    def of(cls, path: Location, dataset, rows: int) -> "_FrameChunks | None":
        """The index of ``dataset``'s first ``rows`` frames; None where there is no local file
        to read (object storage) or the HDF5 library cannot list chunks."""
        if loc.is_remote(path) or not hasattr(dataset.id, "chunk_iter"):
            return None
        offsets = np.full(rows, -1, np.int64)
        sizes = np.zeros(rows, np.int64)
        masks = np.zeros(rows, np.uint32)

        def visit(chunk) -> None:
            row = chunk.chunk_offset[0]
            if row < rows:
                offsets[row], sizes[row], masks[row] = (
                    chunk.byte_offset,
                    chunk.size,
                    chunk.filter_mask,
                )

        dataset.id.chunk_iter(visit)
        return cls(path, offsets, sizes, masks)

    def read(self, row: int) -> tuple[int, bytes] | None:
        """Frame ``row``'s filter mask and stored bytes; None for a chunk not in the index."""
        offset = int(self.offsets[row])
        if offset < 0:
            return None
        data = os.pread(self.descriptor, int(self.sizes[row]), offset)
        if len(data) != self.sizes[row]:
            raise OSError(f"frame {row}: the file ends inside its chunk")
        return int(self.masks[row]), data

    def will_need(self, rows: np.ndarray) -> None:
        """Ask the kernel to start reading frames ``rows``' chunks into the page cache now: a
        batch's reads then reach the disk together, while this thread decodes the first ones,
        instead of one at a time. Chunks on the same or neighbouring pages are asked for in one
        range (small frames: a few calls a batch, not one a frame)."""
        offsets = self.offsets[rows]
        order = np.argsort(offsets, kind="stable")
        order = order[offsets[order] >= 0]  # in file order, chunks the index holds
        if not order.size:
            return
        starts = offsets[order] // _PAGE * _PAGE
        ends = np.maximum.accumulate(offsets[order] + self.sizes[rows][order])
        # A range starts at a chunk that begins past every earlier chunk's end.
        first = np.flatnonzero(np.r_[True, starts[1:] > ends[:-1]])
        last = np.r_[first[1:] - 1, len(starts) - 1]
        for start, end in zip(starts[first].tolist(), ends[last].tolist(), strict=True):
            os.posix_fadvise(self.descriptor, start, end - start, os.POSIX_FADV_WILLNEED)

    def close(self) -> None:
        os.close(self.descriptor)


class _RowChunks:
    """Where each chunk of an uncompressed small key lies in a local file (a few hundred chunks
    for a million rows, read once with ``chunk_iter``): a batch's rows are then one gather from a
    read-only memory map of the file."""

    def __init__(self, path: Path, chunk_rows: int, row_bytes: int, starts: np.ndarray):
        self.chunk_rows, self.row_bytes, self.starts = chunk_rows, row_bytes, starts
        self.file = np.memmap(path, np.uint8, "r")

    @classmethod
    def of(cls, path: Location, dataset, rows: int) -> "_RowChunks | None":
        """The index of the chunks holding ``dataset``'s first ``rows`` rows; None where h5py
        reads them instead: object storage, compressed or unchunked data, a byte order other
        than this machine's, or a chunk never written."""
        if (
            loc.is_remote(path)
            or not hasattr(dataset.id, "chunk_iter")
            or dataset.chunks is None
            or _filter_ids(dataset)
            or not dataset.dtype.isnative
            or rows == 0
        ):
            return None
        chunk_rows = dataset.chunks[0]
        starts = np.full(-(-rows // chunk_rows), -1, np.int64)

        def visit(chunk) -> None:
            number = chunk.chunk_offset[0] // chunk_rows
            if number < len(starts):
                starts[number] = chunk.byte_offset

        dataset.id.chunk_iter(visit)
        if (starts < 0).any():
            return None
        row_bytes = dataset.dtype.itemsize * int(np.prod(dataset.shape[1:]))
        return cls(path, chunk_rows, row_bytes, starts)

    def read(self, rows: np.ndarray, out: np.ndarray) -> None:
        """Rows ``rows`` (all below the rows indexed) into ``out``, in that order."""
        if not rows.size:
            return
        chunk, within = np.divmod(rows, self.chunk_rows)
        first = self.starts[chunk] + within * self.row_bytes
        if first.size and first.max() + self.row_bytes > len(self.file):
            raise OSError("the file ends inside a chunk")
        gathered = self.file[first[:, None] + np.arange(self.row_bytes)]
        out.reshape(len(rows), -1).view(np.uint8)[:] = gathered

    def close(self) -> None:
        self.file = None  # the map closes with its last reference


def _read_small(dataset, rows: np.ndarray, out: np.ndarray, chunks=None) -> None:
    """Small rows into ``out``: through ``chunks`` where given (and ``out`` is one block of
    memory), else through h5py chunk by chunk."""
    if chunks is not None and out.flags.c_contiguous and out.dtype == dataset.dtype:
        chunks.read(rows, out)
    else:
        _read_by_chunk(dataset, rows, out)


def _read_by_chunk(dataset, rows: np.ndarray, out: np.ndarray) -> None:
    """Small rows: read each chunk that holds any of ``rows`` once, as a slice (a point
    selection of scattered rows costs far more in h5py than reading their whole chunks)."""
    chunk_rows = dataset.chunks[0] if dataset.chunks else len(dataset)
    chunk_of = rows // chunk_rows
    for chunk in np.unique(chunk_of).tolist():
        start = chunk * chunk_rows
        block = dataset[start : start + chunk_rows]
        wanted = chunk_of == chunk
        out[wanted] = block[rows[wanted] - start]


def _read_each(dataset, rows: np.ndarray, out: np.ndarray, chunks=None) -> None:
    """Read frame by frame into ``out``. With one frame per LZ4 chunk (what swm writes), each
    frame is one raw chunk read (through ``chunks`` where given) and one decode: h5py's selection
    machinery would cost more than the decode itself, and LZ4 needs no HDF5 plugin this way; any
    other layout is read through h5py."""
    frame_shape = dataset.shape[1:]
    if dataset.chunks != (1, *frame_shape) or _filter_ids(dataset) != (H5Z_LZ4,):
        for position, row in enumerate(rows):
            dataset.read_direct(out, np.s_[int(row)], np.s_[position])
        return
    origin = (0,) * len(frame_shape)
    flat = out.reshape(len(rows), -1).view(np.uint8)
    # Rows in file order: a cold read walks the file forwards instead of seeking at random.
    order = np.argsort(rows, kind="stable")
    if chunks is not None:
        chunks.will_need(rows[order])
    for position in order.tolist():
        row = int(rows[position])
        stored = chunks.read(row) if chunks is not None else None
        mask, data = stored or dataset.id.read_direct_chunk((row, *origin))
        # A set mask bit means the filter was skipped for this chunk: the bytes are raw.
        flat[position] = np.frombuffer(data if mask & 1 else _lz4_decode(data), np.uint8)


def _lz4_encode(frame: np.ndarray) -> bytes:
    """One chunk in the framing of HDF5's registered LZ4 filter (32004, what ``hdf5plugin``
    and the HDF Group's plugin read): original size (u64, big-endian), block size (u32), then
    one block: its compressed size (u32) and the raw LZ4 block."""
    import pyarrow as pa

    data = np.ascontiguousarray(frame).reshape(-1).view(np.uint8)
    block = pa.Codec("lz4_raw").compress(data, asbytes=True)
    if len(block) >= data.nbytes:  # incompressible: the filter stores the block as is
        block = data.tobytes()
    size = data.nbytes
    return struct.pack(">QII", size, size, len(block)) + block


def _lz4_decode(chunk: bytes):
    """Inverse of ``_lz4_encode`` for any block size (chunks written by other LZ4 writers)."""
    import pyarrow as pa

    size, block_size = struct.unpack_from(">QI", chunk)
    codec = pa.Codec("lz4_raw")
    position, parts, done = 12, [], 0
    while done < size:
        expected = min(block_size, size - done)
        (stored,) = struct.unpack_from(">I", chunk, position)
        block = memoryview(chunk)[position + 4 : position + 4 + stored]
        parts.append(block if stored == expected else codec.decompress(block, expected))
        position, done = position + 4 + stored, done + expected
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _write_lz4(dataset, start: int, frames: np.ndarray) -> None:
    """Write ``frames`` from row ``start`` as LZ4 chunks, one per frame."""
    origin = (0,) * (dataset.ndim - 1)
    for offset, frame in enumerate(frames):
        dataset.id.write_direct_chunk((start + offset, *origin), _lz4_encode(frame))


def _filter_ids(dataset) -> tuple[int, ...]:
    plist = dataset.id.get_create_plist()
    return tuple(plist.get_filter(i)[0] for i in range(plist.get_nfilters()))


def _guarded(where: Path, read):
    """``read()``, an HDF5 error becoming one DatasetError naming the file."""
    try:
        return read()
    except (OSError, KeyError, ValueError, RuntimeError) as error:
        raise DatasetError(f"cannot read {where}: {first_line(error)}", _DAMAGED_HINT) from error


def _entries(file, keys, where: Path, first: int = 0) -> tuple[np.ndarray, int]:
    """The ``episode_lengths`` entries from ``first`` on that a commit reached, and the rows
    every key holds. A kill between resize and write leaves a zero last entry: it was never
    committed. So may a reader's view of a file being written, whose rows can lag its last
    entries (SWMR shows each dataset as of its own last flush): those episodes are not there
    yet, for this reader."""
    lengths = _guarded(where, lambda: file["episode_lengths"][first:].astype(np.int64))
    rows = _guarded(where, lambda: min(file[k].shape[0] for k in keys) if keys else 0)
    if len(lengths) and lengths[-1] == 0:
        lengths = lengths[:-1]
    if np.any(lengths <= 0):
        raise DatasetError(f"{where}: episode_lengths is damaged (an empty entry)", _DAMAGED_HINT)
    return lengths, rows


def _committed_lengths(file, keys, where: Path) -> np.ndarray:
    """Lengths of the episodes whose commit entry reached the file and whose rows all exist."""
    if "episode_lengths" not in file:
        return np.zeros(0, dtype=np.int64)
    lengths, rows = _entries(file, keys, where)
    _check_offsets(file, lengths, where)
    while len(lengths) and lengths.sum() > rows:
        lengths = lengths[:-1]
    return lengths


def _committed_tail(file, keys, where: Path) -> tuple[int, int, int]:
    """``(episodes, steps, rows of the last episode)`` committed, from the index's last
    ``_TAIL`` entries, by ``_committed_lengths``'s rules for what a killed writer leaves at the
    end (a zero last length, rows short of the last episodes); the whole index only where
    every one of those entries goes."""
    if "episode_lengths" not in file:
        return 0, 0, 0
    first = max(0, _guarded(where, lambda: file["episode_lengths"].shape[0]) - _TAIL)
    lengths, rows = _entries(file, keys, where, first)
    stop = first + len(lengths)
    offsets = _guarded(where, lambda: file["episode_offsets"][first:stop].astype(np.int64))
    disagree = len(offsets) != len(lengths) or np.any(offsets[1:] != offsets[:-1] + lengths[:-1])
    if disagree or (first == 0 and len(offsets) and offsets[0] != 0):
        raise DatasetError(f"{where}: episode_offsets and episode_lengths disagree", _DAMAGED_HINT)
    ends = offsets + lengths
    kept = int(np.sum(np.cumsum(ends > rows) == 0))  # entries up to the first beyond the rows
    if kept == 0 and first > 0:
        whole = _committed_lengths(file, keys, where)
        return len(whole), int(whole.sum()), int(whole[-1]) if len(whole) else 0
    if kept == 0:
        return 0, 0, 0
    return first + kept, int(ends[kept - 1]), int(lengths[kept - 1])


def _check_offsets(file, lengths: np.ndarray, where) -> None:
    """Every written ``episode_offsets`` entry must continue the sum of the lengths before it:
    a damaged length (or offset) is an error, never episodes silently dropped or merged."""
    count = len(lengths)
    offsets = _guarded(where, lambda: file["episode_offsets"][:count].astype(np.int64))
    expected = offsets_from_lengths(lengths[: len(offsets)])
    written = offsets != 0  # an entry not written yet reads 0 (only the first is 0 when written)
    if np.any(written & (offsets != expected)):
        raise DatasetError(f"{where}: episode_offsets and episode_lengths disagree", _DAMAGED_HINT)


class Hdf5Writer:
    """Appends whole episodes to one HDF5 file in SWMR mode."""

    format = "hdf5"

    def __init__(self, path: Path, metadata: dict, append: bool):
        self.path = Path(path)
        self._user_metadata = metadata
        self._file = None
        self.schema = None
        self.num_episodes = 0
        self.num_steps = 0
        if append:
            self._resume()

    def _resume(self) -> None:
        reader = Hdf5Reader(self.path)
        check_metadata(reader.metadata, self._user_metadata, self.path)
        self.schema = reader.keys
        self.num_episodes, self.num_steps = reader.num_episodes, reader.num_steps
        reader.close()
        _clear_open_flag(self.path)
        self._file = _open(self.path, "r+", libver=_LIBVER)
        # Drop rows of an episode cut short by a kill: appending starts where the last commit ended.
        for name in (*INDEX_COLUMNS, *self.schema, CHECKSUM_COLUMN):
            self._file[name].resize(self.num_steps, axis=0)
        for name in ("episode_offsets", "episode_lengths"):
            self._file[name].resize(self.num_episodes, axis=0)
        self._file.flush()
        self._file.swmr_mode = True

    def _create(self, episode) -> None:
        self.schema = episode_schema(episode)
        meta = build_metadata(self._user_metadata, self.schema, PIXEL_ENCODING)
        file = _open(self.path, "w", libver=_LIBVER)
        # A fixed-length string: kept in the root's object header, which HDF5 checksums. A
        # variable-length one lives in a global heap HDF5 does not check, where one flipped size
        # byte made reading the attribute loop for ever.
        file.attrs["swm"] = np.bytes_(json.dumps(meta).encode())
        columns = {
            "episode_idx": (np.dtype(np.int64), ()),
            "step_idx": (np.dtype(np.int32), ()),
            CHECKSUM_COLUMN: (np.dtype(np.uint32), (len(self.schema),)),
        }
        for name, (dtype, shape) in {**columns, **self.schema}.items():
            # Frames: LZ4, one per chunk (written here, so no HDF5 plugin is needed to write).
            codec = {"compression": H5Z_LZ4, "allow_unknown_filter": True}
            if not is_image(shape):
                codec = {}  # uncompressed: each chunk is rewritten in place (see the top)
            file.create_dataset(
                name,
                shape=(0, *shape),
                maxshape=(None, *shape),
                dtype=dtype,
                chunks=(1 if is_image(shape) else _SMALL_CHUNK_ROWS, *shape),
                **codec,
            )
        for name in ("episode_offsets", "episode_lengths"):
            file.create_dataset(name, shape=(0,), maxshape=(None,), dtype=np.int64, chunks=(1024,))
        file.flush()
        file.swmr_mode = True
        self._file = file

    def write_episode(self, episode) -> int:
        """Append one episode; its ``episode_lengths`` entry, written last, commits it."""
        if self._file is None:
            try:
                self._create(episode)
                return self._append(episode)
            except BaseException:
                self._discard()  # a first write that failed leaves no file to block the next
                raise
        return self._append(episode)

    def _discard(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError, RuntimeError):  # the file goes anyway
                self._file.close()
            self._file = None
        self.path.unlink(missing_ok=True)

    def _append(self, episode) -> int:
        check_schema(self.schema, episode, self.path)
        length = len(next(iter(episode.values())))
        start, stop = self.num_steps, self.num_steps + length
        values = {
            "episode_idx": np.full(length, self.num_episodes, dtype=np.int64),
            "step_idx": np.arange(length, dtype=np.int32),
            **episode,
            CHECKSUM_COLUMN: row_checksums(episode, list(self.schema)),
        }
        for name, array in values.items():
            dataset = self._file[name]
            dataset.resize(stop, axis=0)
            if _filter_ids(dataset) == (H5Z_LZ4,):
                _write_lz4(dataset, start, array)
            else:
                dataset[start:stop] = array
        self._file.flush()
        for name, value in (("episode_offsets", start), ("episode_lengths", length)):
            dataset = self._file[name]
            dataset.resize(self.num_episodes + 1, axis=0)
            dataset[self.num_episodes] = value
        self._file.flush()
        self.num_steps = stop
        self.num_episodes += 1
        return self.num_episodes - 1

    def close(self) -> None:
        """Close the file (clears its open-for-write flag)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> "Hdf5Writer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _lookup3(data: bytes) -> int:
    """Bob Jenkins' lookup3 ``hashlittle`` (initval 0): HDF5's metadata checksum."""
    mask = 0xFFFFFFFF

    def rot(x: int, k: int) -> int:
        return ((x << k) | (x >> (32 - k))) & mask

    length = len(data)
    a = b = c = (0xDEADBEEF + length) & mask
    padded = data.ljust(max(1, (length + 11) // 12) * 12, b"\0")
    words = np.frombuffer(padded, "<u4").reshape(-1, 3).tolist()  # 12 bytes a round
    for x, y, z in words[:-1]:
        a, b, c = (a + x) & mask, (b + y) & mask, (c + z) & mask
        a = ((a - c) & mask) ^ rot(c, 4)
        c = (c + b) & mask
        b = ((b - a) & mask) ^ rot(a, 6)
        a = (a + c) & mask
        c = ((c - b) & mask) ^ rot(b, 8)
        b = (b + a) & mask
        a = ((a - c) & mask) ^ rot(c, 16)
        c = (c + b) & mask
        b = ((b - a) & mask) ^ rot(a, 19)
        a = (a + c) & mask
        c = ((c - b) & mask) ^ rot(b, 4)
        b = (b + a) & mask
    if length == 0:
        return c
    x, y, z = words[-1]
    a, b, c = (a + x) & mask, (b + y) & mask, (c + z) & mask
    c = ((c ^ b) - rot(b, 14)) & mask
    a = ((a ^ c) - rot(c, 11)) & mask
    b = ((b ^ a) - rot(a, 25)) & mask
    c = ((c ^ b) - rot(b, 16)) & mask
    a = ((a ^ c) - rot(c, 4)) & mask
    b = ((b ^ a) - rot(a, 14)) & mask
    c = ((c ^ b) - rot(b, 24)) & mask
    return c


def _clear_open_flag(path: Path) -> None:
    """Clear the superblock's open-for-write flags left by a killed writer (``h5clear -s``).

    Safe because this process holds the dataset's writer lock: no other swm writer is alive.
    """
    with path.open("r+b") as handle:
        head = handle.read(64)
        version, offset_size = head[8], head[9]
        if head[:8] != b"\x89HDF\r\n\x1a\n" or version < 2 or head[11] == 0:
            return  # older superblocks have no flags; flags already clear
        end = 12 + 4 * offset_size
        patched = head[:11] + b"\0" + head[12:end]
        handle.seek(0)
        handle.write(patched + _lookup3(patched).to_bytes(4, "little"))
        handle.flush()


def open_reader(path: Location) -> Hdf5Reader:
    """Open a swm HDF5 file for reading."""
    return Hdf5Reader(path)


def open_writer(path: Path, metadata: dict, append: bool) -> Hdf5Writer:
    """Open a swm HDF5 file for episode-atomic appends."""
    return Hdf5Writer(path, metadata, append)
