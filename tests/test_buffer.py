"""ReplayBuffer: its invariants (hypothesis), its clip layout, its memory and its errors."""

import os
import subprocess
import sys
from collections import deque
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swmcli.data.buffer import ReplayBuffer, step_bytes
from swmcli.data.clips import clip_starts
from swmcli.errors import BudgetExceeded, SwmError, UsageError

ACTION_DIM = 2


def make_episode(episode_id: int, length: int, res: int = 2) -> dict[str, np.ndarray]:
    """An episode whose rows say which episode and step they are (state and action hold both)."""
    steps = np.arange(length, dtype=np.float32)
    ids = np.full(length, episode_id, dtype=np.float32)
    last = np.arange(length) == length - 1
    return {
        "pixels": np.full((length, res, res, 3), episode_id % 256, dtype=np.uint8),
        "action": np.stack([ids, steps], axis=1),
        "reward": steps.copy(),
        "terminated": last.copy(),
        "truncated": np.zeros(length, dtype=bool),
        "state": np.stack([ids, steps], axis=1),
        "goal": np.zeros((length, 2), dtype=np.float32),
    }


def write(buf: ReplayBuffer, episode: dict[str, np.ndarray], by_step: bool) -> None:
    """Write ``episode`` with add_episode, or row by row with add (no action on the last row)."""
    if not by_step:
        buf.add_episode(episode)
        return
    length = len(episode["pixels"])
    for t in range(length):
        step = {key: value[t] for key, value in episode.items()}
        if t == length - 1 and t > 0:  # (a first row without action would lock a schema without)
            del step["action"]
        buf.add(step)
    buf.end_episode()


def expected_fifo(lengths: list[int], max_steps: int) -> deque[tuple[int, int]]:
    """(episode id, length) a capped FIFO of whole episodes holds after writing ``lengths``."""
    kept: deque[tuple[int, int]] = deque()
    for episode_id, length in enumerate(lengths):
        while sum(n for _, n in kept) + length > max_steps:
            kept.popleft()
        kept.append((episode_id, length))
    return kept


def check_clip(clip: dict[str, np.ndarray], history_len: int, frameskip: int, kept: dict) -> None:
    """One clip lies inside one stored episode, strided observations, dense actions."""
    episode_id, start = clip["state"][0]
    length = kept[int(episode_id)]
    span = history_len * frameskip
    assert start >= 0 and start + span <= length
    strided = start + frameskip * np.arange(history_len)
    np.testing.assert_array_equal(clip["state"][:, 0], episode_id)
    np.testing.assert_array_equal(clip["state"][:, 1], strided)
    assert (clip["pixels"] == int(episode_id) % 256).all()
    np.testing.assert_array_equal(clip["terminated"], strided == length - 1)
    dense = clip["action"].reshape(span, ACTION_DIM)
    rows = start + np.arange(span)
    expect = np.stack([np.full(span, episode_id), rows], axis=1).astype(np.float32)
    expect[rows == length - 1] = np.nan  # the last row of an episode has no action
    np.testing.assert_array_equal(dense, expect)


run = st.tuples(
    st.integers(1, 3),  # history_len
    st.integers(1, 3),  # frameskip
    st.integers(0, 30),  # max_steps above the clip span
    st.lists(st.tuples(st.integers(1, 20), st.booleans()), min_size=1, max_size=12),
    st.integers(0, 2**31),  # seed
)


def build(history_len, frameskip, extra, episodes, seed):
    max_steps = history_len * frameskip + extra
    episodes = [(min(length, max_steps), by_step) for length, by_step in episodes]
    buf = ReplayBuffer(max_steps, history_len=history_len, frameskip=frameskip, seed=seed)
    for episode_id, (length, by_step) in enumerate(episodes):
        write(buf, make_episode(episode_id, length), by_step)
        assert len(buf) <= max_steps
    return buf, [length for length, _ in episodes]


@settings(max_examples=150, deadline=None)
@given(run)
def test_fifo_of_whole_episodes_and_clips_inside_one_episode(params):
    history_len, frameskip, _, _, _ = params
    buf, lengths = build(*params)
    kept = expected_fifo(lengths, buf.max_steps)

    # Never more than max_steps rows; only whole episodes, oldest first, are evicted.
    assert len(buf) == sum(n for _, n in kept) <= buf.max_steps
    assert buf.nbytes == buf.max_steps * buf.bytes_per_step
    assert buf.num_episodes == len(kept)
    assert buf.evicted_episodes == len(lengths) - len(kept)
    assert buf.evicted_steps == sum(lengths) - len(buf)
    for (episode_id, length), rows in zip(kept, buf.episodes(), strict=True):
        np.testing.assert_array_equal(rows["state"][:, 0], episode_id)
        np.testing.assert_array_equal(rows["state"][:, 1], np.arange(length))
        assert np.isnan(rows["action"][-1]).all() and not np.isnan(rows["action"][:-1]).any()
    np.testing.assert_array_equal(buf.last_episode()["state"], make_episode(*kept[-1])["state"])

    # Clips: exactly the valid starts, in order, each inside one episode with the right strides.
    span = history_len * frameskip
    ids = np.array([i for i, _ in kept])
    starts = clip_starts(np.zeros(len(kept)), np.array([n for _, n in kept]), span)
    assert buf.num_clips == len(starts)
    for index in range(buf.num_clips):
        clip = buf[index]
        assert clip["state"][0, 1] == starts[index]
        assert clip["state"][0, 0] in ids
        check_clip(clip, history_len, frameskip, dict(kept))
    if buf.num_clips:
        batch = buf.sample(8)
        for b in range(8):
            check_clip({k: v[b] for k, v in batch.items()}, history_len, frameskip, dict(kept))


def test_the_clip_index_stays_right_over_hundreds_of_episodes_and_evictions():
    """Past the index's first arrays (16 episodes): they grow, and evicted episodes' slots are
    given back; every clip is where a fresh count puts it."""
    lengths = [1 + (7 * n) % 9 for n in range(300)]
    small = ReplayBuffer(60, history_len=2)  # evicts at almost every episode
    large = ReplayBuffer(2000, history_len=2)  # holds them all: the arrays grow
    for episode_id, length in enumerate(lengths):
        for buf in (small, large):
            buf.add_episode(make_episode(episode_id, length))
        if episode_id % 50 != 49:
            continue
        for buf in (small, large):
            kept = expected_fifo(lengths[: episode_id + 1], buf.max_steps)
            kept_lengths = np.array([n for _, n in kept])
            starts = clip_starts(np.zeros(len(kept)), kept_lengths, 2)
            ids = np.repeat([i for i, _ in kept], np.maximum(kept_lengths - 1, 0))
            assert buf.num_clips == len(starts)
            clips = buf.read_batch(np.arange(buf.num_clips))
            np.testing.assert_array_equal(clips["state"][:, 0, 0], ids)
            np.testing.assert_array_equal(clips["state"][:, 0, 1], starts)


@settings(max_examples=40, deadline=None)
@given(run)
def test_sample_is_reproducible_with_a_seed(params):
    first, _ = build(*params)
    second, _ = build(*params)
    if first.num_clips == 0:
        with pytest.raises(UsageError, match="no clip to sample"):
            first.sample(4)
        return
    for _ in range(3):
        a, b = first.sample(16), second.sample(16)
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


def test_sample_draws_every_valid_start_uniformly():
    buf = ReplayBuffer(100, history_len=2, frameskip=2, seed=3)
    buf.add_episode(make_episode(0, 8))  # 5 clips
    buf.add_episode(make_episode(1, 2))  # none: shorter than the span
    buf.add_episode(make_episode(2, 9))  # 6 clips
    batch = buf.sample(11_000)
    keys = batch["state"][:, 0, 0] * 100 + batch["state"][:, 0, 1]
    values, counts = np.unique(keys, return_counts=True)
    np.testing.assert_array_equal(values, [0, 1, 2, 3, 4, 200, 201, 202, 203, 204, 205])
    assert counts.min() > 850 and counts.max() < 1150  # 1,000 each expected (sd ~30)


def test_the_clip_index_of_many_episodes_is_each_episodes_starts_in_order():
    """Episodes of 0 to 12 rows (some too short for a clip), 30,000 of them: more clips than
    ``clip_starts`` numbers at a time, against the index built episode by episode."""
    rng = np.random.default_rng(5)
    lengths = rng.integers(0, 13, 30_000)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    for span in (1, 3, 12):
        pairs = zip(offsets, lengths, strict=True)
        expected = [row for start, n in pairs for row in range(start, start + n - span + 1)]
        starts = clip_starts(offsets, lengths, span)
        assert starts.dtype == np.int64
        np.testing.assert_array_equal(starts, expected)
    assert len(clip_starts(offsets, lengths, 1)) > 2 * 2**16  # more than two blocks
    assert clip_starts(offsets[:0], lengths[:0], 3).shape == (0,)


def test_layout_of_a_clip():
    buf = ReplayBuffer(100, history_len=3, frameskip=2, seed=1)
    buf.add_episode(make_episode(7, 10, res=4))
    batch = buf.sample(5)
    assert batch["pixels"].shape == (5, 3, 4, 4, 3) and batch["pixels"].dtype == np.uint8
    assert batch["action"].shape == (5, 3, 2 * ACTION_DIM) and batch["action"].dtype == np.float32
    assert batch["reward"].shape == (5, 3) and batch["terminated"].dtype == bool
    assert batch["state"].shape == (5, 3, 2)
    clip = buf[4]  # rows 4..9: observations 4, 6, 8; actions of rows 4..9, the last one NaN
    np.testing.assert_array_equal(clip["reward"], [4, 6, 8])
    np.testing.assert_array_equal(
        clip["action"], [[7, 4, 7, 5], [7, 6, 7, 7], [7, 8, np.nan, np.nan]]
    )
    assert buf.num_clips == 5 and len(buf) == 10
    np.testing.assert_array_equal(buf[-1]["reward"], clip["reward"])
    with pytest.raises(IndexError):
        buf[5]


def test_end_episode_sets_the_last_action_to_nan_even_if_one_was_given():
    buf = ReplayBuffer(10)
    episode = make_episode(0, 3)
    buf.add_episode(episode)
    assert not np.isnan(episode["action"]).any()  # the caller's arrays are not touched
    assert np.isnan(buf.last_episode()["action"][-1]).all()


def test_an_episode_wrapping_around_the_ring_reads_back_whole():
    buf = ReplayBuffer(10, history_len=2)
    buf.add_episode(make_episode(0, 6))
    write(buf, make_episode(1, 7), by_step=True)  # rows 6..12 wrap to ring slots 6..9, 0..2
    assert buf.evicted_episodes == 1 and len(buf) == 7
    last = buf.last_episode()
    np.testing.assert_array_equal(last["state"][:, 1], np.arange(7))
    assert [clip["state"][0, 1] for clip in (buf[i] for i in range(buf.num_clips))] == list(
        range(6)
    )


def test_the_episode_in_progress_is_never_evicted_and_may_not_outgrow_the_ring():
    buf = ReplayBuffer(5)
    buf.add_episode(make_episode(0, 2))
    with pytest.raises(UsageError, match="more than max_steps"):
        buf.add_episode(make_episode(1, 6))
    assert len(buf) == 2  # refused before anything was evicted or written
    episode = make_episode(2, 6)
    with pytest.raises(UsageError, match="more than max_steps"):
        for t in range(6):
            buf.add({key: value[t] for key, value in episode.items()})
    assert buf.num_episodes == 0 and buf.evicted_episodes == 1


def test_the_schema_is_locked_by_the_first_step():
    buf = ReplayBuffer(10)
    step = {key: value[0] for key, value in make_episode(0, 1).items()}
    buf.add(step)
    wrong = [
        ({**step, "extra": np.zeros(1)}, "unexpected"),
        ({k: v for k, v in step.items() if k != "reward"}, "missing"),
        ({**step, "pixels": np.zeros((3, 3, 3), np.uint8)}, "pixels"),
        ({**step, "state": step["state"].astype(np.float64)}, "float64"),
        ({**step, "terminated": 1.5}, "terminated"),
    ]
    for bad, words in wrong:
        with pytest.raises(UsageError, match=words) as caught:
            buf.add(bad)
        assert "first one" in caught.value.hint
    buf.add({**step, "reward": 2.0, "terminated": True})  # Python scalars of the same kind are fine
    buf.end_episode()
    assert len(buf) == 2  # nothing of a refused step was kept
    assert buf.last_episode()["reward"].dtype == np.float32


def test_empty_episode_and_empty_buffer_are_clear_errors():
    buf = ReplayBuffer(10, history_len=4)
    with pytest.raises(UsageError, match="end_episode"):
        buf.end_episode()
    buf.add_episode(make_episode(0, 3))  # shorter than a clip
    with pytest.raises(UsageError, match="no clip to sample"):
        buf.sample(1)
    with pytest.raises(UsageError, match="no clip could ever be sampled"):
        ReplayBuffer(3, history_len=2, frameskip=2)
    with pytest.raises(UsageError, match="common"):
        buf.add_episode({"pixels": np.zeros((2, 2, 2, 3), np.uint8), "reward": np.zeros(3)})


def test_preflight_refuses_a_budget_before_allocating():
    step = {key: value[0] for key, value in make_episode(0, 1, res=64).items()}
    per_step = step_bytes(step)
    buf = ReplayBuffer(1000, max_bytes=per_step * 600 + 5)
    with pytest.raises(BudgetExceeded) as caught:
        buf.add(step)
    error = caught.value
    assert error.needed == 1000 * per_step and error.available == per_step * 600 + 5
    assert "at most 600 steps" in error.message and "12.3 MB (11.75 MiB)" in error.message
    assert "max_steps to at most 600" in error.hint and "resolution" in error.hint
    assert error.exit_code == 2 and isinstance(error, SwmError)
    assert buf.nbytes == 0 and buf.bytes_per_step == 0
    with pytest.raises(BudgetExceeded):
        buf.add_episode(make_episode(0, 3, res=64))
    assert ReplayBuffer.nbytes_for(1000, step) == 1000 * per_step
    fits = ReplayBuffer(600, max_bytes=per_step * 600 + 5)
    fits.add(step)
    assert fits.nbytes == fits.nbytes_for(600, step) == 600 * fits.bytes_per_step


def test_allocate_preflights_and_allocates_from_an_example_row_writing_nothing():
    step = {key: value[0] for key, value in make_episode(0, 1, res=16).items()}
    per_step = step_bytes(step)
    with pytest.raises(BudgetExceeded):
        ReplayBuffer(1000, max_bytes=per_step * 10).allocate(step)
    buf = ReplayBuffer(100, history_len=2, seed=0)
    buf.allocate({key: value for key, value in step.items() if key != "action"} | step)
    assert buf.nbytes == 100 * per_step and len(buf) == 0 and buf.num_clips == 0
    buf.add_episode(make_episode(1, 10, res=16))  # rows like the example fit the rings
    assert len(buf) == 10 and buf.nbytes == 100 * per_step
    with pytest.raises(UsageError, match="allocated already"):
        buf.allocate(step)


def test_clear_keeps_the_arrays_and_release_frees_them():
    buf = ReplayBuffer(50, history_len=2)
    buf.add_episode(make_episode(0, 20))
    before = buf.last_episode()["pixels"]
    allocated = buf.nbytes
    buf.clear()
    assert len(buf) == 0 and buf.num_clips == 0 and buf.nbytes == allocated
    buf.add_episode(make_episode(1, 20))
    assert np.shares_memory(before, buf.last_episode()["pixels"])  # same arrays reused
    with pytest.raises(UsageError, match="schema"):  # clear() keeps the schema
        buf.add_episode(make_episode(1, 5, res=3))
    buf.release()
    assert len(buf) == 0 and buf.nbytes == 0 and buf.bytes_per_step == 0
    buf.add_episode(make_episode(2, 5, res=3))  # a fresh schema after release()
    assert buf.last_episode()["pixels"].shape == (5, 3, 3, 3)


def current_rss_bytes() -> int:
    """Resident set size of this process now (Linux)."""
    resident_pages = int(Path("/proc/self/statm").read_text().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


RINGS_RSS = """
import gc
from test_buffer import current_rss_bytes, make_episode
from swmcli.data.buffer import ReplayBuffer, step_bytes
episode = make_episode(0, 100, res=64)
warm = ReplayBuffer(200, history_len=4, frameskip=2)  # first-use allocations are not the rings'
warm.add_episode(episode)
warm.release()
gc.collect()
rss_before = current_rss_bytes()
buf = ReplayBuffer(8000, history_len=4, frameskip=2)
for _ in range(100):
    buf.add_episode(episode)
expected = 8000 * step_bytes({key: value[0] for key, value in episode.items()})
assert buf.nbytes == expected
growth = current_rss_bytes() - rss_before
buf.release()
gc.collect()
print(expected, growth, current_rss_bytes() - rss_before)
"""


def test_ram_is_the_rings_and_is_given_back_on_release():
    # 8,000 steps of 64x64 pixels (~98 MB): RSS grows by the rings, within 1%, once every page
    # has been written (the ring wraps several times), and drops by them on release(). Measured in
    # a fresh interpreter: in a test worker, threads earlier tests started (Lance's, torch's) move
    # the RSS by megabytes while it runs.
    paths = [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths))}
    done = subprocess.run([sys.executable, "-c", RINGS_RSS], capture_output=True, text=True,
                          env=env, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    expected, growth, left = map(int, done.stdout.split())
    assert abs(growth - expected) <= 0.01 * expected, (growth, expected)
    assert left <= 0.01 * expected, (left, expected)


def twin_buffers() -> tuple[ReplayBuffer, ReplayBuffer]:
    """Two buffers with the same episodes and seed: they sample the same clips."""
    twins = ReplayBuffer(100, 2, 3, seed=5), ReplayBuffer(100, 2, 3, seed=5)
    for buf in twins:
        buf.add_episode(make_episode(0, 30))
        buf.add_episode(make_episode(1, 30))
    return twins


def test_sample_into_given_arrays_matches_a_fresh_sample():
    first, second = twin_buffers()
    out = first.sample(6)
    pixels = out["pixels"]
    again = first.sample(6, out=out)
    assert again["pixels"] is pixels or np.shares_memory(again["pixels"], pixels)
    second.sample(6)
    fresh = second.sample(6)
    for key in fresh:
        np.testing.assert_array_equal(again[key], fresh[key])
    with pytest.raises(UsageError, match="out"):
        first.sample(7, out=out)


def test_a_held_batch_is_never_written_over_and_a_dropped_one_is_reused():
    import torch

    buf, twin = twin_buffers()
    held = {k: torch.from_numpy(v) for k, v in buf.sample(6).items()}  # as the loader holds it
    kept = twin.sample(6)
    dropped = buf.sample(6)
    address = dropped["pixels"].ctypes.data
    twin.sample(6)
    del dropped
    reused = buf.sample(6)
    assert reused["pixels"].ctypes.data == address  # no fresh pages to fault in
    for key, value in twin.sample(6).items():
        np.testing.assert_array_equal(reused[key], value)
    for _ in range(3):  # more batches than spares: the held one stays intact throughout
        again, fresh = buf.sample(6), twin.sample(6)
        for key in fresh:
            np.testing.assert_array_equal(again[key], fresh[key])
    for key in kept:
        np.testing.assert_array_equal(held[key].numpy(), kept[key])


def test_a_buffer_is_a_writer_and_a_map_style_dataset():
    import torch
    from torch.utils.data import DataLoader

    with ReplayBuffer(200, history_len=2, frameskip=2) as buf:
        for episode_id in range(4):
            buf.write_episode(make_episode(episode_id, 12))
    buf.close()
    loader = DataLoader(buf, batch_size=8, sampler=range(buf.num_clips), num_workers=0)
    batches = list(loader)
    assert sum(len(batch["pixels"]) for batch in batches) == buf.num_clips == 4 * 9
    first = batches[0]
    assert first["pixels"].dtype == torch.uint8 and first["pixels"].shape == (8, 2, 2, 2, 3)
    assert first["action"].shape == (8, 2, 2 * ACTION_DIM)
    np.testing.assert_array_equal(
        first["state"].numpy(), np.stack([buf[i]["state"] for i in range(8)])
    )
    assert [len(e["pixels"]) for e in buf.episodes()] == [12] * 4


def test_every_bad_argument_is_a_value_error_a_library_user_can_catch():
    buf = ReplayBuffer(20, history_len=2)
    bad_calls = [
        lambda: ReplayBuffer(0),
        lambda: ReplayBuffer(3, history_len=2, frameskip=2),
        lambda: ReplayBuffer(10**6, max_bytes=1).add_episode(make_episode(0, 5)),
        buf.end_episode,
        lambda: buf.sample(4),
        lambda: buf.add_episode(make_episode(0, 25)),
    ]
    for call in bad_calls:
        with pytest.raises(ValueError):
            call()
    buf.add_episode(make_episode(0, 5))
    for call in (
        lambda: buf.add({"pixels": np.zeros((2, 2, 3), np.uint8)}),
        lambda: buf.sample(0),
        lambda: buf.sample(2, out={"pixels": np.zeros(3, np.uint8)}),
    ):
        with pytest.raises(ValueError):
            call()
    with pytest.raises(IndexError):
        buf[buf.num_clips]
    with pytest.raises(IndexError):
        buf.read_batch([0, -buf.num_clips - 1])


def test_a_buffer_pickles_to_an_equal_buffer():
    import pickle

    buffer = ReplayBuffer(50, history_len=2, frameskip=1, seed=3)
    for seed in range(3):
        buffer.add_episode(make_episode(seed, 6 + seed))
    buffer.sample(4)  # its spare outputs hold a lock: not part of what is pickled
    copy = pickle.loads(pickle.dumps(buffer))
    assert (len(copy), copy.num_episodes, copy.num_clips) == (21, 3, 18)
    for mine, theirs in zip(buffer.episodes(), copy.episodes(), strict=True):
        for key in mine:
            np.testing.assert_array_equal(mine[key], theirs[key])
    mine, theirs = buffer.sample(5), copy.sample(5)  # the same generator state too
    for key in mine:
        np.testing.assert_array_equal(mine[key], theirs[key])


def test_writing_an_empty_episode_is_a_no_op():
    buffer = ReplayBuffer(20, seed=0)
    buffer.add_episode({})
    empty = {"pixels": np.zeros((0, 4, 4, 3), np.uint8), "action": np.zeros((0, 2), np.float32)}
    buffer.add_episode(empty)
    assert (len(buffer), buffer.num_episodes, buffer.nbytes) == (0, 0, 0)
    buffer.add_episode(make_episode(0, 5))
    buffer.write_episode(empty)
    assert (len(buffer), buffer.num_episodes) == (5, 1)
    with pytest.raises(UsageError, match="one common, non-zero length"):
        buffer.add_episode({"pixels": empty["pixels"], "action": np.zeros((3, 2), np.float32)})
