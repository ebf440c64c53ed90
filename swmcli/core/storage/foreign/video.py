"""Frames of MP4/AV1 videos in foreign datasets, decoded with PyAV (the optional ``video``
extra): by timestamp (LeRobot, several episodes a file) or by frame index (stable-worldmodel's
one video per episode). A video whose frames are not the size its dataset declares is refused."""

from pathlib import Path

import numpy as np

from swmcli.core.storage.foreign import DAMAGED_HINT
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
    """``h264 video``, ``av1 video``, ... of a video file (or file-like object)."""
    with _pyav().open(source if hasattr(source, "read") else str(source)) as container:
        return f"{container.streams.video[0].codec_context.name} video"


def frame_shape(source) -> tuple[int, int, int]:
    """(H, W, 3) of a video's frames, from its stream header."""
    with _pyav().open(source if hasattr(source, "read") else str(source)) as container:
        context = container.streams.video[0].codec_context
        return (context.height, context.width, 3)


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
