"""``swm convert SRC DST --layout lerobot``: a LeRobot v3 dataset (see ``foreign/lerobot.py`` for
the layout) a LeRobot user trains on, streamed episode by episode: one parquet file of frames
written row group by row group, one h264 MP4 per image key holding every episode one after
another, the episode index (with each episode's stats) and ``meta/stats.json`` at the end.

LeRobot's convention is that every frame holds the action taken at it. swm's last row of an
episode (its final observation) has none, so it is not a frame: an episode of T+1 rows is T
frames, and LeRobot's own loader pads past an episode's end (repeating the edge frame, with
``action_is_pad`` set), so no NaN reaches a batch. The last row itself is kept, for swm's
import, in ``meta/swm_last_rows.parquet`` (frames as PNG: lossless), which LeRobot never reads.
``reward``/``terminated``/``truncated`` (what arriving at row t+1 brought) become frame t's
``next.reward``/``next.done``/``next.truncated`` (what its action brought); the first row's have
no frame to go to (swm's own collect writes 0/False there).

Names are LeRobot's: frames ``observation.images.<key>``; the robot's state
``observation.state`` (``proprio`` where the dataset has one, else ``state``), a ``state``
beside a ``proprio`` ``observation.environment_state``; any other key ``observation.<key>``; a key
already named as LeRobot names features (``--map state=observation.environment_state``) is kept.
``info.json`` keeps swm's key of every feature under ``swm_keys`` (LeRobot ignores it), so a
re-import restores them. Numbers are exact; frames go through h264 (yuv420p, CRF 18): lossy.
"""

import json
from pathlib import Path

import numpy as np

from swmcli.data.exports import stats as lerobot_stats
from swmcli.data.exports.upstream import encoded
from swmcli.data.foreign.lerobot import LAST_ROWS
from swmcli.data.storage.schema import is_image
from swmcli.errors import UsageError

FPS = 10  # swm datasets record no frame rate; LeRobot needs one for its timestamps
CRF = "18"
_NEXT = {"reward": "next.reward", "terminated": "next.done", "truncated": "next.truncated"}
ARRIVAL_KEYS = tuple(_NEXT)  # exact from the second row on: LeRobot has no slot for the first
_INDEX = {"timestamp": np.float32, **dict.fromkeys(
    ("frame_index", "episode_index", "index", "task_index"), np.int64
)}  # fmt: skip
_TASK = "swm"
_DATA = "data/chunk-000/file-000.parquet"
_EPISODES = "meta/episodes/chunk-000/file-000.parquet"
_VIDEO = "videos/{video_key}/chunk-000/file-000.mp4"
_VIDEO_TEMPLATE = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
_LEROBOT_NAMES = ("observation.", "next.")
_LAST_ROWS_FLUSH = 64  # last rows held before they are written as one row group


def feature_names(schema) -> dict[str, str]:
    """swm key -> LeRobot feature name (see the module's docstring); two keys on one feature
    name are a UsageError naming ``--map``."""
    robot = "proprio" if "proprio" in schema else "state"
    names = {}
    for key, (_, shape) in schema.items():
        if key == "action" or key.startswith(_LEROBOT_NAMES):
            names[key] = key
        elif is_image(shape):
            names[key] = f"observation.images.{key}"
        elif key in _NEXT:
            names[key] = _NEXT[key]
        elif key == robot:
            names[key] = "observation.state"
        elif key == "state":
            names[key] = "observation.environment_state"
        else:
            names[key] = f"observation.{key}"
    taken = {}
    for key, name in names.items():
        if name in taken or name in _INDEX:
            raise UsageError(
                f"{taken.get(name, 'the index')!r} and {key!r} would both be LeRobot's {name!r}",
                hint=f"name one of them with --map, e.g. --map {key}=observation.{key}_2",
            )
        taken[name] = key
    return names


class LeRobotExport:
    """A LeRobot v3 dataset written one episode at a time."""

    def __init__(self, path: Path, schema):
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.path, self.schema, self.names = path, schema, feature_names(schema)
        self._images = [key for key, (_, shape) in schema.items() if is_image(shape)]
        for key in self._images:
            height, width, *channels = schema[key][1]
            if channels != [3] or height % 2 or width % 2:
                raise UsageError(
                    f"{key} {schema[key][1]}: LeRobot's h264 videos need even-sized RGB frames",
                    hint=f"leave it out with --map {key}=, or resize it",
                )
        fields = [self._field(key) for key in schema if key not in self._images]
        fields += [pa.field(name, pa.from_numpy_dtype(dtype)) for name, dtype in _INDEX.items()]
        self._arrow = pa.schema(fields)
        self._last_keys = [key for key in schema if key != "action" and key not in _NEXT]
        self._last_arrow = pa.schema(
            [pa.field("episode_index", pa.int64())]
            + [pa.field(self.names[k], pa.binary()) if k in self._images else self._field(k)
               for k in self._last_keys]
        )  # fmt: skip
        self._last_rows: list[dict] = []
        path.mkdir(parents=True)
        (path / _DATA).parent.mkdir(parents=True)
        (path / LAST_ROWS).parent.mkdir(parents=True)
        self._data = pq.ParquetWriter(path / _DATA, self._arrow)
        self._last = pq.ParquetWriter(path / LAST_ROWS, self._last_arrow)
        self._videos = {key: self._open_video(key) for key in self._images}
        self._episodes: list[dict] = []
        self._stats: list[dict] = []
        self.num_episodes = self.num_frames = 0

    def _field(self, key: str):
        import pyarrow as pa

        dtype, shape = self.schema[key]
        kind = pa.from_numpy_dtype(np.dtype(dtype))
        size = int(np.prod(shape))
        return pa.field(self.names[key], pa.list_(kind, size) if shape else kind)

    def _open_video(self, key: str):
        import av

        file = self.path / _VIDEO.format(video_key=self.names[key])
        file.parent.mkdir(parents=True)
        container = av.open(str(file), "w")
        stream = container.add_stream("libx264", rate=FPS, options={"crf": CRF})
        stream.height, stream.width = self.schema[key][1][:2]
        stream.pix_fmt = "yuv420p"
        return container, stream

    def write_episode(self, episode) -> int:
        """T+1 rows in: T frames (each with the action taken at it), the last row aside."""
        import av
        import pyarrow as pa

        frames = len(next(iter(episode.values()))) - 1
        if frames < 1:
            raise UsageError(
                f"episode {self.num_episodes} has one row: no action was taken in it, and a "
                "LeRobot episode is made of frames that each hold one",
                hint="leave out episodes of one row before exporting to LeRobot",
            )
        values = {}
        for key in self.schema:
            if key in self._images:
                continue
            rows = np.asarray(episode[key])  # what arriving at row t+1 brought = frame t's next.*
            values[self.names[key]] = rows[1:] if key in _NEXT else rows[:frames]
        steps = np.arange(frames)
        values["timestamp"] = (steps / FPS).astype(np.float32)
        values["frame_index"] = steps
        values["episode_index"] = np.full(frames, self.num_episodes)
        values["index"] = self.num_frames + steps
        values["task_index"] = np.zeros(frames, dtype=np.int64)
        columns = {field.name: _arrow_column(values[field.name], field) for field in self._arrow}
        self._data.write_table(pa.table(columns, schema=self._arrow))
        for key, (container, stream) in self._videos.items():
            for frame in np.asarray(episode[key])[:frames]:
                picture = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
                container.mux(stream.encode(picture))
        episode_stats = {name: lerobot_stats.number_stats(v, v.shape[1:]) for name, v in
                         values.items()}  # fmt: skip
        for key in self._images:
            frames_of = np.asarray(episode[key])[:frames]
            episode_stats[self.names[key]] = lerobot_stats.frame_stats(frames_of)
        self._stats.append(episode_stats)
        self._episodes.append(self._episode_row(frames, episode_stats))
        self._keep_last_row(episode)
        self.num_episodes += 1
        self.num_frames += frames
        return self.num_episodes - 1

    def _episode_row(self, frames: int, episode_stats: dict) -> dict:
        start = self.num_frames / FPS
        row = {
            "episode_index": self.num_episodes, "tasks": [_TASK], "length": frames,
            "data/chunk_index": 0, "data/file_index": 0,
            "dataset_from_index": self.num_frames, "dataset_to_index": self.num_frames + frames,
        }  # fmt: skip
        for key in self._images:
            name = self.names[key]
            row.update({f"videos/{name}/chunk_index": 0, f"videos/{name}/file_index": 0})
            row[f"videos/{name}/from_timestamp"] = start
            row[f"videos/{name}/to_timestamp"] = start + frames / FPS
        row.update({"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0})
        for feature, values in lerobot_stats.as_lists(episode_stats).items():
            row.update({f"stats/{feature}/{name}": value for name, value in values.items()})
        return row

    def _keep_last_row(self, episode) -> None:
        """The row LeRobot has no frame for, kept for swm's import (frames as PNG: lossless)."""
        row = {"episode_index": np.int64(self.num_episodes)}
        for key in self._last_keys:
            last = np.asarray(episode[key])[-1]
            row[self.names[key]] = encoded(last, "PNG") if key in self._images else last
        self._last_rows.append(row)
        if len(self._last_rows) >= _LAST_ROWS_FLUSH:
            self._flush_last_rows()

    def _flush_last_rows(self) -> None:
        import pyarrow as pa

        columns = {}
        for field in self._last_arrow:
            values = [row[field.name] for row in self._last_rows]
            binary = field.type == pa.binary()
            stacked = None if binary else np.stack(values)
            columns[field.name] = pa.array(values) if binary else _arrow_column(stacked, field)
        self._last.write_table(pa.table(columns, schema=self._last_arrow))
        self._last_rows = []

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()

    def close(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self._data is None:
            return
        self._data.close()
        self._data = None
        if self._last_rows:
            self._flush_last_rows()
        self._last.close()
        for container, stream in self._videos.values():
            container.mux(stream.encode())
            container.close()
        episodes = self.path / _EPISODES
        episodes.parent.mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(self._episodes), episodes)
        _write_tasks(self.path / "meta/tasks.parquet")
        meta = self.path / "meta"
        (meta / "info.json").write_text(json.dumps(self._info(), indent=1) + "\n")
        features = self._stats[0].keys() if self._stats else ()
        dataset = {f: lerobot_stats.aggregate([e[f] for e in self._stats]) for f in features}
        (meta / "stats.json").write_text(
            json.dumps(lerobot_stats.as_lists(dataset), indent=1) + "\n"
        )

    def _info(self) -> dict:
        features = {}
        for key, (dtype, shape) in self.schema.items():
            if key in self._images:
                feature = {"dtype": "video", "shape": list(shape)}
                feature.update(names=["height", "width", "channels"], info=_video_info(shape))
            else:
                feature = {"dtype": np.dtype(dtype).name, "shape": list(shape) or [1]}
                feature["names"] = None
            features[self.names[key]] = feature
        for name, dtype in _INDEX.items():
            features[name] = {"dtype": np.dtype(dtype).name, "shape": [1], "names": None}
        return {
            "codebase_version": "v3.0", "robot_type": None,
            "total_episodes": self.num_episodes, "total_frames": self.num_frames, "total_tasks": 1,
            "chunks_size": 1000, "data_files_size_in_mb": 100, "video_files_size_in_mb": 200,
            "fps": FPS, "splits": {"train": f"0:{self.num_episodes}"},
            "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
            "video_path": _VIDEO_TEMPLATE if self._images else None,
            "features": features,
            "swm_keys": {name: key for key, name in self.names.items()},
            "swm_last_rows": LAST_ROWS,
        }  # fmt: skip


def _video_info(shape) -> dict:
    """What LeRobot records of a feature's video (``info`` of its feature in ``info.json``)."""
    height, width, channels = shape
    return {
        "video.height": height, "video.width": width, "video.codec": "h264",
        "video.pix_fmt": "yuv420p", "video.is_depth_map": False, "video.fps": FPS,
        "video.channels": channels, "has_audio": False,
    }  # fmt: skip


def _arrow_column(values: np.ndarray, field):
    """A column of ``field``'s type from ``values`` (rows first): fixed-size lists for vectors."""
    import pyarrow as pa

    if pa.types.is_fixed_size_list(field.type):
        flat = pa.array(values.reshape(-1), field.type.value_type)
        return pa.FixedSizeListArray.from_arrays(flat, field.type.list_size)
    return pa.array(values.reshape(len(values)), field.type)


def _write_tasks(path: Path) -> None:
    """``meta/tasks.parquet`` as LeRobot writes it (a pandas frame indexed by the task's text),
    so its reader gets the task's text back, without pandas here."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    index = "__index_level_0__"
    pandas = {
        "index_columns": [index],
        "column_indexes": [],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64",
             "numpy_type": "int64", "metadata": None},
            {"name": None, "field_name": index, "pandas_type": "unicode",
             "numpy_type": "object", "metadata": None},
        ],
        "creator": {"library": "swm"},
        "pandas_version": "2.0.0",
    }  # fmt: skip
    table = pa.table({"task_index": pa.array([0], pa.int64()), index: pa.array([_TASK])})
    pq.write_table(table.replace_schema_metadata({"pandas": json.dumps(pandas)}), path)
