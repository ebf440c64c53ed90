"""``swm convert SRC DST --layout lerobot``: a LeRobot v3 dataset (see ``lerobot.py`` for the
layout), streamed episode by episode: one parquet file of frames written row group by row group,
one h264 MP4 per image key holding every episode one after another, the episode index at the end.

swm's rows map onto LeRobot's frames one to one: frame t holds observation t and the action taken
at it (the last one NaN, as swm stores it); ``reward``/``terminated``/``truncated`` (what arriving
at a row brought) become ``next.reward``/``next.done``/``next.truncated`` one frame up (what the
frame's action brought), the last frame's ``next.done`` its own row's flag. ``info.json`` keeps
swm's key of every feature under ``swm_keys`` (LeRobot ignores it), so a re-import restores them.
Numbers are exact (reward and flags from the second row on: a first row's have no frame to go
to, and swm's own collect writes 0/False there); frames go through h264 (yuv420p, CRF 18): lossy.
"""

import json
from pathlib import Path

import numpy as np

from swmcli.data.storage.schema import is_image
from swmcli.errors import UsageError

FPS = 10  # swm datasets record no frame rate; LeRobot needs one for its timestamps
CRF = "18"
_NAMES = {"proprio": "observation.state", "state": "observation.environment_state"}
_NEXT = {"reward": "next.reward", "terminated": "next.done", "truncated": "next.truncated"}
ARRIVAL_KEYS = tuple(_NEXT)  # exact from the second row on: LeRobot has no slot for the first
_DATA = "data/chunk-000/file-000.parquet"
_VIDEO = "videos/{video_key}/chunk-000/file-000.mp4"
_VIDEO_TEMPLATE = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"


def feature_names(schema) -> dict[str, str]:
    """swm key -> LeRobot feature name (the first image is ``observation.image``)."""
    names, images = {}, [key for key, (_, shape) in schema.items() if is_image(shape)]
    for key in schema:
        if key in images:
            names[key] = "observation.image" if key == images[0] else f"observation.images.{key}"
        elif key == "action":
            names[key] = "action"
        else:
            names[key] = _NEXT.get(key) or _NAMES.get(key) or f"observation.{key}"
    return names


class LeRobotExport:
    """A LeRobot v3 dataset written one episode at a time."""

    def __init__(self, path: Path, schema):
        import pyarrow as pa

        self.path, self.schema, self.names = path, schema, feature_names(schema)
        self._images = [key for key, (_, shape) in schema.items() if is_image(shape)]
        for key in self._images:
            height, width, *channels = schema[key][1]
            if channels != [3] or height % 2 or width % 2:
                raise UsageError(
                    f"{key} {schema[key][1]}: LeRobot's h264 videos need even-sized RGB frames",
                    hint=f"leave it out with --keys, or resize it (--map {key}=)",
                )
        fields = []
        for key, (dtype, shape) in schema.items():
            if key not in self._images:
                kind = pa.from_numpy_dtype(np.dtype(dtype))
                size = int(np.prod(shape))
                fields.append(pa.field(self.names[key], pa.list_(kind, size) if shape else kind))
        for name in ("timestamp",):
            fields.append(pa.field(name, pa.float32()))
        for name in ("frame_index", "episode_index", "index", "task_index"):
            fields.append(pa.field(name, pa.int64()))
        self._arrow = pa.schema(fields)
        path.mkdir(parents=True)
        (path / _DATA).parent.mkdir(parents=True)
        import pyarrow.parquet as pq

        self._data = pq.ParquetWriter(path / _DATA, self._arrow)
        self._videos = {key: self._open_video(key) for key in self._images}
        self._episodes: list[dict] = []
        self.num_episodes = self.num_steps = 0

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
        import av
        import pyarrow as pa

        length = len(next(iter(episode.values())))
        columns = {}
        for key, (_, shape) in self.schema.items():
            if key in self._images:
                continue
            values = np.asarray(episode[key])
            if key in _NEXT:  # what arriving at row t+1 brought = what frame t's action brought
                values = np.concatenate(
                    [values[1:], values[-1:] if key != "reward" else 0 * values[:1]]
                )
            field = self._arrow.field(self.names[key])
            flat = pa.array(values.reshape(-1), field.type.value_type if shape else field.type)
            columns[field.name] = (
                pa.FixedSizeListArray.from_arrays(flat, int(np.prod(shape))) if shape else flat
            )
        steps = np.arange(length)
        columns["timestamp"] = pa.array((steps / FPS).astype(np.float32))
        columns["frame_index"] = pa.array(steps)
        columns["episode_index"] = pa.array(np.full(length, self.num_episodes))
        columns["index"] = pa.array(self.num_steps + steps)
        columns["task_index"] = pa.array(np.zeros(length, dtype=np.int64))
        self._data.write_table(pa.table(columns, schema=self._arrow))
        for key, (container, stream) in self._videos.items():
            for frame in np.asarray(episode[key]):
                picture = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
                container.mux(stream.encode(picture))
        start = self.num_steps / FPS
        row = {
            "episode_index": self.num_episodes, "tasks": ["swm"], "length": length,
            "data/chunk_index": 0, "data/file_index": 0,
            "dataset_from_index": self.num_steps, "dataset_to_index": self.num_steps + length,
            "meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0,
        }  # fmt: skip
        for key in self._images:
            name = self.names[key]
            row.update({f"videos/{name}/chunk_index": 0, f"videos/{name}/file_index": 0})
            row[f"videos/{name}/from_timestamp"] = start
            row[f"videos/{name}/to_timestamp"] = start + length / FPS
        self._episodes.append(row)
        self.num_episodes += 1
        self.num_steps += length
        return self.num_episodes - 1

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
        for container, stream in self._videos.values():
            container.mux(stream.encode())
            container.close()
        episodes = self.path / "meta/episodes/chunk-000/file-000.parquet"
        episodes.parent.mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(self._episodes), episodes)
        pq.write_table(
            pa.table({"task_index": [0], "task": ["swm"]}), self.path / "meta/tasks.parquet"
        )
        (self.path / "meta/info.json").write_text(json.dumps(self._info(), indent=1) + "\n")

    def _info(self) -> dict:
        features = {}
        for key, (dtype, shape) in self.schema.items():
            if key in self._images:
                feature = {
                    "dtype": "video",
                    "shape": list(shape),
                    "names": ["height", "width", "channels"],
                }
                feature["info"] = {
                    "video.fps": FPS,
                    "video.codec": "h264",
                    "video.pix_fmt": "yuv420p",
                }
            else:
                feature = {
                    "dtype": np.dtype(dtype).name,
                    "shape": list(shape) or [1],
                    "names": None,
                }
            features[self.names[key]] = feature
        for name, dtype in (
            ("timestamp", "float32"),
            *((n, "int64") for n in ("frame_index", "episode_index", "index", "task_index")),
        ):
            features[name] = {"dtype": dtype, "shape": [1], "names": None}
        return {
            "codebase_version": "v3.0", "robot_type": None,
            "total_episodes": self.num_episodes, "total_frames": self.num_steps, "total_tasks": 1,
            "chunks_size": 1000, "data_files_size_in_mb": 100, "video_files_size_in_mb": 200,
            "fps": FPS, "splits": {"train": f"0:{self.num_episodes}"},
            "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
            "video_path": _VIDEO_TEMPLATE if self._images else None,
            "features": features,
            "swm_keys": {name: key for key, name in self.names.items()},
        }  # fmt: skip
