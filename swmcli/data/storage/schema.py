"""What every format holds: the schema of an episode's rows, the dataset metadata, the row index.

One row per observation with ``episode_idx`` (int64), ``step_idx`` (int32) and one column per
episode key (``pixels``, ``action``, ``reward``, ``terminated``, ``truncated``, and any other
observation key), plus dataset metadata (format version, env id, resolution, action dim, pixel
encoding, swm version). An episode in memory is ``dict[str, np.ndarray]`` whose arrays share their
first dimension. Writers add ``episode_idx`` and ``step_idx``; readers return episodes without
them, so an episode read back equals the one written. The ``Reader`` and ``Writer`` protocols
are what every format (and the foreign readers, and the ReplayBuffer as a writer) offer.
"""

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from swmcli import __version__
from swmcli.data.storage import location as loc
from swmcli.data.storage.checksums import CHECKSUM_COLUMN, seal_metadata, unseal_metadata
from swmcli.data.storage.location import Location
from swmcli.errors import DatasetError, MissingKeyError, UsageError, first_line
from swmcli.names import bad_name, check_name

FORMAT_VERSION = 2  # the layout swm writes: metadata sealed by a checksum per field (checksums.py)


# Bookkeeping columns every format stores; not episode keys.
INDEX_COLUMNS = ("episode_idx", "step_idx")


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
    # With ``checksums``, also the rows' stored CRC-32s (``read_row_checksums``'s) under
    # ``CHECKSUM_COLUMN``, in the same read where the format stores them beside the keys.
    def read_columns(self, keys: list[str], rows: np.ndarray, checksums: bool = False) -> dict: ...

    # Integrity (see checksums.py): whether the metadata was checked against its checksums on
    # open, and the stored per-row CRC-32s (swm's own datasets; another tool's have neither:
    # False and None).
    metadata_sealed: bool

    def read_checksums(self, index: int) -> np.ndarray | None: ...
    def read_row_checksums(self, rows: np.ndarray) -> np.ndarray | None: ...
    def close(self) -> None: ...


class Writer(Protocol):
    """What writers of episodes (every format's, and the ReplayBuffer) offer their users."""

    num_episodes: int  # written so far, those already there when appending included

    def write_episode(self, episode: Mapping[str, np.ndarray]) -> object: ...
    def close(self) -> None: ...


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
    for key in episode:
        check_name(key, "episode key")  # it names folders, HDF5 datasets, Lance columns
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
    meta = {"env_id": None, "resolution": None, "action_dim": None, **user}
    if meta["action_dim"] is None and "action" in schema:
        meta["action_dim"] = int(np.prod(schema["action"][1]))
    if meta["resolution"] is None and "pixels" in schema and len(schema["pixels"][1]) >= 2:
        meta["resolution"] = list(schema["pixels"][1][:2])
    meta.update(
        format_version=FORMAT_VERSION,
        pixel_encoding=pixel_encoding,
        swm_version=__version__,
        keys=schema_to_json(schema),
    )
    return seal_metadata(meta)


def read_metadata(raw: str | bytes, where) -> tuple[dict, Schema]:
    """Dataset metadata stored as JSON text: ``(metadata, schema)``, its checksums checked; a
    DatasetError naming the damage otherwise."""
    metadata = unseal_metadata(raw, where)
    try:
        schema = schema_from_json(metadata["keys"])
        shapes = [shape for _, shape in schema.values()]
        if not schema or any(len(shape) > 8 or min(shape, default=1) < 1 for shape in shapes):
            raise ValueError("an empty schema or an impossible shape")
        bad = next((key for key in schema if bad_name(key)), None)
        if bad is not None:
            raise ValueError(f"the key {bad!r} {bad_name(bad)}")
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise DatasetError(
            f"{where}: its schema (metadata keys) is damaged: {first_line(error)}",
            hint="restore the dataset, or collect again",
        ) from None
    return metadata, schema


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


# What episodes in one dataset must share where their datasets record it (appended, merged).
AGREEING_METADATA = ("env_id", "resolution", "action_dim")


def metadata_conflict(first: Mapping[str, Any], second: Mapping[str, Any]):
    """The first of ``AGREEING_METADATA`` that both record and that differs, as ``(field,
    first's value, second's value)``; None when they agree."""
    for key in AGREEING_METADATA:
        mine, theirs = first.get(key), second.get(key)
        recorded = mine is not None and theirs is not None
        if recorded and json.dumps(mine, sort_keys=True) != json.dumps(theirs, sort_keys=True):
            return key, mine, theirs
    return None


def check_metadata(existing: Mapping[str, Any], user: Mapping[str, Any], where: Path) -> None:
    """Refuse appending episodes of another env / resolution / action dim."""
    if conflict := metadata_conflict(existing, user):
        key, old, new = conflict
        raise UsageError(
            f"{where} holds {key} {old}, not {new}",
            hint="write to a new path (--out), or delete the old dataset first",
        )


def is_image(shape: tuple[int, ...]) -> bool:
    """Rows with two or more dimensions are images: stored as one compressed blob per row."""
    return len(shape) >= 2


def unfit(values: np.ndarray, dtype) -> str | None:
    """Why ``values`` cannot become ``dtype`` without changing beyond rounding (None: they can):
    a finite number that would become infinite, NaN or a fraction as an integer, a number outside
    an integer type's range (it would wrap), a flag that is neither 0 nor 1."""
    values, dtype = np.asarray(values), np.dtype(dtype)
    if values.dtype == dtype or not values.size or values.dtype.kind not in "biuf":
        return None
    if values.dtype.kind == "b" or (dtype.kind == "f" and values.dtype.kind in "iu"):
        return None  # every flag fits a number, every int64 a float32 (rounded)
    if dtype.kind == "f":
        beyond = np.isfinite(values) & (np.abs(values) > np.finfo(dtype).max)
        bad, why = beyond, f"beyond {dtype}'s largest, {np.finfo(dtype).max:.4g}"
    elif dtype.kind == "b":
        bad, why = (values != 0) & (values != 1), "neither 0 nor 1"
    else:
        limits = np.iinfo(dtype)
        if values.dtype.kind == "f":
            wide = values.astype(np.float64)
            fraction = ~np.isfinite(wide) | (np.floor(wide) != wide)
            outside = (wide < limits.min) | (wide >= limits.max + 1.0)  # 2**63 is no int64
        else:
            fraction, outside = False, (values < limits.min) | (values > limits.max)
        bad, why = fraction | outside, f"not a whole number in {dtype}'s {limits.min}..{limits.max}"
    found = np.flatnonzero(np.asarray(bad).reshape(-1))
    if not len(found):
        return None
    return f"holds {values.reshape(-1)[found[0]].item()!r} ({len(found)} such values), {why}"


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
    episode_ids, step_ids = np.asarray(episode_ids), np.asarray(step_ids)
    rows = int(lengths.sum())
    starts = offsets_from_lengths(lengths)
    if not (len(episode_ids) == rows and _ids_match(lengths, starts, episode_ids)):
        raise DatasetError(f"{where}: episode_idx does not match the episode index", hint)
    if not (len(step_ids) == rows and _steps_match(lengths, starts, step_ids)):
        raise DatasetError(f"{where}: step_idx does not count the steps of each episode", hint)


# The checks compare neighbouring rows instead of building each row's expected value: a million
# episodes' index is ten million rows, and every array of them is memory to fault in (0.1-0.3 s
# each on the benchmark VM).
def _ids_match(lengths: np.ndarray, starts: np.ndarray, ids: np.ndarray) -> bool:
    """``ids`` (as many as the rows) is episode ``i`` for each of episode ``i``'s rows, which
    start at ``starts[i]``."""
    if not len(ids) or np.any(lengths <= 0):  # no rows, or episodes of none: row by row
        return np.array_equal(ids, np.repeat(np.arange(len(lengths)), lengths))
    changes = np.flatnonzero(ids[1:] != ids[:-1]) + 1
    return np.array_equal(changes, starts[1:]) and np.array_equal(ids[starts], range(len(starts)))


def _steps_match(lengths: np.ndarray, starts: np.ndarray, steps: np.ndarray) -> bool:
    """``steps`` (as many as the rows) counts 0, 1, ... over each episode's rows, which start
    at ``starts[i]``."""
    if not len(steps) or np.any(lengths <= 0):  # no rows, or episodes of none: row by row
        row_starts = np.repeat(starts[: len(lengths)], lengths)
        return np.array_equal(steps, np.arange(int(lengths.sum())) - row_starts)
    counting = steps[1:] == steps[:-1] + 1
    counting[starts[1:] - 1] = True  # an episode's first row follows another episode's last
    return bool(np.all(steps[starts] == 0)) and bool(np.all(counting))


def rows_by_episode(offsets: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Episode of each global row."""
    return np.searchsorted(offsets, rows, side="right") - 1
