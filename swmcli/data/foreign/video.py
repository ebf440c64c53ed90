"""Frames of MP4/AV1 videos in foreign datasets, decoded with PyAV (the optional ``video``
extra): by timestamp (LeRobot, several episodes a file) or by frame index (stable-worldmodel's
one video per episode). A video whose frames are not the size its dataset declares is refused,
and so is one whose frames would decode to more than the JPEG path allows (``check_decoded``):
a side beyond ``MAX_SIDE``, or more than ``MAX_EXPANSION`` times the bytes stored."""

from pathlib import Path

import numpy as np

from swmcli.data.foreign.common import DAMAGED_HINT
from swmcli.data.foreign.jpeg import MAX_EXPANSION, MAX_SIDE
from swmcli.errors import DatasetError, UsageError


def _pyav():
    try:
        import av
    except ImportError:
        raise UsageError(
            "reading this dataset's videos needs PyAV",
            hint="pip install 'swmcli[video]'  (or: pip install av)",
        ) from None
    return av


def _check_size(stream, shape: tuple, where) -> None:
    if (stream.codec_context.height, stream.codec_context.width) != tuple(shape[:2]):
        raise DatasetError(f"{where}: frames are not the {shape[:2]} the dataset declares")


def codec_name(source) -> str:
    """``h264 video``, ``av1 video``, ... of a video file (or file-like object): the codec, not
    the decoder FFmpeg picked for it (AV1 decodes with ``libdav1d``)."""
    with _pyav().open(source if hasattr(source, "read") else str(source)) as container:
        return f"{container.streams.video[0].codec_context.codec.canonical_name} video"


def frame_rate(path: Path) -> float | None:
    """Frames a second of a video file, from its stream header (None when it says none)."""
    with _pyav().open(str(path)) as container:
        rate = container.streams.video[0].average_rate
    return float(rate) if rate else None


def frame_shape(source, where=None) -> tuple[int, int, int]:
    """(H, W, 3) of a video's frames, from its stream header (a side beyond ``MAX_SIDE`` or of
    no pixel refused)."""
    with _pyav().open(source if hasattr(source, "read") else str(source)) as container:
        context = container.streams.video[0].codec_context
        shape = (context.height, context.width, 3)
    if not 0 < min(shape[:2]) <= max(shape[:2]) <= MAX_SIDE:
        raise DatasetError(f"{where or source}: video frames of {shape[1]}x{shape[0]} pixels")
    return shape


def check_decoded(stored_bytes: int, frames: int, shape: tuple, where) -> None:
    """Refuse, before decoding, a video of ``stored_bytes`` whose ``frames`` of ``shape`` would
    decode to more than ``MAX_EXPANSION`` times that (a few KB claiming GB of frames)."""
    decoded = frames * int(np.prod(shape))
    if decoded > MAX_EXPANSION * max(stored_bytes, 1):
        raise DatasetError(
            f"{where}: {frames} frames of {shape[1]}x{shape[0]} pixels ({decoded} bytes) from "
            f"{stored_bytes} bytes of video, more than any real video decodes to",
            DAMAGED_HINT,
        )


def decode_indices(source, indices: np.ndarray, shape: tuple, where) -> np.ndarray:
    """Frames number ``indices`` (0 = the first) of a video, decoded from its start up to the
    last one asked for."""
    av = _pyav()
    out = np.empty((len(indices), *shape), dtype=np.uint8)
    filled = np.zeros(len(indices), dtype=bool)
    last = int(indices.max()) if len(indices) else -1
    with av.open(source if hasattr(source, "read") else str(source)) as container:
        stream = container.streams.video[0]
        _check_size(stream, shape, where)
        for number, frame in enumerate(container.decode(stream)):
            hit = indices == number
            if hit.any():
                out[hit] = frame.to_ndarray(format="rgb24")
                filled |= hit
            if number >= last:
                break
    if not filled.all():
        raise DatasetError(f"{where}: the video holds fewer frames than its episode", DAMAGED_HINT)
    return out


def decode_at(path: Path, times: np.ndarray, fps: float, shape: tuple) -> np.ndarray:
    """The frames of the video at ``path`` shown at ``times`` (seconds), within half a frame:
    one seek to the keyframe before the first, then decoding forward to the last."""
    av = _pyav()
    out = np.empty((len(times), *shape), dtype=np.uint8)
    filled = np.zeros(len(times), dtype=bool)
    tolerance = 0.5 / fps
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        _check_size(stream, shape, path)
        first = max(float(times.min()) - tolerance, 0.0)
        container.seek(int(first / stream.time_base), stream=stream, backward=True)
        for frame in container.decode(stream):
            if frame.pts is None:
                continue
            moment = float(frame.pts * stream.time_base)
            hit = ~filled & (np.abs(times - moment) < tolerance)
            if hit.any():
                out[hit] = frame.to_ndarray(format="rgb24")
                filled |= hit
            if filled.all() or moment > times.max() + tolerance:
                break
    if not filled.all():
        missing = float(times[~filled][0])
        raise DatasetError(f"{path}: no frame at {missing:.3f} s", DAMAGED_HINT)
    return out


class LanceVideos:
    """stable-worldmodel's ``lance_video`` side table ``<name>_videos.lance``: one MP4 blob per
    (episode, image column), frame j = step j of that episode."""

    def __init__(self, table: Path, episode_ids: np.ndarray, offsets: np.ndarray, lengths):
        import io

        import lance

        self.path, self._offsets, self._episode_ids = table, offsets, episode_ids
        self._lengths = lengths
        self._dataset = lance.dataset(str(table.absolute()))
        index = self._dataset.to_table(columns=["episode_idx", "video_key"]).to_pydict()
        self._rows = {
            (int(episode), str(key)): row
            for row, (episode, key) in enumerate(zip(*index.values(), strict=True))
        }
        names = sorted({key for _, key in self._rows})
        first = {key: io.BytesIO(self._blob(0, key)) for key in names}
        self.columns = {
            key: (np.dtype(np.uint8), frame_shape(first[key], f"{table} ({key})")) for key in names
        }
        self.codec = codec_name(io.BytesIO(self._blob(0, names[0]))) if names else None

    def _blob(self, episode: int, key: str) -> bytes:
        row = self._rows.get((int(self._episode_ids[episode]), key))
        if row is None:
            raise DatasetError(f"{self.path}: no {key} video for episode {episode}", DAMAGED_HINT)
        with self._dataset.take_blobs("video_bytes", indices=[row])[0] as blob:
            return blob.read()

    def read(self, key: str, rows: np.ndarray) -> np.ndarray:
        import io

        shape = self.columns[key][1]
        out = np.empty((len(rows), *shape), dtype=np.uint8)
        episodes = np.searchsorted(self._offsets, rows, side="right") - 1
        for episode in np.unique(episodes):
            where = episodes == episode
            steps = rows[where] - self._offsets[episode]
            blob = self._blob(int(episode), key)
            name = f"{self.path} ({key}, episode {episode})"
            check_decoded(len(blob), int(self._lengths[episode]), shape, name)
            out[where] = decode_indices(io.BytesIO(blob), steps, shape, name)
        return out
