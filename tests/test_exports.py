"""Exports another tool trains on (``swm convert --layout stable-worldmodel|lerobot|minari``):
each target's convention for the last row (no NaN in what the tool reads), its names and stats,
swm's import of each giving swm's rows back exactly; the tools' own readers and a plain
DataLoader over what swm wrote where the tool installs here; ``--map`` on swm's own datasets;
LeRobot's image layout and codecs read."""

import json
import os
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest
from test_foreign import read_all, swm

from swmcli.data.exports import stats as lerobot_stats
from swmcli.data.formats import detect, open_reader

LEROBOT = Path(__file__).parent / "fixtures" / "lerobot"
SIDE = 32


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A swm dataset as collect writes one: reward and flags 0/False on the first row, NaN last
    action; smooth frames (JPEG- and h264-friendly), a float64 column, a uint8 one."""
    from swmcli.data.formats import open_writer

    path = tmp_path_factory.mktemp("exports") / "source.h5"
    with open_writer(path, mode="error", metadata={"env_id": "swm/TwoRoom-v0"}) as writer:
        for seed, length in enumerate((5, 3, 7)):
            rng = np.random.default_rng(seed)
            ramp = np.arange(SIDE, dtype=np.uint8)[None, :, None, None] * 7
            pixels = np.broadcast_to(ramp + 9 * seed, (length, SIDE, SIDE, 3)).copy()
            pixels[:, 8:14, 10 + seed : 20 + seed] = (250, 40, 90)
            action = rng.uniform(-1, 1, (length, 2)).astype(np.float32)
            action[-1] = np.nan
            reward = rng.standard_normal(length).astype(np.float32)
            reward[0] = 0
            truncated = np.zeros(length, bool)
            truncated[-1] = True
            writer.write_episode({
                "pixels": pixels, "action": action, "reward": reward,
                "terminated": np.zeros(length, bool), "truncated": truncated,
                "state": rng.standard_normal((length, 2)).astype(np.float32),
                "goal": rng.standard_normal((length, 2)).astype(np.float32),
                "score": np.linspace(0, 1, length) / 3,
                "count": np.arange(length, dtype=np.uint8),
            })  # fmt: skip
    return path


def export(source: Path, out: Path, layout: str, *extra) -> dict:
    result = swm("convert", source, out, "--layout", layout, "--json", *extra)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def numbers_of(out: Path, layout: str) -> dict[str, np.ndarray]:
    """Every number column of an export, read from its files as the tool stores them."""
    import pyarrow.parquet as pq

    if layout == "lerobot":
        table = pq.read_table(out / "data/chunk-000/file-000.parquet")
        columns = {}
        for name in table.column_names:
            column = table.column(name).combine_chunks()
            flat = column.flatten() if hasattr(column, "flatten") else column
            columns[name] = flat.to_numpy(zero_copy_only=False).astype(np.float64)
        return columns
    if out.suffix == ".lance":
        import lance

        table = lance.dataset(str(out)).to_table()
        return {
            name: np.asarray(table.column(name).combine_chunks().flatten(), np.float64)
            for name in table.column_names if name not in ("pixels", "episode_idx", "step_idx")
        }  # fmt: skip
    columns = {}

    def keep(name, item):
        if isinstance(item, h5py.Dataset) and item.dtype.kind in "biuf":
            columns[name] = item[()].astype(np.float64)

    with h5py.File(out if out.suffix == ".h5" else out / "data/main_data.hdf5") as file:
        file.visititems(keep)
    return columns


TARGETS = [("stable-worldmodel", "up.h5"), ("stable-worldmodel", "up.lance"),
           ("lerobot", "lerobot"), ("minari", "swm-v0")]  # fmt: skip


@pytest.mark.parametrize(("layout", "name"), TARGETS, ids=[n for _, n in TARGETS])
def test_exports_carry_no_nan_and_come_back_exactly(source, tmp_path, layout, name):
    out = tmp_path / name
    shown = export(source, out, layout)
    assert shown["convention"] and "\n" not in shown["convention"]  # said, in one line
    for column, values in numbers_of(out, layout).items():
        assert not np.isnan(values).any(), f"NaN in {column} of the {layout} export"
    back = read_all(out)
    for original, returned in zip(read_all(source), back, strict=True):
        assert original.keys() == returned.keys()
        for key, value in original.items():
            assert returned[key].dtype == value.dtype and returned[key].shape == value.shape, key
            lossy = (name == "up.lance" and key in ("pixels", "score")) or (
                layout == "lerobot" and key == "pixels"
            )
            if not lossy:  # the last row's action NaN again: swm's convention, bit for bit
                assert returned[key].tobytes() == value.tobytes(), f"{layout}: {key}"
        if layout == "lerobot":  # h264 frames, but the last row's frame is kept losslessly
            assert np.abs(returned["pixels"].astype(int) - original["pixels"]).mean() < 4
            np.testing.assert_array_equal(returned["pixels"][-1], original["pixels"][-1])


def test_stable_worldmodel_export_holds_0_1_1s_last_action(source, tmp_path):
    out = tmp_path / "up.h5"
    export(source, out, "stable-worldmodel")
    with h5py.File(out) as file:
        action, ends = file["action"][()], np.cumsum(file["ep_len"][()])
    for episode, end in zip(read_all(source), ends, strict=True):
        np.testing.assert_array_equal(action[end - 1], episode["action"][0])  # its first
    assert "swm's export" in open_reader(out).metadata["source_convention"]


def test_lerobot_export_names_and_stats(source, tmp_path):
    import pyarrow.parquet as pq

    out = tmp_path / "lerobot"
    export(source, out, "lerobot")
    info = json.loads((out / "meta/info.json").read_text())
    features = info["features"]
    assert features["observation.images.pixels"]["dtype"] == "video"
    assert features["observation.state"]["shape"] == [2]  # the robot's state: swm's state
    assert {"observation.goal", "next.reward", "next.done", "action"} <= features.keys()
    assert info["total_frames"] == 15 - 3  # T+1 rows are T frames
    episodes = read_all(source)
    frames = {key: np.concatenate([e[key][:-1] for e in episodes]) for key in ("state", "action")}
    stats = json.loads((out / "meta/stats.json").read_text())
    for feature, key in (("observation.state", "state"), ("action", "action")):
        values = frames[key].astype(np.float64)
        np.testing.assert_allclose(stats[feature]["mean"], values.mean(axis=0), rtol=1e-6)
        np.testing.assert_allclose(stats[feature]["std"], values.std(axis=0), rtol=1e-6)
        np.testing.assert_array_equal(stats[feature]["min"], frames[key].min(axis=0))
        assert stats[feature]["count"] == [12] and len(stats[feature]["q50"]) == 2
    image = stats["observation.images.pixels"]
    assert np.shape(image["mean"]) == (3, 1, 1) and 0 <= np.min(image["min"]) <= 1
    pixels = np.concatenate([e["pixels"][:-1] for e in episodes]).reshape(-1, 3) / 255
    np.testing.assert_allclose(np.ravel(image["mean"]), pixels.mean(axis=0), rtol=1e-9)
    assert stats["next.done"]["count"] == [12] and stats["index"]["max"] == [11]
    rows = pq.read_table(out / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [row["length"] for row in rows] == [4, 2, 6]
    np.testing.assert_allclose(rows[2]["stats/action/mean"], episodes[2]["action"][:-1].mean(0),
                               rtol=1e-6)  # fmt: skip


def test_lerobot_names_follow_proprio_and_map(source, tmp_path):
    out = tmp_path / "named"
    export(source, out, "lerobot", "--map", "goal=proprio", "--map", "score=")
    features = json.loads((out / "meta/info.json").read_text())["features"]
    assert features["observation.state"]["shape"] == [2]  # proprio: the robot's state
    assert "observation.environment_state" in features and "observation.score" not in features
    out = tmp_path / "chosen"
    export(source, out, "lerobot", "--map", "pixels=observation.images.front")
    features = json.loads((out / "meta/info.json").read_text())["features"]
    assert "observation.images.front" in features
    assert read_all(out)[0].keys() == read_all(source)[0].keys() - {"pixels"} | {
        "observation.images.front"
    }


def test_map_renames_swm_datasets_or_says_why_not(source, tmp_path):
    out = tmp_path / "renamed.lance"
    result = swm("convert", source, out, "--map", "state=proprio", "--map", "goal=")
    assert result.exit_code == 0, result.output
    (episode,) = read_all(out)[:1]
    assert "proprio" in episode and "state" not in episode and "goal" not in episode
    np.testing.assert_array_equal(episode["proprio"], read_all(source)[0]["state"])
    shown = json.loads(swm("info", source, "--json", "--map", "state=proprio").stdout)
    assert shown["mapping"] == {"state": "proprio"}
    for flags, message in (
        (("--map", "nothere=x"), "not a column"),
        (("--map", "state=goal"), "both map to 'goal'"),
        (("--map", "state=observation.state"), "takes no '.' in a key"),  # Lance's rule
    ):
        result = swm("convert", source, tmp_path / "x.lance", *flags)
        assert result.exit_code == 2 and result.output.startswith("error:"), result.output
        assert message in result.output and not (tmp_path / "x.lance").exists()


def test_minari_needs_its_name_and_columns(source, tmp_path):
    result = swm("convert", source, tmp_path / "noversion", "--layout", "minari")
    assert result.exit_code == 2 and "NAME-vN" in result.output
    result = swm("convert", source, tmp_path / "x-v0", "--layout", "minari", "--keys",
                 "pixels,action")  # fmt: skip
    assert result.exit_code == 2 and "rewards and flags" in result.output


# ------------------------------------------------------------------ the tools' own readers


def _padded(episodes):
    """Minari's documented collate: episodes of different lengths padded into one batch."""
    import torch
    from torch.nn.utils.rnn import pad_sequence

    def stacked(values):
        return pad_sequence([torch.as_tensor(v) for v in values], batch_first=True)

    return {
        "observations": {key: stacked([e.observations[key] for e in episodes])
                         for key in episodes[0].observations},
        "actions": stacked([e.actions for e in episodes]),
        "rewards": stacked([e.rewards for e in episodes]),
    }  # fmt: skip


def test_minaris_own_reader_and_a_dataloader(source, tmp_path, monkeypatch):
    minari = pytest.importorskip("minari", reason="minari not installed: pip install minari")
    import torch

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    export(source, tmp_path / "swm" / "dots-v0", "minari")
    dataset = minari.load_dataset("swm/dots-v0")
    episodes = read_all(source)
    assert dataset.total_episodes == 3 and dataset.total_steps == 15 - 3
    for episode, ours in zip(dataset.iterate_episodes(), episodes, strict=True):
        for key in ("pixels", "state", "goal", "score", "count"):
            np.testing.assert_array_equal(episode.observations[key], ours[key])  # T+1, raw
        np.testing.assert_array_equal(episode.actions, ours["action"][:-1])  # T: no NaN row
        np.testing.assert_array_equal(episode.rewards, ours["reward"][1:])
        np.testing.assert_array_equal(episode.truncations, ours["truncated"][1:])
    loader = torch.utils.data.DataLoader(dataset, batch_size=2, collate_fn=_padded)
    batches = list(loader)
    assert len(batches) == 2
    for batch in batches:
        assert not torch.isnan(batch["actions"]).any() and not torch.isnan(batch["rewards"]).any()
    np.testing.assert_array_equal(batches[1]["actions"][0].numpy(), episodes[2]["action"][:-1])


UPSTREAM_LOADER = """
import json, sys
import numpy as np, torch
from stable_worldmodel.data import load_dataset
dataset = load_dataset(sys.argv[1], num_steps=2, frameskip=1)
batches, with_nan, seen = 0, 0, {}
for batch in torch.utils.data.DataLoader(dataset, batch_size=8):
    batches += 1
    with_nan += any(torch.isnan(v).any().item() for v in batch.values()
                    if torch.is_tensor(v) and v.is_floating_point())
    for key, value in batch.items():
        seen.setdefault(key, []).append(value.numpy())
np.savez(sys.argv[2], **{key: np.concatenate(v) for key, v in seen.items()})
print(json.dumps({"clips": len(dataset), "batches": batches, "with_nan": with_nan}))
"""


@pytest.mark.parametrize("suffix", [".h5", ".lance"])
def test_stable_worldmodels_own_loader_and_a_dataloader(source, tmp_path, suffix, upstream_python):
    """stable-worldmodel 0.1.1's load_dataset and a plain DataLoader over swm's export: no NaN
    in any batch, every value swm's (frames within JPEG's error in Lance). stable-worldmodel
    pulls a second torch, so it runs in the interpreter SWM_UPSTREAM_PYTHON names."""
    from swmcli import load_dataset

    python = upstream_python
    out, arrays = tmp_path / f"upstream{suffix}", tmp_path / "batches.npz"
    export(source, out, "stable-worldmodel")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([python, "-c", UPSTREAM_LOADER, str(out), str(arrays)],
                          capture_output=True, text=True, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    ours = load_dataset(source, history_len=2, frameskip=1)
    assert counts == {"clips": len(ours), "batches": -(-len(ours) // 8), "with_nan": 0}
    theirs = np.load(arrays)
    index = 0
    for episode in read_all(source):  # upstream's clip order: by episode, then start
        for start in range(len(episode["action"]) - 2 + 1):
            clip = ours[index]  # swm's own clip: its values are the ones to match
            dense = slice(start, start + 2)
            wrapped = np.where(np.isnan(episode["action"]), episode["action"][0], episode["action"])
            np.testing.assert_array_equal(clip["action"].reshape(2, 2), episode["action"][dense])
            got = theirs["action"][index].reshape(2, 2)  # the NaN row: 0.1.1's first action
            np.testing.assert_array_equal(got, wrapped[dense])
            for key in ("state", "goal", "reward", "count"):
                np.testing.assert_array_equal(theirs[key][index].reshape(clip[key].shape),
                                              clip[key].astype(theirs[key].dtype))  # fmt: skip
            frames = theirs["pixels"][index].transpose(0, 2, 3, 1)  # channels first there
            error = np.abs(frames.astype(int) - clip["pixels"].astype(int))
            assert error.max() == 0 if suffix == ".h5" else error.mean() < 4
            index += 1
    assert index == len(ours)


# ------------------------------------------------------------------ LeRobot's layouts, read


def dot_frame(side: int, episode: int, step: int) -> np.ndarray:
    """What ``make_lerobot_tool.py`` recorded."""
    image = np.zeros((side, side, 3), np.uint8)
    image[:, :, 2] = np.arange(side, dtype=np.uint8)[:, None] * (192 // side)
    x, y = 4 + 3 * step, 6 + 6 * episode
    image[y : y + 5, x : x + 5] = (240, 200, 40)
    return image


def test_lerobots_image_layout_is_read_exactly_and_trains(tmp_path):
    path = LEROBOT / "dots-images"  # written by LeRobot itself, use_videos=False
    shown = json.loads(swm("info", path, "--json").stdout)
    assert shown["source_codec"] == "PNG (lossless)" and shown["source_lossy"] is False
    assert shown["mapping"]["observation.image"] == "pixels" and "not_imported" not in shown
    for index, episode in enumerate(read_all(path)):
        expected = np.stack([dot_frame(32, index, step) for step in range(8)])
        np.testing.assert_array_equal(episode["pixels"], expected)  # PNG: bit for bit
    result = swm("train", "--data", path, "--steps", "2", "--batch-size", "2", "--history-len",
                 "2", "--frameskip", "1", "--set", "eval.heldout_episodes=1",
                 "--out", tmp_path / "run")  # fmt: skip
    assert result.exit_code == 0, result.output


def test_codec_is_named_as_the_codec():
    shown = json.loads(swm("info", LEROBOT / "dots-av1", "--json").stdout)
    assert shown["source_codec"] == "av1 video"  # not the decoder's name (libdav1d)
    for index, episode in enumerate(read_all(LEROBOT / "dots-av1")):
        expected = np.stack([dot_frame(64, index, step) for step in range(6)])
        assert np.abs(episode["pixels"].astype(int) - expected).mean() < 6


def test_stats_combine_as_lerobots_aggregate():
    rng = np.random.default_rng(0)
    parts = [rng.standard_normal((n, 3)) for n in (4, 9, 2)]
    combined = lerobot_stats.aggregate([lerobot_stats.number_stats(p, (3,)) for p in parts])
    everything = np.concatenate(parts)
    np.testing.assert_allclose(combined["mean"], everything.mean(axis=0))
    np.testing.assert_allclose(combined["std"], everything.std(axis=0))
    np.testing.assert_array_equal(combined["min"], everything.min(axis=0))
    assert combined["count"] == [15]
    frames = rng.integers(0, 256, (5, 8, 8, 3), dtype=np.uint8)
    image = lerobot_stats.frame_stats(frames)
    channels = frames.reshape(-1, 3)
    np.testing.assert_allclose(image["mean"].ravel(), channels.mean(axis=0) / 255)
    np.testing.assert_allclose(image["std"].ravel(), channels.std(axis=0) / 255)
    median = np.quantile(channels, 0.5, axis=0, method="inverted_cdf") / 255
    np.testing.assert_allclose(image["q50"].ravel(), median)


def test_detected_layouts_of_the_exports(source, tmp_path):
    export(source, tmp_path / "m-v0", "minari")
    assert detect(tmp_path / "m-v0") == "minari"
