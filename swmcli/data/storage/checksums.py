"""Checksums written with the data: one CRC-32 per row and key, and one per metadata field.

Each writer stores, beside each row, the CRC-32 of that row's bytes for every episode key (in
schema order) in the column ``swm_crc32`` (``(rows, keys)`` uint32), in the same atomic write as
the row itself. ``verify`` re-reads every episode and compares; ``convert`` checks each episode
it copies, so the destination's checksums are the source's (a damaged source is refused, never
laundered into a clean-looking copy); a streamed reader checks each row the first time this
process reads it (``RowChecks``).

What gives the rows their meaning is sealed too: the dataset metadata (schema: dtype and shape
per key; env id, resolution, action dim, format version, pixel encoding) carries the CRC-32 of
each of its fields under ``field_crc32`` (``seal_metadata``), and every reader checks it on every
open (``unseal_metadata``), so a dataset whose schema or metadata changed is refused before a
row is read. Other tools' datasets (read through ``data/foreign``) carry neither: their reads are
checked for structure only.
"""

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
from isal.isal_zlib import crc32  # zlib's CRC-32, ~7x faster (PCLMUL): streamed rows are checked

from swmcli.errors import DatasetError

CHECKSUM_COLUMN = "swm_crc32"
SEAL_FIELD = "field_crc32"  # the metadata field holding the other fields' CRC-32s
_METADATA_HINT = "the dataset's metadata is damaged: restore the dataset, or collect again"


def row_checksums(episode: Mapping[str, np.ndarray], keys: list[str]) -> np.ndarray:
    """``(rows, len(keys))`` uint32: the CRC-32 of each row's bytes, key by key."""
    rows = len(next(iter(episode.values())))
    sums = np.empty((rows, len(keys)), dtype=np.uint32)
    for column, key in enumerate(keys):
        sums[:, column] = _crc_rows(np.asarray(episode[key]))
    return sums


def _crc_rows(values: np.ndarray) -> list[int]:
    flat = np.ascontiguousarray(values).reshape(len(values), -1).view(np.uint8)
    return [crc32(row) for row in flat]


def _field_crc(value: Any) -> int:
    return crc32(json.dumps(value, sort_keys=True, separators=(",", ":")).encode())


def seal_metadata(metadata: Mapping[str, Any]) -> dict:
    """``metadata`` plus the CRC-32 of each field's canonical JSON under ``field_crc32``."""
    fields = {k: v for k, v in metadata.items() if k != SEAL_FIELD}
    return {**fields, SEAL_FIELD: {k: _field_crc(v) for k, v in fields.items()}}


def unseal_metadata(raw: str | bytes, where) -> dict:
    """The metadata stored as JSON text ``raw``, without its seal, checked against it.

    A DatasetError names what is damaged: text that is not JSON, a field whose value no longer
    matches its checksum (``keys`` is the schema), a field added or lost, a seal missing.
    """
    try:
        metadata = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise DatasetError(f"{where}: its swm metadata is not valid JSON", _METADATA_HINT) from None
    if not isinstance(metadata, dict):
        raise DatasetError(f"{where}: its swm metadata is not a JSON object", _METADATA_HINT)
    seal = metadata.pop(SEAL_FIELD, None)
    if seal is None:
        raise DatasetError(
            f"{where}: its swm metadata has no {SEAL_FIELD} (format_version "
            f"{metadata.get('format_version')!r})",
            _METADATA_HINT,
        )
    if not isinstance(seal, dict):
        raise DatasetError(f"{where}: its metadata checksums are damaged", _METADATA_HINT)
    damaged = sorted(
        (seal.keys() ^ metadata.keys())
        | {k for k in seal.keys() & metadata.keys() if _field_crc(metadata[k]) != seal[k]}
    )
    if damaged:
        named = ", ".join("keys (the schema)" if k == "keys" else _printable(k) for k in damaged)
        raise DatasetError(
            f"{where}: its metadata is damaged: {named} does not match its checksum",
            _METADATA_HINT,
        )
    return metadata


def _printable(name: str) -> str:
    """A field name for a message: as is, or quoted with escapes if damage made it unprintable."""
    return name if name.isascii() and name.isprintable() else ascii(name)


class RowChecks:
    """Which rows of which keys this process has checked against their stored CRC-32s.

    A row is checked the first time it is read (a frame is read ``history_len`` times an epoch
    and once verified is not hashed again): on the loader benchmark the checks cost a few
    percent of the first epoch and nothing after.
    """

    def __init__(self, schema_keys: list[str], num_steps: int):
        self.columns = {key: column for column, key in enumerate(schema_keys)}
        self._checked = {key: np.zeros(num_steps, dtype=bool) for key in schema_keys}

    def pending(self, keys, rows: np.ndarray) -> bool:
        """True when some of ``rows`` of some of ``keys`` were never checked here."""
        return any(not self._checked[key][rows].all() for key in keys)

    def damaged_rows(self, key: str, rows: np.ndarray, values: np.ndarray, stored) -> np.ndarray:
        """Those of ``rows`` (whose bytes are ``values``) that fail their checksum; ``stored``
        gives each row's ``(keys,)`` CRC-32s. The others are marked checked."""
        todo = np.flatnonzero(~self._checked[key][rows])
        if not todo.size:
            return rows[:0]
        flat = np.ascontiguousarray(values).reshape(len(values), -1).view(np.uint8)
        sums = np.fromiter((crc32(flat[i]) for i in todo.tolist()), np.uint32, len(todo))
        bad = sums != stored[todo, self.columns[key]]
        self._checked[key][rows[todo[~bad]]] = True
        return rows[todo[bad]]


def columns_apart(reader, keys: list[str], rows: np.ndarray, checksums: bool) -> dict:
    """``read_columns`` for formats that read each key apart: one ``read_rows`` a key, and with
    ``checksums`` the rows' stored CRC-32s under ``CHECKSUM_COLUMN``."""
    values = {key: reader.read_rows(key, rows) for key in keys}
    if checksums:
        values[CHECKSUM_COLUMN] = reader.read_row_checksums(rows)
    return values


def damaged_keys(episode: Mapping[str, np.ndarray], stored: np.ndarray, keys: list[str]) -> list:
    """The keys of ``episode`` whose rows do not match the ``stored`` checksums (all ``keys``)."""
    rows = len(next(iter(episode.values())))
    if stored.shape != (rows, len(keys)):
        return list(keys)
    differs = np.any(row_checksums(episode, keys) != stored, axis=0)
    return [key for key, bad in zip(keys, differs, strict=True) if bad]


def check_episode(reader, index: int, episode: Mapping[str, np.ndarray]) -> None:
    """Refuse episode ``index`` (read from ``reader``) if any of its keys fails its checksum."""
    stored = reader.read_checksums(index)
    if stored is None:  # another tool's dataset: it carries none
        return
    schema_keys = list(reader.keys)
    columns = [schema_keys.index(key) for key in episode]
    bad = damaged_keys(episode, stored[:, columns], list(episode))
    if bad:
        raise DatasetError(
            f"{reader.path}: episode {index} is damaged (checksum mismatch in {', '.join(bad)})",
            hint="restore the dataset, or collect again; `swm info --verify` lists all damage; "
            "--skip-damaged goes on without it",
        )
