"""A verified, atomic copy of a dataset into any format (what ``swm convert`` runs).

The copy streams episode by episode (memory stays at about one episode whatever the dataset
size), writes to a hidden temporary path next to the destination, re-reads what it wrote and
compares counts and a BLAKE2 checksum of every column, and only then renames it into place. The
source is only ever read.
"""

import hashlib
import os
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from swmcli.data.foreign.reader import read_beside
from swmcli.data.formats import check_free_space, detect, open_reader, open_writer, resolve_format
from swmcli.data.storage import location as loc
from swmcli.data.storage.checksums import check_episode
from swmcli.data.storage.location import Location, as_location
from swmcli.data.storage.lock import WriterLock, being_read
from swmcli.data.storage.schema import WRITER_METADATA, check_keys, describe_schema
from swmcli.errors import DatasetError, UsageError
from swmcli.names import check_name


def _check_apart(dst: Location, sources: Sequence[Location]) -> None:
    """Refuse a destination that is a source, lies inside one or holds one: the copy (its lock
    file included) would be written into a source, or replacing it would delete one."""
    target = loc.resolve(dst)
    for src in sources:
        source = loc.resolve(src)
        if target == source:
            raise UsageError(
                f"source and destination are the same path: {src}", hint="choose another DST"
            )
        beside = [] if loc.is_remote(source) else read_beside(source)
        if side := next((p for p in beside if target == p or _inside(target, p)), None):
            raise UsageError(
                f"{dst} would write over {side}, a side table the source {src} reads",
                hint="write DST beside its sources, never over a table one of them reads",
            )
        if _inside(target, source) or _inside(source, target):
            where = (
                "inside the source" if _inside(target, source) else "a folder holding the source"
            )
            raise UsageError(
                f"{dst} is {where} {src}",
                hint="write DST beside its sources, never inside or around one",
            )


def _inside(inner: Location, outer: Location) -> bool:
    if loc.is_remote(inner) != loc.is_remote(outer):
        return False
    if loc.is_remote(inner):
        return inner.startswith(outer.rstrip("/") + "/")
    return inner != outer and inner.is_relative_to(outer)


def _check_destination(dst: Location, overwrite: bool) -> None:
    if not loc.exists(dst):
        return
    if not overwrite:
        raise UsageError(f"{dst} already exists", hint="pass --overwrite to replace it")
    try:
        detect(dst)
    except (DatasetError, UsageError):
        raise UsageError(
            f"refusing to replace {dst}: it is not a swm dataset",
            hint="choose another destination",
        ) from None
    if not loc.is_remote(dst) and dst.is_dir() and being_read(dst):
        raise UsageError(
            f"refusing to replace {dst}: another process is reading it (a train streaming it?)",
            hint="wait for it to finish, or convert to another destination",
        )


def _remove_dead_leftovers(dst: Path) -> None:
    """Delete the temporary copies (and their lock files) of ``dst`` that a killed convert left:
    their names carry the PID of a process that no longer runs."""
    names = (f".tmp-*-{dst.name}", f".old-*-{dst.name}", f"..tmp-*-{dst.name}.swm-writer")
    for leftover in (p for name in names for p in dst.parent.glob(name)):
        pid = leftover.name.lstrip(".").split("-")[1]
        if pid.isdigit() and not _alive(int(pid)):
            loc.remove(leftover)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


@dataclass(frozen=True)
class Copied:
    """What ``copy_dataset`` wrote: counts and sizes on disk of the source (or the sources a
    merge read) and the copy."""

    src: Location | tuple[Location, ...]
    dst: Location
    format: str
    episodes: int
    steps: int
    src_size_bytes: int
    dst_size_bytes: int
    skipped: dict[int, str] = field(default_factory=dict)  # damaged episodes left out, with why


def _copy_episodes(reader, writer, keys: list[str], on_episode, skipped, dst) -> dict[str, str]:
    """Stream every episode from reader to writer; the checksum of each column as it went.
    A damaged episode stops the copy, or, when ``skipped`` is a dict, is left out and
    recorded there with why. With a local ``dst``, a disk too full for the next episode is an
    error naming ``dst``."""
    digests = {key: hashlib.blake2b(digest_size=16) for key in keys}
    for index in range(reader.num_episodes):
        try:
            episode = reader.read_episode(index, keys)
            check_episode(reader, index, episode)  # the copy's checksums are then the source's
        except DatasetError as error:
            if skipped is None:
                raise
            skipped[index] = error.message
            continue
        for key in keys:
            digests[key].update(np.ascontiguousarray(episode[key]).data)
        if not loc.is_remote(dst):
            nbytes = sum(v.nbytes for v in episode.values())
            check_free_space(dst, nbytes, hint=_DISK_HINT)  # the disk the copy is written on
        writer.write_episode(episode)
        if on_episode is not None:
            on_episode(index + 1, reader.num_episodes)
    if skipped is not None and len(skipped) == reader.num_episodes:
        raise DatasetError(f"every episode of {reader.path} is damaged", hint="restore it")
    return {key: digest.hexdigest() for key, digest in digests.items()}


_DISK_HINT = (
    "free some disk space or convert to another disk; the destination was left as it was "
    "(the partial copy is removed)"
)


def _column_checksums(reader, keys: list[str]) -> dict[str, str]:
    digests = {key: hashlib.blake2b(digest_size=16) for key in keys}
    for index in range(reader.num_episodes):
        episode = reader.read_episode(index, keys)
        for key in keys:
            digests[key].update(np.ascontiguousarray(episode[key]).data)
    return {key: digest.hexdigest() for key, digest in digests.items()}


def _verify(
    source,
    written_path: Location,
    keys: list[str],
    expected: dict[str, str],
    exact=None,
    skipped=(),
) -> None:
    """Counts, episode lengths, schema and every column's checksum (of the ``exact`` keys only,
    when given: a lossy layout's frames differ) must match the source's, less the ``skipped``
    episodes."""
    lengths = np.delete(source.episode_lengths, list(skipped))
    written = open_reader(written_path)
    try:
        problems = []
        if written.num_episodes != len(lengths) or written.num_steps != int(lengths.sum()):
            problems.append(
                f"{written.num_episodes} episodes / {written.num_steps} steps written, "
                f"{len(lengths)} / {int(lengths.sum())} read"
            )
        elif not np.array_equal(written.episode_lengths, lengths):
            problems.append("episode lengths differ")
        wanted = {k: source.keys[k] for k in keys}
        if written.keys != wanted:
            problems.append(f"schema {describe_schema(written.keys)} != {describe_schema(wanted)}")
        if not problems:
            compared = keys if exact is None else exact
            actual = _column_checksums(written, compared)
            problems += [f"column {k} differs" for k in compared if actual[k] != expected[k]]
    finally:
        written.close()
    if problems:
        raise DatasetError(
            f"verification failed: {'; '.join(problems)}",
            hint="the destination was not written; report this with SWM_DEBUG=1",
        )


def _move_into_place(temporary: Location, dst: Location) -> None:
    """Rename the verified copy onto ``dst``; an old ``dst`` is moved aside first, then deleted.

    On object storage an old ``dst`` is deleted first, then the copy moved (see ``loc.move``).
    """
    aside = loc.with_name(dst, f".old-{os.getpid()}-{loc.name(dst)}")
    if loc.is_remote(dst):
        loc.remove(dst)
    elif dst.exists():
        os.rename(dst, aside)
    loc.move(temporary, dst)
    loc.remove(aside)


def copy_dataset(
    src: str | Path,
    dst: str | Path,
    to: str | None = None,
    keys: list[str] | None = None,
    overwrite: bool = False,
    on_episode: Callable[[int, int], None] | None = None,
    mapping: dict[str, str] | None = None,
    skip_damaged: bool = False,
) -> Copied:
    """Copy the dataset at ``src`` into ``dst`` (format ``to``, else from the suffix, else
    lance), keeping only ``keys`` if given. Streams, verifies, renames into place at the end;
    ``on_episode(done, total)`` is called after each episode is written; ``mapping`` renames
    another tool's columns (see ``foreign``). ``dst`` is held under its writer lock throughout
    (a dataset another process writes is refused, never replaced); ``skip_damaged`` leaves out
    episodes that fail their checksum instead of stopping.
    """
    src, dst = as_location(src), as_location(dst)
    if keys is not None and not keys:
        raise UsageError("no key to keep was given", hint="pass keys, e.g. --keys pixels,action")
    reader = open_reader(src, mapping)
    try:
        with destination_lock(dst, [src]):
            keys = check_source(reader, src, dst, keys, overwrite)
            fmt = resolve_format(temporary_path(dst), to)
            # Every field the collector wrote (env, policy, ...); the writer sets its own.
            metadata = {k: v for k, v in reader.metadata.items() if k not in WRITER_METADATA}

            def writer(temporary):
                return open_writer(temporary, format=fmt, mode="error", metadata=metadata)

            skipped = {} if skip_damaged else None
            return write_into_place(
                reader, src, dst, keys, writer, fmt, on_episode, skipped=skipped
            )
    finally:
        reader.close()


def destination_lock(dst: Location, sources: Sequence[Location]):
    """A context holding ``dst``'s writer lock for a whole copy, from before the destination is
    checked until the copy is in place (object storage has no lock file: one writer there is
    the user's to arrange). A ``dst`` that is one of ``sources``, or inside or around one, is
    refused first, before its lock file is written."""
    _check_apart(dst, sources)
    return nullcontext() if loc.is_remote(dst) else WriterLock(dst)


def check_source(reader, src: Location, dst: Location, keys, overwrite: bool) -> list[str]:
    """The keys to copy, once ``dst`` may be written and ``src`` holds episodes; each key is
    checked to be a plain name before anything is written (it names files and columns)."""
    _check_destination(dst, overwrite)
    keys = check_keys(reader.keys, keys, src)
    for key in keys:
        check_name(key, f"{src}: the key")
    if reader.num_episodes == 0:
        raise DatasetError(f"{src} holds no episodes", hint="nothing to copy from it")
    return keys


def temporary_path(dst: Location) -> Location:
    """The hidden path next to ``dst`` a copy is written to before it is renamed into place."""
    return loc.with_name(dst, f".tmp-{os.getpid()}-{loc.name(dst)}")


def write_into_place(
    reader, src, dst, keys, open_temporary, fmt: str, on_episode, exact=None, skipped=None
) -> Copied:
    """Stream ``reader``'s episodes into ``open_temporary(path)`` at ``temporary_path(dst)``,
    verify what was written (the checksums of the ``exact`` keys only, when given), then rename
    it onto ``dst``; nothing is left behind on failure. Damaged episodes stop it, or are left
    out and recorded in ``skipped`` when it is a dict. The caller holds ``destination_lock``."""
    if not loc.is_remote(dst):
        _remove_dead_leftovers(dst)  # a killed convert's temporaries (local disks only)
    temporary = temporary_path(dst)
    loc.remove(temporary)
    try:
        with open_temporary(temporary) as writer:
            checksums = _copy_episodes(reader, writer, keys, on_episode, skipped, dst)
        _verify(reader, temporary, keys, checksums, exact=exact, skipped=skipped or {})
        _move_into_place(temporary, dst)
    except BaseException:
        loc.remove(temporary)
        raise
    kept = np.delete(reader.episode_lengths, list(skipped or {}))
    return Copied(
        src=src,
        dst=dst,
        format=fmt,
        episodes=len(kept),
        steps=int(kept.sum()),
        src_size_bytes=reader.nbytes_on_disk,
        dst_size_bytes=loc.nbytes_under(dst),
        skipped=skipped or {},
    )
