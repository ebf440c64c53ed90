"""Datasets written by other tools, read in swm's convention through swm's own Reader protocol.

``detect(path)`` names a foreign layout (or None: swm's own formats and unknown paths are not
ours to claim); ``open_reader(path, mapping)`` returns a ``ForeignReader``: one front over a
*source* (one small module per tool family: ``upstream`` for stable-worldmodel's Lance and HDF5,
``minari``) that already yields rows in swm's convention (row t = observation t, the reward and
flags of arriving there, the action taken from it; the last row's action NaN). The front renames
the source's columns to swm's keys (``mapping``, overridable with ``--map SRC=DST``) and states
in its metadata what it found: the format, the alignment convention and what was done about it,
the codec and whether frames are lossy, and which columns were left out and why.

A foreign dataset is untrusted input: sources read with pickling off, never follow a path out of
the dataset, and check every length and shape a header claims against the bytes actually stored
before they allocate for it (``check_stored``).
"""

from collections.abc import Callable, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import numpy as np

from swmcli.core.storage import INDEX_COLUMNS, Schema, check_keys, offsets_from_lengths, take_rows
from swmcli.core.storage.location import nbytes_under
from swmcli.errors import DatasetError, UsageError, first_line

UPSTREAM_LANCE = "stable-worldmodel-lance"
UPSTREAM_HDF5 = "stable-worldmodel-hdf5"
UPSTREAM_FOLDER = "stable-worldmodel-folder"
UPSTREAM_VIDEO = "stable-worldmodel-video"
MINARI = "minari"
LEROBOT = "lerobot"
UPSTREAM = (UPSTREAM_LANCE, UPSTREAM_HDF5, UPSTREAM_FOLDER, UPSTREAM_VIDEO)
FOREIGN_FORMATS = (*UPSTREAM, MINARI, LEROBOT)
_PROVENANCE = ("codec", "lossy", "convention")
DAMAGED_HINT = "the dataset is damaged or not what it claims to be: re-download or re-export it"


class Source(Protocol):
    """What a foreign layout's module offers the front: rows already in swm's convention."""

    lengths: np.ndarray  # rows of each episode, in swm's convention
    columns: Schema  # source column name -> (dtype, per-row shape) as read
    info: dict  # what to tell the user: convention, codec, lossy, dropped columns ...
    defaults: dict[str, str]  # source column -> swm key where the name alone does not say it

    def read(self, name: str, rows: np.ndarray) -> np.ndarray: ...
    def close(self) -> None: ...


def detect(path: Path) -> str | None:
    """The foreign layout at the local ``path``, or None. Cheap: reads a few bytes, lists a
    directory; never opens a Lance dataset (that would make this process unsafe to fork)."""
    from swmcli.core.storage.foreign import lerobot, minari, upstream, upstream_files

    found = upstream.detect(path) or upstream_files.detect(path) or minari.detect(path)
    return found or lerobot.detect(path)


def is_hdf5(path: Path) -> bool:
    """Whether the file at ``path`` starts with HDF5's signature."""
    with path.open("rb") as handle:
        return handle.read(8) == b"\x89HDF\r\n\x1a\n"


def parse_mapping(pairs: list[str] | None) -> dict[str, str]:
    """``["observation.image=pixels", ...]`` -> ``{"observation.image": "pixels"}``; an empty
    DST (``SRC=``) leaves the column out."""
    mapping = {}
    for pair in pairs or []:
        source, sep, target = pair.partition("=")
        if not sep or not source.strip():
            raise UsageError(f"--map takes SRC=DST, got {pair!r}", hint="e.g. --map rgb=pixels")
        mapping[source.strip()] = target.strip()
    return mapping


def open_reader(path: Path, format: str, mapping: Mapping[str, str] | None = None):
    """A ``ForeignReader`` over the dataset at ``path`` (its layout ``format`` from ``detect``)."""
    from swmcli.core.storage.foreign import lerobot, minari, upstream, upstream_files

    opener = {UPSTREAM_LANCE: upstream.open_lance, UPSTREAM_HDF5: upstream.open_hdf5}
    opener.update({UPSTREAM_FOLDER: upstream_files.open_source})
    opener.update({UPSTREAM_VIDEO: upstream_files.open_source})
    opener.update({MINARI: minari.open_source, LEROBOT: lerobot.open_source})
    source = opener[format](path)
    try:
        return ForeignReader(path, format, source, mapping or {})
    except BaseException:
        source.close()
        raise


def default_key(name: str) -> str:
    """swm's key for a source column: the same name, with the dots Lance refuses as ``_``."""
    return name.replace(".", "_")


class ForeignReader:
    """swm's Reader protocol over a foreign source: mapped keys, swm's row convention."""

    index_token = None  # the index comes from the source on each open: nothing to cache
    metadata_sealed = False  # foreign layouts carry no swm metadata checksums

    def __init__(self, path: Path, format: str, source: Source, mapping: Mapping[str, str]):
        self.path, self.format, self._source = path, format, source
        unknown = [name for name in mapping if name not in source.columns]
        if unknown:
            raise UsageError(
                f"--map names {', '.join(map(repr, unknown))}, not a column of {path}",
                hint=f"its columns: {', '.join(source.columns)}",
            )
        self._names = {}  # swm key -> source column
        for name in source.columns:
            key = mapping.get(name, source.defaults.get(name, default_key(name)))
            if not key:
                continue
            if key in self._names or key in INDEX_COLUMNS:
                raise UsageError(
                    f"{name!r} and {self._names.get(key, 'the index')!r} both map to {key!r}",
                    hint="give one of them another name with --map SRC=DST (SRC= leaves it out)",
                )
            self._names[key] = name
        self.keys: Schema = {key: source.columns[name] for key, name in self._names.items()}
        self.episode_lengths = np.asarray(source.lengths, dtype=np.int64)
        self.episode_offsets = offsets_from_lengths(self.episode_lengths)
        self.num_episodes = len(self.episode_lengths)
        self.num_steps = int(self.episode_lengths.sum())
        action = self.keys.get("action")
        renamed = {name: key for key, name in self._names.items() if name != key}
        left_out = [name for name in source.columns if name not in self._names.values()]
        # "source_*": read as provenance once ``swm convert`` has copied them into swm's format
        self.metadata = {
            "source_format": format,
            **{f"source_{k}" if k in _PROVENANCE else k: v for k, v in source.info.items()},
            "mapping": renamed or "same names",
            "env_id": None,
            "resolution": _side(self.keys.get("pixels")),
            "action_dim": int(np.prod(action[1])) if action else None,
        }
        if left_out:
            self.metadata["left_out_by_map"] = left_out

    @property
    def nbytes_on_disk(self) -> int:
        return nbytes_under(self.path)

    def read_rows(self, key: str, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Rows (global, swm convention) of one key."""
        rows = self._check_rows(rows)
        check_keys(self.keys, [key], self.path)
        return take_rows(self._source.read(self._names[key], rows), None, out)

    def _check_rows(self, rows) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= self.num_steps):
            raise DatasetError(f"{self.path}: rows outside 0..{self.num_steps - 1} asked for")
        return rows

    def read_columns(self, keys: list[str], rows: np.ndarray) -> dict[str, np.ndarray]:
        """Several keys at the same rows (one read for all, where the source offers it)."""
        many = getattr(self._source, "read_many", None)
        if many is None or len(keys) < 2:
            return {key: self.read_rows(key, rows) for key in keys}
        rows = self._check_rows(rows)
        check_keys(self.keys, keys, self.path)
        values = many([self._names[key] for key in keys], rows)
        return {key: values[self._names[key]] for key in keys}

    def read_episode(self, index: int, keys=None) -> dict[str, np.ndarray]:
        if not 0 <= index < self.num_episodes:
            raise DatasetError(f"{self.path} holds {self.num_episodes} episodes, not {index + 1}")
        start = int(self.episode_offsets[index])
        rows = np.arange(start, start + int(self.episode_lengths[index]))
        return self.read_columns(check_keys(self.keys, keys, self.path), rows)

    def read_checksums(self, index: int) -> None:
        return None  # foreign layouts carry no per-row checksums

    def read_row_checksums(self, rows: np.ndarray) -> None:
        return None

    def close(self) -> None:
        self._source.close()


def _side(pixels) -> int | list[int] | None:
    """swm's resolution: the side of square frames (what a model is built for), else [H, W]."""
    if pixels is None or len(pixels[1]) < 2:
        return None
    height, width = pixels[1][:2]
    return int(height) if height == width else [int(height), int(width)]


@contextmanager
def reading(path, on_error: Callable[[], None] | None = None):
    """Whatever a damaged file makes h5py, Lance or Pillow raise becomes one DatasetError line
    (``on_error`` runs first, e.g. to close the file)."""
    try:
        yield
    except BaseException as error:
        if on_error is not None:
            on_error()
        if isinstance(error, DatasetError) or not isinstance(error, Exception):
            raise
        raise DatasetError(f"cannot read {path}: {first_line(error)}", DAMAGED_HINT) from None


def check_stored(name: str, claimed_bytes: int, stored_bytes: int, where, ratio: int = 1) -> None:
    """Refuse a header that claims more bytes than are stored (times ``ratio`` for compressed
    data): what a hostile or truncated file would otherwise make swm allocate."""
    if claimed_bytes > max(stored_bytes, 0) * ratio:
        raise DatasetError(
            f"{where}: {name} claims {claimed_bytes} bytes but only {stored_bytes} are stored",
            DAMAGED_HINT,
        )


def check_lengths(lengths: np.ndarray, rows: int, where) -> np.ndarray:
    """Episode lengths that are positive and add up to the rows stored."""
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or lengths.dtype.kind not in "iu":
        raise DatasetError(f"{where}: the episode lengths are not a list of integers", DAMAGED_HINT)
    lengths = lengths.astype(np.int64)
    if np.any(lengths <= 0) or int(lengths.sum()) != rows:
        raise DatasetError(
            f"{where}: episode lengths add up to {int(lengths.sum())} rows, {rows} are stored",
            DAMAGED_HINT,
        )
    return lengths


def inside(root: Path, relative: str) -> Path:
    """``root / relative``, refused when it would lead out of ``root`` (a dataset naming
    ``../../etc/passwd`` or an absolute path)."""
    target = (root / relative).resolve()
    if not target.is_relative_to(root.resolve()):
        raise DatasetError(f"{root}: names a path outside the dataset ({relative})", DAMAGED_HINT)
    return target
