"""stable-worldmodel's ``folder`` and ``video`` layouts, read.

Both are a directory of ``ep_len.npz``, ``ep_offset.npz`` and one ``<column>.npz`` per tabular
column (``np.savez``: the array is ``arr_0``), plus one sub-directory per image column: ``folder``
keeps one JPEG per step (``<col>/ep_<i>_step_<j>.jpeg``), ``video`` one MP4 per episode
(``<col>/ep_<i>.mp4``, frame j = step j). The rows and their conventions are the Lance and HDF5
layouts' (see ``upstream.py``), and so is the alignment.

``.npz`` files are read with pickling off, after their array header is checked against the bytes
the archive stores (``np.load`` would allocate whatever a header claims before reading it).
"""

import zipfile
from pathlib import Path

import numpy as np

from swmcli.data.foreign import jpeg
from swmcli.data.foreign import video as videos
from swmcli.data.foreign.common import (
    DAMAGED_HINT,
    UPSTREAM_FOLDER,
    UPSTREAM_VIDEO,
    check_lengths,
    not_rows,
    reading,
)
from swmcli.data.foreign.upstream import _Alignment, _as_action, _convention, step_order
from swmcli.data.storage.containment import inside
from swmcli.data.storage.schema import FOLDER_METADATA
from swmcli.errors import DatasetError

_DEFLATE_MAX_RATIO = 1100  # deflate expands at most ~1032x


def detect(path: Path) -> str | None:
    """UPSTREAM_VIDEO or UPSTREAM_FOLDER for a directory holding ``ep_len.npz``."""
    if (
        not path.is_dir()
        or not (path / "ep_len.npz").is_file()
        or (path / FOLDER_METADATA).exists()
    ):
        return None
    if any(any(sub.glob("ep_*.mp4")) for sub in path.iterdir() if sub.is_dir()):
        return UPSTREAM_VIDEO
    return UPSTREAM_FOLDER


def open_source(path: Path):
    return UpstreamFiles(path)


def read_npz(file: Path) -> np.ndarray:
    """``arr_0`` of an ``np.savez`` file: no pickles, and no header claiming more than is stored."""
    with zipfile.ZipFile(file) as archive:
        member = archive.getinfo("arr_0.npy")
        if member.file_size > max(member.compress_size, 1) * _DEFLATE_MAX_RATIO:
            raise DatasetError(f"{file}: claims {member.file_size} bytes", DAMAGED_HINT)
        with archive.open(member) as handle:
            version = np.lib.format.read_magic(handle)
            header = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, _, dtype = header(handle)
    if dtype.hasobject:
        raise DatasetError(f"{file}: holds Python objects (never unpickled)", DAMAGED_HINT)
    claimed = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if claimed > member.file_size:
        raise DatasetError(
            f"{file}: claims {claimed} bytes, {member.file_size} stored", DAMAGED_HINT
        )
    with np.load(file, allow_pickle=False) as archive:
        return archive["arr_0"]


class UpstreamFiles:
    """A stable-worldmodel folder or video dataset: tabular columns held, frames read per row."""

    defaults: dict[str, str] = {}  # noqa: RUF012 - upstream already uses swm's names

    def __init__(self, path: Path):
        self.path = path
        with reading(path):
            self._open()

    def _open(self) -> None:
        self._video = detect(self.path) == UPSTREAM_VIDEO
        self._arrays, self.columns, dropped = {}, {}, {}
        for file in sorted(self.path.glob("*.npz")):
            if file.stem in ("ep_len", "ep_offset"):
                continue
            values = read_npz(inside(self.path, file.name))
            if values.dtype.kind not in "biuf" or not values.ndim:
                dropped[file.stem] = not_rows(values.dtype)
                continue
            self._arrays[file.stem] = values
        rows = {len(values) for values in self._arrays.values()}
        if len(rows) > 1:
            raise DatasetError(f"{self.path}: columns of different lengths", DAMAGED_HINT)
        self.lengths = check_lengths(
            read_npz(self.path / "ep_len.npz"), rows.pop() if rows else 0, self.path
        )
        offsets = read_npz(self.path / "ep_offset.npz")
        if not np.array_equal(offsets, np.concatenate([[0], np.cumsum(self.lengths)[:-1]])):
            raise DatasetError(f"{self.path}: ep_offset does not follow ep_len", DAMAGED_HINT)
        self.offsets = offsets.astype(np.int64)
        self._align = _Alignment(self.lengths)
        steps = self._arrays.pop("step_idx", None)  # swm keeps its own step index
        if steps is not None and step_order(steps, self.lengths, self.path) is not None:
            raise DatasetError(  # frames are files named by position: no order to restore
                f"{self.path}: step_idx is not in order within an episode, and this layout's "
                "frames are named by position: which row a frame belongs to cannot be told",
                DAMAGED_HINT,
            )
        first_steps = steps[self._align.first_rows] if steps is not None else None
        last = self._arrays["action"][self._align.last_rows] if "action" in self._arrays else None
        self.columns = {n: (_as_action(n, v.dtype), v.shape[1:]) for n, v in self._arrays.items()}
        self._frames = {}
        for folder in sorted(p for p in self.path.iterdir() if p.is_dir()):
            first = self._frame_file(folder.name, 0, 0)
            if first.is_file():
                self._frames[folder.name] = self._first_shape(first)
                self.columns[folder.name] = (np.dtype(np.uint8), self._frames[folder.name])
        self.info = {
            **self._codec(),
            **self._align.said(_convention(last, first_steps)),
        }
        if dropped:
            self.info["not_imported"] = dropped

    def _frame_file(self, name: str, episode: int, step: int) -> Path:
        relative = (
            f"{name}/ep_{episode}.mp4" if self._video else f"{name}/ep_{episode}_step_{step}.jpeg"
        )
        return self.path / relative

    def _first_shape(self, file: Path) -> tuple:
        if self._video:
            return videos.frame_shape(inside(self.path, str(file.relative_to(self.path))))
        return jpeg.frame_shape(
            inside(self.path, str(file.relative_to(self.path))).read_bytes(), file
        )

    def _codec(self) -> dict:
        """Each frame column's codec, judged by its first frame (``decode`` holds every other
        frame of the column to it)."""
        if not self._frames:
            return {"codec": None, "lossy": False}
        said = {}
        for name in self._frames:
            first = self._frame_file(name, 0, 0)
            said[name] = (
                (videos.codec_name(first), True) if self._video else jpeg.codec(first.read_bytes())
            )
        self._codecs = {name: codec for name, (codec, _) in said.items()}
        lossy = [name for name, (_, lossy) in said.items() if lossy]
        codec = ", ".join(sorted(set(self._codecs.values())))
        return {"codec": codec, "lossy": f"frames ({', '.join(lossy)})" if lossy else False}

    def read(self, name: str, rows: np.ndarray) -> np.ndarray:
        if name not in self._frames:
            return self._align.apply(name, rows, np.array(self._arrays[name][rows]))
        shape = self._frames[name]
        out = np.empty((len(rows), *shape), dtype=np.uint8)
        episodes = np.searchsorted(self.offsets, rows, side="right") - 1
        with reading(self.path):
            for episode in np.unique(episodes):
                where = episodes == episode
                steps = rows[where] - self.offsets[episode]
                out[where] = self._episode_frames(name, int(episode), steps, shape)
        return out

    def _episode_frames(self, name: str, episode: int, steps: np.ndarray, shape) -> np.ndarray:
        if self._video:
            file = inside(self.path, f"{name}/ep_{episode}.mp4")
            videos.check_decoded(file.stat().st_size, int(self.lengths[episode]), shape, file)
            return videos.decode_indices(file, steps, shape, file)
        files = [inside(self.path, f"{name}/ep_{episode}_step_{int(s)}.jpeg") for s in steps]
        blobs = [file.read_bytes() for file in files]
        return jpeg.decode(blobs, shape, self.path / name, self._codecs[name])

    def close(self) -> None:
        self._arrays.clear()
