"""`swm collect` end to end: a real TwoRoom rollout through the buffer into real datasets."""

import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from typer.testing import CliRunner

from swmcli.cli import app
from swmcli.data.formats import open_reader

runner = CliRunner()


def _collect(*args):
    return runner.invoke(app, ["collect", "--preset", "tiny", *args])


def test_collect_tiny_to_lance_reports_and_reads_back(tmp_path):
    out = tmp_path / "tiny.lance"
    result = _collect("--out", str(out), "--episodes", "3", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["episodes"] == 3 and report["dataset_episodes"] == 3
    assert report["format"] == "lance"
    assert report["buffer_allocated_bytes"] > 0
    # Sized for 3 episodes of at most 40 steps plus their last rows, not the preset's 5,000 cap.
    assert report["buffer_max_steps"] == 3 * 41
    row_bytes = 32 * 32 * 3 + 4 * 2 + 4 + 1 + 1 + 4 * 2 + 4 * 2
    assert report["buffer_max_bytes"] == 3 * 41 * row_bytes
    assert report["memory"]["cuda"] == "no CUDA device"
    reader = open_reader(out)
    assert reader.num_steps == report["steps"]
    episode = reader.read_episode(0)
    assert episode["pixels"].dtype == np.uint8 and episode["pixels"].shape[1:] == (32, 32, 3)
    assert np.isnan(episode["action"][-1]).all() and not np.isnan(episode["action"][:-1]).any()
    assert episode["terminated"][-1] or episode["truncated"][-1]
    assert not (episode["terminated"][:-1] | episode["truncated"][:-1]).any()
    assert (tmp_path / "tiny.lance.config.json").is_file()


def test_collect_appends_to_an_existing_dataset(tmp_path):
    out = tmp_path / "a.lance"
    assert _collect("--out", str(out), "--episodes", "2").exit_code == 0
    assert _collect("--out", str(out), "--episodes", "2", "--seed", "1").exit_code == 0
    assert open_reader(out).num_episodes == 4


def test_appending_continues_with_new_episodes(tmp_path):
    """Running the same collect twice appends new episodes, the ones a single longer run writes."""
    twice, once = tmp_path / "twice.h5", tmp_path / "once.h5"
    for _ in range(2):
        assert _collect("--out", str(twice), "--episodes", "3").exit_code == 0
    assert _collect("--out", str(once), "--episodes", "6").exit_code == 0
    twice_reader, once_reader = open_reader(twice), open_reader(once)
    pixels = [twice_reader.read_episode(i)["pixels"] for i in range(6)]
    for i in range(3):
        assert not np.array_equal(pixels[i][0], pixels[i + 3][0])
    for i in range(6):
        assert np.array_equal(pixels[i], once_reader.read_episode(i)["pixels"])


def test_max_steps_alone_collects_the_buffers_worth(tmp_path):
    out = tmp_path / "full.lance"
    args = ["collect", "--env", "swm/TwoRoom-v0", "--resolution", "16", "--max-steps", "150"]
    result = runner.invoke(app, [*args, "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["steps"] == 150
    assert open_reader(out).num_steps == 150


@pytest.mark.parametrize("suffix", ["h5", "frames"])
def test_collect_exact_steps_in_other_formats(tmp_path, suffix):
    fmt = {"h5": [], "frames": ["--format", "folder"]}[suffix]
    out = tmp_path / f"d.{suffix}"
    result = _collect("--out", str(out), "--steps", "57", *fmt, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["steps"] == 57
    assert open_reader(out).num_steps == 57


def test_buffer_cap_evicts_whole_episodes_while_collecting(tmp_path):
    out = tmp_path / "e.lance"
    result = _collect("--out", str(out), "--episodes", "6", "--max-steps", "90", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["evicted_episodes"] > 0
    assert report["dataset_episodes"] == 6, "eviction never loses what is already on disk"
    assert "warning" not in result.stderr  # --max-steps is the user's own word: no warning


def test_budget_refused_before_anything_is_written(tmp_path):
    out = tmp_path / "big.lance"
    result = _collect(
        "--out", str(out), "--resolution", "224", "--max-steps", "2000000", "--episodes", "99999"
    )
    assert result.exit_code == 2
    assert "at most" in result.output and "GB" in result.output
    assert not out.exists()


def test_the_buffer_is_sized_for_the_steps_asked_not_the_default_cap(tmp_path):
    # The default cap (200,000 steps at 224 x 224: about 30 GB) refused this before.
    out = tmp_path / "small.lance"
    command = ["collect", "--resolution", "224", "--steps", "100", "--out", str(out)]
    result = runner.invoke(app, [*command, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["buffer_max_steps"] == 100 and report["steps"] == 100
    assert any("buffer sized for 100 steps (--steps 100)" in note for note in report["notes"])


def test_ctrl_c_keeps_finished_episodes(tmp_path):
    out = tmp_path / "int.lance"
    command = ["collect", "--preset", "tiny", "--out", str(out), "--episodes", "100000"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "swmcli", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 60
    while time.time() < deadline and not (out.exists() and _episodes(out) >= 2):
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert _episodes(out) >= 2


def _episodes(path) -> int:
    try:
        return open_reader(path).num_episodes
    except Exception:
        return 0


def test_same_seed_collects_the_same_dataset(tmp_path):
    paths = [tmp_path / "a.lance", tmp_path / "b.lance"]
    for path in paths:
        assert _collect("--out", str(path), "--episodes", "3", "--seed", "7").exit_code == 0
    first, second = (open_reader(path) for path in paths)
    for index in range(3):
        a, b = first.read_episode(index), second.read_episode(index)
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


@pytest.mark.parametrize("suffix", ["lance", "h5", "h5"])  # HDF5 ignored it every other time
def test_sigterm_stops_like_ctrl_c(tmp_path, suffix):
    out = tmp_path / f"term.{suffix}"
    command = ["collect", "--preset", "tiny", "--out", str(out), "--episodes", "100000"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "swmcli", *command], stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 60
    while time.time() < deadline and not (out.exists() and _episodes(out) >= 1):
        time.sleep(0.5)
    proc.terminate()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err
    assert _episodes(out) >= 1


def test_progress_is_plain_lines_when_stderr_is_not_a_terminal(tmp_path):
    result = _collect("--out", str(tmp_path / "p.h5"), "--steps", "60")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("collect ")]
    assert lines and lines[-1].startswith("collect 60/60 (100%)")
    assert "/s" in lines[-1]


def test_random_episodes_come_first_then_the_policy(tmp_path):
    mixed, random = tmp_path / "mixed.lance", tmp_path / "random.lance"
    args = ["--out", str(mixed), "--episodes", "4", "--set", "collect.random_episodes=2"]
    assert _collect(*args).exit_code == 0
    assert _collect("--out", str(random), "--episodes", "4", "--policy", "random").exit_code == 0
    mixed_reader, random_reader = open_reader(mixed), open_reader(random)
    for index in range(2):  # the same seeded random episodes
        np.testing.assert_array_equal(
            mixed_reader.read_episode(index)["action"], random_reader.read_episode(index)["action"]
        )
    expert, other = mixed_reader.read_episode(2)["action"], random_reader.read_episode(2)["action"]
    assert expert.shape != other.shape or not np.array_equal(expert, other, equal_nan=True)
    assert mixed_reader.metadata["random_episodes"] == 2


@pytest.mark.parametrize("name", ["race.lance", "race.h5", "race"])
def test_two_collects_at_once_one_writes_the_other_is_refused(tmp_path, name):
    out = tmp_path / name
    fmt = ["--format", "folder"] if name == "race" else []
    command = ["collect", "--preset", "tiny", "--out", str(out), "--episodes", "10", *fmt]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "swmcli", *command, "--seed", str(seed)],
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in (1, 2)
    ]
    errors = [proc.communicate(timeout=120)[1] for proc in procs]
    codes = [proc.returncode for proc in procs]
    # Usually they overlap and one is refused at once; if one finished first, the other appends.
    assert 0 in codes
    for code, err, other in zip(codes, errors, reversed(procs), strict=True):
        assert code in (0, 1), err
        if code == 1:
            assert f"being written by process {other.pid}" in err and "Traceback" not in err
    reader = open_reader(out)
    assert reader.num_episodes == 10 * codes.count(0)
    for index in range(reader.num_episodes):  # every episode whole: no frames of the other
        episode = reader.read_episode(index)
        assert len(episode["action"]) == reader.episode_lengths[index]
        assert np.isnan(episode["action"][-1]).all() and not np.isnan(episode["action"][:-1]).any()


def test_worker_processes_write_the_same_dataset_as_one_process(tmp_path):
    one, two = tmp_path / "one.lance", tmp_path / "two.lance"
    # 130 steps: the last episode is cut to fit, as one process cuts it.
    args = ["--steps", "130", "--set", "collect.random_episodes=1", "--json"]
    first = _collect("--out", str(one), *args)
    second = _collect("--out", str(two), *args, "--workers", "2")
    assert first.exit_code == 0 and second.exit_code == 0, second.output
    assert json.loads(second.stdout)["steps"] == 130
    a, b = open_reader(one), open_reader(two)
    assert a.num_episodes == b.num_episodes > 3
    for index in range(a.num_episodes):
        left, right = a.read_episode(index), b.read_episode(index)
        for key in left:
            np.testing.assert_array_equal(left[key], right[key], err_msg=key)
    a.close(), b.close()


def test_collect_noise_is_the_experts_noise_in_every_worker(tmp_path):
    """``--set collect.noise`` reaches the expert, in this process and in worker processes."""
    noisy = ["--episodes", "2", "--set", "collect.noise=1.0"]
    paths = {name: tmp_path / f"{name}.lance" for name in ("default", "one", "two")}
    assert _collect("--out", str(paths["default"]), "--episodes", "2").exit_code == 0
    assert _collect("--out", str(paths["one"]), *noisy).exit_code == 0
    assert _collect("--out", str(paths["two"]), *noisy, "--workers", "2").exit_code == 0
    default, one, two = (open_reader(path) for path in paths.values())
    for index in range(2):
        expert, noisier = default.read_episode(index), one.read_episode(index)
        np.testing.assert_array_equal(expert["pixels"][0], noisier["pixels"][0])  # same start
        assert not np.array_equal(expert["action"], noisier["action"], equal_nan=True)
        for key, values in two.read_episode(index).items():
            np.testing.assert_array_equal(values, noisier[key], err_msg=key)
    refused = _collect("--out", str(tmp_path / "x.lance"), "--set", "collect.noise=-1")
    assert refused.exit_code == 2 and "noise" in refused.output
    assert not (tmp_path / "x.lance").exists()
