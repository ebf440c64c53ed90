"""Clip index math shared by the ReplayBuffer and every on-disk dataset.

A clip of ``history_len`` observations with ``frameskip`` spans ``history_len * frameskip``
consecutive rows of one episode. Observation keys are read at the strided rows
``s, s+frameskip, ..., s+(history_len-1)*frameskip``; the action is dense: observation ``k`` gets
the ``frameskip`` actions of rows ``s+k*frameskip ... s+(k+1)*frameskip-1`` concatenated, so a
clip's action has shape ``(history_len, frameskip * action_dim)``. Clips never cross episodes.

Everything here works on integer arrays (no per-clip Python objects): one int64 start per clip.
"""

import numpy as np

ACTION = "action"
_BLOCK = 2**16  # clip starts numbered at a time by clip_starts


def clip_span(history_len: int, frameskip: int) -> int:
    """Rows one clip covers."""
    return history_len * frameskip


def clip_starts(episode_starts: np.ndarray, episode_lengths: np.ndarray, span: int) -> np.ndarray:
    """Row of every valid clip start, episode by episode, in order (int64).

    An episode of length L starting at row r contributes starts r .. r+L-span; one shorter than
    ``span`` contributes none.
    """
    counts = clip_counts(episode_lengths, span)
    # A clip's start is its episode's start plus its number within the episode: the episode's
    # start less the number of its first clip, repeated, plus the clip's number, added in place a
    # block at a time: whole temporaries of a ten-million-clip index are 80 MB each of fresh
    # memory, which the kernel faults in page by page (up to 0.5 s of an open, measured).
    first = np.cumsum(counts) - counts
    starts = np.repeat(np.asarray(episode_starts, dtype=np.int64) - first, counts)
    for block in range(0, len(starts), _BLOCK):
        starts[block : block + _BLOCK] += np.arange(block, min(block + _BLOCK, len(starts)))
    return starts


def clip_counts(episode_lengths: np.ndarray, span: int) -> np.ndarray:
    """Clips each episode holds: ``max(L - span + 1, 0)`` per episode (int64)."""
    return np.maximum(np.asarray(episode_lengths, dtype=np.int64) - span + 1, 0)


def locate_clips(
    indices: np.ndarray, episode_starts: np.ndarray, clip_ends: np.ndarray, first_clip: int = 0
) -> np.ndarray:
    """Start row of each clip in ``indices``, numbered as :func:`clip_starts` numbers them.

    ``clip_ends`` is ``first_clip + np.cumsum(clip_counts(lengths, span))``: the clips are
    numbered from ``first_clip``. This finds a clip's episode by binary search, so a sampler
    needs O(episodes) memory instead of one start per clip.
    """
    indices = np.asarray(indices, dtype=np.int64)
    episode = np.searchsorted(clip_ends, indices, side="right")
    # Clips before this episode; the first has first_clip (the -1 index is masked by the where).
    before = np.where(episode > 0, clip_ends[episode - 1], first_clip)
    return np.asarray(episode_starts, dtype=np.int64)[episode] + (indices - before)


def observation_rows(starts: np.ndarray, history_len: int, frameskip: int) -> np.ndarray:
    """Rows of the strided observations, shape ``(len(starts), history_len)``."""
    steps = np.arange(history_len, dtype=np.int64) * frameskip
    return np.asarray(starts, dtype=np.int64)[:, None] + steps[None, :]


def action_rows(starts: np.ndarray, history_len: int, frameskip: int) -> np.ndarray:
    """Rows of the dense actions, shape ``(len(starts), history_len * frameskip)``."""
    steps = np.arange(clip_span(history_len, frameskip), dtype=np.int64)
    return np.asarray(starts, dtype=np.int64)[:, None] + steps[None, :]


def fold_actions(actions: np.ndarray, history_len: int) -> np.ndarray:
    """Dense actions ``(..., history_len*frameskip, A)`` -> ``(..., history_len, frameskip*A)``."""
    *lead, rows, action_dim = actions.shape
    return actions.reshape(*lead, history_len, (rows // history_len) * action_dim)


def heldout_split(num_episodes: int, heldout: int) -> tuple[range, range]:
    """Episodes to train on and episodes held out for evaluation: the last ``heldout`` are held
    out (all of them when there are fewer). Training and evaluation split with this one rule."""
    first = max(num_episodes - heldout, 0)
    return range(first), range(first, num_episodes)
