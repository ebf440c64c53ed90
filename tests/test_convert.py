"""``convert`` and ``info``: bit-exact round trips between formats, atomic and verified, the source
never touched, and clear refusals."""

import hashlib
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_storage import assert_same_episode, make_episode

from swmcli.commands.convert import run_convert as convert
from swmcli.commands.convert import run_info as info
from swmcli.data.copy import Copied, copy_dataset
from swmcli.data.formats import detect, open_reader, open_writer

LENGTHS = (6, 3, 11)


def write_source(path: Path) -> list[dict]:
    episodes = [make_episode(seed, length) for seed, length in enumerate(LENGTHS)]
    meta = {"env_id": "swm/TwoRoom-v0", "resolution": [32, 32], "action_dim": 2, "policy": "expert"}
    with open_writer(path, mode="error", metadata=meta) as writer:
        for episode in episodes:
            writer.write_episode(episode)
    return episodes


def fingerprint(path: Path) -> str:
    """Names, sizes, mtimes and bytes of every file: changes if anything is touched."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    digest = hashlib.sha256()
    for file in files:
        stat = file.stat()
        digest.update(f"{file}:{stat.st_size}:{stat.st_mtime_ns}".encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()


def test_round_trip_lance_hdf5_folder_lance_is_bit_exact(tmp_path):
    episodes = write_source(tmp_path / "a.lance")
    source_print = fingerprint(tmp_path / "a.lance")
    chain = [
        (tmp_path / "a.lance", tmp_path / "b.h5", None),
        (tmp_path / "b.h5", tmp_path / "c", "folder"),
        (tmp_path / "c", tmp_path / "d.lance", None),
    ]
    for src, dst, to in chain:
        result = convert(src, dst, to=to)
        assert result.fields["verified"] is True
        assert result.fields["episodes"] == 3 and result.fields["steps"] == sum(LENGTHS)
        assert result.fields["dst_size_bytes"] > 0 and result.fields["src_size_bytes"] > 0
    assert [detect(p) for _, p, _ in chain] == ["hdf5", "folder", "lance"]
    final = open_reader(tmp_path / "d.lance")
    reader = open_reader(tmp_path / "a.lance")
    source = reader.metadata
    reader.close()  # an open Lance reader pins its version with a file in the dataset
    for key in ("env_id", "resolution", "action_dim", "policy", "keys"):
        assert final.metadata[key] == source[key], key
    for index, episode in enumerate(episodes):
        assert_same_episode(final.read_episode(index), episode)
    assert fingerprint(tmp_path / "a.lance") == source_print
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no leftovers


def test_keys_subset(tmp_path):
    episodes = write_source(tmp_path / "a.lance")
    convert(tmp_path / "a.lance", tmp_path / "b.h5", keys=["pixels", "action"])
    reader = open_reader(tmp_path / "b.h5")
    assert list(reader.keys) == ["pixels", "action"]
    assert np.array_equal(reader.read_episode(2)["pixels"], episodes[2]["pixels"])


def test_refuses_existing_destination_unless_overwrite(tmp_path):
    write_source(tmp_path / "a.lance")
    convert(tmp_path / "a.lance", tmp_path / "b.h5")
    before = fingerprint(tmp_path / "b.h5")
    with pytest.raises(ValueError, match="already exists") as caught:
        convert(tmp_path / "a.lance", tmp_path / "b.h5")
    assert caught.value.exit_code == 2 and "--overwrite" in caught.value.hint
    assert fingerprint(tmp_path / "b.h5") == before
    convert(tmp_path / "a.lance", tmp_path / "b.h5", keys=["reward"], overwrite=True)
    assert list(open_reader(tmp_path / "b.h5").keys) == ["reward"]
    (tmp_path / "precious").mkdir()
    with pytest.raises(ValueError, match="not a swm dataset"):
        convert(tmp_path / "a.lance", tmp_path / "precious", overwrite=True)
    assert (tmp_path / "precious").is_dir()


def test_bad_input_is_one_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no dataset at"):
        convert(tmp_path / "missing.lance", tmp_path / "out.h5")
    write_source(tmp_path / "a.lance")
    with pytest.raises(KeyError, match="no key 'depth'") as caught:
        convert(tmp_path / "a.lance", tmp_path / "out.h5", keys=["depth"])
    assert caught.value.exit_code == 2
    assert not (tmp_path / "out.h5").exists()


def test_info_shows_format_counts_sizes_and_keys(tmp_path):
    write_source(tmp_path / "a.lance")
    result = info(tmp_path / "a.lance")
    fields = result.fields
    assert fields["format"] == "lance"
    assert fields["episodes"] == 3 and fields["steps"] == sum(LENGTHS)
    assert fields["on_disk_bytes"] > 0
    assert fields["per_step_bytes"] == fields["on_disk_bytes"] // sum(LENGTHS)
    assert fields["env_id"] == "swm/TwoRoom-v0"
    rows = {row[0]: row for row in result.tables[0].rows}
    assert rows["pixels"][1:] == ["uint8", [32, 32, 3], 32 * 32 * 3]
    assert rows["action"][1:3] == ["float32", [2]]


def test_copy_dataset_returns_what_it_wrote_and_reports_each_episode(tmp_path):
    write_source(tmp_path / "a.lance")
    seen = []
    copied = copy_dataset(
        tmp_path / "a.lance", tmp_path / "b.h5", on_episode=lambda *done: seen.append(done)
    )
    assert isinstance(copied, Copied) and copied.format == "hdf5"
    assert (copied.episodes, copied.steps) == (3, sum(LENGTHS))
    assert seen == [(1, 3), (2, 3), (3, 3)]
    assert copied.dst_size_bytes == sum(f.stat().st_size for f in [tmp_path / "b.h5"])


def test_convert_removes_what_a_killed_convert_left(tmp_path):
    src = tmp_path / "a.lance"
    with open_writer(src, metadata={"env_id": "swm/TwoRoom-v0"}) as writer:
        writer.write_episode(make_episode(0, 5))
    dead = _finished_pid()
    leftover = tmp_path / f".tmp-{dead}-b.h5"
    leftover.write_bytes(b"half a copy")
    live = tmp_path / f".tmp-{os.getppid()}-b.h5"  # a running process's copy is not touched
    live.write_bytes(b"in progress")
    copy_dataset(src, tmp_path / "b.h5")
    assert not leftover.exists() and live.exists()


def _finished_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_damaged_episodes_stop_a_convert_or_are_left_out_and_counted(tmp_path):
    import json

    import h5py
    from typer.testing import CliRunner

    from swmcli.cli import app

    source = tmp_path / "a.h5"
    write_source(source)
    with h5py.File(source, "r+") as file:  # one reward of episode 1, behind swm's back
        file["reward"][int(file["episode_offsets"][1])] += 1
    runner = CliRunner()
    refused = runner.invoke(app, ["convert", str(source), str(tmp_path / "b.lance")])
    assert refused.exit_code == 1 and "episode 1 is damaged" in refused.output
    assert not (tmp_path / "b.lance").exists()
    done = runner.invoke(
        app, ["convert", str(source), str(tmp_path / "b.lance"), "--skip-damaged", "--json"]
    )
    assert done.exit_code == 0, done.output
    result = json.loads(done.stdout)
    assert result["skipped_damaged_episodes"] == 1 and result["episodes"] == 2
    assert any("left out 1 damaged episodes: episode 1" in w for w in result["warnings"])
    assert info(tmp_path / "b.lance", verify=True).fields["verified_episodes"] == 2


def test_no_keys_and_a_full_disk_are_clear_errors(tmp_path, monkeypatch):
    import shutil

    from typer.testing import CliRunner

    from swmcli.cli import app

    write_source(tmp_path / "a.lance")
    result = CliRunner().invoke(app, ["convert", str(tmp_path / "a.lance"), "b.h5", "--keys", ""])
    assert result.exit_code == 2 and "no key" in result.output
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=10 * 2**20))
    result = CliRunner().invoke(app, ["convert", str(tmp_path / "a.lance"), str(tmp_path / "b.h5")])
    assert result.exit_code == 1 and f"free on the disk of {tmp_path / 'b.h5'}" in result.output
    assert "left as it was" in result.output and "every finished episode" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.lance"]
