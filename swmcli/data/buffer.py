"""ReplayBuffer: a capped ring of steps, one preallocated numpy array per key.

The buffer holds at most ``max_steps`` rows. Rows are observations; ``action[t]`` is the action
taken at observation ``t``, and the last row of an episode has NaN actions. When a new row would
not fit, the oldest whole sealed episodes are evicted (never part of one, never the episode in
progress). Nothing is allocated until the first write, and that write first checks that
``max_steps * bytes_per_step`` fits in the host's available RAM.

Positions are *logical*: a row's position counts every row ever written, and its place in the ring
is ``position % max_steps``. An episode that runs past the end of the ring simply wraps, and the
gathers read it with ``np.take(..., mode="wrap")``, so nothing is ever moved or staged.
"""

from collections.abc import Iterator, Mapping

import numpy as np

from swmcli.data.clips import (
    ACTION,
    action_rows,
    clip_span,
    fold_actions,
    locate_clips,
    observation_rows,
)
from swmcli.data.spares import Spares
from swmcli.data.storage.schema import Schema, describe_schema
from swmcli.errors import BudgetExceeded, OutOfRangeError, UsageError
from swmcli.host import available_host_bytes
from swmcli.units import format_bytes, format_gb

_SPARES_PER_KEY = 2  # a loop holds the batch it works on while the next one is gathered


def step_bytes(step: Mapping[str, np.ndarray]) -> int:
    """Bytes one row of ``step`` takes in a buffer (the sum over its keys)."""
    return sum(np.asarray(value).nbytes for value in step.values())


def schema_bytes(schema: Schema) -> int:
    """Bytes of one row of ``schema`` (the sum over its keys)."""
    return sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for dtype, shape in schema.values())


def preflight(max_steps: int, row_bytes: int, max_bytes: int | None = None) -> int:
    """The bytes a buffer of ``max_steps`` rows of ``row_bytes`` needs, or ``BudgetExceeded``.

    The budget is ``max_bytes`` when given, else the RAM the host has available. Nothing is
    allocated: a caller can ask before it commits to holding the rows.
    """
    needed = int(max_steps) * int(row_bytes)
    if max_bytes is not None:
        available, source = int(max_bytes), "the budget allows"
    else:
        available, source = available_host_bytes(), "the host has available"
    if needed > available:
        fits = available // row_bytes
        raise BudgetExceeded(
            f"a ReplayBuffer of {max_steps:,} steps needs {format_gb(needed)} "
            f"({format_bytes(needed)}) of RAM but {source} only {format_gb(available)} "
            f"({format_bytes(available)}); at most {fits:,} steps of "
            f"{format_bytes(row_bytes)} fit",
            hint=f"lower max_steps to at most {fits:,}, or the resolution",
            needed=needed,
            available=available,
        )
    return needed


class _Episodes:
    """Sealed episodes, oldest first, in arrays grown in place: each one's start row, length,
    and the clips of every episode sealed before it. Sealing and evicting an episode cost O(1)
    (amortised), and a clip is found by a binary search, however many episodes are held."""

    def __init__(self, span: int):
        self.span = span
        self._start = np.empty(16, np.int64)
        self._length = np.empty(16, np.int64)
        self._clips = np.zeros(17, np.int64)  # [k]: clips of the episodes sealed before slot k
        self._first = self._end = 0  # slots of the episodes held

    def __len__(self) -> int:
        return self._end - self._first

    def __iter__(self) -> Iterator[tuple[int, int]]:
        """(start, length) of every episode held, oldest first."""
        held = slice(self._first, self._end)
        return zip(self._start[held].tolist(), self._length[held].tolist(), strict=True)

    def append(self, start: int, length: int) -> None:
        if self._end == len(self._start):
            self._make_room()
        end = self._end
        self._start[end], self._length[end] = start, length
        self._clips[end + 1] = self._clips[end] + max(length - self.span + 1, 0)
        self._end += 1

    def popleft(self) -> int:
        """Forget the oldest episode; its length."""
        length = int(self._length[self._first])
        self._first += 1
        return length

    def last(self) -> tuple[int, int]:
        return int(self._start[self._end - 1]), int(self._length[self._end - 1])

    @property
    def num_clips(self) -> int:
        return int(self._clips[self._end] - self._clips[self._first])

    def locate(self, indices: np.ndarray) -> np.ndarray:
        """Start row of each clip in ``indices`` (0: the oldest episode's first clip)."""
        first, end = self._first, self._end
        base = int(self._clips[first])
        ends = self._clips[first + 1 : end + 1]
        return locate_clips(indices + base, self._start[first:end], ends, first_clip=base)

    def _make_room(self) -> None:
        """Move the episodes held to the front of arrays twice their count (at least 16)."""
        held, count = slice(self._first, self._end), len(self)
        size = max(16, 2 * count)
        start, length, clips = (
            np.empty(size, np.int64),
            np.empty(size, np.int64),
            np.empty(size + 1, np.int64),
        )
        start[:count], length[:count] = self._start[held], self._length[held]
        clips[: count + 1] = self._clips[self._first : self._end + 1]
        self._start, self._length, self._clips = start, length, clips
        self._first, self._end = 0, count


def _schema_of(step: Mapping[str, np.ndarray]) -> Schema:
    """Dtype and shape of every key of one step (the storage formats' convention)."""
    arrays = {key: np.asarray(value) for key, value in step.items()}
    return {key: (array.dtype, array.shape) for key, array in arrays.items()}


class ReplayBuffer:
    """A capped ring of steps with whole-episode FIFO eviction; also a map-style Dataset of clips.

    ``sample(B)`` returns ``dict[str, np.ndarray]``: every key but ``action`` is an observation,
    strided by ``frameskip`` -> ``(B, history_len, *shape)``; ``action`` is dense ->
    ``(B, history_len, frameskip * action_dim)``. ``buf[i]`` is clip ``i`` in the same layout
    without the batch axis, clips numbered oldest episode first (the numbering shifts when an
    episode is evicted).

    ``len(buf)`` counts *steps* in sealed episodes, as the spec says, not clips: to use the buffer
    as a torch Dataset, sample over ``range(buf.num_clips)`` (the DataLoader factory does, and the
    on-disk datasets expose ``num_clips`` too). Like stable-worldmodel's buffer it also meets the
    dataset ``Writer`` protocol (``num_episodes``, ``write_episode``, ``close``): what writes
    episodes to a dataset can write them to a buffer.

    The last clip of an episode ends on the episode's last row, whose action is NaN: a model must
    ignore (or zero) the action block of a clip's last observation. DataLoader workers should be
    forked (or ``num_workers=0``): a spawned worker would pickle every ring.
    """

    def __init__(
        self,
        max_steps: int,
        history_len: int = 1,
        frameskip: int = 1,
        seed: int | None = 0,
        max_bytes: int | None = None,
    ):
        for name, value in (
            ("max_steps", max_steps),
            ("history_len", history_len),
            ("frameskip", frameskip),
        ):
            if int(value) < 1:
                raise UsageError(f"{name} must be at least 1, got {value}")
        span = clip_span(history_len, frameskip)
        if max_steps < span:
            raise UsageError(
                f"a clip spans {span} rows (history_len {history_len} x frameskip {frameskip}) "
                f"but max_steps is {max_steps}: no clip could ever be sampled",
                hint=f"raise --max-steps to at least {span}",
            )
        self.max_steps = int(max_steps)
        self.history_len = int(history_len)
        self.frameskip = int(frameskip)
        self.span = span
        self.max_bytes = max_bytes
        self._rng = np.random.default_rng(seed)
        self._schema: Schema | None = None
        self._rings: dict[str, np.ndarray] = {}
        self._spares = Spares(_SPARES_PER_KEY)  # gather outputs to reuse once let go
        self._reset_rows()

    def __getstate__(self) -> dict:
        # Its spare gather outputs hold a lock and only buffers of past samples: not state.
        return {**self.__dict__, "_spares": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._spares = Spares(_SPARES_PER_KEY)

    def _reset_rows(self) -> None:
        """Forget every row (the arrays, if any, stay)."""
        self._tail = 0  # logical position of the oldest row held
        self._head = 0  # logical position of the next row to write
        self._open_start = 0  # first row of the episode in progress (== _head when none)
        self._episodes = _Episodes(self.span)  # sealed episodes, oldest first
        self.evicted_episodes = 0
        self.evicted_steps = 0

    # ----------------------------------------------------------------- sizes

    def __len__(self) -> int:
        """Steps stored in sealed episodes."""
        return self._open_start - self._tail

    @property
    def num_episodes(self) -> int:
        """Sealed episodes stored."""
        return len(self._episodes)

    @property
    def num_clips(self) -> int:
        """Clips that can be sampled (every valid start in every sealed episode)."""
        return self._episodes.num_clips

    @property
    def nbytes(self) -> int:
        """Bytes allocated for the rings (0 before the first write and after ``release()``)."""
        return sum(ring.nbytes for ring in self._rings.values())

    @property
    def bytes_per_step(self) -> int:
        """Bytes of one row (0 until the first step fixes the schema)."""
        return 0 if self._schema is None else schema_bytes(self._schema)

    @staticmethod
    def nbytes_for(max_steps: int, step: Mapping[str, np.ndarray]) -> int:
        """RAM a buffer of ``max_steps`` rows like ``step`` would hold, without allocating it."""
        return int(max_steps) * step_bytes(step)

    # -------------------------------------------------------------- allocation

    def allocate(self, example_row: Mapping[str, np.ndarray]) -> None:
        """Fix the schema (keys, shapes, dtypes) of rows like ``example_row`` and allocate the
        rings now, after the preflight, instead of on the first write; nothing is written. A
        float ``action`` may be left out of later rows (stored as NaN)."""
        if self._schema is not None:
            raise UsageError(
                "the buffer is allocated already",
                hint="call release() first to allocate it for another schema",
            )
        self._allocate(_schema_of(example_row))

    def _allocate(self, schema: Schema) -> None:
        """Preflight the full budget, then allocate one ring per key (lazy pages, full size)."""
        preflight(self.max_steps, schema_bytes(schema), self.max_bytes)
        self._rings = {
            key: np.empty((self.max_steps, *shape), dtype) for key, (dtype, shape) in schema.items()
        }
        self._schema = schema
        self._keys = frozenset(schema)
        # A float action may be left out of a step (the last observation has none): stored as NaN.
        action = schema.get(ACTION)
        floating = action is not None and np.issubdtype(action[0], np.floating)
        self._optional = frozenset({ACTION}) if floating else frozenset()

    def clear(self) -> None:
        """Empty the buffer; the arrays stay allocated and the schema stays locked."""
        self._reset_rows()

    def release(self) -> None:
        """Empty the buffer and free its arrays; the next write locks a new schema and allocates."""
        self._rings = {}
        self._spares.clear()
        self._schema = None
        self._reset_rows()

    # ----------------------------------------------------------------- writing

    def _schema_error(self, what: str) -> UsageError:
        return UsageError(
            f"step does not match the buffer's schema: {what}",
            hint=f"every step needs the keys, shapes and dtypes of the first one "
            f"({describe_schema(self._schema)}); call release() to start over with a new schema",
        )

    def _check_keys(self, keys: frozenset) -> None:
        """Raise unless ``keys`` are the schema's keys, a float ``action`` alone being optional."""
        missing = sorted(self._keys - keys - self._optional)
        extra = sorted(keys - self._keys)
        if missing and extra:
            raise self._schema_error(f"missing {missing} and unexpected {extra}")
        if missing or extra:
            raise self._schema_error(f"missing {missing}" if missing else f"unexpected {extra}")

    def _checked(self, key: str, value, leading: tuple[int, ...] = ()) -> np.ndarray:
        """``value`` as an array of the schema's shape (after ``leading``) and dtype, or raise."""
        dtype, shape = self._schema[key]
        if not hasattr(value, "dtype"):  # a Python scalar or list has no dtype to disagree with
            value = np.asarray(value)
            if not np.can_cast(value.dtype, dtype, "same_kind"):
                raise self._schema_error(f"{key} holds {value.dtype}, expected {dtype}")
            value = value.astype(dtype)
        if value.shape != (*leading, *shape) or value.dtype != dtype:
            got = value.shape[len(leading) :]
            raise self._schema_error(f"{key} is {got} {value.dtype}, expected {shape} {dtype}")
        return value

    def _check_episode_fits(self, rows: int) -> None:
        """Raise if ``rows`` more rows would make the episode in progress longer than the ring."""
        open_len = self._head - self._open_start
        if open_len + rows > self.max_steps:
            raise UsageError(
                f"the episode in progress would reach {open_len + rows:,} steps, more than "
                f"max_steps ({self.max_steps:,})",
                hint="raise max_steps or cap the episode length (e.g. the env's max episode steps)",
            )

    def _make_room(self, rows: int) -> None:
        """Evict the oldest sealed episodes until ``rows`` more rows fit."""
        self._check_episode_fits(rows)
        while self._head - self._tail + rows > self.max_steps:
            length = self._episodes.popleft()
            self._tail += length
            self.evicted_episodes += 1
            self.evicted_steps += length

    def add(self, step: Mapping[str, np.ndarray]) -> None:
        """Write one row straight into the ring; ``action`` may be left out (stored as NaN)."""
        if self._schema is None:
            self._allocate(_schema_of(step))
        if step.keys() != self._keys:
            self._check_keys(frozenset(step))
        # Check every value before evicting or writing anything, so a bad step changes nothing.
        values = []
        for key, (dtype, shape) in self._schema.items():
            value = step.get(key)
            if value is None:  # only a float action may be missing (checked above)
                value = np.nan
            elif getattr(value, "shape", None) != shape or value.dtype != dtype:
                value = self._checked(key, value)
            values.append(value)
        self._make_room(1)
        row = self._head % self.max_steps
        for ring, value in zip(self._rings.values(), values, strict=True):
            ring[row] = value
        self._head += 1

    def end_episode(self) -> None:
        """Seal the episode in progress: its last action becomes NaN and its clips sampleable."""
        length = self._head - self._open_start
        if length == 0:
            raise UsageError(
                "end_episode() with no step added since the last episode ended",
                hint="call add() at least once per episode",
            )
        action = self._rings.get(ACTION)
        if action is not None and np.issubdtype(action.dtype, np.floating):
            action[(self._head - 1) % self.max_steps] = np.nan
        self._episodes.append(self._open_start, length)
        self._open_start = self._head

    def add_episode(self, episode: Mapping[str, np.ndarray]) -> None:
        """Write a whole episode (arrays of shape ``(L, ...)``) into the ring and seal it; an
        empty episode (no keys, or arrays of length 0) writes nothing.

        The same as L calls to ``add`` and one to ``end_episode``, but written in at most two
        slices per key (two when the episode wraps around the end of the ring).
        """
        lengths = {np.shape(value)[0] if np.ndim(value) else 0 for value in episode.values()}
        if lengths <= {0}:  # ``{}`` or zero-length arrays: nothing to write (no episode)
            return
        if len(lengths) != 1 or 0 in lengths:
            raise UsageError(
                f"an episode needs arrays of one common, non-zero length; got lengths {lengths}"
            )
        length = lengths.pop()
        self._check_episode_fits(length)
        if self._schema is None:
            self._allocate(_schema_of({key: value[0] for key, value in episode.items()}))
        self._check_keys(frozenset(episode))
        arrays = {key: self._checked(key, value, (length,)) for key, value in episode.items()}
        self._make_room(length)
        start = self._head % self.max_steps
        first = min(length, self.max_steps - start)
        for key, ring in self._rings.items():
            value = arrays.get(key, np.nan)  # a missing action is stored as NaN
            if np.ndim(value) == 0:
                ring[start : start + first] = value
                ring[: length - first] = value
            else:
                ring[start : start + first] = value[:first]
                ring[: length - first] = value[first:]
        self._head += length
        self.end_episode()

    write_episode = add_episode

    def close(self) -> None:
        """Nothing to flush (the dataset ``Writer`` protocol's end of writing)."""

    def __enter__(self) -> "ReplayBuffer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ----------------------------------------------------------------- reading

    def _rows(self, start: int, length: int) -> dict[str, np.ndarray]:
        """Rows ``start .. start+length-1``: views when contiguous in the ring, else one copy."""
        begin = start % self.max_steps
        end = begin + length
        if end <= self.max_steps:
            return {key: ring[begin:end] for key, ring in self._rings.items()}
        wrapped = end - self.max_steps
        return {
            key: np.concatenate((ring[begin:], ring[:wrapped])) for key, ring in self._rings.items()
        }

    def last_episode(self) -> dict[str, np.ndarray]:
        """Rows of the newest sealed episode still held (views are overwritten by later writes)."""
        if not self._episodes:
            raise UsageError("the buffer holds no sealed episode", hint="call end_episode() first")
        return self._rows(*self._episodes.last())

    def episodes(self) -> Iterator[dict[str, np.ndarray]]:
        """Every sealed episode, oldest first, as a dict of arrays (see ``last_episode``)."""
        for start, length in list(self._episodes):
            yield self._rows(start, length)

    def _gather(
        self, starts: np.ndarray, out: Mapping[str, np.ndarray] | None
    ) -> dict[str, np.ndarray]:
        """Clips starting at ``starts``, gathered by ``np.take`` into preallocated outputs."""
        obs = observation_rows(starts, self.history_len, self.frameskip)
        dense = action_rows(starts, self.history_len, self.frameskip)
        batch = {}
        for key, ring in self._rings.items():
            rows = dense if key == ACTION else obs
            shape = (*rows.shape, *ring.shape[1:])
            if out is None:
                target = self._spares.array(key, shape, ring.dtype)
            else:
                target = self._out_array(out, key, shape, ring.dtype)
            # mode="wrap" maps logical positions onto the ring (and, unlike "raise", is unbuffered).
            np.take(ring, rows, axis=0, out=target, mode="wrap")
            batch[key] = fold_actions(target, self.history_len) if key == ACTION else target
        return batch

    def _out_array(self, out: Mapping[str, np.ndarray], key: str, shape, dtype) -> np.ndarray:
        """``out[key]`` viewed with the gather's (unfolded) shape, or a clear error."""
        given = out.get(key)
        size = int(np.prod(shape))
        if given is None or given.dtype != dtype or given.size != size:
            raise UsageError(
                f"out[{key!r}] must be a {dtype} array of {size} elements, like sample()'s",
                hint="pass the dict a previous sample(batch_size) call returned",
            )
        if not given.flags.c_contiguous:
            raise UsageError(f"out[{key!r}] must be C-contiguous")
        return given.reshape(shape)

    def sample(
        self, batch_size: int, out: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """``batch_size`` clips drawn uniformly, with the buffer's seeded generator.

        ``out`` (a dict a previous ``sample`` of the same size returned, no longer in use) is
        filled in place instead of allocating new arrays, which saves the page faults of fresh
        memory (about half the time at 224x224).
        """
        if int(batch_size) < 1:
            raise UsageError(f"batch_size must be at least 1, got {batch_size}")
        total = self.num_clips
        if total == 0:
            raise UsageError(
                f"no clip to sample: the buffer holds {self.num_episodes} sealed episodes and "
                f"none has the {self.span} rows a clip spans",
                hint="collect more (or longer) episodes, or lower --history-len / --frameskip",
            )
        indices = self._rng.integers(0, total, size=int(batch_size))
        starts = self._episodes.locate(indices)
        return self._gather(starts, out)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        """Clip ``index`` (0 <= index < num_clips), laid out as one row of ``sample()``."""
        return self.__getitems__([index])[0]

    def __getitems__(self, indices) -> list[dict[str, np.ndarray]]:
        """Clips ``indices`` as one dict each, read in one gather (a DataLoader calls this for a
        whole batch and collates the dicts)."""
        batch = self.read_batch(indices)
        return [{key: value[i] for key, value in batch.items()} for i in range(len(indices))]

    def read_batch(self, indices) -> dict[str, np.ndarray]:
        """Clips ``indices`` in one gather, laid out as ``sample()``'s batch."""
        total = self.num_clips
        indices = np.asarray(indices, dtype=np.int64)
        indices = np.where(indices < 0, indices + total, indices)
        if indices.size and not (indices.min() >= 0 and indices.max() < total):
            raise OutOfRangeError(f"clip index out of range: the buffer holds {total} clips")
        return self._gather(self._episodes.locate(indices), None)

    def __repr__(self) -> str:
        return (
            f"ReplayBuffer(max_steps={self.max_steps}, history_len={self.history_len}, "
            f"frameskip={self.frameskip}, steps={len(self)}, episodes={self.num_episodes}, "
            f"nbytes={format_bytes(self.nbytes)})"
        )
