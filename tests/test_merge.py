"""``swm merge``: several datasets of any format into one, episodes in order and bit for bit,
verified and atomic; sources that differ refused in one line before anything is written."""

import numpy as np
import pytest
from test_checksums import _damage_reward
from test_convert import fingerprint
from test_storage import assert_same_episode, make_episode
from typer.testing import CliRunner

from swmcli.cli import app
from swmcli.data.formats import detect, open_reader, open_writer
from swmcli.data.merge import merge_datasets
from swmcli.errors import DatasetError

runner = CliRunner()
META = {"env_id": "swm/TwoRoom-v0", "resolution": 32, "action_dim": 2}


def write_source(path, seeds, metadata=None, fmt=None, **changes) -> list[dict]:
    """A dataset of one episode per seed (``changes``: a key set from the episode, or renamed
    from another key)."""
    episodes = []
    for seed in seeds:
        episode = make_episode(seed, 5 + seed % 3)
        for key, value in changes.items():
            episode[key] = value(episode) if callable(value) else episode.pop(value)
        episodes.append(episode)
    metadata = {**META, **(metadata or {})}
    with open_writer(path, format=fmt, mode="error", metadata=metadata) as writer:
        for episode in episodes:
            writer.write_episode(episode)
    return episodes


def merge(*args: str):
    return runner.invoke(app, ["merge", *map(str, args)])


def assert_holds(path, episodes) -> None:
    reader = open_reader(path)
    assert reader.num_episodes == len(episodes)
    for index, episode in enumerate(episodes):
        assert_same_episode(reader.read_episode(index), episode)


def test_lance_hdf5_and_folder_merge_in_order_bit_for_bit(tmp_path):
    a = write_source(tmp_path / "a.lance", [0, 1])
    b = write_source(tmp_path / "b.h5", [2, 3, 4])
    c = write_source(tmp_path / "c", [5], fmt="folder")
    prints = [fingerprint(tmp_path / name) for name in ("a.lance", "b.h5", "c")]
    result = merge(tmp_path / "a.lance", tmp_path / "b.h5", tmp_path / "c", tmp_path / "all.h5")
    assert result.exit_code == 0, result.output
    assert "swm merge" in result.output and "no CUDA device" in result.output
    assert_holds(tmp_path / "all.h5", [*a, *b, *c])
    assert detect(tmp_path / "all.h5") == "hdf5"
    merged = merge_datasets([tmp_path / "c", tmp_path / "all.h5"], tmp_path / "f", to="folder")
    assert (merged.episodes, merged.format, detect(tmp_path / "f")) == (7, "folder", "folder")
    assert_holds(tmp_path / "f", [*c, *a, *b, *c])
    assert [fingerprint(tmp_path / n) for n in ("a.lance", "b.h5", "c")] == prints
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no leftovers


def test_heldout_writes_the_first_sources_last_episodes_last(tmp_path):
    a = write_source(tmp_path / "a.lance", [0, 1, 2, 3])
    b = write_source(tmp_path / "b.lance", [4, 5])
    result = runner.invoke(
        app, ["merge", *map(str, [tmp_path / "a.lance", tmp_path / "b.lance"]),
              str(tmp_path / "m.lance"), "--heldout", "2", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert_holds(tmp_path / "m.lance", [a[0], a[1], *b, a[2], a[3]])
    merged_from = open_reader(tmp_path / "m.lance").metadata["merged_from"]
    assert [part["written_as"] for part in merged_from] == [[[0, 2], [4, 6]], [[2, 4]]]
    assert '"heldout_last": 2' in result.output
    refused = merge(tmp_path / "a.lance", tmp_path / "b.lance", tmp_path / "n.lance",
                    "--heldout", "5")  # fmt: skip
    _one_line_refusal(refused, "--heldout 5: the first source", "holds 4 episodes")
    assert not (tmp_path / "n.lance").exists()


def test_the_merge_keeps_the_metadata_the_sources_agree_on_and_where_each_differs(tmp_path):
    write_source(tmp_path / "a.lance", [0], metadata={"policy": "expert", "random_episodes": 1})
    write_source(tmp_path / "b.lance", [1], metadata={"policy": "expert", "random_episodes": 0})
    merge_datasets([tmp_path / "a.lance", tmp_path / "b.lance"], tmp_path / "m.lance")
    metadata = open_reader(tmp_path / "m.lance").metadata
    assert metadata["env_id"] == "swm/TwoRoom-v0" and metadata["policy"] == "expert"
    assert "random_episodes" not in metadata
    assert [part["metadata"] for part in metadata["merged_from"]] == [
        {"random_episodes": 1},
        {"random_episodes": 0},
    ]
    assert [part["dataset"] for part in metadata["merged_from"]] == [
        str(tmp_path / "a.lance"),
        str(tmp_path / "b.lance"),
    ]


def test_map_renames_the_column_in_the_sources_that_hold_it(tmp_path):
    a = write_source(tmp_path / "a.lance", [0])
    b = write_source(tmp_path / "b.lance", [1], proprio="state")  # its state is "proprio"
    result = merge(tmp_path / "a.lance", tmp_path / "b.lance", tmp_path / "m.lance",
                   "--map", "proprio=state", "--map", "goal=")  # fmt: skip
    assert result.exit_code == 0, result.output
    reader = open_reader(tmp_path / "m.lance")
    assert set(reader.keys) == {"pixels", "action", "reward", "terminated", "truncated", "state"}
    np.testing.assert_array_equal(reader.read_episode(0)["state"], a[0]["state"])
    np.testing.assert_array_equal(reader.read_episode(1)["state"], b[0]["proprio"])
    unknown = merge(tmp_path / "a.lance", tmp_path / "b.lance", tmp_path / "n.lance",
                    "--map", "depth=pixels")  # fmt: skip
    _one_line_refusal(unknown, "'depth', a column of no source")


def _one_line_refusal(result, *said: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert lines[0].startswith("error: ") and lines[1].startswith("hint: "), result.output
    for words in said:
        assert words in lines[0], lines[0]


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"pixels": lambda e: e["pixels"][:, :16, :16]}, ["'pixels'", "uint8 (32, 32, 3)",
                                                           "uint8 (16, 16, 3)"]),
        ({"reward": lambda e: e["reward"].astype(np.float64)}, ["'reward'", "float32 ()",
                                                                 "float64 ()"]),
        ({"depth": lambda e: e["reward"]}, ["'depth'", "absent in the first"]),
        ({"proprio": "state"}, ["'state'", "absent in the second"]),
    ],
)  # fmt: skip
def test_sources_that_differ_in_a_key_are_refused_in_one_line(tmp_path, change, said):
    write_source(tmp_path / "a.lance", [0, 1])
    write_source(tmp_path / "b.h5", [2], **change)
    before = sorted(tmp_path.iterdir())
    result = merge(tmp_path / "a.lance", tmp_path / "b.h5", tmp_path / "m.lance")
    _one_line_refusal(result, str(tmp_path / "a.lance"), str(tmp_path / "b.h5"), *said)
    assert "--map" in result.output.splitlines()[1]
    assert sorted(tmp_path.iterdir()) == before  # nothing written, no lock file left


def test_sources_of_another_env_or_resolution_are_refused_in_one_line(tmp_path):
    write_source(tmp_path / "a.lance", [0])
    write_source(tmp_path / "b.lance", [1], metadata={"resolution": 64})
    write_source(tmp_path / "c.lance", [2], metadata={"env_id": "CartPole-v1"})
    result = merge(tmp_path / "a.lance", tmp_path / "b.lance", tmp_path / "m.lance")
    _one_line_refusal(result, "differ in resolution: 32 in the first, 64 in the second")
    result = merge(tmp_path / "a.lance", tmp_path / "c.lance", tmp_path / "m.lance")
    _one_line_refusal(result, "differ in env_id: swm/TwoRoom-v0 in the first, CartPole-v1")
    assert not (tmp_path / "m.lance").exists()


def test_a_destination_among_inside_or_around_its_sources_is_refused(tmp_path):
    write_source(tmp_path / "a.lance", [0])
    write_source(tmp_path / "data" / "b", [1], fmt="folder")
    prints = [fingerprint(tmp_path / "a.lance"), fingerprint(tmp_path / "data" / "b")]
    a, b = tmp_path / "a.lance", tmp_path / "data" / "b"
    _one_line_refusal(merge(a, b, b, "--overwrite"), "source and destination are the same path")
    _one_line_refusal(merge(a, b, b / "m.lance"), "is inside the source")
    _one_line_refusal(merge(a, b, tmp_path / "data", "--overwrite"), "a folder holding the source")
    (tmp_path / "link").symlink_to(b)
    _one_line_refusal(merge(a, b, tmp_path / "link" / "m.h5"), "is inside the source")
    assert [fingerprint(a), fingerprint(b)] == prints


def test_an_existing_destination_needs_overwrite(tmp_path):
    write_source(tmp_path / "a.lance", [0])
    b = write_source(tmp_path / "b.lance", [1])
    write_source(tmp_path / "m.h5", [7])
    before = fingerprint(tmp_path / "m.h5")
    _one_line_refusal(merge(tmp_path / "a.lance", tmp_path / "b.lance", tmp_path / "m.h5"),
                      "already exists")  # fmt: skip
    assert fingerprint(tmp_path / "m.h5") == before
    result = merge(tmp_path / "b.lance", tmp_path / "b.lance", tmp_path / "m.h5", "--overwrite")
    assert result.exit_code == 0, result.output
    assert_holds(tmp_path / "m.h5", [*b, *b])


def test_a_merge_that_fails_midway_leaves_no_destination(tmp_path):
    write_source(tmp_path / "a.lance", [0, 1])
    write_source(tmp_path / "b.h5", [2, 3, 4])
    _damage_reward(tmp_path / "b.h5", 1)
    with pytest.raises(DatasetError, match=r"b\.h5: episode 1 is damaged"):
        merge_datasets([tmp_path / "a.lance", tmp_path / "b.h5"], tmp_path / "m.lance")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.lance", "b.h5"]

    def interrupted(done: int, total: int) -> None:
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        merge_datasets([tmp_path / "a.lance", tmp_path / "a.lance"], tmp_path / "m.lance",
                       on_episode=interrupted)  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.lance", "b.h5"]


def test_a_missing_source_or_a_single_one_is_one_line(tmp_path):
    write_source(tmp_path / "a.lance", [0])
    _one_line_refusal(merge(tmp_path / "a.lance", tmp_path / "missing.h5", tmp_path / "m.h5"),
                      "no dataset at")  # fmt: skip
    single = merge(tmp_path / "a.lance", tmp_path / "m.h5")
    _one_line_refusal(single, "got 2 path(s): it needs two or more sources")
    assert not (tmp_path / "m.h5").exists()
