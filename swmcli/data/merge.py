"""Several datasets into one (what ``swm merge`` runs), through ``copy.py``'s verified, atomic copy.

Every source is opened and checked first: the same keys with the same dtypes and shapes, the
same env, resolution and action dim (what appending to a dataset checks), episodes in each, and a
destination that is none of them, inside none of them and holds none of them; only then is
anything written. The sources' episodes are then read as one dataset (``Concatenation``: source
after source, each in its own order) through the copy's one loop, checked against their own
checksums as they are read, verified once written and renamed into place. ``heldout`` moves the
first source's last episodes to the end, where ``swm eval`` takes its held-out episodes from, so
a run trained on the merge is evaluated on the same episodes as one trained on that source.
"""

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from swmcli.data.copy import (
    Copied,
    check_source,
    destination_lock,
    temporary_path,
    write_into_place,
)
from swmcli.data.foreign.reader import ForeignReader
from swmcli.data.formats import open_reader, open_writer, resolve_format
from swmcli.data.storage.checksums import check_episode
from swmcli.data.storage.location import Location, as_location
from swmcli.data.storage.schema import AGREEING_METADATA, WRITER_METADATA, metadata_conflict
from swmcli.errors import UsageError

Order = list[tuple[int, int]]  # (source, episode of that source) for each episode written


class Concatenation:
    """The episodes of several open readers as one dataset, in ``order``: what
    ``copy.write_into_place`` reads. Each episode is checked against its own source's checksums
    as it is read (a damaged one is named by its source and index there), so nothing is left
    for the copy's own check (``read_checksums`` is None)."""

    def __init__(self, readers: Sequence, paths: Sequence[Location], order: Order):
        self._readers, self._order = readers, order
        self.path = " + ".join(map(str, paths))
        self.keys = readers[0].keys
        lengths = [readers[source].episode_lengths[index] for source, index in order]
        self.episode_lengths = np.asarray(lengths, dtype=np.int64)
        self.num_episodes = len(order)
        self.num_steps = int(self.episode_lengths.sum())

    @property
    def nbytes_on_disk(self) -> int:
        return sum(reader.nbytes_on_disk for reader in self._readers)

    def read_episode(self, index: int, keys=None) -> dict[str, np.ndarray]:
        source, own = self._order[index]
        reader = self._readers[source]
        episode = reader.read_episode(own, keys)
        check_episode(reader, own, episode)
        return episode

    def read_checksums(self, index: int) -> None:
        return None  # checked by ``read_episode``, against the source's own


def _episode_order(counts: Sequence[int], heldout: int, first: Location) -> Order:
    """Every source's episodes, source after source, each in its order; the first source's
    last ``heldout`` episodes moved to the end (``first`` names it in a refusal)."""
    if not 0 <= heldout <= counts[0]:
        raise UsageError(
            f"--heldout {heldout}: the first source, {first}, holds {counts[0]} episodes",
            hint=f"pass a --heldout from 0 to {counts[0]}, or put another source first",
        )
    kept = counts[0] - heldout
    order = [(0, index) for index in range(kept)]
    order += [
        (source, index) for source in range(1, len(counts)) for index in range(counts[source])
    ]
    return order + [(0, index) for index in range(kept, counts[0])]


def merge_datasets(
    sources: Sequence[str | Path],
    dst: str | Path,
    to: str | None = None,
    overwrite: bool = False,
    on_episode: Callable[[int, int], None] | None = None,
    mapping: Mapping[str, str] | None = None,
    heldout: int = 0,
) -> Copied:
    """Merge the datasets ``sources`` (two or more, any format swm reads) into ``dst`` (format
    ``to``, else from the suffix, else lance): every episode, in the order the sources are given,
    the first source's last ``heldout`` written last. ``mapping`` (``--map``) renames the
    columns of every source that holds them. Checked before anything is written; streamed,
    verified and renamed into place under ``dst``'s writer lock; returns what was written."""
    sources, dst = [as_location(source) for source in sources], as_location(dst)
    if len(sources) < 2:
        raise UsageError(
            f"merge needs two or more sources, got {len(sources)}",
            hint="swm merge SRC SRC... DST: the last path is the dataset written",
        )
    readers = []
    try:
        for source, names in zip(sources, _mappings(sources, mapping or {}), strict=True):
            readers.append(open_reader(source, names))
        _check_alike(sources, readers)
        order = _episode_order([r.num_episodes for r in readers], heldout, sources[0])
        with destination_lock(dst, sources):
            for source, reader in zip(sources, readers, strict=True):
                check_source(reader, source, dst, None, overwrite)
            merged = Concatenation(readers, sources, order)
            fmt = resolve_format(temporary_path(dst), to)
            metadata = _merged_metadata(sources, readers, order)

            def writer(temporary):
                return open_writer(temporary, format=fmt, mode="error", metadata=metadata)

            return write_into_place(merged, tuple(sources), dst, list(merged.keys), writer, fmt,
                                    on_episode)  # fmt: skip
    finally:
        for reader in readers:
            reader.close()


def _mappings(sources: Sequence[Location], mapping: Mapping[str, str]) -> list[dict[str, str]]:
    """Each source's share of ``--map``: the pairs naming one of its columns (another tool's
    own column names, or swm's keys); a pair naming no source's column is refused."""
    if not mapping:
        return [{} for _ in sources]
    columns = []
    for source in sources:
        reader = open_reader(source)
        try:
            columns.append(
                set(reader.columns if isinstance(reader, ForeignReader) else reader.keys)
            )
        finally:
            reader.close()
    unknown = [name for name in mapping if not any(name in own for own in columns)]
    if unknown:
        raise UsageError(
            f"--map names {', '.join(map(repr, unknown))}, a column of no source",
            hint="`swm info SRC` shows each source's columns",
        )
    return [{k: v for k, v in mapping.items() if k in own} for own in columns]


def _check_alike(sources: Sequence[Location], readers: Sequence) -> None:
    """Refuse, in one line naming both, a source whose env, resolution or action dim (when both
    record it), or whose keys, dtypes or shapes, differ from the first's."""
    first, first_reader = sources[0], readers[0]
    for source, reader in zip(sources[1:], readers[1:], strict=True):
        if conflict := metadata_conflict(first_reader.metadata, reader.metadata):
            field, mine, theirs = conflict
            raise UsageError(
                f"{first} and {source} differ in {field}: {mine} in the first, {theirs} in the "
                "second",
                hint="merge datasets of one env, resolution and action size (`swm info` shows "
                "each one's)",
            )
        for key in dict.fromkeys([*first_reader.keys, *reader.keys]):
            mine, theirs = first_reader.keys.get(key), reader.keys.get(key)
            if mine != theirs:
                raise UsageError(
                    f"{first} and {source} differ in {key!r}: {_row(mine)} in the first, "
                    f"{_row(theirs)} in the second",
                    hint=_mismatch_hint(key, mine, theirs),
                )


def _row(shape_of: tuple | None) -> str:
    if shape_of is None:
        return "absent"
    dtype, shape = shape_of
    return f"{np.dtype(dtype).name} {tuple(shape)}"


def _mismatch_hint(key: str, mine: tuple | None, theirs: tuple | None) -> str:
    if mine is None or theirs is None:
        return (
            f"rename the column that holds it in the other source (--map NAME={key}), or leave "
            f"it out of every source (--map {key}=)"
        )
    return (
        f"merge datasets collected alike (`swm info` shows each one's keys), or leave {key!r} "
        f"out of every source (--map {key}=)"
    )


def _json(value) -> str:
    return json.dumps(value, sort_keys=True)


def _merged_metadata(sources: Sequence[Location], readers: Sequence, order: Order) -> dict:
    """The merge's metadata: the fields every source agrees on; the env, resolution and
    action dim any of them records; and ``merged_from``: each source, its episodes, where they
    went (ranges of the merge's episodes) and the fields in which it differs."""
    fields = [{k: v for k, v in r.metadata.items() if k not in WRITER_METADATA} for r in readers]
    merged = {
        key: value
        for key, value in fields[0].items()
        if all(key in other and _json(other[key]) == _json(value) for other in fields)
    }
    for field in AGREEING_METADATA:
        merged[field] = next((f[field] for f in fields if f.get(field) is not None), None)
    merged["merged_from"] = [
        {
            "dataset": str(source),
            "episodes": reader.num_episodes,
            "written_as": _ranges([i for i, (s, _) in enumerate(order) if s == number]),
            "metadata": {k: v for k, v in own.items() if k not in merged},
        }
        for number, (source, reader, own) in enumerate(zip(sources, readers, fields, strict=True))
    ]
    return merged


def _ranges(indices: list[int]) -> list[list[int]]:
    """``[0, 1, 2, 7, 8]`` -> ``[[0, 3], [7, 9]]``: runs of consecutive indices, stop excluded."""
    runs: list[list[int]] = []
    for index in indices:
        if runs and runs[-1][1] == index:
            runs[-1][1] += 1
        else:
            runs.append([index, index + 1])
    return runs
