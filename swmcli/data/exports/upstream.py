"""stable-worldmodel's own Lance and HDF5 layouts, written (``swm convert --layout
stable-worldmodel``): see ``layouts.py`` for what is kept exact.

Rows are swm's (reset frame + T steps). The last row of an episode has no action (swm stores
NaN there), and NaN would reach every batch of upstream's loader that holds that row, so the
export follows stable-worldmodel 0.1.1's own convention instead: its ``World.collect`` rotates
the actions left, so an episode's last row holds the episode's *first* action. swm's import sets
that row back to NaN (it never trusts a last row's action), so a round trip is exact.
"""

import io
import json
from pathlib import Path

import numpy as np

from swmcli import __version__
from swmcli.data.foreign.upstream import EXPORT_KEY
from swmcli.data.storage.lance import _mark_opened
from swmcli.data.storage.schema import is_image, schema_to_json, unfit
from swmcli.errors import UsageError

JPEG_QUALITY = 95  # stable-worldmodel's own default


_FLUSH_BYTES = 64 * 2**20  # encoded episodes held before they are appended to the Lance table


def last_action_wrapped(episode) -> dict:
    """``episode`` with its last row's action replaced by its first (0.1.1's rotation; zeros for
    an episode of one row, which has no action at all)."""
    if "action" not in episode:
        return episode
    action = np.array(episode["action"])
    action[-1] = action[0] if len(action) > 1 else 0
    return {**episode, "action": action}


def _export_metadata(schema) -> str:
    return json.dumps({"keys": schema_to_json(schema), "swm_version": __version__})


class LanceExport:
    """Upstream's Lance table, written in one Lance commit from a stream of episode batches."""

    def __init__(self, path: Path, schema):
        import pyarrow as pa

        self.path, self.schema = path, schema
        fields = [pa.field("episode_idx", pa.int32()), pa.field("step_idx", pa.int32())]
        for key, (_, shape) in schema.items():
            if is_image(shape):
                fields.append(pa.field(key, pa.binary()))
            else:
                fields.append(pa.field(key, pa.list_(pa.float32(), int(np.prod(shape)))))
        self._arrow = pa.schema(fields, metadata={EXPORT_KEY: _export_metadata(schema)})
        self._batches: list = []
        self._buffered = 0
        self.num_episodes = self.num_steps = 0

    def write_episode(self, episode) -> int:
        """Encode one episode into a record batch (written at ``close``, in one commit)."""
        import pyarrow as pa

        length = len(next(iter(episode.values())))
        episode = last_action_wrapped(episode)
        arrays = [
            pa.array(np.full(length, self.num_episodes, np.int32)),
            pa.array(np.arange(length, dtype=np.int32)),
        ]
        for key, (_, shape) in self.schema.items():
            values = np.asarray(episode[key])
            if is_image(shape):
                arrays.append(pa.array([_jpeg(frame) for frame in values], pa.binary()))
            else:
                _check_float32(key, values)
                flat = values.reshape(length, -1).astype(np.float32).reshape(-1)
                arrays.append(
                    pa.FixedSizeListArray.from_arrays(pa.array(flat), flat.size // length)
                )
        batch = pa.record_batch(arrays, schema=self._arrow)
        self._batches.append(batch)
        self._buffered += batch.nbytes
        if self._buffered >= _FLUSH_BYTES:
            self._flush()
        self.num_episodes += 1
        self.num_steps += length
        return self.num_episodes - 1

    def _flush(self) -> None:
        """Append the buffered episodes as one Lance commit (memory stays under _FLUSH_BYTES)."""
        import lance
        import pyarrow as pa


        if not self._batches:
            return
        _mark_opened()
        stream = pa.RecordBatchReader.from_batches(self._arrow, iter(self._batches))
        mode = "append" if self.path.exists() else "create"
        lance.write_dataset(stream, str(self.path.absolute()), schema=self._arrow, mode=mode)
        self._batches, self._buffered = [], 0

    def __enter__(self):
        return self

    def __exit__(self, kind, *_):
        if kind is None:
            self.close()

    def close(self) -> None:
        self._flush()


def _check_float32(key: str, values: np.ndarray) -> None:
    """Upstream's Lance layout holds numbers as float32: a finite value beyond it (it would
    become inf) is refused."""
    problem = unfit(values, np.float32)
    if problem:
        raise UsageError(
            f"the column {key} {problem}: stable-worldmodel's Lance layout stores numbers as "
            "float32",
            hint="export to a .h5 path (stable-worldmodel's HDF5 layout keeps every dtype)",
        )


def _jpeg(frame: np.ndarray) -> bytes:
    return encoded(frame, "JPEG", quality=JPEG_QUALITY)


def encoded(frame: np.ndarray, kind: str, **options) -> bytes:
    """One frame as an image file's bytes (``kind`` "JPEG" or "PNG", Pillow's ``options``)."""
    from PIL import Image

    if frame.ndim == 3 and frame.shape[-1] == 1:
        frame = frame[..., 0]
    buffer = io.BytesIO()
    Image.fromarray(np.asarray(frame, dtype=np.uint8)).save(buffer, kind, **options)
    return buffer.getvalue()


class Hdf5Export:
    """Upstream's HDF5 file: a resizable dataset per column (one row a chunk), ep_len/ep_offset."""

    def __init__(self, path: Path, schema):
        import h5py

        self.path, self.schema = path, schema
        self._file = h5py.File(path, "w", libver="latest")
        for key, (dtype, shape) in schema.items():
            self._file.create_dataset(
                key, shape=(0, *shape), maxshape=(None, *shape), dtype=dtype, chunks=(1, *shape)
            )
        self._file.create_dataset("ep_len", shape=(0,), maxshape=(None,), dtype=np.int32)
        self._file.create_dataset("ep_offset", shape=(0,), maxshape=(None,), dtype=np.int64)
        self._file.attrs[EXPORT_KEY] = _export_metadata(schema)
        self.num_episodes = self.num_steps = 0

    def write_episode(self, episode) -> int:
        length = len(next(iter(episode.values())))
        episode = last_action_wrapped(episode)
        for key in self.schema:
            column = self._file[key]
            column.resize(self.num_steps + length, axis=0)
            column[self.num_steps :] = episode[key]
        for name, value in (("ep_len", length), ("ep_offset", self.num_steps)):
            self._file[name].resize(self.num_episodes + 1, axis=0)
            self._file[name][self.num_episodes] = value
        self.num_episodes += 1
        self.num_steps += length
        return self.num_episodes - 1

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
