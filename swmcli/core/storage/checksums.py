"""Checksums written with the data: one CRC-32 per row and key, in every format.

Each writer stores, beside each row, the CRC-32 of that row's bytes for every episode key (in
schema order) in the column ``swm_crc32`` (``(rows, keys)`` uint32), in the same atomic write as
the row itself. ``verify`` re-reads every episode and compares; ``convert`` checks each episode
it copies, so the destination's checksums are the source's (a damaged source is refused, never
laundered into a clean-looking copy). Datasets written before checksums existed have none and
verify only their structure.
"""

import zlib
from collections.abc import Mapping

import numpy as np

from swmcli.errors import DatasetError

CHECKSUM_COLUMN = "swm_crc32"


def row_checksums(episode: Mapping[str, np.ndarray], keys: list[str]) -> np.ndarray:
    """``(rows, len(keys))`` uint32: the CRC-32 of each row's bytes, key by key."""
    rows = len(next(iter(episode.values())))
    sums = np.empty((rows, len(keys)), dtype=np.uint32)
    for column, key in enumerate(keys):
        flat = np.ascontiguousarray(episode[key]).reshape(rows, -1).view(np.uint8)
        sums[:, column] = [zlib.crc32(row) for row in flat]
    return sums


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
    if stored is None:
        return
    schema_keys = list(reader.keys)
    columns = [schema_keys.index(key) for key in episode]
    bad = damaged_keys(episode, stored[:, columns], list(episode))
    if bad:
        raise DatasetError(
            f"{reader.path}: episode {index} is damaged (checksum mismatch in {', '.join(bad)})",
            hint="restore the dataset, or collect again; `swm info --verify` lists all damage",
        )


def verify(reader) -> dict:
    """Read every episode of ``reader`` and compare it with its checksums: a DatasetError naming
    the damaged episodes (the first five, and how many), else ``{"verified_episodes",
    "checksums"}`` (False for a dataset written before checksums: only its reads were checked).
    """
    damaged: dict[int, str] = {}
    keys = list(reader.keys)
    has_checksums = reader.read_checksums(0) is not None if reader.num_episodes else False
    for index in range(reader.num_episodes):
        try:
            episode = reader.read_episode(index)
            if has_checksums:
                bad = damaged_keys(episode, reader.read_checksums(index), keys)
                if bad:
                    damaged[index] = f"checksum mismatch in {', '.join(bad)}"
        except DatasetError as error:
            damaged[index] = error.message
    if damaged:
        shown = "; ".join(f"episode {index}: {why}" for index, why in list(damaged.items())[:5])
        more = f" (and {len(damaged) - 5} more)" if len(damaged) > 5 else ""
        raise DatasetError(
            f"{reader.path}: {len(damaged)} of {reader.num_episodes} episodes are damaged: "
            f"{shown}{more}",
            hint="restore the dataset, or collect again (convert refuses damaged episodes)",
        )
    return {"verified_episodes": reader.num_episodes, "checksums": has_checksums}
