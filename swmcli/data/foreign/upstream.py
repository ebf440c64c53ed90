"""stable-worldmodel's Lance and HDF5 layouts (its 0.1.1 release and its main branch), read.

Lance: one LanceDB table ``<name>.lance`` of flat rows, ``episode_idx``/``step_idx`` int32, frames
as JPEG bytes (``binary``), every other number as ``fixed_size_list<float32>`` (scalars as lists
of one), text as ``string``; main adds a ``<name>_episodes.lance`` side table of per-episode data.
HDF5: one file, one dataset per column with the rows of every episode, ``ep_len``/``ep_offset``.

Both versions record ``World.collect``'s rows. 0.1.1 never recorded the reset frame and rotates
the actions left: row t holds observation t+1 and the action taken from it, and the last row
holds the episode's first action, wrapped around. main records the reset frame (reward NaN) and T
steps, and its rotation leaves the reset's NaN action on the last row: swm's convention already.
Importing therefore keeps every row, sets the last row's action to NaN (0.1.1's wrapped action
is not the one taken there) and a reset row's NaN reward to 0 (swm's first-row reward); ``info``
says which convention the data shows (HDF5's own ``step_idx`` starts at 1 in 0.1.1, 0 in main;
in Lance the writer renumbers it, so the last actions tell) and what was done.
"""

import contextlib
import json
from pathlib import Path

import numpy as np

from swmcli.data.foreign import jpeg
from swmcli.data.foreign.common import (
    DAMAGED_HINT,
    UPSTREAM_HDF5,
    UPSTREAM_LANCE,
    check_hdf5_stored,
    check_lengths,
    is_hdf5,
    not_rows,
    reading,
)
from swmcli.data.foreign.video import LanceVideos
from swmcli.data.storage.containment import check_hdf5, check_side
from swmcli.data.storage.lance import _mark_opened, _open_dataset
from swmcli.data.storage.schema import FOLDER_METADATA
from swmcli.errors import DatasetError, UsageError, first_line

EXPORT_KEY = "swm_export"  # swm's schema, kept by an export so a re-import restores it exactly
_SIDE_TABLES = ("_episodes.lance", "_videos.lance")
_FLAGS = ("terminated", "truncated")
_MAIN = "stable-worldmodel main: reset frame + T steps, NaN last action (swm's convention)"
_RELEASE = (
    "stable-worldmodel 0.1.1: reset frame not recorded, actions rotated (the last row holds the "
    "episode's first action)"
)
_EXPORTED = (
    "swm's export: reset frame + T steps, the last row holding the episode's first action "
    "(0.1.1's rotation)"
)


def detect(path: Path) -> str | None:
    """UPSTREAM_LANCE, UPSTREAM_HDF5 or None, from a few bytes and a directory listing."""
    if path.is_file():
        return UPSTREAM_HDF5 if is_hdf5(path) and _upstream_hdf5(path) else None
    if not path.is_dir():
        return None
    if (path / "_versions").is_dir():
        return UPSTREAM_LANCE if _upstream_manifest(path) else None
    if (path / FOLDER_METADATA).exists():
        return None
    return UPSTREAM_LANCE if _table_in(path) is not None else None


def side_tables(path: Path) -> list[Path]:
    """The side tables read beside a stable-worldmodel table named by its ``NAME.lance`` (main's
    ``NAME_episodes.lance`` and ``NAME_videos.lance``); none for a path that is no such table."""
    if path.suffix != ".lance" or path.name.endswith(_SIDE_TABLES) or detect(path) is None:
        return []
    return [_beside(path, side) for side in _SIDE_TABLES]


def _beside(table: Path, side: str) -> Path:
    """The side table ``side`` (one of ``_SIDE_TABLES``) of the table ``NAME.lance``."""
    return table.with_name(table.name[: -len(".lance")] + side)


def _table_in(path: Path) -> Path | None:
    """The one ``<name>.lance`` table of a LanceDB directory (side tables aside), else None."""
    tables = [
        p
        for p in path.glob("*.lance")
        if (p / "_versions").is_dir() and not p.name.endswith(_SIDE_TABLES)
    ]
    return tables[0] if len(tables) == 1 and _upstream_manifest(tables[0]) else None


def _upstream_manifest(table: Path) -> bool:
    """A Lance table with upstream's index columns and no swm metadata (swm's own datasets keep
    their metadata, with its format_version, in every manifest)."""
    manifests = sorted((table / "_versions").glob("*.manifest"))
    if not manifests:
        return False
    with manifests[0].open("rb") as handle:
        head = handle.read(16 * 2**20)
    return b"episode_idx" in head and b"step_idx" in head and b'"format_version"' not in head


def _upstream_hdf5(path: Path) -> bool:
    import h5py

    try:
        with h5py.File(path, "r") as file:
            return "swm" not in file.attrs and "ep_len" in file and "ep_offset" in file
    except Exception:
        return False


def _convention(last_actions: np.ndarray | None, first_steps: np.ndarray | None) -> str:
    """Which of the two conventions the data shows (said, never assumed)."""
    if first_steps is not None and len(first_steps):
        if np.all(first_steps == 1):
            return _RELEASE
        if np.all(first_steps == 0):
            return _MAIN
    if last_actions is None or not len(last_actions):
        return "unknown (no action column): rows kept as stored"
    missing = np.isnan(last_actions.reshape(len(last_actions), -1)).all(axis=1)
    if missing.all():
        return _MAIN
    if not missing.any():
        return _RELEASE
    return f"mixed: {int((~missing).sum())} of {len(missing)} episodes end on a real action"


def step_order(steps: np.ndarray, lengths: np.ndarray, where) -> np.ndarray | None:
    """The stored rows in ``step_idx`` order within each episode (row t of swm's episode is
    stored row ``order[offset + t]``); None when they are stored in that order already. Refused
    unless each episode's ``step_idx`` is a permutation of consecutive steps (a repeated or a
    missing step cannot be put in order)."""
    steps, rows = np.asarray(steps, dtype=np.int64), int(np.sum(lengths))
    if steps.size != rows:
        raise DatasetError(
            f"{where}: step_idx holds {steps.size} values (shape {steps.shape}), not one step "
            f"for each of the {rows} rows",
            DAMAGED_HINT,
        )
    steps = steps.reshape(-1)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    episode = np.repeat(np.arange(len(lengths)), lengths)
    order = np.lexsort((steps, episode))
    ordered = steps[order]
    expected = ordered[offsets][episode] + np.arange(len(steps)) - offsets[episode]
    wrong = np.flatnonzero(ordered != expected)
    if len(wrong):
        bad = int(episode[wrong[0]])
        shown = steps[offsets[bad] : offsets[bad] + min(int(lengths[bad]), 8)].tolist()
        raise DatasetError(
            f"{where}: step_idx of episode {bad} ({shown}...) is not a permutation of "
            "consecutive steps: its rows cannot be put in order",
            DAMAGED_HINT,
        )
    return None if np.array_equal(order, np.arange(len(steps))) else order


class _Alignment:
    """The two fixes that bring either convention to swm's, applied to rows as they are read."""

    def __init__(self, lengths: np.ndarray):
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        self.first_rows, self.last_rows = offsets, offsets + lengths - 1

    def apply(self, name: str, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
        if name == "action":  # an integer action is read as a float, so its last row is NaN
            values = values.astype(_as_action(name, values.dtype), copy=False)
            values[np.isin(rows, self.last_rows)] = np.nan
        elif name == "reward" and values.dtype.kind == "f":
            first = np.isin(rows, self.first_rows) & np.isnan(values.reshape(len(rows), -1)[:, 0])
            values[first] = 0
        return values

    def said(self, convention: str) -> dict:
        return {
            "convention": convention,
            "alignment": "rows kept; last row's action set to NaN; a reset row's NaN reward -> 0",
        }


# ----------------------------------------------------------------------------------- Lance


def open_lance(path: Path):
    return UpstreamLance(path)


class UpstreamLance:
    """A stable-worldmodel Lance table, rows taken with Lance's ``take``, JPEG frames decoded."""

    defaults: dict[str, str] = {}  # noqa: RUF012 - upstream already uses swm's names

    def __init__(self, path: Path):

        self.path = path if (path / "_versions").is_dir() else _table_in(path)
        if self.path is None:
            raise DatasetError(f"{path}: no stable-worldmodel Lance table in it", DAMAGED_HINT)
        _mark_opened()  # this process now holds Lance: the DataLoader must not fork from it
        # Read as swm's own Lance datasets are: through io_uring where the kernel allows it.
        self._dataset = self._guard(lambda: _open_dataset(self.path, uring=True))
        schema = self._dataset.schema
        self._exported = _exported_schema(schema.metadata or {}, self.path)
        self._images, self._dims, self.columns, dropped = {}, {}, {}, {}
        self.lengths = self._episode_lengths()
        first_row = self._guard(lambda: self._dataset.take([0])) if len(self.lengths) else None
        for field in schema:
            self._add_column(field, first_row, dropped)
        self._align = _Alignment(self.lengths)
        self._videos = self._video_table()
        last = None
        if "action" in self.columns and len(self.lengths):
            last = self._numbers("action", self._align.last_rows)
        self.info = {**self._codec(first_row), **self._align.said(_convention(last, None))}
        side = _beside(self.path, "_episodes.lance")
        if side.is_dir():
            dropped["episode data table"] = side.name
        if dropped:
            self.info["not_imported"] = dropped
        if self._exported:
            self.info["exported_by"] = "swm (its dtypes and shapes restored)"
            self.info.update(self._align.said(_EXPORTED))

    def _guard(self, read):
        with reading(self.path):
            return read()

    def _episode_lengths(self) -> np.ndarray:
        """Rows of each episode (its rows contiguous), and ``self._order``: the stored rows in
        ``step_idx`` order (None when stored so)."""
        names = [n for n in ("episode_idx", "step_idx") if n in self._dataset.schema.names]
        table = self._guard(lambda: self._dataset.to_table(columns=names))
        ids = table.column("episode_idx").to_numpy()
        if not len(ids):
            raise UsageError(f"{self.path} holds no episodes", hint="nothing to read in it")
        starts = np.flatnonzero(np.diff(ids) != 0) + 1
        self._episode_ids = ids[np.concatenate([[0], starts])]
        if len(np.unique(ids[np.concatenate([[0], starts])])) != len(starts) + 1:
            raise DatasetError(f"{self.path}: an episode's rows are not contiguous", DAMAGED_HINT)
        lengths = check_lengths(
            np.diff(np.concatenate([[0], starts, [len(ids)]])), len(ids), self.path
        )
        steps = table.column("step_idx").to_numpy() if "step_idx" in names else None
        self._order = None if steps is None else step_order(steps, lengths, self.path)
        return lengths

    def _add_column(self, field, first_row, dropped: dict) -> None:
        import pyarrow as pa

        name, kind = field.name, field.type
        if name in ("episode_idx", "step_idx"):
            return
        if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
            blob = first_row.column(name)[0].as_py() if first_row is not None else b""
            self._images[name] = jpeg.frame_shape(blob, f"{self.path} ({name})")
            self.columns[name] = (np.dtype(np.uint8), self._images[name])
        elif pa.types.is_fixed_size_list(kind) and pa.types.is_floating(kind.value_type):
            self._dims[name] = kind.list_size
            if name in self._exported:
                dtype, shape = self._exported[name]
                if int(np.prod(shape)) != kind.list_size:
                    raise DatasetError(
                        f"{self.path}: its {EXPORT_KEY} metadata gives {name} the shape {shape}, "
                        f"its column holds {kind.list_size} numbers a row",
                        DAMAGED_HINT,
                    )
                self.columns[name] = (_as_action(name, dtype), shape)
            elif kind.list_size == 1 and name != "action":
                self.columns[name] = (np.dtype(bool if name in _FLAGS else np.float32), ())
            else:
                self.columns[name] = (np.dtype(np.float32), (kind.list_size,))
        else:
            dropped[name] = f"{kind} (swm stores numbers and frames)"

    def _video_table(self):
        """main's ``lance_video`` layout: frames as MP4 blobs in ``<name>_videos.lance``."""
        table = _beside(self.path, "_videos.lance")
        check_side(self.path.parent, table)
        if not table.is_dir() or not len(self.lengths):
            return None
        videos = self._guard(
            lambda: LanceVideos(table, self._episode_ids, self._align.first_rows, self.lengths)
        )
        self.columns.update(videos.columns)
        return videos

    def _codec(self, first_row) -> dict:
        """Each image column's codec, by its first frame (``decode`` holds the others to it)."""
        said = {name: jpeg.codec(first_row.column(name)[0].as_py()) for name in self._images}
        self._codecs = {name: codec for name, (codec, _) in said.items()}
        if self._videos is not None and self._videos.columns:
            frames = ", ".join(self._videos.columns)
            return {"codec": f"{self._videos.codec} (lance_video)", "lossy": f"frames ({frames})"}
        if not self._images:
            return {"codec": None, "lossy": False}
        lossy = [name for name, (_, lossy) in said.items() if lossy]
        frames = f"frames ({', '.join(lossy)}); " if lossy else ""
        codec = ", ".join(sorted(set(self._codecs.values())))
        return {"codec": codec, "lossy": f"{frames}numbers are float32 as stored"}

    def _take(self, names: list[str], rows: np.ndarray):
        if self._order is not None:  # swm's rows are in step order; the stored ones may not be
            rows = self._order[rows]
        unique, inverse = np.unique(rows, return_inverse=True)
        return self._guard(lambda: self._dataset.take(unique, columns=names)), inverse

    def _numbers(self, name: str, rows: np.ndarray, taken=None) -> np.ndarray:
        table, inverse = taken or self._take([name], rows)
        column = table.column(name)
        flat = column.combine_chunks().flatten().to_numpy(zero_copy_only=False)
        dtype, shape = self.columns[name]
        values = flat.reshape(len(column), self._dims[name])[inverse]
        cast = values != 0 if dtype.kind == "b" else values.astype(dtype, copy=False)
        return cast.reshape(len(rows), *shape)

    def read(self, name: str, rows: np.ndarray) -> np.ndarray:
        if self._videos is not None and name in self._videos.columns:
            return self._guard(lambda: self._videos.read(name, rows))
        if name in self._images:
            table, inverse = self._take([name], rows)
            blobs = table.column(name).to_pylist()
            where = f"{self.path} ({name})"
            return jpeg.decode(blobs, self._images[name], where, self._codecs[name])[inverse]
        return self._align.apply(name, rows, np.array(self._numbers(name, rows)))

    def read_many(self, names: list[str], rows: np.ndarray) -> dict[str, np.ndarray]:
        """Several columns at these rows: every number column in one Lance take."""
        numbers = [name for name in names if name in self._dims]
        taken = self._take(numbers, rows) if numbers else None
        values = {
            name: self._align.apply(name, rows, np.array(self._numbers(name, rows, taken)))
            for name in numbers
        }
        return {name: values[name] if name in values else self.read(name, rows) for name in names}

    def close(self) -> None:
        self._dataset = None


def _exported_schema(metadata: dict, where) -> dict:
    """The schema an swm export keeps in the table's metadata (``{}`` when there is none),
    every entry checked: a dtype of numbers, a shape of at most 8 sides >= 1."""
    raw = metadata.get(EXPORT_KEY.encode())
    if raw is None:
        return {}
    try:
        said = json.loads(raw)
    except ValueError as error:
        raise DatasetError(
            f"{where}: its {EXPORT_KEY} metadata is damaged (not JSON: {first_line(error)})",
            DAMAGED_HINT,
        ) from None
    keys = said.get("keys") if isinstance(said, dict) else None
    if not isinstance(keys, dict):
        raise DatasetError(
            f"{where}: its {EXPORT_KEY} metadata is damaged: it holds no object \"keys\" "
            '(swm\'s export writes {"keys": {"NAME": [DTYPE, SHAPE]}})',
            DAMAGED_HINT,
        )
    return {str(name): _exported_column(name, entry, where) for name, entry in keys.items()}


def _exported_column(name, entry, where) -> tuple:
    """One column of an export's schema: ``[DTYPE, SHAPE]``, a dtype of numbers and a shape of
    at most 8 sides >= 1, else a DatasetError naming the column and what it holds."""
    dtype = None
    if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str):
        shape = entry[1]
        sides = isinstance(shape, list) and all(type(n) is int and n >= 1 for n in shape)
        with contextlib.suppress(TypeError):  # no dtype numpy knows
            dtype = np.dtype(entry[0]) if sides and len(shape) <= 8 else None
    if dtype is None or dtype.kind not in "biuf":
        raise DatasetError(
            f"{where}: its {EXPORT_KEY} metadata gives {name} {json.dumps(entry)[:80]}, not "
            "[DTYPE, SHAPE] of numbers (a shape of at most 8 sides >= 1)",
            DAMAGED_HINT,
        )
    return dtype, tuple(entry[1])


def _as_action(name: str, dtype) -> np.dtype:
    """A column's dtype as swm reads it: an action is a float (its episode's last row NaN)."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if name == "action" and dtype.kind != "f" else dtype


# ----------------------------------------------------------------------------------- HDF5


def open_hdf5(path: Path):
    return UpstreamHdf5(path)


class UpstreamHdf5:
    """A stable-worldmodel HDF5 file: flat columns, ``ep_len``/``ep_offset``."""

    defaults: dict[str, str] = {}  # noqa: RUF012 - upstream already uses swm's names

    def __init__(self, path: Path):
        import h5py

        self.path = path
        self._file = None
        with reading(path, on_error=self.close):
            self._file = h5py.File(path, "r")
            check_hdf5(self._file, path)
            self._open()

    def _whole(self, name: str) -> np.ndarray:
        dataset = self._file[name]
        check_hdf5_stored(name, dataset, self.path)
        return dataset[()]

    def _open(self) -> None:
        import h5py

        rows = None
        self.columns, dropped = {}, {}
        for name, dataset in self._file.items():
            if name in ("ep_len", "ep_offset") or not isinstance(dataset, h5py.Dataset):
                continue
            if dataset.dtype.kind not in "biuf" or not dataset.shape:
                dropped[name] = not_rows(dataset.dtype)
                continue
            check_hdf5_stored(name, dataset, self.path)
            if rows is not None and dataset.shape[0] != rows:
                raise DatasetError(f"{self.path}: columns of different lengths", DAMAGED_HINT)
            rows = dataset.shape[0]
            self.columns[name] = (_as_action(name, dataset.dtype), tuple(dataset.shape[1:]))
        self.lengths = check_lengths(self._whole("ep_len"), rows or 0, self.path)
        offsets = self._whole("ep_offset")
        if not np.array_equal(offsets, np.concatenate([[0], np.cumsum(self.lengths)[:-1]])):
            raise DatasetError(f"{self.path}: ep_offset does not follow ep_len", DAMAGED_HINT)
        self._align = _Alignment(self.lengths)
        first_steps, self._order = None, None
        if self.columns.pop("step_idx", None) is not None:  # swm keeps its own step index
            steps = self._whole("step_idx")
            self._order = step_order(steps, self.lengths, self.path)
            first_steps = self._rows("step_idx", self._align.first_rows)
        last = self._rows("action", self._align.last_rows) if "action" in self.columns else None
        images = [n for n, (dtype, shape) in self.columns.items() if len(shape) >= 2]
        self.info = {
            "codec": "raw uint8 (uncompressed)" if images else None,
            "lossy": False,
            **self._align.said(_convention(last, first_steps)),
        }
        if dropped:
            self.info["not_imported"] = dropped
        if EXPORT_KEY in self._file.attrs:
            self.info["exported_by"] = "swm"
            self.info.update(self._align.said(_EXPORTED))

    def _rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        dataset = self._file[name]
        if self._order is not None:  # swm's rows are in step order; the stored ones may not be
            rows = self._order[rows]
        unique, inverse = np.unique(rows, return_inverse=True)
        if len(unique) and unique[-1] - unique[0] + 1 == len(unique):  # one contiguous run
            values = dataset[int(unique[0]) : int(unique[-1]) + 1]
        else:
            values = dataset[unique] if len(unique) else dataset[0:0]
        return values[inverse]

    def read(self, name: str, rows: np.ndarray) -> np.ndarray:
        with reading(self.path):
            values = self._rows(name, rows)
        return self._align.apply(name, rows, values)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
