"""``swm convert SRC DST --layout minari``: a Minari dataset (HDF5 storage, laid out as minari
0.5.4's ``DataCollector`` writes it) that ``minari.load_dataset`` and ``iterate_episodes`` read.

``DST`` is the dataset's directory, named ``NAME-vN`` as Minari names datasets:
``DST/data/metadata.json`` (the spaces serialized as Minari serializes them, the counts, the
dataset id) and ``DST/data/main_data.hdf5`` with one ``episode_<i>`` group per episode. Minari's
convention is swm's, counted the other way: an episode of T+1 rows is T+1 observations (every
key but the action, reward and flags, one dataset each under ``observations/``: a Dict space),
T actions (the last row has none: nothing is written for it, so no NaN), and the T steps'
``rewards``/``terminations``/``truncations`` (rows 1..T: what each action brought; the first
row's have no step, and swm's own collect writes 0/False there). Frames are stored raw
(``jpeg_encoding`` false: lossless); every dtype and shape as it is, so the import of the export
gives back swm's rows exactly.

The dataset id is ``DST``'s path under Minari's datasets directory (``MINARI_DATASETS_PATH``,
else ``~/.minari/datasets``) when it lies there, so ``minari.load_dataset(id)`` finds it; else
its name (``minari.MinariDataset("DST/data")`` reads it wherever it is).
"""

import json
import os
import re
from pathlib import Path

import numpy as np

from swmcli.errors import UsageError

MINARI_VERSION = "0.5.4"  # the layout written, as its metadata names it
_STEPS = {"reward": "rewards", "terminated": "terminations", "truncated": "truncations"}
ARRIVAL_KEYS = tuple(_STEPS)
_NAME = re.compile(r"[-_\w]+?-v\d+")


def check_destination(dst: Path) -> None:
    """A Minari dataset is named ``NAME-vN``: anything else is refused before a byte is written."""
    if not _NAME.fullmatch(dst.name):
        raise UsageError(
            f"--layout minari writes a dataset directory named NAME-vN, not {dst.name!r}",
            hint=f"e.g. {dst.with_name(dst.name + '-v0')} (Minari's load_dataset needs the -vN)",
        )


def dataset_id(dst: Path) -> str:
    """The id ``minari.load_dataset`` finds ``dst`` by (see the module's docstring)."""
    root = Path(os.environ.get("MINARI_DATASETS_PATH") or Path.home() / ".minari" / "datasets")
    absolute = dst.absolute()
    if absolute.is_relative_to(root.absolute()):
        return absolute.relative_to(root.absolute()).as_posix()
    return dst.name


def _space(dtype, shape) -> dict:
    """A gymnasium ``Box`` serialized as Minari serializes it: uint8 frames 0..255 (so Minari
    knows them for images), other numbers over their dtype's whole range."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        low, high = -np.inf, np.inf
    elif dtype.kind == "b":
        low, high = 0, 1
    else:
        low, high = np.iinfo(dtype).min, np.iinfo(dtype).max
    return {
        "type": "Box",
        "dtype": dtype.name,
        "shape": list(shape),
        "low": np.full(shape, low, dtype).tolist(),
        "high": np.full(shape, high, dtype).tolist(),
    }


class MinariExport:
    """A Minari HDF5 dataset written one episode at a time (``data/`` under ``path``)."""

    def __init__(self, path: Path, schema, dataset_name: str):
        import h5py

        self.path, self.schema, self.dataset_id = path, schema, dataset_name
        missing = [key for key in ("action", *_STEPS) if key not in schema]
        if missing:
            raise UsageError(
                f"a Minari dataset holds actions, rewards and flags: no {', '.join(missing)} here",
                hint="keep them (--keys), or name the columns that hold them with --map COLUMN=KEY",
            )
        self._observations = [key for key in schema if key != "action" and key not in _STEPS]
        if not self._observations:
            raise UsageError("a Minari dataset holds observations: this one has none", hint="")
        (path / "data").mkdir(parents=True)
        self._file = h5py.File(path / "data" / "main_data.hdf5", "w", track_order=True)
        self.num_episodes = self.num_steps = 0

    def write_episode(self, episode) -> int:
        """T+1 rows in: T+1 observations, T actions, rewards and flags."""
        group = self._file.create_group(f"episode_{self.num_episodes}")
        steps = len(next(iter(episode.values()))) - 1
        group.attrs["id"] = np.int64(self.num_episodes)
        group.attrs["total_steps"] = np.int64(steps)
        observations = group.create_group("observations")
        for key in self._observations:
            observations.create_dataset(key, data=np.asarray(episode[key]), chunks=None)
        group.create_dataset("actions", data=np.asarray(episode["action"])[:steps])
        for key, name in _STEPS.items():
            group.create_dataset(name, data=np.asarray(episode[key])[1:])
        group.create_group("infos")
        self.num_episodes += 1
        self.num_steps += steps
        return self.num_episodes - 1

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()

    def close(self) -> None:
        if self._file is None:
            return
        self._file.close()
        self._file = None
        observations = {
            "type": "Dict",
            "subspaces": {key: _space(*self.schema[key]) for key in self._observations},
        }
        data = self.path / "data"
        size = sum(f.stat().st_size for f in data.iterdir()) / 1e6
        metadata = {
            "total_episodes": self.num_episodes,
            "total_steps": self.num_steps,
            "data_format": "hdf5",
            "jpeg_encoding": False,
            "observation_space": json.dumps(observations),
            "action_space": json.dumps(_space(*self.schema["action"])),
            "dataset_id": self.dataset_id,
            "minari_version": MINARI_VERSION,
            "dataset_size": round(size, 1),
            "algorithm_name": "swm export",
            "swm_keys": {f"observations/{key}": key for key in self._observations},
        }
        (data / "metadata.json").write_text(json.dumps(metadata))
