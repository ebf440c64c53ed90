"""Minari datasets (HDF5 storage), read.

A Minari dataset directory holds ``data/metadata.json`` (read as JSON, never unpickled) and
``data/main_data.hdf5`` with one ``episode_<i>`` group per episode: ``observations`` (T+1 rows, a
group of such datasets for a Dict space), ``actions``, ``rewards``, ``terminations`` and
``truncations`` (T rows each), ``infos``. Image observations are JPEG unless the collector was
told otherwise (``jpeg_encoding`` in the metadata): one byte string per frame.

swm's row t is observation t with the reward and flags of arriving there and the action taken
from it, so an episode becomes T+1 rows: observations as they are, ``actions`` on rows 0..T-1 and
NaN on the last, ``rewards``/``terminations``/``truncations`` shifted down one row with 0/False on
the first.
"""

import json
import re
from pathlib import Path

import numpy as np

from swmcli.data.foreign import jpeg
from swmcli.data.foreign.common import DAMAGED_HINT, MINARI, check_hdf5_stored, reading
from swmcli.data.storage.containment import check_hdf5, check_side
from swmcli.errors import DatasetError, UsageError

_EPISODE = re.compile(r"episode_(\d+)")
_ARRIVAL = {"rewards": "reward", "terminations": "terminated", "truncations": "truncated"}
_MAX_METADATA_BYTES = 16 * 2**20
_CONVENTION = "Minari: T+1 observations, T actions, rewards and flags"
_ALIGNMENT = (
    "T+1 rows per episode; actions on rows 0..T-1, NaN on the last; rewards, terminations and "
    "truncations one row down (0/False on the first)"
)


def _data_file(path: Path) -> Path | None:
    for candidate in (path / "data" / "main_data.hdf5", path / "main_data.hdf5", path):
        if candidate.is_file() and candidate.name == "main_data.hdf5":
            return candidate
    return None


def _root(data_file: Path) -> Path:
    """The Minari dataset's directory: the one holding ``data/main_data.hdf5``."""
    data = data_file.parent
    return data.parent if data.name == "data" else data


def detect(path: Path) -> str | None:
    """MINARI for a Minari dataset directory, its ``data`` directory or its main_data.hdf5."""
    return MINARI if _data_file(path) is not None else None


def open_source(path: Path):
    return MinariSource(path)


def _holds_infos(group) -> bool:
    """Whether an episode carries per-step info dicts (an empty ``infos`` group holds none)."""
    infos = group.get("infos")
    return infos is not None and len(infos) > 0


def _is_jpeg_column(dataset) -> bool:
    import h5py

    base = h5py.check_vlen_dtype(dataset.dtype)
    if base is not None:
        return base == np.uint8
    # frames of one byte length are stored as a (T+1, bytes) uint8 array: JPEG's start marker
    return dataset.dtype == np.uint8 and dataset.ndim == 2 and bytes(dataset[0, :2]) == b"\xff\xd8"


class MinariSource:
    """Rows of a Minari HDF5 dataset in swm's convention."""

    def __init__(self, path: Path):
        import h5py

        self.path = _data_file(path)
        self._file = None
        with reading(self.path, on_error=self.close):
            self._file = h5py.File(self.path, "r")
            check_hdf5(self._file, self.path)
            self._open(self._read_metadata())

    def _read_metadata(self) -> dict:
        file = self.path.parent / "metadata.json"
        check_side(_root(self.path), file)
        if not file.is_file():
            return {}
        if file.stat().st_size > _MAX_METADATA_BYTES:
            raise DatasetError(f"{file} is larger than any Minari metadata", DAMAGED_HINT)
        try:
            metadata = json.loads(file.read_text())
        except ValueError as error:
            raise DatasetError(f"{file} is not JSON ({error})", DAMAGED_HINT) from None
        if not isinstance(metadata, dict):
            raise DatasetError(
                f"{file} holds a JSON {type(metadata).__name__}, not Minari's object of fields",
                DAMAGED_HINT,
            )
        return metadata

    def _open(self, metadata: dict) -> None:
        import h5py

        indices = sorted(int(m[1]) for name in self._file if (m := _EPISODE.fullmatch(name)))
        if not indices:
            raise UsageError(f"{self.path} holds no episodes", hint="nothing to read in it")
        if indices != list(range(len(indices))):
            raise DatasetError(f"{self.path}: episode groups are not episode_0..N-1", DAMAGED_HINT)
        self._episodes = [self._file[f"episode_{i}"] for i in indices]
        first = self._episodes[0] if indices else None
        self._leaves = {}  # column -> path inside an episode group
        if first is not None:
            observations = first["observations"]
            if isinstance(observations, h5py.Group):
                for key in observations:
                    self._leaves[f"observations/{key}"] = f"observations/{key}"
            else:
                self._leaves["observations"] = "observations"
            for name in ("actions", *_ARRIVAL):
                self._leaves[name] = name
        self._jpeg = {name for name, leaf in self._leaves.items() if _is_jpeg_column(first[leaf])}
        self._first = {leaf: (first[leaf].dtype, first[leaf].shape[1:]) for leaf in self._leaves}
        self.lengths = np.array([self._check_episode(e) for e in self._episodes], dtype=np.int64)
        self.columns = {name: self._column(first, name) for name in self._leaves}
        self.defaults = self._default_keys(metadata.get("swm_keys"))
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
        self.info = {
            "dataset_id": metadata.get("dataset_id"),
            "codec": self._codec(first),
            "lossy": f"frames ({', '.join(sorted(self._jpeg))})" if self._jpeg else False,
            "convention": _CONVENTION,
            "alignment": _ALIGNMENT,
            "not_imported": {"infos": "per-step info dicts"} if _holds_infos(first) else {},
        }

    def _codec(self, first) -> str:
        """Each JPEG column's codec, by its first frame (``decode`` holds the others to it)."""
        self._codecs = {
            name: jpeg.codec(self._blobs(first[self._leaves[name]], 0, 1)[0])[0]
            for name in self._jpeg
        }
        return ", ".join(sorted(set(self._codecs.values()))) or "raw (uncompressed)"

    def _check_episode(self, group) -> int:
        """T+1, after checking every column's length and stored bytes in this episode."""
        import h5py

        actions = group.get("actions")
        if not isinstance(actions, h5py.Dataset) or not actions.shape:
            what = "a single value" if isinstance(actions, h5py.Dataset) else "missing"
            raise DatasetError(
                f"{self.path}: {group.name}/actions is {what}, not one action a step",
                DAMAGED_HINT,
            )
        steps = actions.shape[0]
        for name, leaf in self._leaves.items():
            dataset = group.get(leaf)
            if not isinstance(dataset, h5py.Dataset):
                raise DatasetError(
                    f"{self.path}: {group.name} has no dataset {leaf} (episode_0 has one)",
                    DAMAGED_HINT,
                )
            dtype, shape = self._first[name]
            if (dataset.dtype, dataset.shape[1:]) != (dtype, shape) and name not in self._jpeg:
                raise DatasetError(
                    f"{self.path}: {group.name}/{leaf} holds {dataset.dtype} rows of shape "
                    f"{dataset.shape[1:]}, episode_0 {dtype} rows of shape {shape}: an episode "
                    "of another kind",
                    DAMAGED_HINT,
                )
            if 0 in shape:
                raise DatasetError(
                    f"{self.path}: {group.name}/{leaf} holds rows of shape {shape}: no values a "
                    "row",
                    DAMAGED_HINT,
                )
            want = steps + 1 if name.startswith("observations") else steps
            if not dataset.shape or dataset.shape[0] != want:
                held = f"{dataset.shape[0]} rows" if dataset.shape else "a single value"
                raise DatasetError(
                    f"{self.path}: {group.name}/{leaf} holds {held}, not {want} rows",
                    DAMAGED_HINT,
                )
            if name not in self._jpeg:
                check_hdf5_stored(f"{group.name}/{leaf}", dataset, self.path)
        return steps + 1

    def _column(self, first, name: str):
        dataset = first[self._leaves[name]]
        if name in self._jpeg:
            blob = self._blobs(dataset, 0, 1)[0]
            return np.dtype(np.uint8), jpeg.frame_shape(blob, f"{self.path} ({name})")
        dtype, shape = dataset.dtype, tuple(dataset.shape[1:])
        if name == "actions":  # a discrete action is a number; the last row is NaN
            dtype = dtype if dtype.kind == "f" else np.dtype(np.float32)
            shape = shape or (1,)  # one number a step, as swm stores an action
        return dtype, shape

    def _default_keys(self, exported) -> dict[str, str]:
        """swm's keys: an export's own (``swm_keys`` in the metadata), else observations by
        their own names (a single one: ``state``), the first image ``pixels`` unless one is
        already called so."""
        keys = {"actions": "action", **_ARRIVAL}
        if isinstance(exported, dict):
            said = {str(name): str(key) for name, key in exported.items() if name in self.columns}
            return {**keys, **said}
        named = "observations/pixels" in self.columns
        for name, (_, shape) in self.columns.items():
            if name.startswith("observations"):
                leaf = name.partition("/")[2]
                image = len(shape) >= 2 and not named and "pixels" not in keys.values()
                keys[name] = "pixels" if image else (leaf or "state")
        return keys

    @staticmethod
    def _blobs(dataset, start: int, stop: int) -> list[bytes]:
        values = dataset[start:stop]
        return [np.asarray(v, dtype=np.uint8).tobytes() for v in values]

    def _episode_rows(self, name: str, episode: int, steps: np.ndarray) -> np.ndarray:
        dataset = self._episodes[episode][self._leaves[name]]
        dtype, shape = self.columns[name]
        out = np.zeros((len(steps), *shape), dtype=dtype)
        if name == "actions":
            valid = steps < self.lengths[episode] - 1
            source = steps[valid]
            out[~valid] = np.nan
        elif name in _ARRIVAL:
            valid = steps > 0
            source = steps[valid] - 1
        else:
            valid, source = np.ones(len(steps), dtype=bool), steps
        if not valid.any():
            return out
        low, high = int(source.min()), int(source.max()) + 1
        if name in self._jpeg:
            blobs, where = self._blobs(dataset, low, high), f"{self.path} ({name})"
            block = jpeg.decode(blobs, shape, where, self._codecs[name])
        else:
            block = dataset[low:high]
        out[valid] = block[source - low].reshape(-1, *shape)
        return out

    def read(self, name: str, rows: np.ndarray) -> np.ndarray:
        episodes = np.searchsorted(self.offsets, rows, side="right") - 1
        dtype, shape = self.columns[name]
        out = np.empty((len(rows), *shape), dtype=dtype)
        with reading(self.path):
            for episode in np.unique(episodes):
                where = episodes == episode
                out[where] = self._episode_rows(
                    name, int(episode), rows[where] - self.offsets[episode]
                )
        return out

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
