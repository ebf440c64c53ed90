"""Datasets written by other tools, read in swm's convention through swm's own Reader protocol.

``detect(path)`` names a foreign layout (or None: swm's own formats and unknown paths are not
ours to claim); ``open_reader(path, mapping)`` returns a ``ForeignReader``: one front over a
*source* (one small module per tool family: ``upstream`` for stable-worldmodel's Lance and HDF5,
``minari``) that already yields rows in swm's convention (row t = observation t, the reward and
flags of arriving there, the action taken from it; the last row's action NaN). The front renames
the source's columns to swm's keys (``mapping``, overridable with ``--map COLUMN=KEY``) and states
in its metadata what it found: the format, the alignment convention and what was done about it,
the codec and whether frames are lossy, and which columns were left out and why.

A foreign dataset is untrusted input: sources read with pickling off, never follow a path out of
the dataset, and check every length and shape a header claims against the bytes actually stored
before they allocate for it (``check_stored``).
"""

from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from swmcli.data.foreign import lerobot, minari, upstream, upstream_files
from swmcli.data.foreign.common import (
    DAMAGED_HINT,
    LEROBOT,
    MINARI,
    UPSTREAM_FOLDER,
    UPSTREAM_HDF5,
    UPSTREAM_LANCE,
    UPSTREAM_VIDEO,
    Source,
)
from swmcli.data.mapping import map_columns, said
from swmcli.data.storage.checksums import CHECKSUM_COLUMN
from swmcli.data.storage.location import nbytes_under
from swmcli.data.storage.schema import (
    Schema,
    check_keys,
    is_image,
    offsets_from_lengths,
    take_rows,
)
from swmcli.errors import DatasetError, SwmError, first_line

_PROVENANCE = ("codec", "lossy", "convention")


def detect(path: Path) -> str | None:
    """The foreign layout at the local ``path``, or None. Cheap: reads a few bytes, lists a
    directory; never opens a Lance dataset (that would make this process unsafe to fork)."""
    found = upstream.detect(path) or upstream_files.detect(path) or minari.detect(path)
    return found or lerobot.detect(path)


def read_beside(path: Path) -> list[Path]:
    """Paths outside the local ``path`` that the dataset it names reads (a stable-worldmodel
    table's side tables): a destination there would replace part of the source."""
    return upstream.side_tables(path)


def open_reader(path: Path, format: str, mapping: Mapping[str, str] | None = None):
    """A ``ForeignReader`` over the dataset at ``path`` (its layout ``format`` from ``detect``)."""
    opener = {UPSTREAM_LANCE: upstream.open_lance, UPSTREAM_HDF5: upstream.open_hdf5}
    opener.update({UPSTREAM_FOLDER: upstream_files.open_source})
    opener.update({UPSTREAM_VIDEO: upstream_files.open_source})
    opener.update({MINARI: minari.open_source, LEROBOT: lerobot.open_source})
    with documented_errors(path):
        source = opener[format](path)
        try:
            return ForeignReader(path, format, source, mapping or {})
        except BaseException:
            source.close()
            raise


@contextmanager
def documented_errors(path: Path):
    """Whatever a hostile header makes numpy, pyarrow or json raise while a foreign dataset
    opens (a ValueError, a KeyError, a MemoryError) as swm's own DatasetError: what
    ``load_dataset`` documents."""
    try:
        yield
    except SwmError:
        raise
    except (ValueError, KeyError, TypeError, IndexError, MemoryError, OverflowError) as error:
        raise DatasetError(
            f"cannot read {path}: {type(error).__name__}: {first_line(error)}", DAMAGED_HINT
        ) from None


def default_key(name: str) -> str:
    """swm's key for a source column: the same name, with the dots Lance refuses as ``_``."""
    return name.replace(".", "_")


class ForeignReader:
    """swm's Reader protocol over a foreign source: mapped keys, swm's row convention."""

    index_token = None  # the index comes from the source on each open: nothing to cache
    metadata_sealed = False  # foreign layouts carry no swm metadata checksums

    def __init__(self, path: Path, format: str, source: Source, mapping: Mapping[str, str]):
        self.path, self.format, self._source = path, format, source
        self.columns = list(source.columns)  # the source's own names: what ``--map`` renames
        empty = next((name for name, (_, shape) in source.columns.items() if 0 in shape), None)
        if empty is not None:
            raise DatasetError(
                f"{path}: the column {empty} holds rows of shape {source.columns[empty][1]}: "
                "no values a row",
                DAMAGED_HINT,
            )
        defaults = {name: default_key(name) for name in source.columns}
        self._names = map_columns(path, source.columns, mapping, {**defaults, **source.defaults})
        self.keys: Schema = {key: source.columns[name] for key, name in self._names.items()}
        # Float frames are read as uint8 once, here (x 255, rounded): swm's pixels are bytes.
        self._float_frames = {
            k for k, (dtype, shape) in self.keys.items() if is_image(shape) and dtype.kind == "f"
        }
        for key in self._float_frames:
            self.keys[key] = (np.dtype(np.uint8), self.keys[key][1])
        self.episode_lengths = np.asarray(source.lengths, dtype=np.int64)
        self.episode_offsets = offsets_from_lengths(self.episode_lengths)
        self.num_episodes = len(self.episode_lengths)
        self.num_steps = int(self.episode_lengths.sum())
        action = self.keys.get("action")
        # "source_*": read as provenance once ``swm convert`` has copied them into swm's format
        self.metadata = {
            "source_format": format,
            **{f"source_{k}" if k in _PROVENANCE else k: v for k, v in source.info.items()},
            **said(self._names, source.columns),
            "env_id": None,
            "resolution": _side(self.keys.get("pixels")),
            "action_dim": int(np.prod(action[1])) if action else None,
        }
        if self._float_frames:
            self.metadata["frame_conversion"] = (
                f"{', '.join(sorted(self._float_frames))}: float values in [0, 1] read as uint8 "
                "(x 255, rounded)"
            )

    @property
    def nbytes_on_disk(self) -> int:
        return nbytes_under(self.path)

    def read_rows(self, key: str, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Rows (global, swm convention) of one key."""
        rows = self._check_rows(rows)
        check_keys(self.keys, [key], self.path)
        return take_rows(self._as_read(key, self._source.read(self._names[key], rows)), None, out)

    def _as_read(self, key: str, values: np.ndarray) -> np.ndarray:
        """Float frames as uint8; values outside [0, 1] (or NaN) refused, never wrapped."""
        if key not in self._float_frames:
            return values
        finite = not values.size or np.isfinite(values).all()
        if not finite or (values.size and not 0 <= values.min() <= values.max() <= 1):
            raise DatasetError(
                f"{self.path}: {key} holds float frames with values outside [0, 1] (from "
                f"{np.nanmin(values):.4g} to {np.nanmax(values):.4g}): swm reads float frames as "
                "[0, 1]",
                hint="store frames as uint8 (0..255), or as floats in [0, 1]",
            )
        return np.rint(values * 255).astype(np.uint8)

    def _check_rows(self, rows) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= self.num_steps):
            raise DatasetError(f"{self.path}: rows outside 0..{self.num_steps - 1} asked for")
        return rows

    def read_columns(self, keys: list[str], rows: np.ndarray, checksums: bool = False) -> dict:
        """Several keys at the same rows (one read for all, where the source offers it); no
        checksums (None) with ``checksums``: foreign layouts carry none."""
        many = getattr(self._source, "read_many", None)
        if many is None or len(keys) < 2:
            values = {key: self.read_rows(key, rows) for key in keys}
        else:
            rows = self._check_rows(rows)
            check_keys(self.keys, keys, self.path)
            read = many([self._names[key] for key in keys], rows)
            values = {key: self._as_read(key, read[self._names[key]]) for key in keys}
        if checksums:
            values[CHECKSUM_COLUMN] = None
        return values

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
