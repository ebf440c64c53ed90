"""Streaming clips from a dataset on disk: ``load_dataset``, the DataLoader factory.

A ``ClipDataset`` is a map-style torch Dataset whose item ``i`` is clip ``i`` in exactly the
ReplayBuffer's layout: every key but ``action`` is an observation read at the strided rows
(``(history_len, ...)``), and ``action`` is dense, folded to ``(history_len, frameskip * A)``.
It holds one int64 start row per clip (no per-clip Python objects) and reads only the rows a batch
needs, a whole batch per read (``read_batch``, which ``make_loader`` uses). It also works in a
plain ``DataLoader(ds, batch_size=...)`` with the default collate: ``__getitems__`` returns one dict
per clip, read in that same single gather.

``make_loader`` reads with threads of this process (``ThreadLoader``), or with a DataLoader's worker
processes when asked. Lance is not fork-safe: a process forked after its parent opened a Lance
dataset crashes. So the parent builds the episode index in a short-lived forked child, never
opening Lance itself, and worker processes (forked, fast to start) each open the dataset lazily.
If this process has opened a Lance dataset anyway, ``make_loader`` switches to a forkserver
context; the user never has to choose.
"""

import hashlib
import itertools
import multiprocessing
import os
import signal
import threading
import warnings
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, Sampler

from swmcli import errors
from swmcli.data.clips import (
    ACTION,
    action_rows,
    clip_span,
    clip_starts,
    fold_actions,
    observation_rows,
)
from swmcli.data.formats import detect, open_reader
from swmcli.data.spares import Spares
from swmcli.data.storage import location
from swmcli.data.storage.checksums import CHECKSUM_COLUMN, RowChecks
from swmcli.data.storage.lance import opened_in_this_process
from swmcli.data.storage.schema import (
    check_keys,
    is_image,
    offsets_from_lengths,
    read_ahead,
    rows_by_episode,
)
from swmcli.errors import OutOfRangeError, SwmError, UsageError
from swmcli.host import available_host_bytes, keep_freed_memory


class ClipDataset(Dataset):
    """Clips of ``history_len`` observations ``frameskip`` apart, read from disk on demand."""

    def __init__(
        self,
        path: Path,
        description: dict,
        keys: list[str],
        history_len: int,
        frameskip: int,
        episodes: Sequence[int] | None,
        skip_damaged: bool = False,
    ):
        self.path = path
        self.skip_damaged = skip_damaged
        # Episodes found damaged while reading, with why (skipped when ``skip_damaged``).
        self.damaged: dict[int, str] = {}
        self.format = description["format"]
        self.metadata = description["metadata"]
        self.keys = {k: description["keys"][k] for k in keys}
        self.history_len, self.frameskip = history_len, frameskip
        self.episode_lengths = description["lengths"]
        self.episode_offsets = offsets_from_lengths(self.episode_lengths)
        self.episodes = _episode_selection(episodes, len(self.episode_lengths), self.path)
        span = clip_span(history_len, frameskip)
        self._starts = clip_starts(
            self.episode_offsets[self.episodes], self.episode_lengths[self.episodes], span
        )
        if len(self._starts) == 0:
            longest = int(self.episode_lengths[self.episodes].max(initial=0))
            raise UsageError(
                f"no clip fits: a clip spans {span} rows (history_len {history_len} x frameskip "
                f"{frameskip}) but the longest episode of {self.path} has {longest}",
                hint="lower --history-len or --frameskip, or collect longer episodes",
            )
        self._reader = None
        self._reader_pid = None
        self._checks = None
        self._opening = threading.Lock()
        self.spares = Spares()

    @property
    def num_clips(self) -> int:
        """Clips in the dataset (``len(dataset)``)."""
        return len(self._starts)

    def __len__(self) -> int:
        return self.num_clips

    def __getstate__(self) -> dict:
        # Workers get the index, never an open file: each opens its own after the fork/spawn.
        unpicklable = {"_reader": None, "_reader_pid": None, "_checks": None, "spares": None}
        return {**self.__dict__, **unpicklable, "_opening": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._opening = threading.Lock()
        self.spares = Spares()

    def _open(self):
        with self._opening:  # reader threads start together: one opens, the others wait for it
            if self._reader is None or self._reader_pid != os.getpid():
                if self.format == "lance" and torch.utils.data.get_worker_info() is None:
                    _stop_forking()
                keep_freed_memory()  # readers free and refault a batch's worth of pages otherwise
                reader = open_reader(self.path)
                if self.format == "folder":  # it maps rows to files through the index: no rescan
                    reader.set_episode_lengths(self.episode_lengths)
                else:  # a dataset well inside the free RAM: its first epoch reads from the cache
                    read_ahead(self.path, available_host_bytes() // 8)
                has_sums = reader.read_row_checksums(np.zeros(1, np.int64)) is not None
                self._checks = RowChecks(list(reader.keys), reader.num_steps) if has_sums else None
                self._reader, self._reader_pid = reader, os.getpid()
            return self._reader

    def read_batch(self, indices: Sequence[int]) -> dict[str, np.ndarray]:
        """A whole batch of clips, one read per key: ``{key: (len(indices), history_len, ...)}``.

        Each row is checked against its stored checksum the first time this process reads it:
        a damaged episode stops the read with a DatasetError naming it, or, with
        ``skip_damaged``, is recorded in ``damaged`` and its clips replaced by the next clips
        of undamaged episodes."""
        indices = _clip_indices(indices)
        total = self.num_clips
        if indices.size and not (indices.min() >= -total and indices.max() < total):
            raise OutOfRangeError(f"clip index out of range: the dataset holds {total} clips")
        reader = self._open()
        while True:
            indices = self._undamaged(indices % total if total else indices)
            clips, read, sums = self._read_clips(reader, indices)
            found = self._check_rows(reader, read, sums)
            if not found:
                return clips
            self._record_damage(found)

    def _read_clips(self, reader, indices: np.ndarray):
        """The clips ``indices``, what was read for them (``{key: (rows, values)}``) and, where
        some of those rows are still to be checked, their stored checksums read with the small
        keys (``(rows, sums)``, else None)."""
        starts = self._starts[indices]
        read = {}
        clips = {}
        sums = None
        small = [key for key, (_, shape) in self.keys.items() if not is_image(shape)]
        if small:  # one read for all of them, at the dense rows (observations: every frameskip-th)
            dense = action_rows(starts, self.history_len, self.frameskip)
            # The dense rows hold every row the clips read: their checksums come in the same read.
            unchecked = self._checks is not None and self._checks.pending(self.keys, dense)
            values = reader.read_columns(small, dense.reshape(-1), checksums=unchecked)
            if unchecked:
                sums = (dense.reshape(-1), values[CHECKSUM_COLUMN])
            read.update({key: (dense.reshape(-1), values[key]) for key in small})
            for key in small:
                shape = self.keys[key][1]
                if key == ACTION:
                    flat = values[key].reshape(len(starts), -1, int(np.prod(shape)))
                    clips[key] = fold_actions(flat, self.history_len)
                else:
                    value = values[key].reshape(*dense.shape, *shape)
                    clips[key] = np.ascontiguousarray(value[:, :: self.frameskip])
        observed = observation_rows(starts, self.history_len, self.frameskip).reshape(-1)
        for key, (dtype, shape) in self.keys.items():
            if key not in clips:
                out = self._output(key, (len(observed), *shape), dtype)
                values = reader.read_rows(key, observed, out=out)
                read[key] = (observed, values)
                clips[key] = values.reshape(len(starts), self.history_len, *shape)
        return {key: clips[key] for key in self.keys}, read, sums

    def _check_rows(self, reader, read: dict, sums=None) -> dict[int, str]:
        """Check the rows just read that this process never checked: ``{episode: why}`` for
        the episodes holding rows that fail their checksum. ``sums`` (rows, their stored
        checksums), where given, holds every row read."""
        checks = self._checks
        if checks is None:  # another tool's dataset: no row checksums
            return {}
        # Reader threads share ``checks``: at worst two of them both check a row once.
        pending = {k: rv for k, rv in read.items() if checks.pending([k], rv[0])}
        if not pending:
            return {}
        if sums is None:
            rows = np.unique(np.concatenate([rows for rows, _ in pending.values()]))
            stored = reader.read_row_checksums(rows)
        else:
            rows, first = np.unique(sums[0], return_index=True)
            stored = sums[1][first]
        found: dict[int, str] = {}
        for key, (key_rows, values) in pending.items():
            key_sums = stored[np.searchsorted(rows, key_rows)]
            bad = checks.damaged_rows(key, key_rows, values, key_sums)
            for episode in np.unique(rows_by_episode(self.episode_offsets, bad)).tolist():
                found.setdefault(episode, "checksum mismatch in")
                found[episode] += f" {key}"
        return found

    def _record_damage(self, found: dict[int, str]) -> None:
        """Stop on the first damaged episode, or (``skip_damaged``) note them all."""
        if not self.skip_damaged:
            episode, why = next(iter(found.items()))
            raise errors.DatasetError(
                f"{self.path}: episode {episode} is damaged ({why})",
                hint="restore the dataset, or collect again; `swm info --verify` lists all "
                "damage; --skip-damaged goes on without it",
            )
        self.damaged.update(found)

    def _undamaged(self, indices: np.ndarray) -> np.ndarray:
        """``indices`` with each clip of a damaged episode replaced by the next clip (in index
        order, wrapping around) of an undamaged one."""
        if not self.damaged:
            return indices
        episodes = rows_by_episode(self.episode_offsets, self._starts)
        good = np.flatnonzero(~np.isin(episodes, list(self.damaged)))
        if not good.size:
            raise errors.DatasetError(
                f"{self.path}: every episode read is damaged", hint="restore the dataset"
            )
        position = np.searchsorted(good, indices) % len(good)
        return good[position]

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, np.ndarray]]:
        """Clips ``indices`` as one dict each (what the default collate expects), read in one
        ``read_batch``."""
        batch = self.read_batch(indices)
        return [{key: value[i] for key, value in batch.items()} for i in range(len(indices))]

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return self.__getitems__([index])[0]

    def close(self) -> None:
        """Close this process's file handle (reopened on the next read)."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def _output(self, key: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """Where a batch of ``key`` is read into: in a DataLoader worker process, shared memory;
        in this process, a spare array that no earlier batch still holds (``Spares``)."""
        if torch.utils.data.get_worker_info() is None:
            return self.spares.array(key, shape, dtype)
        return _shared_array(shape, dtype)


def _stop_forking() -> None:
    """Make forkserver the default start method before this process opens Lance (which is not
    fork-safe), as stable-worldmodel does: a plain ``DataLoader(dataset, num_workers=N)``
    built after ``dataset[0]`` then starts workers that open their own dataset, where forked
    ones would be refused. A start method the user chose (other than fork) is kept."""
    forking = multiprocessing.get_start_method(allow_none=True) in (None, "fork")
    if forking and "forkserver" in multiprocessing.get_all_start_methods():
        multiprocessing.set_start_method("forkserver", force=True)


def _clip_indices(indices) -> np.ndarray:
    """Clip indices as int64; a float (``dataset[1.5]``) is a TypeError, never clip 1."""
    array = np.asarray(indices)
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"clip indices must be integers, got {array.dtype}")
    return array.astype(np.int64).reshape(-1)


def _shared_array(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A worker's batch reaches the main process through shared memory; torch would copy a
    private array there. Reading straight into it saves that copy (``collate_clips`` finds the
    tensor)."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    element = torch.from_numpy(np.empty(0, dtype)).dtype
    storage = torch.UntypedStorage._new_shared(nbytes)
    return torch.empty(0, dtype=element).set_(storage).view(shape).numpy()


def _tensor_of(array: np.ndarray) -> torch.Tensor:
    """The tensor ``array`` views when it came from ``_shared_array`` in a worker, else a
    wrapper."""
    owner = array
    while isinstance(owner, np.ndarray):
        owner = owner.base
    if (
        isinstance(owner, torch.Tensor)
        and owner.data_ptr() == array.ctypes.data
        and owner.numel() * owner.element_size() == array.nbytes
        and array.flags.c_contiguous
    ):
        return owner.view(array.shape)  # keeps the shared storage: no copy on the way out
    return torch.from_numpy(array)


def _episode_selection(episodes, count: int, where: Path) -> np.ndarray:
    if episodes is None:
        return np.arange(count, dtype=np.int64)
    selected = np.asarray(list(episodes), dtype=np.int64)
    if selected.size and (selected.min() < 0 or selected.max() >= count):
        raise OutOfRangeError(
            f"episode indices must lie in 0..{count - 1}: {where} holds {count} episodes"
        )
    return selected


def _cached_lengths(reader, path: Path, cache_dir: Path | None) -> np.ndarray:
    """The episode index, from ``cache_dir`` when it was built for this very version."""
    token = getattr(reader, "index_token", None)
    if cache_dir is None or token is None:
        return reader.episode_lengths
    key = hashlib.sha1(f"{location.resolve(path)}|{token}".encode()).hexdigest()[:24]
    file = Path(cache_dir) / f"episode-index-{key}.npy"
    if file.is_file():
        reader.set_episode_lengths(np.load(file))
        return reader.episode_lengths
    lengths = reader.episode_lengths
    file.parent.mkdir(parents=True, exist_ok=True)
    temporary = file.with_suffix(f".{os.getpid()}.tmp")
    with temporary.open("wb") as handle:
        np.save(handle, lengths)
    os.replace(temporary, file)
    return lengths


def _describe(path: Path, cache_dir: Path | None) -> dict:
    reader = open_reader(path)
    try:
        lengths = _cached_lengths(reader, path, cache_dir)
        return {
            "format": reader.format,
            "metadata": reader.metadata,
            "keys": reader.keys,
            "lengths": np.asarray(lengths, dtype=np.int64),
        }
    finally:
        reader.close()


def _describe_in_child(send, path: Path, cache_dir: Path | None) -> None:
    # SIGTERM's default action: the CLI's handler would print a child traceback instead.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        send.send(("ok", _describe(path, cache_dir)))
    except SwmError as error:  # exceptions with hints do not survive pickling: send the parts
        send.send(("error", (type(error).__name__, error.message, error.hint, error.exit_code)))
    except Exception as error:
        send.send(("raise", error))
    finally:
        send.close()


def _lance_opened() -> bool:

    return opened_in_this_process()


def _describe_fork_safe(path: Path, cache_dir: Path | None) -> dict:
    """Index the dataset; for Lance, in a forked child so this process stays fork-safe."""
    if (
        not detect(path).endswith("lance")  # swm's Lance, or stable-worldmodel's
        or _lance_opened()
        or "fork" not in multiprocessing.get_all_start_methods()
    ):
        return _describe(path, cache_dir)
    # Importing Lance is fork-safe (opening a dataset is not): import once here, and the indexing
    # child and every forked worker inherit it instead of each paying the import.
    import lance  # noqa: F401

    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    with _quiet_lance_fork_warning():
        child = context.Process(target=_describe_in_child, args=(send, path, cache_dir))
        child.start()
    send.close()  # the child holds the only write end: if it dies, recv() ends with EOFError
    try:
        status, payload = receive.recv()
    except EOFError:
        child.join()
        raise errors.DatasetError(
            f"indexing {path} failed: its process died (exit code {child.exitcode})",
            hint="run `swm info --verify` on the dataset; it may be damaged",
        ) from None
    finally:
        receive.close()
    child.join()
    if status == "ok":
        return payload
    if status == "raise":
        raise payload
    name, message, hint, exit_code = payload
    raise getattr(errors, name)(message, hint, exit_code)


@contextmanager
def _quiet_lance_fork_warning():
    """Lance warns on every fork once imported; ours fork before any Lance dataset is opened."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="lance is not fork-safe")
        yield


def load_dataset(
    path: str | Path,
    keys_to_load: Sequence[str] | None = None,
    history_len: int = 1,
    frameskip: int = 1,
    cache_dir: str | Path | None = None,
    episodes: Sequence[int] | None = None,
    skip_damaged: bool = False,
) -> ClipDataset:
    """A map-style Dataset of clips from the dataset at ``path`` (any format), in the
    ReplayBuffer's clip layout. ``episodes`` restricts it to some episode indices; ``cache_dir``
    keeps the episode index so that reopening does not rescan. Every row read is checked
    against its checksum: a damaged episode is a DatasetError naming it, or with
    ``skip_damaged`` is skipped and listed in ``dataset.damaged``. ``history_len`` and
    ``frameskip`` must be integers of at least 1 (a ValueError otherwise).
    """
    for name, value in (("history_len", history_len), ("frameskip", frameskip)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            raise UsageError(
                f"{name} must be an integer of at least 1, got {value!r}",
                hint="a clip takes every frameskip-th of history_len observations",
            )
    path = location.as_location(path)
    cache = Path(cache_dir) if cache_dir is not None else None
    description = _describe_fork_safe(path, cache)
    keys = check_keys(description["keys"], keys_to_load, path)
    return ClipDataset(path, description, keys, history_len, frameskip, episodes, skip_damaged)


class ClipSampler(Sampler[int]):
    """Clip indices ``0 .. dataset.num_clips - 1`` per epoch, shuffled with a seeded generator.

    Reads ``num_clips`` at every epoch, so a ReplayBuffer that grows while training is covered.
    """

    def __init__(self, dataset, shuffle: bool, generator: torch.Generator):
        self.dataset, self.shuffle, self.generator = dataset, shuffle, generator

    def __len__(self) -> int:
        return int(self.dataset.num_clips)

    def __iter__(self):
        count = len(self)
        if self.shuffle:
            yield from torch.randperm(count, generator=self.generator).tolist()
        else:
            yield from range(count)


class WholeBatches(Dataset):
    """Item ``indices`` is the whole batch ``clips.read_batch(indices)``: a DataLoader over this,
    with a BatchSampler as its sampler and no automatic batching, reads a batch in one gather."""

    def __init__(self, clips):
        self.clips = clips
        self.format = getattr(clips, "format", None)

    def __len__(self) -> int:
        return len(self.clips)

    def __getitem__(self, indices: Sequence[int]) -> dict[str, np.ndarray]:
        return self.clips.read_batch(indices)


def collate_clips(arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """A batch from ``read_batch`` -> tensors; pixels stay uint8."""
    with warnings.catch_warnings():
        # Frames read by Lance may be read-only views of Arrow memory; nothing writes to them.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return {key: _tensor_of(np.asarray(value)) for key, value in arrays.items()}


class ClipLoader(DataLoader):
    """A DataLoader that picks its workers' start method when it starts them, not when built:
    reading an eval episode from Lance between ``make_loader`` and the first batch must not
    leave it forking."""

    def __iter__(self):
        if self.num_workers > 0 and self._iterator is None:
            self.multiprocessing_context = _worker_context(self.dataset)
        return _worker_deaths_named(super().__iter__(), getattr(self.dataset, "format", None))


def _worker_deaths_named(batches, format: str | None):
    """Torch's "DataLoader worker exited unexpectedly" as one SwmError that says what to check:
    a worker dies when a decoder crashes on damaged data, or when memory runs out."""
    try:
        yield from batches
    except RuntimeError as error:
        if not str(error).startswith("DataLoader worker"):
            raise
        raise errors.SwmError(
            f"a loader worker reading the {format or 'training'} data died: "
            f"{errors.first_line(error)}",
            hint="`swm info --verify DATASET` names damaged episodes; if memory ran out, lower "
            "--batch-size or --set data.num_workers=N",
        ) from error


def _worker_context(dataset):
    """Fork (fast to start) unless this process opened a Lance dataset: then forkserver."""
    methods = multiprocessing.get_all_start_methods()
    if "fork" not in methods:
        return None
    if _lance_opened():  # swm's Lance or another tool's: either way this process holds Lance
        return multiprocessing.get_context("forkserver")
    # The workers open the dataset after the fork; Lance's blanket warning does not apply.
    warnings.filterwarnings("ignore", message="lance is not fork-safe")
    return multiprocessing.get_context("fork")


class ThreadLoader:
    """Batches of a ClipDataset read by ``num_workers`` threads of this process, up to
    ``num_workers * prefetch_factor`` batches ahead, yielded in order as tensors.

    Threads rather than worker processes: readers spend their time where the GIL is released
    (Lance's Rust reader, LZ4 and zlib decompression, file reads); a batch then reaches the trainer
    without a trip through shared memory, its arrays are reused once let go (no page faults per
    batch), and nothing forks (Lance is not fork-safe). The price: a decoder that crashes on
    damaged data takes this process with it, where a worker process would die alone.
    """

    def __init__(self, dataset, batch_sampler, num_workers: int, prefetch_factor: int):
        self.dataset, self.batch_sampler = dataset, batch_sampler
        self.num_workers, self.prefetch_factor = num_workers, prefetch_factor
        self.pin_memory = torch.cuda.is_available()
        # Batches in flight, plus the one the caller works on and the one it just let go.
        dataset.spares.keep = num_workers * prefetch_factor + 2

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        from concurrent.futures import ThreadPoolExecutor

        batches = iter(self.batch_sampler)
        pending: deque = deque()
        with ThreadPoolExecutor(self.num_workers, thread_name_prefix="swm-reader") as pool:
            try:
                for indices in itertools.islice(batches, self.num_workers * self.prefetch_factor):
                    pending.append(pool.submit(self._batch, indices))
                while pending:
                    batch = pending.popleft().result()
                    following = next(batches, None)
                    if following is not None:
                        pending.append(pool.submit(self._batch, following))
                    yield batch
            finally:
                for future in pending:
                    future.cancel()

    def _batch(self, indices) -> dict[str, torch.Tensor]:
        """One batch as tensors, pinned where CUDA exists (in the reader thread, as a
        DataLoader's pin-memory thread would, so the trainer's thread never waits for it)."""
        batch = collate_clips(self.dataset.read_batch(indices))
        if self.pin_memory:
            batch = {key: value.pin_memory() for key, value in batch.items()}
        return batch


def make_loader(
    dataset,
    batch_size: int,
    num_workers: int = 2,
    shuffle: bool = True,
    seed: int = 0,
    prefetch_factor: int = 2,
    drop_last: bool = True,
    order: np.ndarray | None = None,
    processes: bool = False,
):
    """An iterable over a ClipDataset or a ReplayBuffer yielding ``{key: (B, ...)}`` tensors.

    ``num_workers`` readers, threads of this process (``ThreadLoader``) or, with ``processes``,
    a DataLoader's worker processes (their start method picked here, kept alive across epochs);
    memory is pinned only where CUDA exists, and the order is seeded. ``order`` (clip indices)
    replaces the shuffled epochs with exactly that sequence, read ``batch_size`` at a time
    (training uses it to resume mid-epoch). A ReplayBuffer is read in this process by the caller
    (its arrays live here; a gather runs at memory speed), so ``num_workers`` is 0 for it.
    """
    if not isinstance(dataset, ClipDataset):
        num_workers = 0
    if order is None:
        clips = ClipSampler(dataset, shuffle, torch.Generator().manual_seed(seed))
    else:  # an array, or any sized iterable of clip indices (drawn lazily)
        clips = order.tolist() if isinstance(order, np.ndarray) else order
    sampler = BatchSampler(clips, batch_size, drop_last)
    if num_workers > 0 and not processes:
        return ThreadLoader(dataset, sampler, num_workers, prefetch_factor)
    workers = {}
    if num_workers > 0:
        workers = {
            "multiprocessing_context": _worker_context(dataset),
            "persistent_workers": True,
            "prefetch_factor": prefetch_factor,
        }
    return ClipLoader(
        WholeBatches(dataset),
        sampler=sampler,
        batch_size=None,
        num_workers=num_workers,
        collate_fn=collate_clips,
        pin_memory=torch.cuda.is_available(),
        # Its own generator (workers' base seed): the sampler's order is the same for threads.
        generator=torch.Generator().manual_seed(seed),
        **workers,
    )
