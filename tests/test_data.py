"""Streaming clips from disk: the ReplayBuffer's layout, from any format, through DataLoader
workers, with clear errors for impossible requests."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_storage import SUFFIX, make_episode

from swmcli.data.buffer import ReplayBuffer
from swmcli.data.formats import FORMATS, open_writer
from swmcli.data.storage.lance import opened_in_this_process as lance_opened
from swmcli.data.streaming import load_dataset, make_loader

LENGTHS = (9, 4, 12, 7)


def write_dataset(path, lengths=LENGTHS, fmt=None):
    with open_writer(path, format=fmt, mode="overwrite", metadata={"env_id": "test"}) as writer:
        for seed, length in enumerate(lengths):
            writer.write_episode(make_episode(seed, length))
    return [make_episode(seed, length) for seed, length in enumerate(lengths)]


@pytest.fixture(params=FORMATS)
def dataset(request, tmp_path):
    path = tmp_path / f"d{SUFFIX[request.param]}"
    return path, write_dataset(path, fmt=request.param)


def expected_clip(episodes, clip: int, history_len: int, frameskip: int) -> dict:
    """Clip ``clip`` computed by hand from the episodes (episode order, then start)."""
    span = history_len * frameskip
    for episode in episodes:
        count = max(len(episode["pixels"]) - span + 1, 0)
        if clip < count:
            start = clip
            clip_rows = slice(start, start + span, frameskip)
            out = {k: v[clip_rows] for k, v in episode.items() if k != "action"}
            dense = episode["action"][start : start + span]
            out["action"] = dense.reshape(history_len, frameskip * dense.shape[-1])
            return out
        clip -= count
    raise IndexError(clip)


def test_clips_match_hand_computed_layout(dataset):
    path, episodes = dataset
    clips = load_dataset(path, history_len=3, frameskip=2)
    # Episodes of 9, 4, 12, 7 rows hold 4, 0, 7, 2 clips of span 6.
    assert len(clips) == clips.num_clips == 13
    for index in range(len(clips)):
        got, want = clips[index], expected_clip(episodes, index, 3, 2)
        assert set(got) == set(want)
        for key in want:
            assert got[key].dtype == want[key].dtype
            assert got[key].tobytes() == want[key].tobytes(), (index, key)
    assert clips[0]["pixels"].shape == (3, 32, 32, 3)
    assert clips[0]["action"].shape == (3, 4)


def test_batch_read_equals_single_reads(dataset):
    path, _ = dataset
    clips = load_dataset(path, keys_to_load=["pixels", "action"], history_len=2, frameskip=3)
    indices = [5, 0, 5, 3]
    batch = clips.read_batch(indices)
    assert set(batch) == {"pixels", "action"}
    for position, index in enumerate(indices):
        for key, value in clips[index].items():
            assert np.array_equal(batch[key][position], value, equal_nan=True)


def test_same_layout_as_the_replay_buffer(tmp_path):
    path = tmp_path / "d.lance"
    episodes = write_dataset(path)
    buffer = ReplayBuffer(max_steps=1000, history_len=2, frameskip=2)
    for episode in episodes:
        buffer.add_episode(episode)
    clips = load_dataset(path, history_len=2, frameskip=2)
    assert clips.num_clips == buffer.num_clips
    for index in range(clips.num_clips):
        from_disk, from_buffer = clips[index], buffer[index]
        assert set(from_disk) == set(from_buffer)
        for key in from_disk:
            assert from_disk[key].shape == from_buffer[key].shape, key
            assert np.array_equal(from_disk[key], from_buffer[key], equal_nan=True), key


def test_episode_selection(tmp_path):
    path = tmp_path / "d.h5"
    episodes = write_dataset(path)
    clips = load_dataset(path, history_len=2, episodes=[2])
    assert clips.num_clips == 11
    assert np.array_equal(clips[0]["pixels"], episodes[2]["pixels"][:2])
    with pytest.raises(IndexError, match="episode indices"):
        load_dataset(path, episodes=[7])


def test_missing_key_and_too_long_clips_are_usage_errors(tmp_path):
    path = tmp_path / "d.lance"
    write_dataset(path)
    with pytest.raises(KeyError, match="no key 'depth'") as caught:
        load_dataset(path, keys_to_load=["pixels", "depth"])
    assert caught.value.exit_code == 2 and "pixels" in caught.value.hint
    with pytest.raises(ValueError, match="no clip fits") as caught:
        load_dataset(path, history_len=7, frameskip=2)
    assert caught.value.exit_code == 2
    with pytest.raises(FileNotFoundError, match="no dataset at"):
        load_dataset(tmp_path / "missing.lance")


def test_cache_dir_keeps_the_episode_index(tmp_path, dataset):
    path, _ = dataset
    cache = tmp_path / "cache"
    first = load_dataset(path, history_len=2, cache_dir=cache)
    files = list(cache.glob("*.npy"))
    if first.format == "hdf5":
        assert files == []  # the index lives in the file itself
        return
    assert len(files) == 1
    # A reopen trusts the cache instead of rescanning: a doctored index shows it was used.
    np.save(files[0], np.array([sum(LENGTHS)], dtype=np.int64))
    assert load_dataset(path, history_len=2, cache_dir=cache).num_clips == sum(LENGTHS) - 1
    # Appending an episode changes the dataset's token: the cache is rebuilt, not trusted.
    with open_writer(path) as writer:
        writer.write_episode(make_episode(9, 5))
    assert load_dataset(path, history_len=2, cache_dir=cache).num_clips == first.num_clips + 4


# Lance through workers: test_lance_workers_fork_only_while_it_is_safe (a fresh process).
@pytest.mark.parametrize("processes", [False, True])
@pytest.mark.parametrize("fmt", ["hdf5", "folder"])
def test_loader_with_workers_yields_batches_in_order(tmp_path, fmt, processes):
    path = tmp_path / f"d{SUFFIX[fmt]}"
    write_dataset(path, lengths=(30, 30), fmt=fmt)
    clips = load_dataset(path, history_len=4, frameskip=2)
    loader = make_loader(clips, batch_size=8, num_workers=2, shuffle=False, processes=processes)
    assert loader.pin_memory == torch.cuda.is_available()
    batches = list(loader)
    assert len(batches) == clips.num_clips // 8
    first = batches[0]
    assert first["pixels"].dtype == torch.uint8
    assert first["pixels"].shape == (8, 4, 32, 32, 3)
    assert first["action"].shape == (8, 4, 4)
    want = clips.read_batch(list(range(8)))
    for key, value in want.items():
        assert np.array_equal(first[key].numpy(), value, equal_nan=True)


def test_loader_order_is_seeded(tmp_path):
    path = tmp_path / "d.h5"
    write_dataset(path)
    clips = load_dataset(path, keys_to_load=["state"], history_len=2)

    def first_batch(seed, workers=0, processes=False):
        loader = make_loader(clips, 4, num_workers=workers, seed=seed, processes=processes)
        return next(iter(loader))["state"]

    assert torch.equal(first_batch(1), first_batch(1))
    assert not torch.equal(first_batch(1), first_batch(2))
    # The order is the seed's, whoever reads: this process, threads or worker processes.
    assert torch.equal(first_batch(1), first_batch(1, workers=2))
    assert torch.equal(first_batch(1), first_batch(1, workers=2, processes=True))


def test_loader_over_a_replay_buffer(tmp_path):
    buffer = ReplayBuffer(max_steps=500, history_len=2, frameskip=1)
    for seed, length in enumerate(LENGTHS):
        buffer.add_episode(make_episode(seed, length))
    loader = make_loader(buffer, batch_size=5, num_workers=2)
    assert loader.num_workers == 0
    batch = next(iter(loader))
    assert batch["pixels"].dtype == torch.uint8
    assert batch["pixels"].shape == (5, 2, 32, 32, 3)
    assert batch["action"].shape == (5, 2, 2)


FRESH_PROCESS = """
import sys
from swmcli.data.streaming import load_dataset, make_loader
clips = load_dataset(sys.argv[1], history_len=2)
first = make_loader(clips, batch_size=4, num_workers=2, shuffle=False, processes=True)
second = make_loader(clips, batch_size=4, num_workers=1, shuffle=False, processes=True)
batch = next(iter(first))
same = (batch["pixels"].numpy() == clips.read_batch([0, 1, 2, 3])["pixels"]).all()
# clips.__getitems__ opened Lance here: the second loader, built before that, must not fork now.
again = next(iter(second))
same = same and (again["pixels"] == batch["pixels"]).all().item()
methods = [loader.multiprocessing_context.get_start_method() for loader in (first, second)]
print(*methods, tuple(batch["pixels"].shape), same)
"""


def _in_a_fresh_process(script: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """Run ``script`` on a 20-row Lance dataset in a new Python process (nothing opened yet)."""
    path = tmp_path / "d.lance"
    write_dataset(path, lengths=(20,))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run(
        [sys.executable, "-c", script, str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done


def test_lance_workers_fork_only_while_it_is_safe(tmp_path):
    """With worker processes, a fresh process (`swm train` after `swm collect`) forks its workers
    (fast); once it has opened Lance itself, a loader starting workers uses forkserver instead
    (no crash)."""
    done = _in_a_fresh_process(FRESH_PROCESS, tmp_path)
    assert done.stdout.split() == ["fork", "forkserver", "(4,", "2,", "32,", "32,", "3)", "True"]
    assert "fork-safe" not in done.stderr


@pytest.mark.parametrize("workers", [2, 0])
def test_a_plain_dataloader_with_the_default_collate_equals_make_loader(dataset, workers):
    path, _ = dataset
    clips = load_dataset(path, keys_to_load=["pixels", "action"], history_len=2, frameskip=2)
    order = np.random.default_rng(0).permutation(clips.num_clips)
    # Workers fork, unless this (test) process has opened Lance already: Lance is not fork-safe.
    # A fresh process forks them (test_plain_dataloader_workers_fork_in_a_fresh_process).
    context = "forkserver" if workers and lance_opened() else None
    plain = torch.utils.data.DataLoader(
        clips,
        batch_size=4,
        sampler=order.tolist(),
        num_workers=workers,
        multiprocessing_context=context,
    )
    ours = make_loader(clips, batch_size=4, num_workers=workers, order=order, drop_last=False)
    pairs = list(zip(plain, ours, strict=True))
    assert len(pairs) == -(-clips.num_clips // 4)
    for got, want in pairs:
        assert set(got) == set(want) == {"pixels", "action"}
        for key in want:
            assert got[key].dtype == want[key].dtype
            assert torch.equal(got[key].nan_to_num(), want[key].nan_to_num())
    # shuffle=True: every clip once per epoch, in some order
    shuffled = torch.utils.data.DataLoader(
        clips, batch_size=4, shuffle=True, num_workers=workers, multiprocessing_context=context
    )
    seen = torch.cat([batch["pixels"] for batch in shuffled])
    every = torch.from_numpy(clips.read_batch(range(clips.num_clips))["pixels"])
    assert sorted(map(bytes, seen.numpy())) == sorted(map(bytes, every.numpy()))


def test_plain_dataloader_workers_fork_in_a_fresh_process(tmp_path):
    """A user's script: load_dataset over Lance, then a plain DataLoader with forked workers."""
    path = tmp_path / "d.lance"
    write_dataset(path, fmt="lance")
    code = (
        "import sys, torch\n"
        "from swmcli import load_dataset\n"
        "clips = load_dataset(sys.argv[1], history_len=2, frameskip=2)\n"
        "loader = torch.utils.data.DataLoader(clips, batch_size=4, shuffle=True, num_workers=2)\n"
        "print(sum(len(batch['pixels']) for batch in loader), clips.num_clips)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    seen, total = done.stdout.split()
    assert seen == total


def test_a_fork_after_lance_was_opened_is_refused_clearly(tmp_path):
    """Lance opened in the parent, then forked workers: one clear error, not a random crash."""
    path = tmp_path / "d.lance"
    write_dataset(path, fmt="lance")
    clips = load_dataset(path, history_len=2, frameskip=2)
    clips[0]  # opens Lance in this process
    loader = torch.utils.data.DataLoader(
        clips, batch_size=4, num_workers=1, multiprocessing_context="fork"
    )
    with pytest.raises(ValueError, match="forkserver"):
        next(iter(loader))


def test_every_bad_argument_of_load_dataset_is_a_value_error(tmp_path):
    path = tmp_path / "d.h5"
    write_dataset(path)
    (tmp_path / "notes.txt").write_text("hello")
    bad_calls = [
        (FileNotFoundError, lambda: load_dataset(tmp_path / "missing.lance")),
        (ValueError, lambda: load_dataset(tmp_path / "notes.txt")),
        (ValueError, lambda: load_dataset(path, history_len=0)),
        (ValueError, lambda: load_dataset(path, history_len=13)),
        (KeyError, lambda: load_dataset(path, keys_to_load=["depth"])),
        (IndexError, lambda: load_dataset(path, episodes=[0, 4])),
        (IndexError, lambda: load_dataset(path)[100]),
        (IndexError, lambda: load_dataset(path).read_batch([0, 100])),
        (ValueError, lambda: load_dataset(path, frameskip=1.5)),
        (ValueError, lambda: load_dataset(path, history_len=True)),
    ]
    for kind, call in bad_calls:
        with pytest.raises(kind) as caught:
            call()
        assert isinstance(caught.value, ValueError), caught.value
    with pytest.raises(TypeError, match="clip indices must be integers"):
        load_dataset(path)[1.5]  # never clip 1


PLAIN_AFTER_USE = """
import sys, torch
from swmcli import load_dataset
for path in sys.argv[1:]:
    clips = load_dataset(path, history_len=2, frameskip=2)
    first = clips[0]  # the dataset is used in this process first
    loader = torch.utils.data.DataLoader(clips, batch_size=4, num_workers=2)
    batches = list(loader)
    same = torch.equal(batches[0]["pixels"][0], torch.from_numpy(first["pixels"]))
    print(sum(len(batch["pixels"]) for batch in batches) == clips.num_clips and same)
"""


def test_a_plain_dataloader_works_after_the_dataset_was_used_in_this_process(tmp_path):
    """stable-worldmodel's pattern, ``ds[0]`` then ``DataLoader(ds, num_workers=2)``, with real
    worker processes, in a fresh process as a user's script runs it, for every format."""
    paths = [tmp_path / f"d{SUFFIX[fmt]}" for fmt in FORMATS]
    for path, fmt in zip(paths, FORMATS, strict=True):
        write_dataset(path, lengths=(6, 5), fmt=fmt)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run(
        [sys.executable, "-c", PLAIN_AFTER_USE, *map(str, paths)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True"] * len(FORMATS)


CHILD_DIES = """
import os, signal, sys
from swmcli.data import streaming as data
from swmcli.errors import DatasetError

data._describe = lambda path, cache_dir: os.kill(os.getpid(), signal.SIGKILL)
try:
    data.load_dataset(sys.argv[1])
except DatasetError as error:
    print(error.message)
"""


def test_an_indexing_child_that_dies_is_an_error_not_a_hang(tmp_path):
    done = _in_a_fresh_process(CHILD_DIES, tmp_path)
    assert "its process died (exit code -9)" in done.stdout


@pytest.mark.parametrize("fmt", ["lance", "hdf5"])
def test_reader_threads_never_write_over_a_batch_still_held(tmp_path, fmt):
    path = tmp_path / f"d{SUFFIX[fmt]}"
    write_dataset(path, lengths=(40, 40, 40), fmt=fmt)
    clips = load_dataset(path, history_len=2, frameskip=1)
    order = np.random.default_rng(0).permutation(clips.num_clips)
    held = list(make_loader(clips, batch_size=4, num_workers=2, order=order))
    for number, batch in enumerate(held):  # all kept: no array may have been reused
        want = clips.read_batch(order[number * 4 : number * 4 + 4])
        for key, value in want.items():
            assert np.array_equal(batch[key].numpy(), value, equal_nan=True), (number, key)
    del held
    # Let go batch by batch, the same few arrays come back: no fresh pages per batch. (A spare
    # still in flight when all are busy makes a new one: a few more than ``keep`` at most, one
    # more each time a busy machine keeps a batch in flight longer.)
    addresses = {b["pixels"].data_ptr() for b in make_loader(clips, 4, num_workers=2, order=order)}
    assert len(addresses) <= clips.spares.keep + 4 < len(order) // 4


def test_reader_threads_raise_the_readers_error_and_stop(tmp_path):
    import threading

    path = tmp_path / "d.h5"
    write_dataset(path)
    clips = load_dataset(path, history_len=2)
    before = threading.active_count()
    loader = make_loader(clips, batch_size=2, num_workers=2, order=np.array([0, 1, 2, 10**9]))
    batches = iter(loader)
    next(batches)
    with pytest.raises(IndexError, match="clip index out of range"):
        next(batches)
    abandoned = iter(make_loader(clips, batch_size=2, num_workers=2))
    next(abandoned)
    abandoned.close()  # what leaving a for loop early does to it
    assert threading.active_count() == before


FREED_BLOCKS = """
import ctypes, resource, sys
from swmcli.host import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):  # a reader's buffer: allocated, filled, freed
    block = libc.malloc(40 * 2**20)
    ctypes.memset(block, 1, 40 * 2**20)
    libc.free(block)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
    reason="glibc's malloc parameters",
)
def test_a_streaming_process_reuses_freed_memory_instead_of_faulting_it_in_again():
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}

    def faults(mode: str) -> int:
        command = [sys.executable, "-c", FREED_BLOCKS, mode]
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return int(done.stdout)

    pages = 40 * 2**20 // os.sysconf("SC_PAGE_SIZE")
    assert faults("default") > 10 * pages  # glibc maps and unmaps every block: faults each time
    assert faults("keep") < 2 * pages  # the first block's pages, then reused
