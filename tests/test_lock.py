"""One writer per dataset, whoever writes: a second writer (convert's destination, a collect,
online recording) is refused at once, naming the first one's PID and command; the first one
finishes and loses nothing. And nothing but swm's own leftovers is ever removed."""

import os
import signal

import pytest
from test_storage import (
    FORMATS,
    assert_same_episode,
    dataset_path,
    make_episode,
    start_writer,
    write,
)
from typer.testing import CliRunner

from swmcli.cli import app
from swmcli.data.formats import open_reader
from swmcli.errors import UsageError


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_second_writer_is_refused_and_the_first_finishes_losing_nothing(tmp_path, fmt):
    source = tmp_path / "source.h5"
    write(source, [make_episode(0, 5)])
    path = dataset_path(tmp_path, fmt)
    stop = tmp_path / "stop"
    first = start_writer(path, fmt, stop=stop)
    runner = CliRunner()
    try:
        assert first.stdout.readline()  # one episode committed: the first writer is live
        attempts = {
            "convert --overwrite": ["convert", str(source), str(path), "--overwrite"],
            "collect": ["collect", "--preset", "tiny", "--episodes", "1", "--out", str(path)],
            "online record": [
                "train", "--preset", "tiny", "--online", "--env", "swm/TwoRoom-v0", "--steps",
                "1", "--record", str(path), "--out", str(tmp_path / "run"),
            ],
        }  # fmt: skip
        for name, command in attempts.items():
            result = runner.invoke(app, command)
            assert result.exit_code == 1, (name, result.output)
            assert f"being written by process {first.pid} (" in result.output, name
            assert "-c" in result.output  # its command line: python -c ...
    finally:
        stop.touch()
    committed = 1 + len(first.stdout.read().split())  # (communicate would skip the buffer)
    assert first.wait(timeout=120) == 0
    reader = open_reader(path)
    assert reader.num_episodes == committed
    for index in range(committed):
        assert_same_episode(reader.read_episode(index), make_episode(index, 7 + index % 5))
    reader.close()


def test_a_convert_holds_its_destination_until_it_is_in_place(tmp_path):
    from swmcli.data.copy import copy_dataset
    from swmcli.data.storage.lock import WriterLock

    source = tmp_path / "source.h5"
    write(source, [make_episode(seed, 5) for seed in range(3)])
    seen = []

    def during(done, total):  # a second writer tries while the copy runs
        with pytest.raises(Exception, match=f"being written by process {os.getpid()}"):
            WriterLock(tmp_path / "copy.lance")
        seen.append(done)

    copy_dataset(source, tmp_path / "copy.lance", on_episode=during)
    assert seen == [1, 2, 3]
    WriterLock(tmp_path / "copy.lance").release()  # free again once the copy is in place


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_users_files_are_never_taken_for_leftovers(tmp_path, fmt):
    mine = tmp_path / "mydir"
    (mine / "sub").mkdir(parents=True)
    (mine / ".gitkeep").touch()
    (mine / "sub" / "notes.txt").touch()
    with pytest.raises(UsageError, match="not a swm dataset"):
        write(mine, [make_episode(0, 5)], fmt=fmt)
    assert (mine / ".gitkeep").is_file() and (mine / "sub" / "notes.txt").is_file()
    result = CliRunner().invoke(app, ["collect", "--preset", "tiny", "--out", str(mine)])
    assert result.exit_code == 2 and "not a swm dataset" in result.output
    assert sorted(p.name for p in mine.rglob("*")) == [".gitkeep", "notes.txt", "sub"]


def test_a_killed_writer_of_the_first_episode_leaves_a_layout_that_is_replaced(tmp_path):
    path = tmp_path / "half.lance"
    process = start_writer(path, "lance")
    assert process.stdout.readline()
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    reader = open_reader(path)  # a committed dataset is kept, never taken for a leftover
    kept = reader.num_episodes
    reader.close()
    write(path, [make_episode(kept, 7 + kept % 5)])
    assert open_reader(path).num_episodes == kept + 1
