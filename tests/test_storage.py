"""On-disk datasets: every format round-trips episodes bit for bit, survives SIGKILL, and turns
bad input into one clear DatasetError."""

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from swmcli.data.formats import FORMATS, detect, open_reader, open_writer
from swmcli.data.storage import folder, hdf5
from swmcli.data.streaming import load_dataset
from swmcli.errors import DatasetError

SUFFIX = {"lance": ".lance", "hdf5": ".h5", "folder": ""}
REPO = Path(__file__).resolve().parents[1]


def make_episode(seed: int, length: int, resolution: int = 32) -> dict[str, np.ndarray]:
    """A collect-like episode: random pixels, NaN last action, state and goal."""
    rng = np.random.default_rng(seed)
    action = rng.standard_normal((length, 2)).astype(np.float32)
    action[-1] = np.nan
    truncated = np.zeros(length, dtype=bool)
    truncated[-1] = True
    return {
        "pixels": rng.integers(0, 256, (length, resolution, resolution, 3), dtype=np.uint8),
        "action": action,
        "reward": rng.standard_normal(length).astype(np.float32),
        "terminated": np.zeros(length, dtype=bool),
        "truncated": truncated,
        "state": rng.standard_normal((length, 2)).astype(np.float32),
        "goal": rng.standard_normal((length, 2)).astype(np.float32),
    }


def assert_same_episode(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for key in want:
        assert got[key].dtype == want[key].dtype, key
        assert got[key].shape == want[key].shape, key
        assert got[key].tobytes() == want[key].tobytes(), key  # bit-exact, NaNs included


def write(path: Path, episodes, fmt: str | None = None, mode: str = "append") -> None:
    meta = {"env_id": "swm/TwoRoom-v0", "action_dim": 2}
    with open_writer(path, format=fmt, mode=mode, metadata=meta) as writer:
        for episode in episodes:
            writer.write_episode(episode)


@pytest.fixture(params=FORMATS)
def fmt(request) -> str:
    return request.param


def dataset_path(tmp_path: Path, fmt: str) -> Path:
    return tmp_path / f"data{SUFFIX[fmt]}"


def test_round_trip_is_bit_exact(tmp_path, fmt):
    episodes = [make_episode(seed, length) for seed, length in enumerate((5, 9, 1, 12))]
    path = dataset_path(tmp_path, fmt)
    write(path, episodes, fmt)
    assert detect(path) == fmt
    reader = open_reader(path)
    assert reader.num_episodes == 4 and reader.num_steps == 27
    assert reader.episode_lengths.tolist() == [5, 9, 1, 12]
    assert reader.episode_offsets.tolist() == [0, 5, 14, 15]
    assert reader.keys["pixels"] == (np.dtype(np.uint8), (32, 32, 3))
    assert reader.metadata["env_id"] == "swm/TwoRoom-v0"
    assert reader.metadata["resolution"] == [32, 32]
    assert reader.metadata["format_version"] == 2 and reader.metadata_sealed
    assert {"pixel_encoding", "swm_version", "action_dim"} <= set(reader.metadata)
    for index, episode in enumerate(episodes):
        assert_same_episode(reader.read_episode(index), episode)
    assert list(reader.read_episode(1, keys=["reward"])) == ["reward"]
    assert reader.nbytes_on_disk > 0


def test_read_rows_any_order_with_repeats(tmp_path, fmt):
    episodes = [make_episode(seed, 10) for seed in range(3)]
    path = dataset_path(tmp_path, fmt)
    write(path, episodes, fmt)
    reader = open_reader(path)
    rows = np.array([29, 3, 3, 17, 0, 10])
    for key in ("pixels", "action", "truncated"):
        every = np.concatenate([e[key] for e in episodes])
        assert reader.read_rows(key, rows).tobytes() == every[rows].tobytes()


def test_read_rows_across_many_chunks(tmp_path, fmt):
    """Rows scattered over more rows than one HDF5 chunk (4,096) of small keys."""
    rng = np.random.default_rng(0)
    episodes = [{"state": rng.standard_normal((900, 2)).astype(np.float32)} for _ in range(6)]
    path = dataset_path(tmp_path, fmt)
    write(path, episodes, fmt)
    every = np.concatenate([e["state"] for e in episodes])
    rows = rng.integers(0, len(every), 300)
    assert np.array_equal(open_reader(path).read_rows("state", rows), every[rows])


def test_append_continues_numbering_and_checks_schema(tmp_path, fmt):
    path = dataset_path(tmp_path, fmt)
    write(path, [make_episode(0, 4)], fmt)
    with open_writer(path, mode="append") as writer:
        assert writer.num_episodes == 1
        assert writer.write_episode(make_episode(1, 6)) == 1
        with pytest.raises(ValueError, match="schema") as caught:
            writer.write_episode(make_episode(2, 6, resolution=16))
        assert caught.value.exit_code == 2
    reader = open_reader(path)
    assert reader.episode_lengths.tolist() == [4, 6]
    assert_same_episode(reader.read_episode(1), make_episode(1, 6))


def test_modes_error_and_overwrite(tmp_path, fmt):
    path = dataset_path(tmp_path, fmt)
    write(path, [make_episode(0, 4)], fmt)
    with pytest.raises(ValueError, match="already exists") as caught:
        open_writer(path, mode="error")
    assert caught.value.exit_code == 2 and "--overwrite" in caught.value.hint
    write(path, [make_episode(5, 7)], fmt, mode="overwrite")
    reader = open_reader(path)
    assert reader.episode_lengths.tolist() == [7]


def test_format_from_suffix_then_existing_then_lance(tmp_path):
    write(tmp_path / "a.h5", [make_episode(0, 3)])
    assert detect(tmp_path / "a.h5") == "hdf5"
    write(tmp_path / "plain", [make_episode(0, 3)])
    assert detect(tmp_path / "plain") == "lance"
    write(tmp_path / "f", [make_episode(0, 3)], fmt="folder")
    write(tmp_path / "f", [make_episode(1, 3)])  # appends in the existing format
    assert open_reader(tmp_path / "f").num_episodes == 2
    (tmp_path / "made-ahead").mkdir()  # an empty directory is no dataset, but not in the way
    write(tmp_path / "made-ahead", [make_episode(0, 3)], fmt="folder")
    assert detect(tmp_path / "made-ahead") == "folder"


def test_lance_is_readable_without_swm(tmp_path):
    """docs/datasets.md's recipe: plain lance and pyarrow, the frame shape from the swm metadata."""
    import json

    import lance
    import lancedb
    import pyarrow as pa

    path = tmp_path / "db" / "episodes.lance"
    episodes = [make_episode(seed, 5) for seed in range(3)]
    for episode in episodes[1:]:  # random pixels, which LZ4 cannot shrink, stored raw
        episode["pixels"] = episode["pixels"] // 64 * 64  # four levels: LZ4 frames
    write(path, episodes)
    dataset = lance.dataset(str(path))
    table = dataset.to_table()
    assert table.num_rows == 15
    assert table.column("episode_idx").to_pylist() == [0] * 5 + [1] * 5 + [2] * 5
    dtype, shape = json.loads(dataset.schema.metadata[b"swm"])["keys"]["pixels"]
    assert dataset.schema.field("pixels").metadata[b"swm:codec"] == b"raw"  # by episode 0
    value = table.column("pixels")[7].as_py()
    assert np.array_equal(np.frombuffer(value, dtype).reshape(shape), episodes[1]["pixels"][2])

    write(path, episodes[1:], mode="overwrite")
    dataset = lance.dataset(str(path))
    assert dataset.schema.field("pixels").metadata[b"swm:codec"] == b"lz4-frame"
    value = dataset.to_table().column("pixels")[2].as_py()
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    frame = np.frombuffer(pa.Codec("lz4").decompress(value, size), dtype).reshape(shape)
    assert np.array_equal(frame, episodes[1]["pixels"][2])
    assert value[:4] == bytes.fromhex("04224d18")  # the LZ4 frame format's magic number
    assert lancedb.connect(tmp_path / "db").open_table("episodes").count_rows() == 10


def test_lance_frames_in_a_codec_this_swm_does_not_know_are_refused_at_open(tmp_path, monkeypatch):
    from swmcli.data.storage import lance as lance_store

    path = tmp_path / "new.lance"
    monkeypatch.setattr(lance_store, "choose_codec", lambda frames: "brotli-frame")  # a newer swm
    write(path, [make_episode(0, 3)])
    monkeypatch.undo()
    with pytest.raises(DatasetError, match=r"codec this swm does not read.*brotli-frame") as caught:
        open_reader(path)
    assert "upgrade" in caught.value.hint


def test_lance_compacts_small_appends(tmp_path):
    import lance

    path = tmp_path / "d.lance"
    write(path, [make_episode(seed, 3) for seed in range(10)])
    assert len(lance.dataset(str(path)).get_fragments()) == 1


def test_lance_frames_that_repeat_are_stored_whole_not_as_a_page_dictionary(tmp_path):
    # Still frames repeat: Lance would store a page of them as a dictionary of its distinct
    # frames, which every scattered take then reads whole. The frames are noise (stored raw), so
    # the data files hold every frame's bytes only where no dictionary is used; they stay so
    # after an appending writer rewrites the fragments.
    from swmcli.data.storage.location import nbytes_under

    path = tmp_path / "d.lance"
    episodes = [make_episode(seed, 50) for seed in range(3)]
    distinct = episodes[0]["pixels"][:2]
    for episode in episodes:
        episode["pixels"] = distinct[np.arange(50) % 2]
    write(path, episodes[:2])
    write(path, episodes[2:])
    frames = sum(episode["pixels"].nbytes for episode in episodes)
    assert nbytes_under(path / "data") >= frames
    reader = open_reader(path)
    for index, episode in enumerate(episodes):
        assert_same_episode(reader.read_episode(index), episode)
    reader.close()


def test_hdf5_is_plain_h5py_with_episode_offsets(tmp_path):
    path = tmp_path / "d.h5"
    write(path, [make_episode(seed, n) for seed, n in enumerate((3, 5))])
    with h5py.File(path, "r") as file:
        assert file["episode_offsets"][:].tolist() == [0, 3]
        assert file["episode_idx"][:].tolist() == [0] * 3 + [1] * 5
        assert file["pixels"].chunks == (1, 32, 32, 3)
        # Frames under HDF5's registered LZ4 filter (hdf5plugin reads it); the rest is raw.
        assert hdf5._filter_ids(file["pixels"]) == (hdf5.H5Z_LZ4,)
        assert file["action"].compression is None


def test_hdf5_opens_in_the_standard_tools(tmp_path):
    # The HDF5 command-line tools read it too (HDF5 1.10 on Debian 12), LZ4 frames through the
    # HDF Group's filter plugin. .ci/run installs both (Debian's hdf5-tools and
    # hdf5-filter-plugin); elsewhere this is a visible skip.
    plugins = Path(
        os.environ.get("HDF5_PLUGIN_PATH", "/usr/lib/x86_64-linux-gnu/hdf5/serial/plugins")
    )
    lz4 = plugins.is_dir() and any("lz4" in plugin.name for plugin in plugins.iterdir())
    if not (shutil.which("h5ls") and shutil.which("h5dump") and lz4):
        pytest.skip("h5ls/h5dump not installed (apt-get install hdf5-tools hdf5-filter-plugin)")
    path = tmp_path / "d.h5"
    write(path, [smooth_episode(0, 3), make_episode(1, 5)])  # compressed and stored-raw frames
    listing = subprocess.run(["h5ls", "-r", str(path)], capture_output=True, text=True)
    assert "ERROR" not in listing.stdout and "/pixels" in listing.stdout
    for row, episode in ((0, smooth_episode(0, 3)), (3, make_episode(1, 5))):
        command = ["h5dump", "-d", "/pixels", "-s", f"{row},0,6,0", "-c", "1,1,1,3", str(path)]
        dump = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        assert ", ".join(map(str, episode["pixels"][0, 0, 6])) in dump


def smooth_episode(seed: int, length: int) -> dict[str, np.ndarray]:
    """Compressible frames (a gradient and a moving square), so LZ4 blocks are compressed."""
    episode = make_episode(seed, length)
    frames = np.broadcast_to(
        np.arange(32, dtype=np.uint8)[None, :, None, None] * 7, (length, 32, 32, 3)
    )
    episode["pixels"] = frames.copy()
    for t in range(length):
        episode["pixels"][t, t : t + 4, 5:9] = 255
    return episode


def test_hdf5_lz4_frames_round_trip(tmp_path):
    path = tmp_path / "d.h5"
    episodes = [smooth_episode(0, 6), make_episode(1, 4)]  # compressed and stored-raw blocks
    write(path, episodes)
    reader = open_reader(path)
    for index, episode in enumerate(episodes):
        assert_same_episode(reader.read_episode(index), episode)
    reader.close()
    with h5py.File(path, "r") as file:
        chunk = file["pixels"].id.read_direct_chunk((0, 0, 0, 0))[1]
        assert len(chunk) < 32 * 32 * 3 // 4  # the smooth frame really is compressed


def test_missing_path_and_other_formats_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no dataset at"):
        open_reader(tmp_path / "nope.lance")
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("hello")
    for path in (tmp_path / "empty", tmp_path / "notes.txt"):
        with pytest.raises(ValueError, match="not a swm dataset"):
            open_reader(path)


@pytest.mark.parametrize("keep", [0.5, 3000])
def test_truncated_hdf5_is_a_clear_error(tmp_path, keep):
    # Cut deep into the metadata (3,000 bytes), SWMR reads used to retry forever: no hang now.
    path = tmp_path / "d.h5"
    write(path, [make_episode(seed, 20) for seed in range(3)])
    size = path.stat().st_size
    with path.open("r+b") as handle:
        handle.truncate(int(size * keep) if keep < 1 else keep)
    with pytest.raises(DatasetError, match="truncated") as caught:
        reader = open_reader(path)
        for index in range(reader.num_episodes):
            reader.read_episode(index)
    assert caught.value.exit_code == 1


def test_lance_missing_fragment_is_a_clear_error(tmp_path):
    path = tmp_path / "d.lance"
    write(path, [make_episode(seed, 4) for seed in range(2)])
    for file in (path / "data").iterdir():
        file.unlink()
    with pytest.raises(DatasetError, match="missing its data file"):
        open_reader(path)


WRITER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    from test_storage import make_episode
    from swmcli.data.formats import open_writer

    import os

    writer = open_writer({path!r}, format={fmt!r}, mode="append")
    for index in range(writer.num_episodes, 10_000):
        writer.write_episode(make_episode(index, 7 + index % 5))
        print(index, flush=True)
        if os.path.exists({stop!r}):
            break
    writer.close()
    """
)


def start_writer(path: Path, fmt: str, stop: Path | None = None) -> subprocess.Popen:
    """A writer process appending episodes, printing each committed index, until the file
    ``stop`` appears (forever when None); then it closes the dataset and exits 0."""
    stop = str(stop or path.with_name("never"))
    script = WRITER.format(tests=str(REPO / "tests"), path=str(path), fmt=fmt, stop=stop)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env
    )


def run_writer_and_kill(path: Path, fmt: str, episodes: int) -> int:
    """Start a writer appending episodes forever; SIGKILL it once ``episodes`` are committed."""
    process = start_writer(path, fmt)
    committed = -1
    deadline = time.monotonic() + 60
    while committed < episodes - 1 and time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        committed = int(line)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    # Indices the writer printed that were not read yet (a loaded machine lets it run ahead).
    committed = max([committed, *map(int, process.stdout.read().split())])
    assert committed >= episodes - 1, "the writer did not get going"
    return committed + 1


def test_sigkill_mid_run_keeps_every_finished_episode(tmp_path, fmt):
    path = dataset_path(tmp_path, fmt)
    finished = run_writer_and_kill(path, fmt, episodes=5)
    reader = open_reader(path)
    # Episodes printed before the kill are there; one more may have committed before its print.
    assert finished <= reader.num_episodes <= finished + 1
    for index in range(reader.num_episodes):
        assert_same_episode(reader.read_episode(index), make_episode(index, 7 + index % 5))
    reader.close()
    # Appending resumes where the last committed episode ended.
    survived = reader.num_episodes
    with open_writer(path, mode="append") as writer:
        assert writer.write_episode(make_episode(survived, 7 + survived % 5)) == survived
    reader = open_reader(path)
    assert reader.num_episodes == survived + 1
    assert_same_episode(reader.read_episode(survived), make_episode(survived, 7 + survived % 5))


def test_a_second_writer_is_refused_at_once_naming_the_first(tmp_path, fmt):
    path = dataset_path(tmp_path, fmt)
    process = start_writer(path, fmt)
    try:
        assert process.stdout.readline()  # one episode committed: the writer is live
        for mode in ("append", "overwrite"):
            with pytest.raises(DatasetError, match=f"being written by process {process.pid}"):
                open_writer(path, mode=mode)
        reader = open_reader(path)  # readers are welcome meanwhile, and nothing was touched
        assert reader.num_episodes >= 1
        assert_same_episode(reader.read_episode(0), make_episode(0, 7))
        reader.close()
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    with open_writer(path, mode="append") as writer:  # the lock died with its process
        assert writer.num_episodes >= 1


def test_a_lance_reader_survives_a_writer_compacting_and_closing(tmp_path):
    path = tmp_path / "d.lance"
    write(path, [make_episode(seed, 5) for seed in range(3)])
    reader = open_reader(path)
    assert reader.num_episodes == 3
    with open_writer(path) as writer:  # appends, compacts and (not while we read) cleans up
        for seed in range(3, 6):
            writer.write_episode(make_episode(seed, 5))
    for index in range(3):  # the reader's version still has every file it uses
        assert_same_episode(reader.read_episode(index), make_episode(index, 5))
    reader.close()
    versions_before = len(list((path / "_versions").iterdir()))
    with open_writer(path) as writer:  # nobody reads now: superseded versions are deleted
        writer.write_episode(make_episode(6, 5))
    assert len(list((path / "_versions").iterdir())) < versions_before
    assert open_reader(path).num_episodes == 7


def test_a_lance_writer_cleans_every_version_but_the_one_a_reader_holds(tmp_path):
    import lance

    path = tmp_path / "d.lance"
    write(path, [make_episode(seed, 3) for seed in range(3)])
    reader = open_reader(path)
    with open_writer(path) as writer:  # 17 commits and a few merges while the reader reads
        for seed in range(3, 20):
            writer.write_episode(make_episode(seed, 3))
    assert len(lance.dataset(str(path)).versions()) == 2  # the reader's and the latest
    for index in range(3):
        assert_same_episode(reader.read_episode(index), make_episode(index, 3))
    reader.close()
    reader = open_reader(path)
    for index in range(20):  # merged fragments keep the episodes whole and in order
        assert_same_episode(reader.read_episode(index), make_episode(index, 3))
    reader.close()


def test_the_index_check_on_open_agrees_with_a_row_by_row_check():
    # check_index compares neighbouring rows (no array of every row's expected values); its
    # verdict must be the one of building those arrays, on whole and damaged indexes alike.
    from swmcli.data.storage.schema import check_index

    def row_by_row(lengths, ids, steps):
        starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
        if not np.array_equal(ids, np.repeat(np.arange(len(lengths)), lengths)):
            return "episode_idx"
        if not np.array_equal(steps, np.arange(lengths.sum()) - starts):
            return "step_idx"
        return None

    rng = np.random.default_rng(0)
    verdicts = set()
    for trial in range(3000):
        lengths = rng.integers(0 if trial % 7 == 0 else 1, 5, rng.integers(1, 6))
        ids = np.repeat(np.arange(len(lengths)), lengths)
        steps = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        damage = trial % 5
        if damage == 1 and len(ids):
            ids[rng.integers(len(ids))] += rng.choice([-1, 1, 2])
        elif damage == 2 and len(steps):
            steps[rng.integers(len(steps))] += rng.choice([-1, 1])
        elif damage == 3 and len(ids) > 1:
            order = rng.permutation(len(ids))
            ids, steps = ids[order], steps[order]
        elif damage == 4:
            lengths[rng.integers(len(lengths))] += 1
        want = row_by_row(lengths, ids, steps) if len(ids) == lengths.sum() else "episode_idx"
        try:
            check_index(lengths, ids, steps.astype(np.int32), "d", "hint")
            got = None
        except DatasetError as error:
            got = "episode_idx" if "episode_idx" in error.message else "step_idx"
        assert got == want, (lengths, ids, steps)
        verdicts.add(got)
    assert verdicts == {None, "episode_idx", "step_idx"}


def test_lance_merges_keep_few_fragments_and_rewrite_each_row_a_few_times():
    """The merge plan over 5,000 appended episodes of 10 rows: fragments stay a few per tier,
    and the rows rewritten stay a small multiple of the rows written."""
    from swmcli.data.storage.lance import MERGE_FAN_IN, _merge_group

    fragments, rewritten, most = [], 0, 0
    for _ in range(5000):
        fragments.append(10)
        while group := _merge_group(fragments, small=100, large=100_000, closing=False):
            rewritten += sum(fragments[group])
            fragments[group] = [sum(fragments[group])]
        most = max(most, len(fragments))
    assert sum(fragments) == 50_000
    assert most <= MERGE_FAN_IN * 5
    assert rewritten <= 5 * 50_000
    closing = _merge_group([500, 10, 10], small=100, large=100_000, closing=True)
    assert closing == slice(1, 3)  # the smallest tier is merged on close


def test_lance_fragments_grow_to_the_largest_size_and_no_further():
    """Fragments under ``large`` rows are merged into one as soon as they hold ``large`` rows:
    every finished fragment has ``large`` rows and less than an episode more, whatever the tiers
    below it hold, and the tiers stay few."""
    from swmcli.data.storage.lance import MERGE_FAN_IN, _merge_group

    fragments, rewritten = [], 0
    for _ in range(2995):
        fragments.append(10)
        while group := _merge_group(fragments, small=100, large=5000, closing=False):
            rewritten += sum(fragments[group])
            fragments[group] = [sum(fragments[group])]
    finished = [count for count in fragments if count >= 5000]
    assert len(finished) == 5 and sum(fragments) == 29950  # the last 4,950 rows: the tiers
    assert all(5000 <= count < 5010 for count in finished)
    assert fragments[: len(finished)] == finished  # rows stay in order: finished ones first
    assert len(fragments) - len(finished) <= 3 * (MERGE_FAN_IN - 1)
    assert rewritten <= 5 * 29950
    # A finished fragment stays so where ``large`` (an estimate) grows a little, and only the
    # fewest trailing fragments that hold ``large`` rows are merged (a dataset of older sizes).
    assert _merge_group([5005, 10, 10], small=100, large=5500, closing=False) is None
    older = [2000, 2000, 2000, 2000, 1000]
    assert _merge_group(older, small=100, large=5000, closing=False) == slice(2, 5)


def test_an_hdf5_reader_does_not_block_a_writer(tmp_path):
    path = tmp_path / "d.h5"
    write(path, [make_episode(seed, 5) for seed in range(2)])
    reader = open_reader(path)
    # Another process appends while this one has the file open for reading.
    script = f"from test_storage import *; write({str(path)!r}, [make_episode(2, 5)])"
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}"}
    subprocess.run([sys.executable, "-c", script], env=env, check=True)
    assert_same_episode(reader.read_episode(1), make_episode(1, 5))
    reader.close()
    assert open_reader(path).num_episodes == 3


def test_folder_with_a_deleted_frame_is_a_clear_error(tmp_path):
    path = tmp_path / "frames"
    write(path, [make_episode(seed, 5) for seed in range(2)], fmt="folder")
    next(path.glob("episode_000001/pixels/*.png")).unlink()
    with pytest.raises(DatasetError, match=r"cannot read .*episode_000001"):
        open_reader(path).read_episode(1)  # opened from the index: the read finds it
    (path / folder.INDEX).unlink()  # as an older swm wrote it: a scan, which checks every frame
    with pytest.raises(DatasetError, match="4 frames for 5 steps"):
        open_reader(path).episode_lengths  # noqa: B018 (the scan is the check)


def test_folder_episodes_are_checked_for_links_out_when_read_not_walked_when_opened(tmp_path):
    path = tmp_path / "frames"
    write(path, [make_episode(seed, 3) for seed in range(3)], fmt="folder")
    outside = tmp_path / "outside"
    outside.mkdir()
    frame = path / "episode_000001" / "pixels" / "000000.png"
    frame.rename(outside / "frame.png")
    frame.symlink_to(outside / "frame.png")
    (path / "episode_000002").rename(outside / "episode")
    (path / "episode_000002").symlink_to(outside / "episode")
    reader = open_reader(path)  # opening walks no episode
    assert_same_episode(reader.read_episode(0), make_episode(0, 3))
    for episode, link in ((1, "episode_000001/pixels/000000.png"), (2, "episode_000002")):
        with pytest.raises(DatasetError, match=f"{link} is a link to"):
            reader.read_episode(episode)


def test_folder_opens_and_appends_from_its_index_and_rebuilds_a_missing_one(tmp_path):
    path = tmp_path / "frames"
    lengths = [3, 5, 4]
    write(path, [make_episode(seed, n) for seed, n in enumerate(lengths[:2])], fmt="folder")
    assert np.fromfile(path / folder.INDEX, "<i8").tolist() == lengths[:2]
    (path / folder.INDEX).unlink()  # a folder written without one
    assert open_reader(path).episode_lengths.tolist() == lengths[:2]  # scanned
    write(path, [make_episode(2, 4)], fmt="folder")  # the writer writes it back, then appends
    assert np.fromfile(path / folder.INDEX, "<i8").tolist() == lengths
    with open(path / folder.INDEX, "r+b") as index:  # a writer killed after its commit
        index.truncate(2 * 8 + 3)
    reader = open_reader(path)
    assert reader.episode_lengths.tolist() == lengths  # the last from its own arrays
    assert_same_episode(reader.read_episode(2), make_episode(2, 4))
    write(path, [make_episode(3, 2)], fmt="folder")
    assert np.fromfile(path / folder.INDEX, "<i8").tolist() == [*lengths, 2]


def test_a_full_disk_is_refused_before_the_episode_is_written(tmp_path, fmt, monkeypatch):
    path = dataset_path(tmp_path, fmt)
    write(path, [make_episode(0, 5)])
    real = shutil.disk_usage
    # Mounting a small filesystem needs privileges: the free space reported is made small.
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=10 * 2**20))
    with open_writer(path) as writer, pytest.raises(DatasetError, match="free on the disk"):
        writer.write_episode(make_episode(1, 5))
    monkeypatch.undo()
    reader = open_reader(path)
    assert reader.num_episodes == 1
    assert_same_episode(reader.read_episode(0), make_episode(0, 5))


def test_lance_largest_fragments_hold_the_same_bytes_on_disk_whatever_the_frames(
    tmp_path, monkeypatch
):
    """The largest fragment is sized by the bytes its rows take on disk: frames LZ4 shrinks to
    little make it hold many more rows than noise does (whose rows the merge would rewrite at
    full size)."""
    from swmcli.data.storage import lance as lance_storage

    monkeypatch.setattr(lance_storage, "_FRAGMENT_BYTES", 8 * 2**20)
    largest = {}
    for name in ("noise", "flat"):
        path = tmp_path / f"{name}.lance"
        with lance_storage.open_writer(path, {}, append=False) as writer:
            for seed in range(20):
                episode = make_episode(seed, 10)
                if name == "flat":
                    episode["pixels"] = np.zeros_like(episode["pixels"])
                writer.write_episode(episode)
            largest[name] = writer._merge_limits(writer._dataset.get_fragments())[1]
    noise_row = 32 * 32 * 3 + 8 * 4 + 2 + 4  # its frames stored raw, and the small keys
    assert 0.7 < largest["noise"] * noise_row / (8 * 2**20) < 1.0  # files hold some metadata
    assert largest["flat"] > 10 * largest["noise"]


def test_a_lance_merge_the_disk_cannot_hold_waits_with_every_episode_readable(
    tmp_path, monkeypatch
):
    """Room for each episode but not for rewriting eight fragments: the episodes go in, the
    merge waits (no half-written merge, no error), and a later close with room merges them."""
    import lance

    from swmcli.data.storage.location import FREE_SPACE_MARGIN_BYTES

    path = tmp_path / "d.lance"
    episodes = [make_episode(seed, 3) for seed in range(10)]
    real = shutil.disk_usage
    free = FREE_SPACE_MARGIN_BYTES + 3 * episodes[0]["pixels"].nbytes
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=free))
    with open_writer(path, format="lance") as writer:
        for episode in episodes:
            writer.write_episode(episode)
        assert len(lance.dataset(str(path)).get_fragments()) == 10  # eight would have merged
        monkeypatch.undo()
    assert len(lance.dataset(str(path)).get_fragments()) == 1  # merged on close, with room
    assert sorted(p.name for p in (path / "data").iterdir()) == [
        f.path for f in lance.dataset(str(path)).get_fragments()[0].data_files()
    ]
    reader = open_reader(path)
    for index, episode in enumerate(episodes):
        assert_same_episode(reader.read_episode(index), episode)


def test_what_a_failed_first_write_left_does_not_block_the_next(tmp_path):
    (tmp_path / "empty.h5").touch()
    (tmp_path / "half.lance" / "data").mkdir(parents=True)
    (tmp_path / "half.lance" / "data" / "0001.lance").write_bytes(b"never committed")
    (tmp_path / "nothing" / "episode_000000").mkdir(parents=True)
    for name in ("empty.h5", "half.lance", "nothing"):
        write(tmp_path / name, [make_episode(0, 5)])
        assert open_reader(tmp_path / name).num_episodes == 1
    (tmp_path / "notes.txt").write_text("a file of the user's")
    with pytest.raises(ValueError, match="not a swm dataset"):
        write(tmp_path / "notes.txt", [make_episode(0, 5)], fmt="hdf5")
    assert (tmp_path / "notes.txt").read_text() == "a file of the user's"


def test_a_path_with_a_colon_is_a_local_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("file:y.lance", "memory:x.lance"):
        write(Path(name), [make_episode(0, 5)])
        assert (tmp_path / name / "_versions").is_dir()
        assert open_reader(Path(name)).num_episodes == 1


@pytest.mark.parametrize("uri", ["file://z.lance", "file:///tmp/z.lance", "memory://x.lance"])
def test_a_uri_swm_does_not_support_is_refused_before_anything_is_written(
    tmp_path, monkeypatch, uri
):
    from typer.testing import CliRunner

    from swmcli.cli import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(
        app, ["collect", "--preset", "tiny", "--episodes", "1", "--out", uri]
    )
    assert result.exit_code == 2 and "unsupported dataset location" in result.output
    assert "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == []
    assert not Path("/z.lance").exists() and not Path("/tmp/z.lance").exists()


def test_hdf5_frames_come_through_the_chunk_index_and_equal_what_was_written(tmp_path):
    path = tmp_path / "d.h5"
    episodes = [make_episode(seed, 7) for seed in range(3)]
    write(path, episodes, fmt="hdf5")
    frames = np.concatenate([episode["pixels"] for episode in episodes])
    rows = np.random.default_rng(0).permutation(len(frames))
    reader = open_reader(path)
    try:
        np.testing.assert_array_equal(reader.read_rows("pixels", rows), frames[rows])
        chunks = reader._chunks["pixels"]  # one os.pread per frame, no HDF5 call
        assert chunks is not None and (chunks.offsets >= 0).all()
        actions = np.concatenate([episode["action"] for episode in episodes])
        got = reader.read_rows("action", rows)  # gathered from the memory map
        assert isinstance(reader._chunks["action"], hdf5._RowChunks)
        assert got.tobytes() == actions[rows].tobytes()  # NaNs included
        assert reader.read_rows("action", rows[:0]).shape == (0, 2)
    finally:
        reader.close()


def cached_pages(descriptor: int, size: int) -> int:
    """How many of a file's first ``size`` bytes' pages are in the page cache (``mincore``, which
    reads nothing: a probing read would start the very read-ahead it looks for)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    libc.mmap.argtypes += [ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    address = libc.mmap(None, size, 1, 1, descriptor, 0)  # PROT_READ, MAP_SHARED
    pages = ctypes.create_string_buffer(-(-size // os.sysconf("SC_PAGE_SIZE")))
    try:
        assert libc.mincore(address, size, pages) == 0, os.strerror(ctypes.get_errno())
    finally:
        libc.munmap(address, size)
    return sum(byte & 1 for byte in pages.raw)


def test_hdf5_cold_frames_are_read_as_asked_ahead_and_equal_what_was_written(tmp_path):
    """Dropped from the page cache, frames read bring in their own pages only (no
    read-ahead past them), and a batch's frames handed to ``will_need`` are back in
    the cache before they are read, then read back as written."""
    path = tmp_path / "d.h5"
    episodes = [make_episode(seed, 7, resolution=64) for seed in range(2)]
    write(path, episodes, fmt="hdf5")
    frames = np.concatenate([episode["pixels"] for episode in episodes])
    rows = np.random.default_rng(1).permutation(len(frames))
    descriptor = os.open(path, os.O_RDONLY)
    reader = open_reader(path)
    try:
        reader.read_rows("pixels", rows[:1])  # builds the chunk index
        chunks = reader._chunks["pixels"]
        size = path.stat().st_size
        os.fsync(descriptor)
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        before = cached_pages(descriptor, size)
        page = os.sysconf("SC_PAGE_SIZE")
        pages = -(-size // page)
        if before > pages // 2:  # tmpfs and the like: the file lives in memory, nothing is cold
            pytest.skip(f"{tmp_path}'s filesystem keeps files in the page cache")
        for row in (0, 1):  # neighbours, read forwards: what the kernel reads ahead after
            chunks.read(row)
        assert cached_pages(descriptor, size) <= before + int(chunks.sizes[:2].sum()) // page + 3
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        chunks.will_need(rows)
        frame_pages = int(chunks.sizes.sum()) // page
        for _ in range(200):  # the read-ahead completes in the background
            if cached_pages(descriptor, size) >= min(pages, before + frame_pages):
                break
            time.sleep(0.01)
        else:
            pytest.fail(f"{before} pages cached, then {cached_pages(descriptor, size)}")
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        np.testing.assert_array_equal(reader.read_rows("pixels", rows), frames[rows])
    finally:
        reader.close()
        os.close(descriptor)


def test_hdf5_short_episodes_leave_no_dead_space(tmp_path):
    """Appending an episode adds its bytes, not a rewrite of each small key's chunk."""
    path = tmp_path / "d.h5"
    write(path, [make_episode(seed, 2, resolution=8) for seed in range(20)], fmt="hdf5")
    before = path.stat().st_size
    write(path, [make_episode(seed, 2, resolution=8) for seed in range(20, 70)], fmt="hdf5")
    per_episode = (path.stat().st_size - before) / 50
    raw = sum(value.nbytes for value in make_episode(0, 2, resolution=8).values())
    assert per_episode < 4 * raw, (per_episode, raw)
    reader = open_reader(path)
    assert_same_episode(reader.read_episode(69), make_episode(69, 2, resolution=8))
    reader.close()


def test_hdf5_checks_the_last_episodes_index_on_open_and_each_other_when_it_is_read(tmp_path):
    """Opening reads no row of the episodes before the last: a damaged episode_idx there is
    found when that episode is read whole (``swm info --verify`` reads every one)."""
    path = tmp_path / "d.h5"
    write(path, [make_episode(seed, 3, resolution=8) for seed in range(3)])
    with h5py.File(path, "r+") as file:
        file["episode_idx"][4] = 2  # episode 1's second row
    reader = open_reader(path)
    assert reader.num_episodes == 3 and len(reader.read_episode(2)["pixels"]) == 3
    with pytest.raises(DatasetError, match="episode_idx does not match"):
        reader.read_episode(1)
    reader.close()
    with h5py.File(path, "r+") as file:
        file["step_idx"][7] = 5  # the last episode's second row
    with pytest.raises(DatasetError, match="step_idx does not count"):
        open_reader(path)


def test_lance_small_columns_held_in_memory_read_as_the_takes_do(tmp_path, monkeypatch):
    """A Lance reader holds the small columns and checksums in memory where they fit its share
    of the host's memory (read whole 4 rows a batch here: batches that straddle episodes and
    fragments), else takes them per read: both give the same rows."""
    from swmcli.data.storage import lance

    path = tmp_path / "d.lance"
    monkeypatch.setattr(lance, "_SMALL_BYTES", 0)  # no merge on close: a fragment an episode
    write(path, [make_episode(seed, 5 + seed, resolution=8) for seed in range(3)])
    probe = lance.open_reader(path)
    assert len(probe._dataset.get_fragments()) == 3
    probe.close()
    rows = np.array([9, 0, 9, 17, 4])
    monkeypatch.setattr(lance, "_SCAN_ROWS", 4)

    def reads(reader) -> dict:
        read = reader.read_columns(["reward", "action"], rows, checksums=True)
        read["rows of reward"] = reader.read_rows("reward", rows)
        read["row checksums"] = reader.read_row_checksums(rows)
        return read

    held = open_reader(path)
    from_memory = reads(held)
    monkeypatch.setattr(lance, "_RESIDENT_SHARE", 0.0)  # nothing fits: every read is a take
    taken = open_reader(path)
    by_take = reads(taken)
    assert held._resident and not taken._resident
    assert from_memory.keys() == by_take.keys()
    for key, values in from_memory.items():
        np.testing.assert_array_equal(values, by_take[key])
    np.testing.assert_array_equal(from_memory["reward"], from_memory["rows of reward"])


def test_hdf5_opens_from_the_index_tail_and_checks_the_whole_index_on_first_use(tmp_path):
    """Opening (and so appending) reads the last entries of the episode index, at any size; the
    first use of the whole index checks every entry."""
    path = tmp_path / "d.h5"
    write(path, [make_episode(seed, 4, resolution=8) for seed in range(6)])
    with h5py.File(path, "r+") as file:
        file["episode_lengths"][1] = 5  # damage far from the end: the offsets after disagree
    reader = open_reader(path)
    assert (reader.num_episodes, reader.num_steps) == (6, 24)
    with pytest.raises(DatasetError, match="episode_offsets and episode_lengths disagree"):
        reader.episode_lengths  # noqa: B018 (the first use is the check)
    with pytest.raises(DatasetError, match="disagree"):
        load_dataset(path, history_len=2)


def test_lance_reads_through_io_uring_where_allowed_and_writes_through_the_plain_store(
    tmp_path, monkeypatch, capfd
):
    """A reader reads through io_uring where the kernel lets this process set one up, else
    through Lance's plain local store: the same rows either way. A writer appending to the
    dataset commits through the plain store (Lance commits through ``file+uring://`` without
    its safe commit handler, and says so)."""
    from swmcli.data.storage import lance

    path = tmp_path / "d.lance"
    write(path, [make_episode(seed, 4 + seed, resolution=8) for seed in range(3)])
    fast = open_reader(path)
    assert fast._dataset.uri.startswith("file+uring://") == lance.io_uring_allowed()
    monkeypatch.setattr(lance, "io_uring_allowed", lambda: False)  # as in a container refusing it
    plain = open_reader(path)
    assert not plain._dataset.uri.startswith("file+uring://")
    for episode in range(3):
        for key, values in fast.read_episode(episode).items():
            np.testing.assert_array_equal(values, plain.read_episode(episode)[key])
    monkeypatch.undo()
    with open_writer(path, mode="append") as writer:
        assert not writer._writer._dataset.uri.startswith("file+uring://")  # what it commits on
        writer.write_episode(make_episode(7, 3, resolution=8))
    assert "unsafe commit handler" not in capfd.readouterr().err.lower()
    assert open_reader(path).num_episodes == 4
