"""Where training reads its clips: streamed from disk, or from a ReplayBuffer loaded with them.

In memory a batch is one ``np.take`` per key, with no read, decompression or worker in between,
but the buffer holds every training step at once: it is chosen only when that fits the RAM budget
(``--ram-budget``, default ``data.ram_share`` of the RAM available). The check is the buffer's own
preflight, made before anything is allocated. A loaded buffer numbers its clips as the dataset
does (episode by episode, every valid start), so one clip order reads the same clips from either
source and a run's losses do not depend on where its clips came from.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from swmcli.core.buffer import ReplayBuffer, preflight, schema_bytes
from swmcli.core.storage import Schema, open_reader
from swmcli.core.storage.checksums import check_episode
from swmcli.errors import BudgetExceeded, DatasetError, UsageError
from swmcli.memory.measure import available_host_bytes
from swmcli.units import format_bytes


@dataclass(frozen=True)
class SourceChoice:
    """Stream or hold in memory, why, and the bytes the buffer takes (or would take)."""

    in_memory: bool
    reason: str
    buffer_bytes: int
    budget_bytes: int


def ram_budget(budget: int | None, share: float) -> int:
    """Bytes the buffer may take: ``budget``, else ``share`` of the RAM available now."""
    return int(budget) if budget is not None else int(share * available_host_bytes())


def newest_episodes(lengths: np.ndarray, episodes: Sequence[int], max_steps: int | None):
    """The newest of ``episodes`` whose lengths add up to at most ``max_steps``, oldest first
    (all of them when ``max_steps`` is None)."""
    episodes = np.asarray(episodes, dtype=np.int64)
    if max_steps is None:
        return episodes
    newest_first = np.cumsum(np.asarray(lengths, dtype=np.int64)[episodes][::-1])
    kept = int(np.searchsorted(newest_first, max_steps, side="right"))
    if kept == 0:
        raise UsageError(
            f"--memory-steps {max_steps:,} holds no whole episode (the newest has "
            f"{int(newest_first[0]) if len(newest_first) else 0:,} steps)",
            hint="raise --memory-steps, or leave it out to train on every episode",
        )
    return episodes[len(episodes) - kept :]


def choose_source(
    schema: Schema, steps: int, in_memory: bool | None, budget: int, budget_words: str
) -> SourceChoice:
    """In memory when ``steps`` rows of ``schema`` fit ``budget`` bytes, unless ``in_memory`` says.

    ``in_memory=True`` that does not fit raises ``BudgetExceeded`` (before any allocation);
    ``None`` falls back to streaming and says why. ``budget_words`` names the budget for the
    reason ("--ram-budget", "50% of the available RAM").
    """
    row_bytes = schema_bytes(schema)
    needed = steps * row_bytes
    if in_memory is False:
        return SourceChoice(False, "streamed from disk: --no-in-memory", 0, budget)
    try:
        preflight(steps, row_bytes, budget)
    except BudgetExceeded as refused:
        if in_memory:
            fits = budget // row_bytes
            raise BudgetExceeded(
                f"--in-memory: the {steps:,} training steps need {format_bytes(needed)} of RAM "
                f"but {budget_words} allows {format_bytes(budget)} ({fits:,} steps)",
                hint=f"pass --no-in-memory to stream them, --memory-steps {fits:,} to hold the "
                "newest that fit, or a larger --ram-budget",
                needed=needed,
                available=budget,
            ) from refused
        reason = (
            f"streamed from disk: the {steps:,} training steps need {format_bytes(needed)}, "
            f"more than {budget_words} ({format_bytes(budget)})"
        )
        return SourceChoice(False, reason, 0, budget)
    words = "--in-memory" if in_memory else f"they fit {budget_words} ({format_bytes(budget)})"
    reason = f"in memory: {steps:,} training steps take {format_bytes(needed)}; {words}"
    return SourceChoice(True, reason, needed, budget)


def fill_buffer(
    buffer: ReplayBuffer,
    path: Path,
    episodes: Sequence[int],
    keys: Sequence[str] | None,
    damaged: dict[int, str] | None = None,
) -> ReplayBuffer:
    """Add ``episodes`` of the dataset at ``path`` (``keys`` of them; all when None) to
    ``buffer``, in order; the first one runs the buffer's preflight before anything is held.
    Each episode is checked against its checksums first: a damaged one is a DatasetError, or,
    when a ``damaged`` dict is given, is left out and recorded there with why."""
    reader = open_reader(path)
    try:
        for index in episodes:
            episode = reader.read_episode(int(index), keys=keys)
            try:
                check_episode(reader, int(index), episode)
            except DatasetError as error:
                if damaged is None:
                    raise
                damaged[int(index)] = error.message.rsplit("(", 1)[-1].rstrip(")")
                continue
            buffer.add_episode(episode)
    finally:
        reader.close()
    return buffer


def load_clips(dataset, budget: int, seed: int) -> ReplayBuffer:
    """A ReplayBuffer holding exactly ``dataset``'s episodes (a ``ClipDataset``), clip ``i`` of
    the one being clip ``i`` of the other."""
    steps = int(dataset.episode_lengths[dataset.episodes].sum())
    buffer = ReplayBuffer(
        steps, dataset.history_len, dataset.frameskip, seed=seed, max_bytes=budget
    )
    damaged = dataset.damaged if dataset.skip_damaged else None
    return fill_buffer(buffer, dataset.path, dataset.episodes, list(dataset.keys), damaged)
