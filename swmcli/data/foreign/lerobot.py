"""LeRobot v3 datasets, read: ``meta/info.json``, parquet data and episode files, MP4 videos
holding several episodes each (decoded with PyAV: ``pip install 'swmcli[video]'``), or frames as
PNG/JPEG bytes in the data parquet (LeRobot's image layout, ``use_videos=False``).

``info.json`` names the features (dtype, shape), the fps and the path templates of the data and
video files; ``meta/episodes/*/*.parquet`` gives each episode its length, its rows in the data
files (``dataset_from_index``..``dataset_to_index`` of the global ``index`` column) and, per video
key, its file and its ``from_timestamp`` there. A frame t holds the observation, the action taken
at it and ``next.reward``/``next.done`` (what followed that action). In swm's convention the
frames stay rows, the last action becomes NaN, and ``next.*`` move one row down (0/False on the
first row; the last frame's ``next.*`` has no row). Video frames are matched by timestamp
(``from_timestamp`` + the frame's own ``timestamp``), within half a frame. An export of swm's
(``swm_last_rows`` in ``info.json``) keeps each episode's last row, which is no LeRobot frame (no
action was taken there), in ``meta/swm_last_rows.parquet``: its episodes read back as the frames
plus that row, so the import gives back swm's rows exactly.

Untrusted input: the path templates may only name ``chunk_index``/``file_index``/``video_key``
and every path they make must stay inside the dataset; counts and lengths are checked against the
rows the parquet files hold; a video's frame size must be the one ``info.json`` declares.
"""

import json
import re
import string
from pathlib import Path

import numpy as np

from swmcli.data.foreign import jpeg
from swmcli.data.foreign.common import DAMAGED_HINT, LEROBOT, reading
from swmcli.data.foreign.jpeg import MAX_SIDE
from swmcli.data.foreign.video import check_decoded, codec_name, decode_at, frame_rate
from swmcli.data.storage.containment import inside
from swmcli.data.storage.schema import unfit
from swmcli.errors import DatasetError, UsageError
from swmcli.units import format_bytes

_INDEX_FEATURES = ("timestamp", "frame_index", "episode_index", "index", "task_index")
_ARRIVAL = {"next.reward": "reward", "next.done": "terminated", "next.truncated": "truncated"}
_KEYS = {"observation.state": "proprio", "observation.environment_state": "state", **_ARRIVAL}
_INTEGERS = tuple(f"{sign}int{bits}" for sign in ("", "u") for bits in (8, 16, 32, 64))
_NUMBERS = ("float16", "float32", "float64", "bool", *_INTEGERS)
_TEMPLATE_FIELDS = {"chunk_index", "file_index", "video_key", "episode_index"}
_MAX_TEMPLATE, _MAX_WIDTH = 1024, 20  # characters of a path template; digits of one field
_MAX_DIMS = 8
_LIST_LEAVES = ("list.element", "list.item", "element", "item")  # a list column's leaf, by writer
_MAX_INFO_BYTES = 4 * 2**20
_CONVENTION = "LeRobot: frame t = observation, action taken at it, next.reward/next.done after it"
_ALIGNMENT = (
    "rows kept; last row's action set to NaN; next.* one row down (0/False on the first), the "
    "last frame's next.done kept on the last row (as terminated)"
)
_EXPORTED = "swm's LeRobot export: T frames, each episode's last row in meta/swm_last_rows.parquet"
_EXPORTED_ALIGNMENT = (
    "T+1 rows: the frames, then the last row; its action NaN; next.* one row down (0/False on "
    "the first)"
)
LAST_ROWS = "meta/swm_last_rows.parquet"  # what swm's export names in info.json's swm_last_rows


def detect(path: Path) -> str | None:
    """LEROBOT for a directory whose meta/info.json says codebase_version v3.x; a LeRobot dataset
    of another version is a UsageError saying so (swm reads v3 only)."""
    info = path / "meta" / "info.json"
    if not path.is_dir() or not info.is_file():
        return None
    if (size := info.stat().st_size) > _MAX_INFO_BYTES:
        raise DatasetError(
            f"{info} is {format_bytes(size)}: larger than any LeRobot info.json "
            f"(swm reads {format_bytes(_MAX_INFO_BYTES)} at most)",
            DAMAGED_HINT,
        )
    try:
        version = str(json.loads(info.read_text())["codebase_version"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None
    if version.lower().startswith("v3"):  # "V3.0" too
        return LEROBOT
    raise UsageError(
        f"{path} is a LeRobot {version} dataset: swm reads LeRobot v3 datasets "
        "(codebase_version v3.x) only",
        hint="convert it with LeRobot's own script: python -m "
        "lerobot.datasets.v30.convert_dataset_v21_to_v30 --repo-id=ID --root=PATH",
    )


def open_source(path: Path):
    return LeRobotSource(path)


def _template(info: dict, key: str, where) -> str:
    """A path template of info.json, refused if it names anything but the known fields, or
    formats them other than as a number of at most ``_MAX_WIDTH`` digits (``{chunk_index:03d}``;
    a width of 400,000,000 would make a 400 MB path)."""
    template = info.get(key)
    if not isinstance(template, str) or len(template) > _MAX_TEMPLATE:
        raise DatasetError(f"{where}: info.json has no usable {key}", DAMAGED_HINT)
    for _, field, spec, conversion in string.Formatter().parse(template):
        if field is None:
            continue
        if field not in _TEMPLATE_FIELDS:
            raise DatasetError(f"{where}: {key} names the field {field!r}", DAMAGED_HINT)
        width = re.fullmatch(r"0?(\d{0,3})d?", spec or "")
        if conversion or width is None or int(width.group(1) or 0) > _MAX_WIDTH:
            shown = f"{spec!r}" + (f" !{conversion}" if conversion else "")
            raise DatasetError(
                f"{where}: {key} formats {field} as {shown} (swm takes a number of at most "
                f"{_MAX_WIDTH} digits, e.g. {{{field}:03d}})",
                DAMAGED_HINT,
            )
    return template


class LeRobotSource:
    """Rows of a LeRobot v3 dataset in swm's convention."""

    def __init__(self, root: Path):
        self.path = root
        with reading(root):
            self._open(json.loads((root / "meta" / "info.json").read_text()))

    def _open(self, info: dict) -> None:
        self.fps = _fps(info.get("fps"), self.path)
        features = info.get("features")
        if not isinstance(features, dict):
            raise DatasetError(
                f"{self.path}: info.json's features is {_json_kind(features)}, not an object of "
                "features by name",
                DAMAGED_HINT,
            )
        self._videos, self._images, self.columns, dropped = {}, {}, {}, {}
        for name, feature in features.items():
            if name in _INDEX_FEATURES:
                continue
            if not isinstance(feature, dict):
                raise DatasetError(
                    f"{self.path}: info.json's feature {name} is {_json_kind(feature)}, not an "
                    "object of its dtype, shape and names",
                    DAMAGED_HINT,
                )
            dtype, shape = feature.get("dtype"), _declared_shape(name, feature, self.path)
            if dtype in ("video", "image"):
                frames = self._videos if dtype == "video" else self._images
                frames[name] = _frame_shape(shape, feature.get("names"), self.path)
                self.columns[name] = (np.dtype(np.uint8), frames[name])
            elif dtype in _NUMBERS:
                if name == "action" and dtype not in ("float16", "float32", "float64"):
                    dtype = "float32"  # the last row's action is NaN
                scalar = shape == () and name != "action"  # [1]: by its column (_check_stored)
                self.columns[name] = (np.dtype(dtype), () if scalar else shape)
            else:
                dropped[name] = f"{dtype} (swm stores numbers and frames)"
        self._data_template = _template(info, "data_path", self.path)
        self._video_template = _template(info, "video_path", self.path) if self._videos else None
        self._episodes = self._read_episodes(info)
        self._frame_counts = self._episodes["length"]
        self._check_stored()
        self._last = self._last_rows(info.get("swm_last_rows"))
        self.lengths = self._frame_counts + (self._last is not None)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
        self._files = {}  # data file -> (sorted global indices, their rows in the file)
        self._cache = {}  # (data file, column) -> its values
        self._groups = {}  # parquet file -> its row groups (frames in parquet are read by group)
        self._video_frames = {}  # (video key, file) -> frames of the episodes it holds
        codecs = {name: self._codec(name) for name in (*self._videos, *self._images)}
        self._codecs = codecs
        if self._videos:  # frames are found by timestamp: the fps must be the data's and video's
            with reading(self.path):
                self._check_timestamps(self._data_file(0), np.arange(self._frame_counts[0]), 0)
        lossy = [name for name in self._videos] + [
            name for name in self._images if not codecs[name].startswith("PNG")
        ]
        self.defaults = self._default_keys(info.get("swm_keys"))
        self.info = {
            "codec": ", ".join(sorted(set(codecs.values()))) or "parquet (numbers only)",
            "lossy": f"frames ({', '.join(lossy)})" if lossy else False,
            "convention": _CONVENTION if self._last is None else _EXPORTED,
            "alignment": _ALIGNMENT if self._last is None else _EXPORTED_ALIGNMENT,
            "fps": self.fps,
        }
        if dropped:
            self.info["not_imported"] = dropped

    def _read_episodes(self, info: dict) -> dict[str, np.ndarray]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        files = sorted((self.path / "meta" / "episodes").glob("*/*.parquet"))
        if not files:
            raise DatasetError(f"{self.path}: no meta/episodes/*/*.parquet", DAMAGED_HINT)
        wanted = ["episode_index", "length", "data/chunk_index", "data/file_index"]
        wanted += ["dataset_from_index", "dataset_to_index"]
        for key in self._videos:
            wanted += [f"videos/{key}/{field}" for field in ("chunk_index", "file_index")]
            wanted.append(f"videos/{key}/from_timestamp")
        table = pa.concat_tables(
            pq.read_table(inside(self.path, str(f.relative_to(self.path))), columns=wanted)
            for f in files
        )
        episodes = {name: table.column(name).to_numpy() for name in wanted}
        order = np.argsort(episodes["episode_index"], kind="stable")
        episodes = {name: values[order] for name, values in episodes.items()}
        count = len(order)
        if count == 0:
            raise UsageError(f"{self.path} holds no episodes", hint="nothing to read in it")
        if not np.array_equal(episodes["episode_index"], np.arange(count)):
            raise DatasetError(f"{self.path}: episode_index is not 0..{count - 1}", DAMAGED_HINT)
        lengths = _whole_numbers(episodes["length"], "length", self.path)
        starts = _whole_numbers(episodes["dataset_from_index"], "dataset_from_index", self.path)
        ends = _whole_numbers(episodes["dataset_to_index"], "dataset_to_index", self.path)
        # Python ints: lengths near 2**63 must not wrap into a sum that matches the rows stored
        rows = zip(lengths.tolist(), starts.tolist(), ends.tolist(), strict=True)
        wrong = [e for e, (n, start, end) in enumerate(rows) if n <= 0 or n != end - start]
        if wrong:
            e = wrong[0]
            raise DatasetError(
                f"{self.path}: episode {e} has length {lengths[e]} but the data rows "
                f"{starts[e]}..{ends[e]} (dataset_from_index..dataset_to_index)",
                DAMAGED_HINT,
            )
        if starts.min() < 0:
            raise DatasetError(f"{self.path}: an episode starts at a negative row", DAMAGED_HINT)
        by_start = np.argsort(starts, kind="stable")
        overlap = np.flatnonzero(starts[by_start][1:] < ends[by_start][:-1])
        if len(overlap):
            first, second = by_start[overlap[0]], by_start[overlap[0] + 1]
            raise DatasetError(
                f"{self.path}: the rows of episodes {first} and {second} overlap "
                f"({starts[first]}..{ends[first] - 1} and {starts[second]}..{ends[second] - 1}): "
                "a frame would belong to two episodes",
                DAMAGED_HINT,
            )
        total = info.get("total_frames")
        if total is not None and int(total) != sum(lengths.tolist()):
            raise DatasetError(
                f"{self.path}: info.json counts {total} frames, the episodes "
                f"{sum(lengths.tolist())}",
                DAMAGED_HINT,
            )
        episodes["length"] = lengths
        return episodes

    def _check_stored(self) -> None:
        """What ``info.json`` and the episode index claim, against what the parquet files hold
        (their footers only): every episode's rows are in its data file, and every numeric
        feature holds the values a row its shape declares. Nothing is allocated for a claim
        before it is checked."""
        import pyarrow.parquet as pq

        files = {self._data_file(e): [] for e in range(len(self._frame_counts))}
        for episode in range(len(self._frame_counts)):
            files[self._data_file(episode)].append(episode)
        for file, episodes in files.items():
            footer = pq.ParquetFile(file).metadata
            claimed = sum(self._frame_counts[episodes].tolist())
            if claimed > footer.num_rows:
                raise DatasetError(
                    f"{file}: its episodes claim {claimed} rows, it holds {footer.num_rows}",
                    DAMAGED_HINT,
                )
        footer = pq.ParquetFile(self._data_file(0)).metadata
        for name, (_, shape) in self.columns.items():
            if name in self._videos:
                continue
            if name in self._images:
                if _values_per_row(footer, f"{name}.bytes") != 1:
                    raise DatasetError(
                        f"{self.path}: info.json declares the image {name}, its data holds no "
                        "image bytes for it",
                        DAMAGED_HINT,
                    )
                continue
            per_row = _values_per_row(footer, name)
            if per_row is None:
                raise DatasetError(
                    f"{self.path}: info.json declares {name}, its data holds no such column",
                    DAMAGED_HINT,
                )
            if per_row != int(np.prod(shape)):
                raise DatasetError(
                    f"{self.path}: info.json gives {name} the shape {list(shape) or [1]}, "
                    f"its data holds {per_row} values a row",
                    DAMAGED_HINT,
                )
            if shape == (1,) and name != "action" and _values_per_row(footer, name, lists=False):
                self.columns[name] = (self.columns[name][0], ())  # a number a row, not a list

    def _default_keys(self, exported) -> dict[str, str]:
        """swm's keys: an export's own (``swm_keys`` in info.json), else LeRobot's usual names."""
        if isinstance(exported, dict):
            return {str(name): str(key) for name, key in exported.items() if name in self.columns}
        keys = {name: key for name, key in _KEYS.items() if name in self.columns}
        frames = [name for name in self.columns if name in self._videos or name in self._images]
        if frames:
            keys[frames[0]] = "pixels"
        return keys

    def _last_rows(self, relative) -> dict | None:
        """swm's export: each episode's last row, by column (frames as PNG bytes), or None."""
        import pyarrow.parquet as pq

        if relative is None:
            return None
        file = inside(self.path, str(relative))
        footer = pq.ParquetFile(file).metadata
        if footer.num_rows != len(self._frame_counts):
            raise DatasetError(
                f"{file}: {footer.num_rows} last rows for {len(self._frame_counts)} episodes",
                DAMAGED_HINT,
            )
        names = [n for n in pq.ParquetFile(file).schema_arrow.names if n in self.columns]
        for name in names:
            images = name in self._videos or name in self._images
            per_row = _values_per_row(footer, name)
            if per_row != (1 if images else max(int(np.prod(self.columns[name][1])), 1)):
                raise DatasetError(f"{file}: {name} does not hold one row's values", DAMAGED_HINT)
        return {"file": file, "names": names, "values": {}}

    def _data_file(self, episode: int) -> Path:
        relative = self._data_template.format(
            chunk_index=int(self._episodes["data/chunk_index"][episode]),
            file_index=int(self._episodes["data/file_index"][episode]),
            episode_index=episode,
        )
        return inside(self.path, relative)

    def _video_file(self, name: str, episode: int) -> Path:
        relative = self._video_template.format(
            video_key=name,
            chunk_index=int(self._episodes[f"videos/{name}/chunk_index"][episode]),
            file_index=int(self._episodes[f"videos/{name}/file_index"][episode]),
            episode_index=episode,
        )
        return inside(self.path, relative)

    def _column(self, file: Path, name: str) -> np.ndarray:
        """A whole numeric column of one data file (a few bytes per frame), kept."""
        import pyarrow.parquet as pq

        if (file, name) not in self._cache:
            column = pq.read_table(file, columns=[name]).column(name)
            self._cache[file, name] = self._as_declared(column, name, file)
        return self._cache[file, name]

    def _as_declared(self, column, name: str, file: Path) -> np.ndarray:
        """A parquet column as ``(rows, *shape)`` of the dtype info.json declares; refused
        unless every row holds ``shape``'s values (a ragged list is not re-cut from its flat
        values) and every value fits the dtype (300.7 as uint8 would wrap to 44)."""
        import pyarrow.compute as pc

        column = column.combine_chunks()
        dtype, shape = self.columns.get(name, (None, ()))
        width = max(int(np.prod(shape)), 1)
        if column.null_count:
            raise DatasetError(f"{file}: the column {name} holds empty (null) rows", DAMAGED_HINT)
        sizes = np.ones(len(column), np.int64)
        if hasattr(column, "flatten"):
            sizes = pc.list_value_length(column).to_numpy(zero_copy_only=False)
            column = column.flatten()
        wrong = np.flatnonzero(sizes != width)
        if len(wrong):
            raise DatasetError(
                f"{file}: row {int(wrong[0])} of the column {name} holds {int(sizes[wrong[0]])} "
                f"values, not the {width} of its shape {list(shape) or [1]} in info.json",
                DAMAGED_HINT,
            )
        values = column.to_numpy(zero_copy_only=False)
        problem = unfit(values, dtype) if dtype is not None else None
        if problem:
            raise DatasetError(
                f"{file}: the column {name} {problem}; info.json declares it {dtype}",
                DAMAGED_HINT,
            )
        values = values if dtype is None else values.astype(dtype, copy=False)
        return values.reshape(-1, *shape)

    def _positions(self, file: Path, indices: np.ndarray) -> np.ndarray:
        """Rows of ``file`` holding the frames with these global ``index`` values."""
        if file not in self._files:
            stored = self._column_raw(file, "index")
            order = np.argsort(stored, kind="stable")
            self._files[file] = (stored[order], order)
        stored, order = self._files[file]
        found = np.searchsorted(stored, indices).clip(0, max(len(stored) - 1, 0))
        if len(stored) == 0 or not np.array_equal(stored[found], indices):
            raise DatasetError(f"{file}: frames of an episode are missing", DAMAGED_HINT)
        return order[found]

    def _column_raw(self, file: Path, name: str) -> np.ndarray:
        import pyarrow.parquet as pq

        return pq.read_table(file, columns=[name]).column(name).to_numpy()

    def _numbers(self, name: str, episode: int, steps: np.ndarray) -> np.ndarray:
        dtype, shape = self.columns[name]
        out = np.zeros((len(steps), *shape), dtype=dtype)
        source, valid = steps, np.ones(len(steps), dtype=bool)
        if name in _ARRIVAL:
            valid = steps > 0
            source = steps[valid] - 1
        elif name == "action":
            valid = steps < self.lengths[episode] - 1
            source = steps[valid]
            out[~valid] = np.nan
        file = self._data_file(episode)
        start = self._episodes["dataset_from_index"][episode]
        values = self._column(file, name)
        out[valid] = values[self._positions(file, start + source)]
        last = steps == self.lengths[episode] - 1
        if self._last is None and name in _ARRIVAL and dtype.kind == "b" and last.any():
            # a LeRobot episode ends on a frame: its end stays on it
            final = self._positions(file, np.array([start + self.lengths[episode] - 1]))
            out[last] |= values[final[0]]
        return out

    def _frames(self, name: str, episode: int, steps: np.ndarray) -> np.ndarray:
        file = self._data_file(episode)
        positions = self._positions(file, self._episodes["dataset_from_index"][episode] + steps)
        if name in self._images:
            blobs = self._blobs(file, f"{name}", positions, "bytes")
            return jpeg.decode(blobs, self._images[name], f"{file} ({name})", self._codecs[name])
        video = self._video_file(name, episode)
        check_decoded(video.stat().st_size, self._frames_in(name, video), self._videos[name], video)
        stamps = self._check_timestamps(file, steps, episode)
        start = self._episodes[f"videos/{name}/from_timestamp"][episode]
        return decode_at(video, start + stamps.astype(np.float64), self.fps, self._videos[name])

    def _check_timestamps(self, file: Path, steps: np.ndarray, episode: int) -> np.ndarray:
        """The ``timestamp`` of these steps of an episode, refused unless step t is at t / fps
        (within a quarter frame): a wrong fps would match frames to other moments."""
        start = self._episodes["dataset_from_index"][episode]
        stamps = self._column(file, "timestamp")[self._positions(file, start + steps)]
        late = np.abs(stamps.astype(np.float64) - steps / self.fps)
        wrong = np.flatnonzero(late > 0.25 / self.fps)
        if len(wrong):
            step = int(steps[wrong[0]])
            raise DatasetError(
                f"{file}: episode {episode}'s step {step} has the timestamp "
                f"{float(stamps[wrong[0]]):.4g} s, not {step / self.fps:.4g} s as info.json's fps "
                f"{self.fps:g} says",
                DAMAGED_HINT,
            )
        return stamps

    def _blobs(self, file: Path, name: str, positions: np.ndarray, field=None) -> list[bytes]:
        """The bytes of ``name`` at these rows of a parquet ``file`` (its ``field`` for a
        struct column such as LeRobot's images), reading only the row groups that hold them."""
        import pyarrow.parquet as pq

        if file not in self._groups:
            handle = pq.ParquetFile(file)
            rows = [handle.metadata.row_group(g).num_rows for g in range(handle.num_row_groups)]
            self._groups[file] = (handle, np.cumsum([0, *rows]))
        handle, bounds = self._groups[file]
        groups = np.searchsorted(bounds, positions, side="right") - 1
        out = [b""] * len(positions)
        for group in np.unique(groups):
            column = handle.read_row_group(int(group), columns=[name]).column(name)
            where = np.flatnonzero(groups == group)
            taken = column.take(positions[where] - bounds[group])
            values = taken.combine_chunks().field(field) if field else taken
            for slot, blob in zip(where, values.to_pylist(), strict=True):
                if not isinstance(blob, bytes):
                    raise DatasetError(f"{file}: {name} holds no frame bytes", DAMAGED_HINT)
                out[slot] = blob
        return out

    def _last_values(self, name: str, episodes: np.ndarray) -> np.ndarray:
        """``name`` on the last row of these episodes (swm's export keeps it beside the frames)."""
        shape = self.columns[name][1]
        if name in self._videos or name in self._images:
            blobs = self._blobs(self._last["file"], name, episodes)
            return jpeg.decode(blobs, shape, f"{self._last['file']} ({name})")
        if name not in self._last["values"]:
            import pyarrow.parquet as pq

            column = pq.read_table(self._last["file"], columns=[name]).column(name)
            self._last["values"][name] = self._as_declared(column, name, self._last["file"])
        return self._last["values"][name][episodes]

    def _frames_in(self, name: str, video: Path) -> int:
        """Frames of every episode whose ``name`` frames are in the file ``video``."""
        if (name, video) not in self._video_frames:
            episodes = range(len(self._frame_counts))
            held = [e for e in episodes if self._video_file(name, e) == video]
            self._video_frames[name, video] = sum(self._frame_counts[held].tolist())
        return self._video_frames[name, video]

    def _codec(self, name: str) -> str:
        with reading(self.path):
            if name in self._images:
                file = self._data_file(0)
                start = self._episodes["dataset_from_index"][0]
                blob = self._blobs(file, name, self._positions(file, np.array([start])), "bytes")
                return jpeg.codec(blob[0])[0]
            video = self._video_file(name, 0)
            rate = frame_rate(video)
            if rate is not None and abs(rate - self.fps) > 0.01 * self.fps:
                raise DatasetError(
                    f"{video}: {name} is a video of {rate:g} frames a second, info.json's fps is "
                    f"{self.fps:g}",
                    DAMAGED_HINT,
                )
            return codec_name(video)

    def read(self, name: str, rows: np.ndarray) -> np.ndarray:
        episodes = np.searchsorted(self.offsets, rows, side="right") - 1
        dtype, shape = self.columns[name]
        out = np.empty((len(rows), *shape), dtype=dtype)
        frames = name in self._videos or name in self._images
        read = self._frames if frames else self._numbers
        kept = self._last is not None and name in self._last["names"]
        with reading(self.path):
            for episode in np.unique(episodes):
                where = np.flatnonzero(episodes == episode)
                steps = rows[where] - self.offsets[episode]
                last = steps == self._frame_counts[episode] if kept else np.zeros(len(steps), bool)
                if last.any():
                    out[where[last]] = self._last_values(name, np.array([episode]))
                if (~last).any():
                    out[where[~last]] = read(name, int(episode), steps[~last])
        return out

    def close(self) -> None:
        self._cache.clear()
        self._files.clear()
        self._groups.clear()


def _declared_shape(name: str, feature, where) -> tuple[int, ...]:
    """A feature's shape as info.json gives it: at most ``_MAX_DIMS`` whole numbers >= 1."""
    shape = feature.get("shape", []) if isinstance(feature, dict) else None
    whole = isinstance(shape, list) and all(type(n) is int and n >= 1 for n in shape)
    if not whole or len(shape) > _MAX_DIMS:
        raise DatasetError(
            f"{where}: info.json gives {name} the shape {shape!r} (swm takes at most "
            f"{_MAX_DIMS} whole numbers of at least 1)",
            DAMAGED_HINT,
        )
    return tuple(shape)


def _fps(value, where) -> float:
    """info.json's fps: a finite number above 0 (``true`` is no frame rate)."""
    if type(value) not in (int, float) or not 0 < value < float("inf"):
        raise DatasetError(
            f"{where}: info.json gives the fps {value!r} (a number of frames a second above 0)",
            DAMAGED_HINT,
        )
    return float(value)


def _json_kind(value) -> str:
    """What a JSON value is, in JSON's words."""
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    return "null" if value is None else kinds.get(type(value), "a number")


def _whole_numbers(values: np.ndarray, name: str, where) -> np.ndarray:
    """An episode-index column as int64, refused unless it holds integers."""
    if values.dtype.kind not in "iu" or (values.dtype.kind == "u" and values.max() >= 2**63):
        raise DatasetError(
            f"{where}: meta/episodes' {name} holds {values.dtype} values, not whole numbers",
            DAMAGED_HINT,
        )
    return values.astype(np.int64)


def _values_per_row(footer, name: str, lists: bool = True) -> int | None:
    """Values a row of the column ``name`` holds, from a parquet footer (None: no such column;
    not ``lists``: no such column that is not a list)."""
    paths = (name, *(f"{name}.{leaf}" for leaf in _LIST_LEAVES if lists))
    leaves = [i for i in range(footer.num_columns) if footer.schema.column(i).path in paths]
    if not leaves or not footer.num_rows:
        return None
    values = sum(
        footer.row_group(group).column(leaves[0]).num_values
        for group in range(footer.num_row_groups)
    )
    return values // footer.num_rows


def _frame_shape(shape: tuple, names, where) -> tuple[int, int, int]:
    """(H, W, 3) of a video feature, whether info.json lists it channels first or last."""
    if len(shape) != 3:
        raise DatasetError(f"{where}: a video feature of shape {shape}", DAMAGED_HINT)
    if isinstance(names, list) and names and names[0] in ("channels", "channel"):
        shape = (shape[1], shape[2], shape[0])
    if shape[2] != 3 or max(shape[:2]) > MAX_SIDE or min(shape[:2]) <= 0:
        raise DatasetError(f"{where}: a video feature of shape {shape}", DAMAGED_HINT)
    return shape
