"""Folder datasets, for looking at: one PNG per frame plus one ``.npz`` of arrays per episode.

Layout::

    data/run/
      swm_folder.json                metadata (format, env id, keys, ...)
      swm_episodes.bin               the index: each episode's row count, int64 little-endian
      episode_000000/
        pixels/000000.png ...        one lossless PNG per frame of every image key
        arrays.npz                   every other key, plus episode_idx and step_idx

An episode is written into a hidden ``.tmp`` directory and renamed into place: the rename is the
commit, so a reader never sees half an episode. Its row count is then appended to the index, so
opening and appending read the index, not every episode. An episode committed but not indexed
(its writer killed between the two) is read from its own arrays; a folder without an index (or
with a damaged one) is scanned, episode by episode, and its next writer writes the index.
"""

import json
import os
import re
import shutil
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

from swmcli.data.storage.checksums import CHECKSUM_COLUMN, columns_apart, row_checksums
from swmcli.data.storage.containment import check_part
from swmcli.data.storage.location import nbytes_under
from swmcli.data.storage.schema import (
    FOLDER_METADATA,
    build_metadata,
    check_keys,
    check_metadata,
    check_schema,
    check_stored_schema,
    episode_schema,
    is_image,
    offsets_from_lengths,
    read_metadata,
    rows_by_episode,
)
from swmcli.errors import DatasetError

PIXEL_ENCODING = "png (lossless)"
ARRAYS = "arrays.npz"
_EPISODE = re.compile(r"^episode_(\d{6,})$")
_DAMAGED_HINT = "the folder is damaged (a missing or unreadable file): restore it or collect again"
_CACHED_EPISODES = 8
INDEX = "swm_episodes.bin"
_INDEX_DTYPE = np.dtype("<i8")


def _png_mode(shape: tuple[int, ...]) -> bool:
    """PNG holds (H, W), (H, W, 1), (H, W, 3) and (H, W, 4) uint8 frames."""
    return len(shape) == 2 or (len(shape) == 3 and shape[2] in (1, 3, 4))


def _is_png_key(dtype: np.dtype, shape: tuple[int, ...]) -> bool:
    return np.dtype(dtype) == np.uint8 and is_image(shape) and _png_mode(shape)


def _episode_dir(path: Path, index: int) -> Path:
    return path / f"episode_{index:06d}"


def _episode_count(path: Path) -> int:
    """Committed episode directories (a scan of the folder), checked to run 0, 1, ... unbroken."""
    found = sorted(
        (int(m.group(1)), p) for p in path.iterdir() if p.is_dir() and (m := _EPISODE.match(p.name))
    )
    for expected, (index, directory) in enumerate(found):
        if index != expected:
            raise DatasetError(f"{path}: episode {expected} is missing (found {directory.name})")
    return len(found)


def _read_index(path: Path) -> np.ndarray | None:
    """The row counts the index holds, if it agrees with the folder's episodes (None: scan)."""
    try:
        lengths = np.fromfile(path / INDEX, dtype=np.uint8)
    except OSError:
        return None
    lengths = lengths[: len(lengths) - len(lengths) % _INDEX_DTYPE.itemsize].view(_INDEX_DTYPE)
    if np.any(lengths < 1) or (len(lengths) and not _episode_dir(path, len(lengths) - 1).is_dir()):
        return None  # damaged, or its episodes were removed: the scan says what is missing
    return lengths.astype(np.int64)


class FolderReader:
    """Reads a swm folder dataset; keeps a few episodes' arrays in memory, never the frames."""

    format = "folder"
    metadata_sealed = True  # checked on open

    def __init__(self, path: Path):
        self.path = Path(path)
        file = self.path / FOLDER_METADATA
        try:
            raw = file.read_bytes()
        except OSError as error:
            raise DatasetError(f"cannot read {file}: {error}", _DAMAGED_HINT) from error
        self.metadata, self.keys = read_metadata(raw, file)
        # What each episode's arrays.npz must hold: the index, every key not stored as PNG
        # frames, and the row checksums.
        self._array_schema = {
            "episode_idx": (np.dtype(np.int64), ()),
            "step_idx": (np.dtype(np.int32), ()),
            **{k: (d, s) for k, (d, s) in self.keys.items() if not _is_png_key(d, s)},
            CHECKSUM_COLUMN: (np.dtype(np.uint32), (len(self.keys),)),
        }
        self._arrays: OrderedDict[int, dict[str, np.ndarray]] = OrderedDict()
        self._arrays_lock = threading.Lock()
        self._contained: set[int] = set()  # episodes checked to hold no link out of the dataset
        self._lengths: np.ndarray | None = None
        self.indexed = _read_index(self.path)
        if self.indexed is None:
            self.num_episodes = _episode_count(self.path)
        else:  # and the episodes committed after the index's last
            self.num_episodes = len(self.indexed)
            while _episode_dir(self.path, self.num_episodes).is_dir():
                self.num_episodes += 1

    @property
    def index_token(self) -> str:
        """Changes whenever an episode is added: keys the episode-index cache."""
        last = self._dir(self.num_episodes - 1).stat().st_mtime_ns if self.num_episodes else 0
        return f"folder:{self.num_episodes}:{last}"

    def _dir(self, index: int) -> Path:
        return _episode_dir(self.path, index)

    def _read_dir(self, index: int) -> Path:
        """Episode ``index``'s directory, checked before its first read to hold no link out of
        the dataset (opening walks none of them: see ``formats.detect``)."""
        if index not in self._contained:
            check_part(self.path, self._dir(index))
            self._contained.add(index)
        return self._dir(index)

    @property
    def episode_lengths(self) -> np.ndarray:
        """Rows of each episode: the index's, and for the episodes it lacks their arrays' (a
        folder without an index: every episode's, checked to hold all its frames)."""
        if self._lengths is None:
            indexed = np.zeros(0, np.int64) if self.indexed is None else self.indexed
            rest = range(len(indexed), self.num_episodes)
            lengths = [len(self._episode_arrays(i)["step_idx"]) for i in rest]
            self._check_frames(rest, lengths)
            self.set_episode_lengths(np.concatenate([indexed, np.array(lengths, np.int64)]))
        return self._lengths

    def _check_frames(self, episodes: range, lengths: list[int]) -> None:
        """Every episode has one PNG per step for every image key (a deleted frame is damage)."""
        png_keys = [key for key, (dtype, shape) in self.keys.items() if _is_png_key(dtype, shape)]
        for index, length in zip(episodes, lengths, strict=True):
            directory = self._dir(index)
            for key in png_keys:
                frames = sum(1 for _ in (directory / key).glob("*.png"))
                if frames != length:
                    raise DatasetError(
                        f"{directory / key} holds {frames} frames for {length} steps",
                        _DAMAGED_HINT,
                    )

    def set_episode_lengths(self, lengths: np.ndarray) -> None:
        """Use a cached episode index instead of scanning (of the first episodes, if the folder
        has grown since)."""
        lengths = np.asarray(lengths, dtype=np.int64)
        if len(lengths) > self.num_episodes:
            raise DatasetError(f"episode index of {self.path} does not match its episodes")
        self._lengths = lengths
        self._offsets = offsets_from_lengths(lengths)
        self.num_episodes = len(lengths)

    @property
    def episode_offsets(self) -> np.ndarray:
        """First global row of each episode."""
        self.episode_lengths  # noqa: B018 - builds the index on first use
        return self._offsets

    @property
    def num_steps(self) -> int:
        return int(self.episode_lengths.sum())

    @property
    def nbytes_on_disk(self) -> int:
        return nbytes_under(self.path)

    def _episode_arrays(self, index: int) -> dict[str, np.ndarray]:
        with self._arrays_lock:  # reader threads share the cache: one looks it up at a time
            if index in self._arrays:
                self._arrays.move_to_end(index)
                return self._arrays[index]
        try:
            with np.load(self._read_dir(index) / ARRAYS) as npz:
                arrays = {k: npz[k] for k in npz.files}
        except Exception as error:  # a damaged zip fails in many ways (bad CRC, method, ...)
            raise DatasetError(
                f"cannot read {self._dir(index) / ARRAYS}: {error}", _DAMAGED_HINT
            ) from error
        stored = {key: (value.dtype, value.shape[1:]) for key, value in arrays.items()}
        check_stored_schema(self._dir(index) / ARRAYS, stored, self._array_schema)
        with self._arrays_lock:
            self._arrays[index] = arrays
            if len(self._arrays) > _CACHED_EPISODES:
                self._arrays.popitem(last=False)
        return arrays

    def _frame(self, key: str, episode: int, step: int) -> np.ndarray:
        from PIL import Image

        dtype, shape = self.keys[key]
        file = self._read_dir(episode) / key / f"{step:06d}.png"
        try:
            with Image.open(file) as image:
                return np.asarray(image, dtype=dtype).reshape(shape)
        except Exception as error:  # a damaged PNG fails in many ways (zlib, syntax, size)
            raise DatasetError(f"cannot read {file}: {error}", _DAMAGED_HINT) from error

    def read_rows(self, key: str, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``rows`` (global, any order) of ``key``, in that order (into ``out`` if given)."""
        check_keys(self.keys, [key], self.path)
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if rows.size and (rows.min() < 0 or rows.max() >= self.num_steps):
            raise IndexError(f"rows out of range 0..{self.num_steps - 1}")
        episodes = rows_by_episode(self.episode_offsets, rows)
        steps = rows - self.episode_offsets[episodes]
        dtype, shape = self.keys[key]
        if out is None:
            out = np.empty((len(rows), *shape), dtype=dtype)
        pairs = zip(episodes.tolist(), steps.tolist(), strict=True)
        for position, (episode, step) in enumerate(pairs):
            if _is_png_key(dtype, shape):
                out[position] = self._frame(key, episode, step)
            else:
                out[position] = self._episode_arrays(episode)[key][step]
        return out

    def read_columns(self, keys: list[str], rows: np.ndarray, checksums: bool = False) -> dict:
        """Rows ``rows`` of several keys (one ``read_rows`` each; with ``checksums``, the rows'
        stored CRC-32s under ``CHECKSUM_COLUMN``)."""
        return columns_apart(self, keys, rows, checksums)

    def read_episode(self, index: int, keys=None) -> dict[str, np.ndarray]:
        """Episode ``index`` as ``{key: (length, ...)}`` (all keys unless ``keys`` is given)."""
        keys = check_keys(self.keys, keys, self.path)
        length = int(self.episode_lengths[index])
        episode = {}
        for key in keys:
            dtype, shape = self.keys[key]
            if _is_png_key(dtype, shape):
                episode[key] = np.stack([self._frame(key, index, s) for s in range(length)])
            else:
                episode[key] = self._episode_arrays(index)[key].copy()
        return episode

    def read_checksums(self, index: int) -> np.ndarray:
        """Episode ``index``'s stored ``(rows, keys)`` CRC-32s."""
        return self._episode_arrays(index)[CHECKSUM_COLUMN]

    def read_row_checksums(self, rows: np.ndarray) -> np.ndarray:
        """The stored ``(len(rows), keys)`` CRC-32s of global ``rows``."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        episodes = rows_by_episode(self.episode_offsets, rows)
        steps = (rows - self.episode_offsets[episodes]).tolist()
        sums = [self.read_checksums(e) for e in episodes.tolist()]
        return np.array([s[step] for s, step in zip(sums, steps, strict=True)], dtype=np.uint32)

    def close(self) -> None:
        self._arrays.clear()


class FolderWriter:
    """Writes each episode into a hidden directory, then renames it into place (the commit)."""

    format = "folder"

    def __init__(self, path: Path, metadata: dict, append: bool):
        self.path = Path(path)
        self._user_metadata = metadata
        self.schema = None
        self.num_episodes = 0
        self.num_steps = 0
        if append:
            reader = FolderReader(self.path)
            check_metadata(reader.metadata, metadata, self.path)
            self.schema = reader.keys
            self.num_episodes, self.num_steps = reader.num_episodes, reader.num_steps
            index = self.path / INDEX
            size = index.stat().st_size if index.is_file() else None
            if size != _INDEX_DTYPE.itemsize * self.num_episodes:  # missing, short or torn
                self._write_index(reader.episode_lengths)
        # The half-written episode of a killed writer (the next one's staging: its episodes
        # after the last committed were never begun): never committed, safe to drop.
        shutil.rmtree(self._staging(self.num_episodes), ignore_errors=True)

    def _staging(self, index: int) -> Path:
        """Where episode ``index`` is written before its rename into place."""
        return self.path / f".tmp_{_episode_dir(self.path, index).name}"

    def _write_index(self, lengths: np.ndarray) -> None:
        """The whole index, replaced at once (a folder without one, or one that lacks episodes)."""
        temporary = self.path / f".{INDEX}.tmp"
        np.asarray(lengths, _INDEX_DTYPE).tofile(temporary)
        os.replace(temporary, self.path / INDEX)

    def _create(self, episode) -> None:
        self.schema = episode_schema(episode)
        meta = build_metadata(self._user_metadata, self.schema, PIXEL_ENCODING)
        self.path.mkdir(parents=True, exist_ok=True)
        temporary = self.path / f".{FOLDER_METADATA}.tmp"
        temporary.write_text(json.dumps(meta, indent=2))
        os.replace(temporary, self.path / FOLDER_METADATA)

    def write_episode(self, episode) -> int:
        """Write one episode's PNGs and arrays, then rename its directory into place."""
        from PIL import Image

        if self.schema is None:
            self._create(episode)
        check_schema(self.schema, episode, self.path)
        length = len(next(iter(episode.values())))
        staging = self._staging(self.num_episodes)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        arrays = {
            "episode_idx": np.full(length, self.num_episodes, dtype=np.int64),
            "step_idx": np.arange(length, dtype=np.int32),
            CHECKSUM_COLUMN: row_checksums(episode, list(self.schema)),
        }
        for key, (dtype, shape) in self.schema.items():
            values = np.asarray(episode[key])
            if not _is_png_key(dtype, shape):
                arrays[key] = values
                continue
            (staging / key).mkdir()
            frames = values.reshape(length, *shape[:2], -1)
            for step, frame in enumerate(frames):
                image = Image.fromarray(frame[..., 0] if frame.shape[-1] == 1 else frame)
                image.save(staging / key / f"{step:06d}.png", compress_level=1)
        np.savez(staging / ARRAYS, **arrays)
        # A killed process loses no written bytes (the kernel holds them): the rename suffices.
        os.rename(staging, _episode_dir(self.path, self.num_episodes))
        with open(self.path / INDEX, "ab") as index:  # one write: the entry is whole or absent
            index.write(np.array([length], _INDEX_DTYPE).tobytes())
        self.num_steps += length
        self.num_episodes += 1
        return self.num_episodes - 1

    def close(self) -> None:
        """Nothing is buffered: every episode is on disk when ``write_episode`` returns."""

    def __enter__(self) -> "FolderWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_reader(path: Path) -> FolderReader:
    """Open a swm folder dataset for reading."""
    return FolderReader(path)


def open_writer(path: Path, metadata: dict, append: bool) -> FolderWriter:
    """Open a swm folder dataset for episode-atomic appends."""
    return FolderWriter(path, metadata, append)
