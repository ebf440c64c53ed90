"""On-disk datasets: a registry of three formats behind one small protocol.

``detect(path)`` names the format of a dataset, ``open_reader(path)`` reads any of them and
``open_writer(path, ...)`` writes one. Every format holds the same schema: one row per observation
with ``episode_idx`` (int64), ``step_idx`` (int32) and one column per episode key (``pixels``,
``action``, ``reward``, ``terminated``, ``truncated``, and any other observation key), plus
dataset metadata (format version, env id, resolution, action dim, pixel encoding, swm version).

An episode in memory is ``dict[str, np.ndarray]`` whose arrays share their first dimension.
Writers add ``episode_idx`` and ``step_idx``; readers return episodes without them, so an episode
read back equals the one written. Writes are episode-atomic in every format.

A dataset path may also be an ``s3://`` URI (see ``location``): Lance datasets are read and
written there, HDF5 files are read; folders stay local.
"""

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from swmcli.config import format_name
from swmcli.core.storage import location as loc
from swmcli.core.storage.checksums import CHECKSUM_COLUMN, seal_metadata, unseal_metadata
from swmcli.core.storage.location import Location, as_location
from swmcli.core.storage.location import nbytes_under as nbytes_under
from swmcli.errors import DatasetError, MissingKeyError, MissingPathError, UsageError, first_line

FORMATS = ("lance", "hdf5", "folder")
MODES = ("append", "overwrite", "error")
FORMAT_VERSION = 2  # 2: the metadata carries a checksum per field (see checksums.py)
# Bookkeeping columns every format stores; not episode keys.
INDEX_COLUMNS = ("episode_idx", "step_idx")
_SUFFIXES = {".lance": "lance", ".h5": "hdf5", ".hdf5": "hdf5"}
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
FOLDER_METADATA = "swm_folder.json"

Schema = dict[str, tuple[np.dtype, tuple[int, ...]]]


class Reader(Protocol):
    """What every format's reader offers (rows are global: episode offsets + step)."""

    format: str
    metadata: dict
    keys: Schema
    num_episodes: int
    num_steps: int
    episode_lengths: np.ndarray
    episode_offsets: np.ndarray
    nbytes_on_disk: int

    def read_episode(self, index: int, keys=None) -> dict[str, np.ndarray]: ...
    def read_rows(self, key: str, rows: np.ndarray, out=None) -> np.ndarray: ...
    def read_columns(self, keys: list[str], rows: np.ndarray) -> dict[str, np.ndarray]: ...

    # Integrity (see checksums.py): whether the metadata was checked against its checksums on
    # open, and the stored per-row CRC-32s (None where the dataset has none).
    metadata_sealed: bool

    def read_checksums(self, index: int) -> np.ndarray | None: ...
    def read_row_checksums(self, rows: np.ndarray) -> np.ndarray | None: ...
    def close(self) -> None: ...


class Writer(Protocol):
    """What writers of episodes (every format's, and the ReplayBuffer) offer their users."""

    num_episodes: int  # written so far, those already there when appending included

    def write_episode(self, episode: Mapping[str, np.ndarray]) -> object: ...
    def close(self) -> None: ...


def detect(path: str | Path) -> str:
    """The format of the dataset at ``path``; a DatasetError with a hint if it is not one."""
    path = as_location(path)
    if loc.is_remote(path):
        return _detect_remote(path)
    if not path.exists():
        raise MissingPathError(
            f"no dataset at {path}", hint="check the path (collect one with `swm collect`)"
        )
    from swmcli.core.storage import foreign

    if foreign_format := foreign.detect(path):  # another tool's layout (bring your data)
        return foreign_format
    if path.is_file():
        with path.open("rb") as handle:
            if handle.read(8) == _HDF5_SIGNATURE:
                return "hdf5"
    elif (path / "_versions").is_dir():
        return "lance"
    elif (path / FOLDER_METADATA).is_file():
        return "folder"
    raise UsageError(
        f"{path} is not a swm dataset (lance, hdf5 or folder) nor one swm imports "
        f"({', '.join(foreign.FOREIGN_FORMATS)})",
        hint="point to a .lance directory, an .h5 file or a folder written by swm or those tools",
    )


def _detect_remote(uri: str) -> str:
    """``detect`` on object storage, where a directory is a prefix holding objects."""
    if loc.is_file(uri):
        if loc.read_head(uri, 8) == _HDF5_SIGNATURE:
            return "hdf5"
    elif loc.is_dir(loc.join(uri, "_versions")):
        return "lance"
    elif not loc.exists(uri):
        raise MissingPathError(
            f"no dataset at {uri}",
            hint="check the URI and AWS_ENDPOINT_URL (collect one with `swm collect --out s3://...`)",
        )
    raise UsageError(
        f"{uri} is not a swm dataset on object storage (lance or hdf5)",
        hint="point to a .lance prefix or an .h5 object written by swm",
    )


def _module(fmt: str):
    if fmt == "lance":
        from swmcli.core.storage import lance as module
    elif fmt == "hdf5":
        from swmcli.core.storage import hdf5 as module
    elif fmt == "folder":
        from swmcli.core.storage import folder as module
    else:
        raise UsageError(f"unknown dataset format {fmt!r}", hint=f"use one of {', '.join(FORMATS)}")
    return module


def open_reader(path: str | Path, mapping: Mapping[str, str] | None = None) -> Reader:
    """Open the dataset at ``path`` for reading, whatever its format; another tool's dataset has
    its columns renamed to swm's keys (``mapping`` {source: key} overrides the defaults)."""
    from swmcli.core.storage import foreign

    path = as_location(path)
    fmt = detect(path)
    if fmt in foreign.FOREIGN_FORMATS:
        return foreign.open_reader(path, fmt, mapping)
    return _module(fmt).open_reader(path)


def resolve_format(path: str | Path, format: str | None = None) -> str:
    """The format to write: ``format``, else by suffix, else the existing dataset's, else lance."""
    path = as_location(path)
    if format is not None:
        format = format_name(format)
        _module(format)
        return format
    suffix = Path(loc.name(path)).suffix.lower()
    if suffix in _SUFFIXES:
        return _SUFFIXES[suffix]
    if loc.exists(path):
        return detect(path)
    return "lance"


def open_writer(
    path: str | Path,
    format: str | None = None,
    mode: str = "append",
    metadata: Mapping[str, Any] | None = None,
) -> Writer:
    """A writer for ``path``: ``mode`` "append" continues the dataset, "overwrite" replaces it,
    "error" refuses an existing path. ``metadata`` holds env_id, resolution and action_dim.
    """
    from swmcli.core.storage.lock import WriterLock

    path = as_location(path)
    if mode not in MODES:
        raise UsageError(f"unknown write mode {mode!r}", hint=f"use one of {', '.join(MODES)}")
    if loc.is_remote(path):
        # object storage has no local lock file to hold and no disk to measure; Lance's own
        # commits keep each episode atomic there
        return _open_unlocked(path, format, mode, metadata)
    lock = WriterLock(path)  # before anything is touched: a second writer is refused here
    try:
        writer = _open_unlocked(path, format, mode, metadata)
    except BaseException:
        lock.release()
        raise
    return GuardedWriter(writer, lock)


class GuardedWriter:
    """A format's writer, guarded: it holds the dataset's writer lock until it is closed, and
    refuses an episode the disk cannot hold before writing any of it."""

    def __init__(self, writer: Writer, lock):
        self._writer, self._lock = writer, lock
        self.path = self._path = Path(writer.path)
        self.format = writer.format

    @property
    def num_episodes(self) -> int:
        return self._writer.num_episodes

    def write_episode(self, episode: Mapping[str, np.ndarray]) -> int:
        """Append one episode atomically (refused first if the disk cannot hold it); returns
        its episode_idx."""
        check_free_space(self._path, sum(np.asarray(v).nbytes for v in episode.values()))
        return self._writer.write_episode(episode)

    def close(self) -> None:
        """Finish the dataset, then let the next writer in."""
        try:
            self._writer.close()
        finally:
            self._lock.release()

    def __enter__(self) -> "GuardedWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _open_unlocked(path: Location, format: str | None, mode: str, metadata) -> Writer:
    """The format's writer (a local path is under its writer lock by now)."""
    if not loc.is_remote(path) and _holds_no_episode(path):
        remove_tree(path)  # an empty place, or what a failed first write left: start afresh
    fmt = resolve_format(path, format)
    if loc.is_remote(path) and fmt != "lance":
        raise UsageError(
            f"cannot write a {fmt} dataset to object storage ({path})",
            hint="write Lance there (a .lance name), or write locally and upload the file",
        )
    append = False
    if loc.exists(path):
        if mode == "error":
            raise UsageError(f"{path} already exists", hint="pass --overwrite to replace it")
        existing = detect(path)
        if mode == "overwrite":
            remove_dataset(path)
        elif existing != fmt:
            raise UsageError(
                f"cannot append {fmt} episodes to {path}: it is a {existing} dataset",
                hint=f"write to a new path, or use --format {existing}",
            )
        else:
            append = True
    loc.make_parent(path)
    return _module(fmt).open_writer(path, dict(metadata or {}), append)


# A write needs room for the episode (raw, before compression) twice over (Lance compaction
# rewrites it) plus this much, so a full disk is refused before a write, never met inside one.
FREE_SPACE_MARGIN_BYTES = 64 * 2**20


def check_free_space(path: Path, episode_bytes: int, hint: str | None = None) -> None:
    """Refuse a write the disk holding ``path`` has no room for (one clear error, exit 1;
    ``hint`` says what became of what was written)."""
    from swmcli.units import format_bytes

    existing = path if path.exists() else path.parent
    free = shutil.disk_usage(existing).free
    needed = 2 * episode_bytes + FREE_SPACE_MARGIN_BYTES
    if free < needed:
        raise DatasetError(
            f"only {format_bytes(free)} free on the disk of {path}; writing the next "
            f"episode needs about {format_bytes(needed)}",
            hint=hint
            or "free some disk space or write to another disk (--out); every finished episode "
            "is kept",
        )


def _holds_no_episode(path: Path) -> bool:
    """True only for nothing at all or for what swm itself leaves when a first write fails: an
    empty directory or ``.h5``/``.hdf5`` file; a Lance directory with no commit (``data/*.lance``,
    ``_transactions/*.txn``, the readers' lock); a folder dataset's uncommitted parts (its
    staging directories and metadata, empty episode directories). A user's files (a
    ``.gitkeep``, empty notes) are never taken for leftovers. Called under the writer lock."""
    if path.is_file():
        return path.stat().st_size == 0 and path.suffix.lower() in (".h5", ".hdf5")
    if not path.is_dir():
        return False
    entries = list(path.iterdir())
    lance = {"data": ".lance", "_transactions": ".txn"}
    return all(_lance_leftover(entry, lance) for entry in entries) or all(
        _folder_leftover(entry) for entry in entries
    )


def _lance_leftover(entry: Path, suffixes: dict[str, str]) -> bool:
    if entry.name == "_swm_readers.lock":
        return entry.is_file()
    suffix = suffixes.get(entry.name)
    return (
        suffix is not None
        and entry.is_dir()
        and all(f.is_file() and f.suffix == suffix for f in entry.iterdir())
    )


def _folder_leftover(entry: Path) -> bool:
    if entry.name.startswith(".tmp_episode_") or entry.name == f".{FOLDER_METADATA}.tmp":
        return True  # the folder writer's staging: never committed
    return entry.is_dir() and entry.name.startswith("episode_") and not any(entry.iterdir())


def remove_tree(path: Path) -> None:
    """Delete a file or a directory tree (only ever called on paths swm itself made)."""
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def remove_dataset(path: Location) -> None:
    """Delete a dataset (only something ``detect`` recognises, never an arbitrary directory)."""
    detect(path)
    if loc.is_remote(path):
        loc.remove(path)
    else:
        remove_tree(path)


def episode_schema(episode: Mapping[str, np.ndarray]) -> Schema:
    """Per-row dtype and shape of every key; a clear error for an empty or ragged episode."""
    if not episode:
        raise UsageError("an episode needs at least one key", hint="pass pixels, action, ...")
    lengths = {key: np.shape(value)[0] if np.ndim(value) else 0 for key, value in episode.items()}
    if len(set(lengths.values())) != 1 or 0 in lengths.values():
        raise UsageError(
            f"episode arrays must share a non-zero first dimension, got {lengths}",
            hint="every key holds one row per step",
        )
    for key in (*INDEX_COLUMNS, CHECKSUM_COLUMN):
        if key in episode:
            raise UsageError(f"episode key {key!r} is reserved", hint="the writer adds it")
    return {key: (np.asarray(v).dtype, tuple(np.shape(v)[1:])) for key, v in episode.items()}


def check_schema(expected: Schema, episode: Mapping[str, np.ndarray], where: Path) -> Schema:
    """The episode's schema, or a clear error if it differs from the dataset's."""
    got = episode_schema(episode)
    if got != expected:
        raise UsageError(
            f"episode does not match the schema of {where}: "
            f"expected {describe_schema(expected)}, got {describe_schema(got)}",
            hint="append episodes with the same keys, shapes and dtypes, or write a new dataset",
        )
    return got


def describe_schema(schema: Schema) -> str:
    """``pixels uint8 (64, 64, 3), action float32 (2,)`` for messages."""
    return ", ".join(f"{k} {np.dtype(d).name} {s}" for k, (d, s) in schema.items())


def schema_to_json(schema: Schema) -> dict[str, list]:
    """The schema as JSON-able ``{key: [dtype, shape]}``."""
    return {k: [np.dtype(d).str, list(s)] for k, (d, s) in schema.items()}


def schema_from_json(data: Mapping[str, list]) -> Schema:
    """Inverse of ``schema_to_json``."""
    return {k: (np.dtype(d), tuple(int(n) for n in s)) for k, (d, s) in data.items()}


WRITER_METADATA = ("format_version", "pixel_encoding", "swm_version", "keys")  # set by the writer


def build_metadata(user: Mapping[str, Any], schema: Schema, pixel_encoding: str) -> dict:
    """Dataset metadata: the user's env_id/resolution/action_dim plus what swm adds."""
    import swmcli

    meta = {"env_id": None, "resolution": None, "action_dim": None, **user}
    if meta["action_dim"] is None and "action" in schema:
        meta["action_dim"] = int(np.prod(schema["action"][1]))
    if meta["resolution"] is None and "pixels" in schema and len(schema["pixels"][1]) >= 2:
        meta["resolution"] = list(schema["pixels"][1][:2])
    meta.update(
        format_version=FORMAT_VERSION,
        pixel_encoding=pixel_encoding,
        swm_version=swmcli.__version__,
        keys=schema_to_json(schema),
    )
    return seal_metadata(meta)


def read_metadata(raw: str | bytes, where) -> tuple[dict, Schema, bool]:
    """Dataset metadata stored as JSON text: ``(metadata, schema, sealed)``, its checksums
    checked (``sealed`` is False for a dataset written before metadata checksums); a
    DatasetError naming the damage otherwise."""
    metadata, sealed = unseal_metadata(raw, where)
    try:
        schema = schema_from_json(metadata["keys"])
        shapes = [shape for _, shape in schema.values()]
        if not schema or any(len(shape) > 8 or min(shape, default=1) < 1 for shape in shapes):
            raise ValueError("an empty schema or an impossible shape")
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise DatasetError(
            f"{where}: its schema (metadata keys) is damaged: {first_line(error)}",
            hint="restore the dataset, or collect again",
        ) from None
    return metadata, schema, sealed


def check_stored_schema(where, stored: Mapping[str, tuple], schema: Schema) -> None:
    """Refuse a dataset whose stored columns (``{key: (dtype, row shape)}`` as the file holds
    them) disagree with the schema its metadata gives: the rows would be reinterpreted."""
    for key, (dtype, shape) in schema.items():
        if key not in stored:
            raise DatasetError(f"{where}: column {key} is missing", _STORED_HINT)
        got_dtype, got_shape = stored[key]
        if (got_dtype is not None and np.dtype(got_dtype) != dtype) or tuple(got_shape) != shape:
            raise DatasetError(
                f"{where}: column {key} holds {got_dtype} {tuple(got_shape)}, its schema says "
                f"{np.dtype(dtype).name} {shape}",
                _STORED_HINT,
            )


_STORED_HINT = "the dataset is damaged (schema and data disagree): restore it or collect again"


def check_metadata(existing: Mapping[str, Any], user: Mapping[str, Any], where: Path) -> None:
    """Refuse appending episodes of another env / resolution / action dim."""
    for key in ("env_id", "resolution", "action_dim"):
        new, old = user.get(key), existing.get(key)
        if new is not None and old is not None and json.dumps(new) != json.dumps(old):
            raise UsageError(
                f"{where} holds {key} {old}, not {new}",
                hint="write to a new path (--out), or delete the old dataset first",
            )


def is_image(shape: tuple[int, ...]) -> bool:
    """Rows with two or more dimensions are images: stored as one compressed blob per row."""
    return len(shape) >= 2


def check_keys(schema: Schema, keys, where) -> list[str]:
    """The requested keys (all when None); a usage error naming the missing ones."""
    if keys is None:
        return list(schema)
    missing = [k for k in keys if k not in schema]
    if missing:
        raise MissingKeyError(
            f"{where} has no key {', '.join(map(repr, missing))}",
            hint=f"available keys: {', '.join(schema)}",
        )
    return list(keys)


def offsets_from_lengths(lengths: np.ndarray) -> np.ndarray:
    """First global row of each episode."""
    lengths = np.asarray(lengths, dtype=np.int64)
    return np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)


def read_ahead(path: Location, limit: int) -> bool:
    """Ask the kernel to load a dataset's files into the page cache in the background when they add
    up to at most ``limit`` bytes: one sequential pass instead of a first epoch of random reads
    (an HDF5 worker reads one chunk at a time, and cold chunks made its batches ~2x slower).
    Returns whether it asked (never for object storage: no page cache to fill)."""
    if loc.is_remote(path):
        return False
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    if sum(file.stat().st_size for file in files) > limit:
        return False
    for file in files:
        descriptor = os.open(file, os.O_RDONLY)
        try:
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(descriptor)
    return True


def take_rows(values: np.ndarray, index: np.ndarray | None, out: np.ndarray | None):
    """``values[index]`` (all of ``values`` when ``index`` is None), written into ``out`` if given.

    Readers take ``out`` so a DataLoader worker can gather a batch straight into shared memory.
    """
    if out is None:
        return values if index is None else values[index]
    if index is None:
        out[...] = values
    else:
        np.take(values, index, axis=0, out=out)
    return out


def check_index(lengths: np.ndarray, episode_ids, step_ids, where, hint: str) -> None:
    """The cheap structural check on open: every row's ``episode_idx`` and ``step_idx`` agree
    with the episode lengths (a damaged index is an error, never a silent merge of episodes)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    offsets = offsets_from_lengths(lengths)
    expected_ids = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    expected_steps = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(offsets, lengths)
    if len(episode_ids) != len(expected_ids) or np.any(episode_ids != expected_ids):
        raise DatasetError(f"{where}: episode_idx does not match the episode index", hint)
    if len(step_ids) != len(expected_steps) or np.any(step_ids != expected_steps):
        raise DatasetError(f"{where}: step_idx does not count the steps of each episode", hint)


def rows_by_episode(offsets: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Episode of each global row."""
    return np.searchsorted(offsets, rows, side="right") - 1
