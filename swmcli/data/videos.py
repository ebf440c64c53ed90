"""Episodes as videos a person watches: frames side by side, enlarged, a label strip under them,
encoded by PyAV (the ``video`` extra: H.264 in MP4, or GIF).

Labels are drawn with PIL (a dependency already) into a small strip per frame: a few hundred
microseconds a frame, where a matplotlib figure per frame costs tens of milliseconds. The
distance plot under ``swm eval --video``'s frames is matplotlib's (axes, ticks, a title), drawn
once per replanning; each frame only moves its cursor.
"""

import functools
from pathlib import Path

import numpy as np

from swmcli.errors import UsageError

MIN_PANEL_SIDE = 128  # frames are enlarged (whole pixels, nearest) to at least this side
GAP = 4  # pixels between panels
LINE_HEIGHT = 13  # pixels per label line
PLOT_HEIGHT = 110  # pixels of a plot strip under the frames
WHITE, BLACK, GREY = (255, 255, 255), (0, 0, 0), (128, 128, 128)
GREEN, RED, BLUE = (0, 140, 0), (200, 0, 0), (30, 80, 200)


def require_av(what: str) -> None:
    """Refuse to start ``what`` without PyAV, with the line that installs it."""
    try:
        import av  # noqa: F401
    except ImportError:
        raise UsageError(
            f"{what} writes videos with PyAV, which is not installed",
            hint='pip install "swmcli[video]"  (PyAV; its wheel bundles FFmpeg)',
        ) from None


def is_frame(dtype, shape: tuple[int, ...]) -> bool:
    """Whether rows of ``dtype`` and ``shape`` are pictures: uint8 ``(H, W)`` or ``(H, W, C)``
    with 1, 3 or 4 channels."""
    if np.dtype(dtype) != np.uint8 or len(shape) not in (2, 3) or min(shape[:2]) < 2:
        return False
    return len(shape) == 2 or shape[2] in (1, 3, 4)


def as_rgb(frame: np.ndarray) -> np.ndarray:
    """A frame as ``(H, W, 3)`` uint8: grey repeated, alpha dropped."""
    if frame.ndim == 2:
        frame = frame[..., None]
    if frame.shape[2] == 1:
        return np.repeat(frame, 3, axis=2)
    return frame[..., :3]


def enlarged(frame: np.ndarray, min_side: int = MIN_PANEL_SIDE) -> np.ndarray:
    """``frame`` repeated by a whole factor so that its shorter side reaches ``min_side``."""
    scale = max(1, -(-min_side // min(frame.shape[:2])))
    return frame.repeat(scale, axis=0).repeat(scale, axis=1) if scale > 1 else frame


def text_strip(width: int, lines: list[tuple[str, tuple]]) -> np.ndarray:
    """White ``(len(lines) * LINE_HEIGHT + 4, width, 3)`` strip holding ``(text, colour)``
    lines."""
    from PIL import Image, ImageDraw

    strip = Image.new("RGB", (width, LINE_HEIGHT * len(lines) + 4), WHITE)
    draw = ImageDraw.Draw(strip)
    for row, (text, colour) in enumerate(lines):
        draw.text((3, 2 + row * LINE_HEIGHT), text, fill=colour)
    return np.asarray(strip)


def plot_strip(
    width: int, series: list[tuple[np.ndarray, np.ndarray, tuple]], now: int, last: int, title: str
) -> np.ndarray:
    """A ``PLOT_HEIGHT`` strip: each ``(x, y, colour)`` series as a line over x in ``0..last``,
    with axes, ticks and ``title`` (matplotlib), and a grey cursor at x = ``now``. A figure is
    drawn once per distinct ``series`` (a replanning); each frame only moves the cursor."""
    key = tuple((tuple(map(float, x)), tuple(map(float, y)), colour) for x, y, colour in series)
    picture, (left, right, top, bottom) = _plot(width, key, max(last, 1), title)
    strip = picture.copy()
    column = min(round(left + (right - left) * now / max(last, 1)), right)
    strip[top:bottom, column] = GREY
    return strip


@functools.lru_cache(maxsize=4)
def _plot(width: int, series: tuple, last: int, title: str) -> tuple[np.ndarray, tuple]:
    """The plot of ``plot_strip`` as RGB pixels, and its axes' pixel box (left, right, top,
    bottom)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    dpi = 100
    figure = Figure(figsize=(width / dpi, PLOT_HEIGHT / dpi), dpi=dpi)
    canvas = FigureCanvasAgg(figure)
    axes = figure.add_axes((48 / width, 0.3, 1 - 56 / width, 0.5))
    tops = [max(y) for _, y, _ in series if y]
    for x, y, colour in series:
        axes.plot(x, y, color=[c / 255 for c in colour], marker="." if len(x) == 1 else None)
    axes.set_xlim(0, last)
    axes.set_ylim(0, 1.05 * max(tops, default=1.0) or 1.0)
    axes.set_title(title, fontsize=7, loc="left")
    axes.set_xlabel("env step", fontsize=7, labelpad=1)
    axes.tick_params(labelsize=6, pad=1)
    canvas.draw()
    picture = np.asarray(canvas.buffer_rgba())[:, :width, :3].copy()
    box = axes.get_window_extent()
    height = picture.shape[0]
    pixels = (round(box.x0), round(box.x1), round(height - box.y1), round(height - box.y0))
    return picture, pixels


def side_by_side(panels: list[tuple[str, np.ndarray]], border: tuple | None = None) -> np.ndarray:
    """Titled panels ``(title, frame)`` enlarged to one height and put side by side on white, the
    title over each; ``border`` (a colour) frames the whole row."""
    frames = [enlarged(as_rgb(frame)) for _, frame in panels]
    height = max(frame.shape[0] for frame in frames)
    columns = []
    for (title, _), frame in zip(panels, frames, strict=True):
        column = np.full((height, frame.shape[1], 3), 255, np.uint8)
        column[: frame.shape[0]] = frame
        columns += [np.vstack([text_strip(frame.shape[1], [(title, BLACK)]), column])]
        columns.append(np.full((columns[-1].shape[0], GAP, 3), 255, np.uint8))
    row = np.hstack(columns[:-1])
    if border is not None:
        row = np.pad(row, ((GAP, GAP), (GAP, GAP), (0, 0)), constant_values=0)
        row[:GAP], row[-GAP:], row[:, :GAP], row[:, -GAP:] = border, border, border, border
    return row


def stacked(*parts: np.ndarray) -> np.ndarray:
    """Strips of any widths one above the other, padded white on the right to the widest."""
    width = max(part.shape[1] for part in parts)
    return np.vstack([np.pad(p, ((0, 0), (0, width - p.shape[1]), (0, 0)), constant_values=255)
                      for p in parts])  # fmt: skip


def grid(tiles: list[np.ndarray], columns: int) -> np.ndarray:
    """Tiles (any sizes) in rows of ``columns``, each cell the largest tile's size, on white."""
    height = max(tile.shape[0] for tile in tiles)
    width = max(tile.shape[1] for tile in tiles)
    rows = -(-len(tiles) // columns)
    canvas = np.full((rows * (height + GAP), columns * (width + GAP), 3), 255, np.uint8)
    for index, tile in enumerate(tiles):
        top, left = (index // columns) * (height + GAP), (index % columns) * (width + GAP)
        canvas[top : top + tile.shape[0], left : left + tile.shape[1]] = tile
    return canvas


def _paletted(frame: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``frame`` as a GIF frame: indices into its own palette of at most 256 colours (PIL's
    median cut, no dithering: swm's pictures are flat colours and text), and that palette as
    PyAV takes it, ``(256, 4)`` ARGB."""
    from PIL import Image

    quantized = Image.fromarray(frame).quantize(
        256, Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE
    )
    colours = np.asarray(quantized.getpalette(), np.uint8).reshape(-1, 3)
    palette = np.zeros((256, 4), np.uint8)
    palette[:, 0] = 255  # opaque
    palette[: len(colours), 1:] = colours
    return np.asarray(quantized), palette


class VideoWriter:
    """Frames ``(H, W, 3)`` uint8 written one at a time into an MP4 (H.264, yuv420p) or a GIF.

    The first frame fixes the size (rounded up to even sides for H.264, padded white); later
    frames are padded or cropped to it. The video is written beside ``path`` under a hidden name
    and renamed into place once whole: an interrupted write leaves no half video.
    """

    def __init__(self, path: Path, fps: int, gif: bool = False):
        import av

        self.path, self.fps, self.gif = Path(path), fps, gif
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._partial = self.path.with_name(f".{self.path.stem}.partial{self.path.suffix}")
        self._container = av.open(str(self._partial), mode="w")
        self._stream = None
        self.frames = 0

    def write(self, frame: np.ndarray) -> None:
        """Encode one frame."""
        import av

        if self._stream is None:
            height, width = frame.shape[:2]
            codec = "gif" if self.gif else "libx264"
            self._stream = self._container.add_stream(codec, rate=self.fps)
            self._stream.width, self._stream.height = (width, height) if self.gif else (
                width + width % 2, height + height % 2)  # fmt: skip
            self._stream.pix_fmt = "pal8" if self.gif else "yuv420p"
            if not self.gif:  # no lookahead: x264 holds a few frames, not forty
                self._stream.options = {"tune": "zerolatency"}
        frame = self._fitted(frame)
        if self.gif:
            picture = av.VideoFrame.from_ndarray(_paletted(frame), format="pal8")
        else:
            picture = av.VideoFrame.from_ndarray(frame, format="rgb24")
        packets = self._stream.encode(picture)
        self._container.mux(packets)
        self.frames += 1

    def _fitted(self, frame: np.ndarray) -> np.ndarray:
        height, width = self._stream.height, self._stream.width
        frame = frame[:height, :width]
        pad = ((0, height - frame.shape[0]), (0, width - frame.shape[1]), (0, 0))
        return np.ascontiguousarray(np.pad(frame, pad, constant_values=255))

    def close(self) -> Path:
        """Flush the encoder, close the file and rename it into place; its path."""
        if self._stream is not None:
            self._container.mux(self._stream.encode(None))
        self._container.close()
        self._partial.replace(self.path)
        return self.path

    def discard(self) -> None:
        """Close and remove the unfinished video."""
        self._container.close()
        self._partial.unlink(missing_ok=True)

    def __enter__(self) -> "VideoWriter":
        return self

    def __exit__(self, kind, *exc) -> None:
        if kind is None:
            self.close()
        else:
            self.discard()
