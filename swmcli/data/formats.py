"""Every dataset swm reads or writes, behind one registry: ``detect``, ``open_reader``,
``open_writer``.

swm's own formats (``storage/``: Lance, HDF5, folder) and the layouts of other tools
(``foreign/``: stable-worldmodel, Minari, LeRobot) are told apart here, by a few bytes or a
directory listing; ``open_reader`` then returns a reader of the ``storage.schema.Reader``
protocol for any of them, and ``open_writer`` one of swm's formats, under the dataset's writer
lock and with its free-space check. Writes are episode-atomic in every format.

A dataset path may also be an ``s3://`` URI (see ``storage/location.py``): Lance datasets are read
and written there, HDF5 files are read; folders stay local.
"""

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from swmcli.config import format_name
from swmcli.data.foreign.common import FOREIGN_FORMATS
from swmcli.data.foreign.reader import detect as detect_foreign
from swmcli.data.foreign.reader import open_reader as open_foreign
from swmcli.data.mapping import MappedReader
from swmcli.data.storage import folder, hdf5, lance
from swmcli.data.storage import location as loc
from swmcli.data.storage.containment import check_part, check_tree
from swmcli.data.storage.location import Location, as_location
from swmcli.data.storage.lock import WriterLock
from swmcli.data.storage.schema import FOLDER_METADATA, Reader, Writer
from swmcli.errors import DatasetError, MissingPathError, UsageError
from swmcli.units import format_bytes

FORMATS = ("lance", "hdf5", "folder")
MODES = ("append", "overwrite", "error")
_SUFFIXES = {".lance": "lance", ".h5": "hdf5", ".hdf5": "hdf5"}
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
# What is read by name from a swm folder's root before any episode: its metadata and index, and
# what detecting another tool's layout reads (LeRobot's meta/info.json).
_READ_BY_NAME = (FOLDER_METADATA, folder.INDEX, "meta")


def detect(path: str | Path) -> str:
    """The format of the dataset at ``path``; a DatasetError with a hint if it is not one."""
    path = as_location(path)
    if loc.is_remote(path):
        return _detect_remote(path)
    if not path.exists():
        raise MissingPathError(
            f"no dataset at {path}", hint="check the path (collect one with `swm collect`)"
        )
    # Before any of its files is read: no link leads out of it. A swm folder's root holds one
    # entry per episode, so it is not listed: the entries read by name are checked here, and
    # each episode by its reader before its first read.
    swm_folder = path.is_dir() and (path / FOLDER_METADATA).is_file()
    if swm_folder:
        for name in _READ_BY_NAME:
            if (path / name).is_symlink() or (path / name).exists():
                check_part(path, path / name)
    else:
        check_tree(path)
    if foreign_format := detect_foreign(path):  # another tool's layout (bring your data)
        if swm_folder:
            check_tree(path)
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
        f"({', '.join(FOREIGN_FORMATS)})",
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
    """The module of swm's format ``fmt``: its ``open_reader`` and ``open_writer``."""
    modules = {"lance": lance, "hdf5": hdf5, "folder": folder}
    if fmt not in modules:
        raise UsageError(f"unknown dataset format {fmt!r}", hint=f"use one of {', '.join(FORMATS)}")
    return modules[fmt]


def open_reader(path: str | Path, mapping: Mapping[str, str] | None = None) -> Reader:
    """Open the dataset at ``path`` for reading, whatever its format; another tool's dataset has
    its columns renamed to swm's keys, and ``mapping`` ({column: key}, ``--map``) renames or
    leaves out the columns of any dataset, swm's own included."""
    path = as_location(path)
    fmt = detect(path)
    if fmt in FOREIGN_FORMATS:
        return open_foreign(path, fmt, mapping)
    reader = _module(fmt).open_reader(path)
    if not mapping:
        return reader
    try:
        return MappedReader(reader, mapping)
    except BaseException:
        reader.close()
        raise


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


def check_free_space(path: Path, episode_bytes: int, hint: str | None = None) -> None:
    """Refuse a write the disk holding ``path`` has no room for (one clear error, exit 1;
    ``hint`` says what became of what was written)."""
    free = loc.free_bytes(path)
    # The episode raw (before compression), twice over: a Lance merge rewrites it.
    needed = 2 * episode_bytes + loc.FREE_SPACE_MARGIN_BYTES
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
    ``_transactions/*.txn``, the readers' locks); a folder dataset's uncommitted parts (its
    staging directories and metadata, empty episode directories). A user's files (a
    ``.gitkeep``, empty notes) are never taken for leftovers. Called under the writer lock."""
    if path.is_file():
        return path.stat().st_size == 0 and path.suffix.lower() in (".h5", ".hdf5")
    if not path.is_dir():
        return False
    first = path / "episode_000000"  # a folder dataset's first episode: not listed past it
    if first.is_dir() and any(first.iterdir()):
        return False
    entries = list(path.iterdir())
    lance = {"data": ".lance", "_transactions": ".txn", "_swm_reading": ".lock"}
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
