"""What the foreign readers share: the layouts' names, the source protocol, and the checks that
keep an untrusted file inside its dataset and its claimed sizes honest.
"""

from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import numpy as np

from swmcli.data.storage.schema import Schema
from swmcli.errors import DatasetError, SwmError, UsageError, first_line

UPSTREAM_LANCE = "stable-worldmodel-lance"


UPSTREAM_HDF5 = "stable-worldmodel-hdf5"


UPSTREAM_FOLDER = "stable-worldmodel-folder"


UPSTREAM_VIDEO = "stable-worldmodel-video"


MINARI = "minari"


LEROBOT = "lerobot"


UPSTREAM = (UPSTREAM_LANCE, UPSTREAM_HDF5, UPSTREAM_FOLDER, UPSTREAM_VIDEO)


FOREIGN_FORMATS = (*UPSTREAM, MINARI, LEROBOT)


DAMAGED_HINT = "the dataset is damaged or not what it claims to be: re-download or re-export it"


class Source(Protocol):
    """What a foreign layout's module offers the front: rows already in swm's convention."""

    lengths: np.ndarray  # rows of each episode, in swm's convention
    columns: Schema  # source column name -> (dtype, per-row shape) as read
    info: dict  # what to tell the user: convention, codec, lossy, dropped columns ...
    defaults: dict[str, str]  # source column -> swm key where the name alone does not say it

    def read(self, name: str, rows: np.ndarray) -> np.ndarray: ...
    def close(self) -> None: ...


def is_hdf5(path: Path) -> bool:
    """Whether the file at ``path`` starts with HDF5's signature."""
    with path.open("rb") as handle:
        return handle.read(8) == b"\x89HDF\r\n\x1a\n"


@contextmanager
def reading(path, on_error: Callable[[], None] | None = None):
    """Whatever a damaged file makes h5py, Lance or Pillow raise becomes one DatasetError line
    (``on_error`` runs first, e.g. to close the file)."""
    try:
        yield
    except BaseException as error:
        if on_error is not None:
            on_error()
        if isinstance(error, SwmError) or not isinstance(error, Exception):
            raise
        raise DatasetError(f"cannot read {path}: {_cause(error)}", DAMAGED_HINT) from None


def _cause(error: Exception) -> str:
    """What went wrong, in words: a file's error (the OS's, PyAV's) as the file and its cause,
    without the ``[Errno N]`` of its text."""
    cause, filename = getattr(error, "strerror", None), getattr(error, "filename", None)
    if isinstance(cause, str) and cause and filename:
        video = " (not a video FFmpeg decodes)" if type(error).__module__.startswith("av") else ""
        return f"{filename}: {cause}{video}"
    return first_line(error)


def check_stored(name: str, claimed_bytes: int, stored_bytes: int, where, ratio: int = 1) -> None:
    """Refuse a header that claims more bytes than are stored (times ``ratio`` for compressed
    data): what a hostile or truncated file would otherwise make swm allocate."""
    if claimed_bytes > max(stored_bytes, 0) * ratio:
        compressed = f" (compressed, they expand at most {ratio}x)" if ratio > 1 else ""
        raise DatasetError(
            f"{where}: {name} claims {claimed_bytes} bytes but only {stored_bytes} are "
            f"stored{compressed}",
            DAMAGED_HINT,
        )


HDF5_EXPANSION = 1000  # what a chunk through HDF5's filters (gzip, LZ4, ...) expands to at most


def check_hdf5_stored(name: str, dataset, where) -> None:
    """``check_stored`` for an h5py dataset: its shape's bytes against the bytes the file holds
    for it (times ``HDF5_EXPANSION`` when it goes through a filter)."""
    claimed = int(np.prod(dataset.shape, dtype=np.int64)) * dataset.dtype.itemsize
    filtered = dataset.id.get_create_plist().get_nfilters() > 0
    ratio = HDF5_EXPANSION if filtered else 1
    check_stored(name, claimed, dataset.id.get_storage_size(), where, ratio)


def check_lengths(lengths: np.ndarray, rows: int, where) -> np.ndarray:
    """Episode lengths that are positive and add up to the rows stored; none at all is an empty
    dataset, said as such (not as damage)."""
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or lengths.dtype.kind not in "iu":
        raise DatasetError(f"{where}: the episode lengths are not a list of integers", DAMAGED_HINT)
    if not len(lengths):
        raise UsageError(f"{where} holds no episodes", hint="nothing to read in it")
    lengths = lengths.astype(np.int64)
    if np.any(lengths <= 0):
        bad = int(np.flatnonzero(lengths <= 0)[0])
        raise DatasetError(
            f"{where}: episode {bad} has {int(lengths[bad])} rows (an episode has at least one)",
            DAMAGED_HINT,
        )
    total = sum(lengths.tolist())  # Python ints: lengths near 2**63 must not wrap to ``rows``
    if total != rows:
        raise DatasetError(
            f"{where}: episode lengths add up to {total} rows, {rows} are stored",
            DAMAGED_HINT,
        )
    return lengths



def not_rows(dtype) -> str:
    """Why a stored column that is not one value (or array) a row is left out: it holds no
    numbers, or a single number."""
    if np.dtype(dtype).kind in "biuf":
        return f"a single {dtype} value, not one a row"
    return f"{dtype} (swm stores numbers and frames)"
