"""``--map COLUMN=KEY``: a dataset's columns under the names the user chooses, for every source.

``parse_mapping`` reads the flag; ``map_columns`` decides each column's key (the user's name,
else the source's default) and checks the result once: every name given is a column, every key a
plain name, no two columns on one key; ``COLUMN=`` leaves a column out. Another tool's dataset is
renamed by its reader (``foreign/reader.py``); swm's own datasets by ``MappedReader``, a front
over any swm reader that reads the same rows under the new keys, checksums and all. An export
then names its columns from those keys (``--map state=observation.state`` chooses LeRobot's).
"""

from collections.abc import Mapping

import numpy as np

from swmcli.data.storage.checksums import CHECKSUM_COLUMN
from swmcli.data.storage.schema import INDEX_COLUMNS, check_keys
from swmcli.errors import DatasetError, UsageError
from swmcli.names import bad_name


def parse_mapping(pairs: list[str] | None) -> dict[str, str]:
    """``["observation.image=pixels", ...]`` -> ``{"observation.image": "pixels"}``; an empty
    KEY (``COLUMN=``) leaves the column out."""
    mapping = {}
    for pair in pairs or []:
        source, sep, target = (part.strip() for part in pair.partition("="))
        if not sep or not source:
            raise UsageError(f"--map takes COLUMN=KEY, got {pair!r}", hint="e.g. --map rgb=pixels")
        if source in mapping:
            raise UsageError(
                f"--map {source} is given twice ({source}={mapping[source]} and {source}={target})",
                hint="map each column once",
            )
        mapping[source] = target
    return mapping


def map_columns(
    path, columns, mapping: Mapping[str, str], defaults: Mapping[str, str] | None = None
) -> dict[str, str]:
    """swm key -> source column for every column kept: ``mapping`` first, then ``defaults``,
    else the column's own name. A name in ``mapping`` that is no column, a key that is not a
    plain name, or two columns on one key is one clear error before anything is read."""
    defaults = defaults or {}
    unknown = [name for name in mapping if name not in columns]
    if unknown:
        raise UsageError(
            f"--map names {', '.join(map(repr, unknown))}, not a column of {path}",
            hint=f"its columns: {', '.join(columns)}",
        )
    names = {}
    for name in columns:
        key = mapping.get(name, defaults.get(name, name))
        if not key:
            continue
        _check_key(path, name, key, given=name in mapping)
        if key in names or key in INDEX_COLUMNS:
            raise UsageError(
                f"{name!r} and {names.get(key, 'the index')!r} both map to {key!r}",
                hint="give one of them another name with --map COLUMN=KEY (COLUMN= leaves it out)",
            )
        names[key] = name
    if not names:
        raise UsageError(f"--map leaves no column of {path}", hint="keep at least one")
    return names


def _check_key(path, name: str, key: str, given: bool) -> None:
    """A key names files and columns of what is written from it: checked before any is."""
    why = bad_name(key)
    if why is None:
        return
    if given:
        raise UsageError(
            f"--map {name}={key}: the key {key!r} {why}",
            hint="map it to a plain name: letters, digits, '_', '-', '.' (no '/', no '..')",
        )
    raise DatasetError(
        f"{path}: its column {name!r} would become the key {key!r}, which {why}",
        hint="a dataset names its keys with plain names: give this one another with --map "
        f"'{name}=NAME', or leave it out with --map '{name}='",
    )


def said(names: Mapping[str, str], columns) -> dict:
    """What ``swm info`` shows of a mapping: the columns renamed, and those left out."""
    renamed = {name: key for key, name in names.items() if name != key}
    shown = {"mapping": renamed or "same names"}
    left_out = [name for name in columns if name not in names.values()]
    if left_out:
        shown["left_out_by_map"] = left_out
    return shown


class MappedReader:
    """One of swm's own readers under the keys ``--map`` gives: the same rows, renamed or left
    out; each stored checksum stays with its column, so copies and streams still check them."""

    def __init__(self, reader, mapping: Mapping[str, str]):
        self._reader = reader
        self._names = map_columns(reader.path, reader.keys, mapping)  # key -> stored key
        self.keys = {key: reader.keys[name] for key, name in self._names.items()}
        stored = list(reader.keys)
        self._columns = [stored.index(name) for name in self._names.values()]
        self.metadata = {**reader.metadata, **said(self._names, reader.keys)}
        for name in ("path", "format", "num_episodes", "num_steps", "episode_lengths"):
            setattr(self, name, getattr(reader, name))
        self.episode_offsets = reader.episode_offsets
        self.metadata_sealed = reader.metadata_sealed
        self.index_token = getattr(reader, "index_token", None)

    @property
    def nbytes_on_disk(self) -> int:
        return self._reader.nbytes_on_disk

    def read_rows(self, key: str, rows: np.ndarray, out=None) -> np.ndarray:
        check_keys(self.keys, [key], self.path)
        return self._reader.read_rows(self._names[key], rows, out)

    def read_columns(self, keys: list[str], rows: np.ndarray, checksums: bool = False) -> dict:
        check_keys(self.keys, keys, self.path)
        values = self._reader.read_columns([self._names[key] for key in keys], rows, checksums)
        mapped = {key: values[self._names[key]] for key in keys}
        if checksums:
            mapped[CHECKSUM_COLUMN] = values[CHECKSUM_COLUMN][:, self._columns]
        return mapped

    def read_episode(self, index: int, keys=None) -> dict[str, np.ndarray]:
        keys = check_keys(self.keys, keys, self.path)
        episode = self._reader.read_episode(index, [self._names[key] for key in keys])
        return {key: episode[self._names[key]] for key in keys}

    def read_checksums(self, index: int) -> np.ndarray:
        return self._reader.read_checksums(index)[:, self._columns]

    def read_row_checksums(self, rows: np.ndarray) -> np.ndarray:
        return self._reader.read_row_checksums(rows)[:, self._columns]

    def close(self) -> None:
        self._reader.close()
