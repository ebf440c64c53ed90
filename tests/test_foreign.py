"""Bring your data: datasets written by stable-worldmodel (0.1.1 and main) and Minari open by
their path alone, in swm's row convention, say what they are, convert and train; damaged or
hostile files are one line and a non-zero exit."""

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

from swmcli.cli import app
from swmcli.data.formats import detect, open_reader
from swmcli.errors import DatasetError, UsageError

FIXTURES = Path(__file__).parent / "fixtures"
UPSTREAM = FIXTURES / "stable_worldmodel"
runner = CliRunner()


def swm(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def read_all(path, **kwargs) -> list[dict]:
    reader = open_reader(path, **kwargs)
    try:
        return [reader.read_episode(i) for i in range(reader.num_episodes)]
    finally:
        reader.close()


@pytest.mark.parametrize("version", ["0.1.1", "main"])
@pytest.mark.parametrize("name", ["tworoom.lance", "tworoom.h5", "tworoom-folder", "tworoom-video"])
def test_upstream_fixtures_open_in_swms_convention(version, name):
    path = UPSTREAM / version / name
    layout = {".lance": "lance", ".h5": "hdf5"}.get(path.suffix, name.partition("-")[2])
    assert detect(path) == f"stable-worldmodel-{layout}"
    reader = open_reader(path)
    assert reader.metadata["source_convention"].startswith(f"stable-worldmodel {version}")
    lengths = reader.episode_lengths.tolist()
    reader.close()
    assert lengths == ([6, 6] if version == "0.1.1" else [7, 7])  # main keeps the reset frame
    for episode in read_all(path):
        assert episode["pixels"].shape[1:] == (32, 32, 3) and episode["pixels"].dtype == np.uint8
        assert np.isnan(episode["action"][-1]).all()  # swm: no action from the last observation
        assert np.isfinite(episode["action"][:-1]).all()
        assert episode["reward"][0] == 0  # main's NaN reset reward becomes swm's first-row 0
        assert episode["truncated"][-1] and not episode["truncated"][:-1].any()


def test_0_1_1_and_main_agree_after_import():
    """Both fixtures are the same seeded rollouts: 0.1.1 lost the reset frame and rotated the
    actions, so once imported its row t must be main's row t+1, frames and actions alike."""
    old, new = read_all(UPSTREAM / "0.1.1/tworoom.h5"), read_all(UPSTREAM / "main/tworoom.h5")
    for released, current in zip(old, new, strict=True):
        assert np.array_equal(released["pixels"], current["pixels"][1:])
        assert np.array_equal(released["action"][:-1], current["action"][1:-1])
        assert np.array_equal(released["state"], current["state"][1:])


def test_hdf5_is_read_bit_exact_and_lance_frames_within_jpeg_error():
    raw = h5py.File(UPSTREAM / "main/tworoom.h5", "r")
    hdf5, lance = read_all(UPSTREAM / "main/tworoom.h5"), read_all(UPSTREAM / "main/tworoom.lance")
    assert np.array_equal(np.concatenate([e["pixels"] for e in hdf5]), raw["pixels"][:])
    assert np.array_equal(np.concatenate([e["state"] for e in hdf5]), raw["state"][:])
    for exact, jpeg in zip(hdf5, lance, strict=True):
        error = np.abs(exact["pixels"].astype(int) - jpeg["pixels"].astype(int))
        assert 0 < error.mean() < 3  # JPEG q95: lossy, and close
        np.testing.assert_array_equal(exact["action"], jpeg["action"])


@pytest.mark.parametrize("name", ["tworoom-folder", "tworoom-video", "tworoom-lance-video"])
def test_upstream_frame_layouts_hold_the_same_rollouts(name):
    """main's folder (JPEG q75 per step), video (MP4 per episode) and lance_video (MP4 blobs)
    layouts: the same seeded rollouts as its HDF5, numbers exact, frames within codec error."""
    exact = read_all(UPSTREAM / "main/tworoom.h5")
    for lossless, lossy in zip(exact, read_all(UPSTREAM / "main" / name), strict=True):
        np.testing.assert_array_equal(lossy["action"], lossless["action"])
        assert np.abs(lossy["pixels"].astype(int) - lossless["pixels"].astype(int)).mean() < 4
    codec = open_reader(UPSTREAM / "main" / name).metadata["source_codec"]
    assert codec == {"tworoom-folder": "JPEG quality 75"}.get(name, codec) and codec


def test_info_names_format_convention_codec_and_mapping():
    result = swm("info", UPSTREAM / "0.1.1/tworoom.lance", "--json")
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["format"] == "stable-worldmodel-lance"
    assert shown["source_codec"] == "JPEG quality 95"
    assert shown["source_lossy"].startswith("frames (pixels)")
    assert "0.1.1" in shown["source_convention"] and "NaN" in shown["alignment"]
    assert shown["mapping"] == "same names"
    result = swm("info", UPSTREAM / "main/tworoom.h5", "--json", "--map", "state=proprio_xy",
                 "--map", "id=")  # fmt: skip
    shown = json.loads(result.stdout)
    assert shown["source_lossy"] is False and shown["mapping"] == {"state": "proprio_xy"}
    keys = [row[0] for row in shown["tables"][0]["rows"]]
    assert "proprio_xy" in keys and "state" not in keys and "id" not in keys
    result = swm("info", UPSTREAM / "main/tworoom.h5", "--map", "nothere=pixels")
    assert result.exit_code == 2 and "not a column" in result.output


def test_convert_streams_into_swm_and_trains(tmp_path):
    out = tmp_path / "imported.lance"
    result = swm("convert", UPSTREAM / "0.1.1/tworoom.lance", out)
    assert result.exit_code == 0, result.output
    assert detect(out) == "lance"
    for imported, direct in zip(read_all(out), read_all(UPSTREAM / "0.1.1/tworoom.lance"),
                                strict=True):  # fmt: skip
        assert imported.keys() == direct.keys()
        for key in direct:
            np.testing.assert_array_equal(imported[key], direct[key])
    assert open_reader(out).metadata["source_codec"] == "JPEG quality 95"  # provenance kept
    result = swm("train", "--data", UPSTREAM / "main/tworoom.h5", "--steps", "2", "--batch-size",
                 "2", "--history-len", "2", "--frameskip", "1", "--set", "eval.heldout_episodes=1",
                 "--out", tmp_path / "run")  # fmt: skip
    assert result.exit_code == 0, result.output


# ------------------------------------------------------------------ hostile and damaged input


def upstream_hdf5(path: Path, **overrides) -> Path:
    """A small file in stable-worldmodel's HDF5 layout, with some datasets replaced."""
    columns = {
        "pixels": np.zeros((6, 8, 8, 3), np.uint8),
        "action": np.ones((6, 2), np.float32),
        "ep_len": np.array([3, 3], np.int32),
        "ep_offset": np.array([0, 3], np.int64),
    }
    columns.update(overrides)
    with h5py.File(path, "w") as file:
        for name, value in columns.items():
            if isinstance(value, tuple):  # (shape, dtype): declared, never written
                file.create_dataset(name, shape=value[0], dtype=value[1], chunks=True)
            else:
                file.create_dataset(name, data=value)
    return path


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"ep_len": np.array([3, 4], np.int32)}, "add up to 7 rows, 6 are stored"),
        ({"ep_len": np.array([6, 0], np.int32)}, "episode 1 has 0 rows"),
        ({"ep_offset": np.array([0, 2], np.int64)}, "ep_offset does not follow"),
        ({"ep_len": ((2**40,), np.int64)}, "claims"),  # a header asking for 8 TB
        ({"pixels": ((6, 4096, 4096, 3), np.uint8)}, "claims"),
        ({"action": np.ones((5, 2), np.float32)}, "different lengths"),
    ],
)
def test_damaged_upstream_hdf5_is_one_line(tmp_path, overrides, message):
    path = upstream_hdf5(tmp_path / "bad.h5", **overrides)
    with pytest.raises(DatasetError, match=message):
        open_reader(path)
    result = swm("info", path)
    assert result.exit_code == 1 and result.output.startswith("error:")
    assert "Traceback" not in result.output


def test_hostile_npz_of_the_folder_layout(tmp_path):
    import shutil
    import zipfile

    root = tmp_path / "folder"
    shutil.copytree(UPSTREAM / "main/tworoom-folder", root)
    np.savez(root / "id.npz", np.array([{"a": 1}] * 14, dtype=object))  # a pickle inside
    result = swm("info", root)
    assert result.exit_code == 1 and "never unpickled" in result.output
    np.savez(root / "id.npz", np.zeros(14))
    header = np.lib.format.header_data_from_array_1_0(np.zeros(14))
    header["shape"] = (2**40,)  # 8 TB claimed by a few bytes
    with zipfile.ZipFile(root / "action.npz", "w") as archive, archive.open("arr_0.npy", "w") as f:
        np.lib.format.write_array_header_1_0(f, header)
        f.write(np.zeros(14).tobytes())
    result = swm("info", root)
    assert result.exit_code == 1 and "claims 8796093022208 bytes" in result.output


def test_hostile_jpeg_and_lance_index(tmp_path):
    import lance
    import pyarrow as pa

    from swmcli.data.foreign import jpeg

    header = FIXTURES / "stable_worldmodel/main/tworoom.lance"
    blob = lance.dataset(str(header)).take([0], columns=["pixels"]).column(0)[0].as_py()
    index = blob.index(b"\xff\xc0")  # start of frame: height and width follow the precision
    giant = blob[: index + 5] + (6000).to_bytes(2, "big") * 2 + blob[index + 9 :]
    with pytest.raises(DatasetError, match="claims 6000x6000"):
        jpeg.decode([giant], (32, 32, 3), "crafted")
    table = pa.table({
        "episode_idx": pa.array([0, 0, 1, 0], pa.int32()),  # episode 0 split in two runs
        "step_idx": pa.array([0, 1, 0, 2], pa.int32()),
        "action": pa.FixedSizeListArray.from_arrays(pa.array(np.ones(8, np.float32)), 2),
    })  # fmt: skip
    lance.write_dataset(table, str(tmp_path / "split.lance"))
    result = swm("info", tmp_path / "split.lance")
    assert result.exit_code == 1 and "not contiguous" in result.output


def test_unknown_directory_is_a_usage_error(tmp_path):
    (tmp_path / "something").mkdir()
    with pytest.raises(UsageError, match="nor one swm imports"):
        detect(tmp_path / "something")


# ------------------------------------------------------------------ export to stable-worldmodel


@pytest.fixture(scope="module")
def swm_dataset(tmp_path_factory) -> Path:
    """A swm Lance dataset: frames, float32/bool/float64 columns, NaN last actions."""
    from test_storage import make_episode

    from swmcli.data.formats import open_writer

    path = tmp_path_factory.mktemp("swm") / "source.lance"
    with open_writer(path, mode="error", metadata={"env_id": "swm/TwoRoom-v0"}) as writer:
        for seed, length in enumerate((5, 3, 7)):
            episode = make_episode(seed, length)
            ramp = np.arange(32, dtype=np.uint8)[None, :, None, None] * 7  # smooth: JPEG-friendly
            episode["pixels"] = np.broadcast_to(ramp + 9 * seed, (length, 32, 32, 3)).copy()
            episode["pixels"][:, 8:14, 10:20] = (250, 40, 90)
            episode["score"] = np.linspace(0, 1, length, dtype=np.float64) / 3
            writer.write_episode(episode)
    return path


@pytest.mark.parametrize("suffix", [".h5", ".lance"])
def test_export_round_trip(swm_dataset, tmp_path, suffix):
    out = tmp_path / f"upstream{suffix}"
    result = swm("convert", swm_dataset, out, "--layout", "stable-worldmodel", "--json")
    assert result.exit_code == 0, result.output
    layout = "stable-worldmodel-lance" if suffix == ".lance" else "stable-worldmodel-hdf5"
    assert json.loads(result.stdout)["format"] == detect(out) == layout
    back = tmp_path / "back.lance"
    assert swm("convert", out, back).exit_code == 0
    for original, returned in zip(read_all(swm_dataset), read_all(back), strict=True):
        assert original.keys() == returned.keys()
        for key, value in original.items():
            assert returned[key].dtype == value.dtype and returned[key].shape == value.shape
            if suffix == ".h5" or key not in ("pixels", "score"):
                np.testing.assert_array_equal(returned[key], value, err_msg=key)  # bit-exact
        if suffix == ".lance":  # JPEG q95 frames, and float64 held as float32
            error = np.abs(returned["pixels"].astype(int) - original["pixels"].astype(int))
            assert error.mean() < 4
            np.testing.assert_allclose(returned["score"], original["score"], rtol=1e-6)


def test_export_refuses_other_destinations(swm_dataset, tmp_path):
    result = swm("convert", swm_dataset, tmp_path / "out", "--layout", "stable-worldmodel")
    assert result.exit_code == 2 and ".lance directory or .h5 file" in result.output
    result = swm("convert", swm_dataset, tmp_path / "o.h5", "--layout", "lerobot-v9")
    assert result.exit_code == 2 and "unknown layout" in result.output


# ------------------------------------------------------------------ Minari

MINARI = FIXTURES / "minari"


def test_minari_fixtures_open_in_swms_convention():
    raw = h5py.File(MINARI / "pixels-raw/data/main_data.hdf5", "r")
    imported, jpeg = read_all(MINARI / "pixels-raw"), read_all(MINARI / "pixels-jpeg/data")
    assert [len(e["pixels"]) for e in imported] == [6, 6, 6]  # T+1 observations become T+1 rows
    for index, (episode, lossy) in enumerate(zip(imported, jpeg, strict=True)):
        group = raw[f"episode_{index}"]
        np.testing.assert_array_equal(episode["pixels"], group["observations"][()])
        np.testing.assert_array_equal(episode["action"][:-1], group["actions"][()])
        assert np.isnan(episode["action"][-1]).all()
        np.testing.assert_array_equal(episode["reward"], np.r_[0, group["rewards"][()]])
        np.testing.assert_array_equal(episode["truncated"], np.r_[False, group["truncations"][()]])
        np.testing.assert_array_equal(lossy["action"], episode["action"])
        assert np.abs(lossy["pixels"].astype(int) - episode["pixels"].astype(int)).mean() < 4
    shown = json.loads(swm("info", MINARI / "pixels-jpeg", "--json").stdout)
    assert shown["format"] == "minari" and shown["source_codec"] == "JPEG quality 75"
    assert shown["mapping"]["observations"] == "pixels" and shown["resolution"] == 32


def crafted_minari(root: Path, *, observations: int = 4, metadata: str = "{}", group: int = 0):
    data = root / "data"
    data.mkdir(parents=True)
    (data / "metadata.json").write_text(metadata)
    with h5py.File(data / "main_data.hdf5", "w") as file:
        episode = file.create_group(f"episode_{group}")
        episode["observations"] = np.zeros((observations, 3), np.float32)
        episode["actions"] = np.zeros((3, 2), np.float32)
        for name in ("rewards", "terminations", "truncations"):
            episode[name] = np.zeros(3)
    return root


@pytest.mark.parametrize(
    ("crafted", "message"),
    [
        ({"observations": 3}, "not 4"),  # Minari holds T+1 observations
        ({"metadata": "\x80\x04pickle"}, "not JSON"),
        ({"group": 7}, "not episode_0..N-1"),
    ],
)
def test_damaged_minari_is_one_line(tmp_path, crafted, message):
    path = crafted_minari(tmp_path / "dataset", **crafted)
    result = swm("info", path)
    assert result.exit_code == 1 and result.output.startswith("error:"), result.output
    assert message in result.output


# ------------------------------------------------------------------ LeRobot v3

LEROBOT = FIXTURES / "lerobot" / "dots"


def test_lerobot_fixture_opens_in_swms_convention():
    import pyarrow.parquet as pq

    data = pq.read_table(LEROBOT / "data/chunk-000/file-000.parquet").to_pydict()
    reader = open_reader(LEROBOT)
    assert reader.format == "lerobot" and reader.metadata["source_codec"] == "h264 video"
    assert reader.metadata["mapping"]["observation.state"] == "proprio"
    for index in range(3):
        episode, rows = reader.read_episode(index), slice(8 * index, 8 * index + 8)
        assert episode["pixels"].shape == (8, 32, 32, 3)
        np.testing.assert_array_equal(episode["action"][:-1], data["action"][rows][:-1])
        assert np.isnan(episode["action"][-1]).all()
        np.testing.assert_array_equal(episode["reward"], np.r_[0, data["next.reward"][rows][:-1]])
        assert episode["terminated"][-1] and not episode["terminated"][:-1].any()
    rows = np.array([20, 3, 9, 23, 0])  # a DataLoader's random rows: each frame by its timestamp
    together = reader.read_rows("pixels", rows)
    for row, frame in zip(rows, together, strict=True):
        np.testing.assert_array_equal(frame, reader.read_rows("pixels", np.array([row]))[0])
    reader.close()


def crafted_lerobot(tmp_path: Path, edit) -> Path:
    import shutil

    root = tmp_path / "dots"
    shutil.copytree(LEROBOT, root)
    info = json.loads((root / "meta/info.json").read_text())
    edit(info)
    (root / "meta/info.json").write_text(json.dumps(info))
    return root


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda i: i.update(data_path="../../{chunk_index}/x.parquet"), "outside the dataset"),
        (lambda i: i.update(data_path="{chunk_index.__class__}"), "names the field"),
        (lambda i: i.update(total_frames=10**12), "counts 1000000000000 frames"),
        (lambda i: i["features"]["observation.image"].update(shape=[64, 64, 3]), "not the (64"),
        (lambda i: i["features"]["observation.image"].update(shape=[9000, 9000, 3]), "shape"),
    ],
)
def test_hostile_lerobot_is_one_line(tmp_path, edit, message):
    root = crafted_lerobot(tmp_path, edit)
    result = swm("convert", root, tmp_path / "out.lance")
    assert result.exit_code == 1 and result.output.startswith("error:"), result.output
    assert message in result.output and not (tmp_path / "out.lance").exists()


UPSTREAM_NAMES = ("tworoom.lance", "tworoom.h5", "tworoom-folder", "tworoom-video")
ALL_FIXTURES = [
    *(UPSTREAM / version / name for version in ("0.1.1", "main") for name in UPSTREAM_NAMES),
    UPSTREAM / "main/tworoom-lance-video",
    MINARI / "pixels-jpeg", MINARI / "pixels-raw", LEROBOT,
    LEROBOT.with_name("dots-images"), LEROBOT.with_name("dots-av1"),
]  # fmt: skip


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_fixture_works_with_no_flag_but_its_path(path, tmp_path):
    assert swm("info", path).exit_code == 0
    result = swm("convert", path, tmp_path / "copy.h5")
    assert result.exit_code == 0, result.output
    if path == LEROBOT:  # the reader furthest from swm (stable-worldmodel: the convert test)
        result = swm("train", "--data", path, "--steps", "2", "--batch-size", "2", "--history-len",
                     "2", "--frameskip", "1", "--set", "eval.heldout_episodes=1",
                     "--out", tmp_path / "run")  # fmt: skip
        assert result.exit_code == 0, result.output


def test_lerobot_export_round_trip(swm_dataset, tmp_path):
    out, back = tmp_path / "lerobot", tmp_path / "back.h5"
    result = swm("convert", swm_dataset, out, "--layout", "lerobot")
    assert result.exit_code == 0, result.output
    assert detect(out) == "lerobot" and (out / "meta/info.json").is_file()
    assert swm("convert", out, back).exit_code == 0
    for original, returned in zip(read_all(swm_dataset), read_all(back), strict=True):
        assert original.keys() == returned.keys()
        for key in ("action", "state", "goal", "score"):
            np.testing.assert_array_equal(returned[key], original[key], err_msg=key)
        for key in ("reward", "terminated", "truncated"):  # LeRobot has no slot for row 0's
            np.testing.assert_array_equal(returned[key][1:], original[key][1:], err_msg=key)
            assert not returned[key][0]
        error = np.abs(returned["pixels"].astype(int) - original["pixels"].astype(int))
        assert error.mean() < 4  # h264, CRF 18


def test_lerobots_own_reader_reads_the_export(swm_dataset, tmp_path):
    """LeRobot's LeRobotDataset on what swm wrote, where lerobot is importable."""
    lerobot = pytest.importorskip(
        "lerobot.datasets.lerobot_dataset", reason="lerobot not installed"
    )
    out = tmp_path / "lerobot"
    assert swm("convert", swm_dataset, out, "--layout", "lerobot").exit_code == 0
    # PyAV decodes (swm's [video] extra); LeRobot's default, torchcodec, needs a system FFmpeg
    dataset = lerobot.LeRobotDataset("swm/export", root=out, video_backend="pyav")
    assert len(dataset) == 15 - 3  # each episode's last row is no frame (no action there)
    assert tuple(dataset[0]["observation.images.pixels"].shape) == (3, 32, 32)


def test_a_stable_worldmodel_lance_table_is_read_as_swm_reads_its_own(monkeypatch):
    """Through io_uring where the kernel allows it, else Lance's plain store: the same rows."""
    from swmcli.data.storage import lance

    path = UPSTREAM / "0.1.1/tworoom.lance"
    fast = open_reader(path)
    assert fast._source._dataset.uri.startswith("file+uring://") == lance.io_uring_allowed()
    monkeypatch.setattr(lance, "io_uring_allowed", lambda: False)
    plain = open_reader(path)
    assert not plain._source._dataset.uri.startswith("file+uring://")
    for episode in range(fast.num_episodes):
        for key, values in fast.read_episode(episode).items():
            np.testing.assert_array_equal(values, plain.read_episode(episode)[key])
    fast.close()
    plain.close()
