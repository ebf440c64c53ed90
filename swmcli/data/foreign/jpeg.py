"""JPEG frames of foreign datasets: decoded with Pillow, sizes checked before anything is
allocated, and the encoder's quality read back from the quantization tables."""

import functools
import io

import numpy as np

from swmcli.errors import DatasetError

_WIDE_MODES = ("I", "I;16", "I;16B", "I;16L", "I;16N", "F")  # Pillow's modes beyond 8 bits
# A frame side beyond this is refused (no world-model dataset comes near it), and so is a frame
# that would decode to more than this many times its compressed bytes (JPEG cannot reach it).
MAX_SIDE = 8192
MAX_EXPANSION = 4096

# The IJG (libjpeg) base luminance table (natural order) its ``quality`` setting scales.
_IJG_LUMINANCE = np.array(
    [16, 11, 10, 16, 24, 40, 51, 61, 12, 12, 14, 19, 26, 58, 60, 55,
     14, 13, 16, 24, 40, 57, 69, 56, 14, 17, 22, 29, 51, 87, 80, 62,
     18, 22, 37, 56, 68, 109, 103, 77, 24, 35, 55, 64, 81, 104, 113, 92,
     49, 64, 78, 87, 103, 121, 120, 101, 72, 92, 95, 98, 112, 100, 103, 99],
    dtype=np.int64,
)  # fmt: skip


def _open(blob: bytes, where):
    from PIL import Image

    try:
        image = Image.open(io.BytesIO(blob))
    except Exception as error:
        raise DatasetError(f"{where}: a frame is not a readable image ({error})") from None
    if image.mode in _WIDE_MODES:
        raise DatasetError(
            f"{where}: a frame of {image.format} mode {image.mode} (more than 8 bits a channel): "
            "swm stores frames as uint8 and would clip it at 255",
            hint="store the frames as 8-bit RGB, or the values as a number column",
        )
    width, height = image.size
    if max(width, height) > MAX_SIDE or width * height * 3 > MAX_EXPANSION * max(len(blob), 1):
        raise DatasetError(
            f"{where}: a frame claims {width}x{height} pixels from {len(blob)} bytes"
        )
    return image


def frame_shape(blob: bytes, where) -> tuple[int, int, int]:
    """(H, W, 3) of a frame, read from its header (nothing decoded)."""
    width, height = _open(blob, where).size
    return (height, width, 3)


def decode(blobs: list[bytes], shape: tuple[int, ...], where, codec: str | None = None):
    """Frames as ``(len(blobs), *shape)`` uint8 RGB; one of another size is a DatasetError, and
    so is one of another ``codec`` than the one said of the column (``JPEG quality 95``, ``PNG
    (lossless)``, as ``codec`` names them): a column said lossless holds no JPEG."""
    out = np.empty((len(blobs), *shape), dtype=np.uint8)
    for i, blob in enumerate(blobs):
        image = _open(blob, where)
        if (image.size[1], image.size[0], 3) != tuple(shape):
            raise DatasetError(f"{where}: frames of two sizes, {shape[:2]} and {image.size[::-1]}")
        if codec is not None and _described(image)[0] != codec:
            raise DatasetError(
                f"{where}: a frame is {_described(image)[0]}, the column's first {codec}: frames "
                "of mixed codecs (swm says one codec, and whether it is lossy, per column)",
                hint="re-encode the column's frames with one codec",
            )
        try:
            out[i] = np.asarray(image.convert("RGB"))
        except Exception as error:
            raise DatasetError(f"{where}: a frame does not decode ({error})") from None
    return out


def codec(blob: bytes) -> tuple[str, bool]:
    """What a frame's bytes are, as ``swm info`` says it, and whether that codec is lossy:
    ``JPEG quality 95``, ``JPEG (quality unknown)``, ``PNG (lossless)``, another image format."""
    from PIL import Image

    try:
        image = Image.open(io.BytesIO(blob))
    except Exception:
        return "JPEG (quality unknown)", True
    return _described(image)


def _described(image) -> tuple[str, bool]:
    """``codec`` of an opened image: its format, and a JPEG's quality from its first table."""
    tables = getattr(image, "quantization", None) or {}
    first = tuple(tables[min(tables)]) if tables else None
    return _named(image.format, first)


@functools.lru_cache(maxsize=64)
def _named(kind: str | None, table: tuple | None) -> tuple[str, bool]:
    if kind == "JPEG" or kind is None:
        setting = _quality(table)
        return (f"JPEG quality {setting}" if setting else "JPEG (quality unknown)"), True
    if kind == "PNG":
        return "PNG (lossless)", False
    return kind, kind not in ("BMP", "TIFF", "PPM")


def _quality(table: tuple | None) -> int | None:
    """The IJG quality setting (1..100) that produced this JPEG luminance ``table``, or None
    when it matches no setting exactly (another encoder, a custom table, not a JPEG)."""
    if not table or len(table) != 64:
        return None
    stored = np.sort(np.asarray(table, dtype=np.int64))  # order-free: zigzag or natural
    for setting in range(1, 101):
        scale = 5000 // setting if setting < 50 else 200 - 2 * setting
        scaled = np.clip((_IJG_LUMINANCE * scale + 50) // 100, 1, 255)
        if np.array_equal(np.sort(scaled), stored):
            return setting
    return None
