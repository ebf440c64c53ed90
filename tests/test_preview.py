"""`swm preview`, `swm eval --video` and `swm envs`: every video written is opened with PyAV and
checked for its frame count, its size and frames that differ."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from swmcli.cli import app
from swmcli.config import resolve_config
from swmcli.data.formats import open_reader, open_writer
from swmcli.data.videos import VideoWriter
from swmcli.models.runner import make_runner
from swmcli.models.world_model import build_jepa
from swmcli.planning.episodes import run_episodes
from swmcli.planning.goals import goal_episodes
from swmcli.planning.plan_videos import FPS, HOLD_SECONDS, EpisodeVideos

av = pytest.importorskip("av", reason="PyAV (the video extra) writes and reads the videos")
FIXTURES = Path(__file__).parent / "fixtures"
runner = CliRunner()


def _frames(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


def _check_video(path: Path, count: int) -> np.ndarray:
    """The video at ``path`` holds ``count`` frames of one size, not all alike; its first."""
    frames = _frames(path)
    assert len(frames) == count, path
    assert len({frame.shape for frame in frames}) == 1
    assert frames[0].shape[0] >= 128 and frames[0].shape[1] >= 128  # enlarged to be watched
    assert any(not np.array_equal(frames[0], frame) for frame in frames[1:])
    return frames[0]


def _swm(*args: str) -> dict:
    result = runner.invoke(app, [*map(str, args), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def two_cameras(tmp_path_factory) -> Path:
    """Three HDF5 episodes with two pixel keys (a moving square, seen twice)."""
    path = tmp_path_factory.mktemp("preview") / "cams.h5"
    metadata = {"env_id": "test", "resolution": 16, "action_dim": 2}
    with open_writer(path, "hdf5", metadata=metadata) as writer:
        for episode in range(3):
            length = 5 + episode
            pixels = np.zeros((length, 16, 16, 3), np.uint8)
            for step in range(length):
                pixels[step, 2:6, step : step + 4] = 255
            writer.write_episode({
                "pixels": pixels,
                "wrist": pixels[:, ::-1].copy(),
                "action": np.full((length, 2), 0.5, np.float32),
            })  # fmt: skip
    return path


def test_preview_writes_one_video_per_episode_with_every_pixel_key(two_cameras, tmp_path):
    out = _swm("preview", two_cameras, "--index", "0,2", "--out", tmp_path)
    assert out["episodes"] == [0, 2] and out["pixel_keys"] == ["pixels", "wrist"]
    first = _check_video(tmp_path / "episode_0.mp4", 5)
    _check_video(tmp_path / "episode_2.mp4", 7)
    assert first.shape[1] >= 2 * 128  # both keys side by side
    held = out["memory"]["phases"][0]["name"]
    assert "holds 64 rows of one episode" in held


@pytest.mark.parametrize(
    "dataset",
    [
        "stable_worldmodel/main/tworoom.lance",
        "stable_worldmodel/0.1.1/tworoom-folder",
        "minari/pixels-raw",
        "lerobot/dots",
    ],
)
def test_preview_reads_other_tools_datasets(dataset, tmp_path):
    path = FIXTURES / dataset
    out = _swm("preview", path, "--episodes", "1", "--seed", "1", "--out", tmp_path)
    (episode,) = out["episodes"]
    reader = open_reader(path)
    length = int(reader.episode_lengths[episode])
    reader.close()
    _check_video(tmp_path / f"episode_{episode}.mp4", length)


def test_preview_grid_gif_of_swm_lance(tiny_data, tmp_path):
    out = _swm("preview", tiny_data, "--episodes", "3", "--grid", "--gif", "--out", tmp_path)
    reader = open_reader(tiny_data)
    longest = max(int(reader.episode_lengths[e]) for e in out["episodes"])
    reader.close()
    _check_video(tmp_path / "grid.gif", longest)


def test_gif_keeps_every_colour_of_flat_frames(tmp_path):
    """GIF frames are paletted per frame: flat colours and text come back exactly."""
    rng = np.random.default_rng(0)
    colours = rng.integers(0, 256, (200, 3), dtype=np.uint8)
    frames = [colours[rng.integers(0, 200, (12, 16))].repeat(8, 0).repeat(8, 1) for _ in range(3)]
    with VideoWriter(tmp_path / "flat.gif", fps=5, gif=True) as video:
        for frame in frames:
            video.write(frame)
    decoded = _frames(tmp_path / "flat.gif")
    assert all(np.array_equal(a, b) for a, b in zip(decoded, frames, strict=True))


def test_preview_refuses_bad_input_in_one_line(tiny_data, tmp_path, monkeypatch):
    result = runner.invoke(app, ["preview", str(tiny_data), "--index", "0,99"])
    assert result.exit_code == 2 and "holds episodes 0 to 9" in result.output
    monkeypatch.setitem(sys.modules, "av", None)  # PyAV not installed
    result = runner.invoke(app, ["preview", str(tiny_data), "--out", str(tmp_path)])
    assert result.exit_code == 2 and 'pip install "swmcli[video]"' in result.output
    assert not list(tmp_path.iterdir())


def test_planned_episode_video_shows_the_decoded_prediction(tiny_data, tmp_path):
    """A model with a decoder (untrained: the video's making is tested, not its skill)."""
    cfg = resolve_config(
        "tiny",
        flags={"data.path": tiny_data, "eval.episodes": 1, "eval.step_budget": 4},
        sets=[
            "model.reconstruction_weight=1",
            "eval.samples=4",
            "eval.iterations=1",
            "eval.elites=2",
            "eval.keep_elites=1",
            "eval.horizon=2",
        ],
    )
    shape = {"resolution": 32, "action_dim": 2, "frameskip": 1, "history_len": 3}
    model = build_jepa(cfg.model, resolution=32, action_dim=2, frameskip=1, history_len=3)
    run = make_runner(cpu_threads=cfg.runtime.cpu_threads)
    model = run.prepare(model)
    videos = EpisodeVideos(tmp_path, model, frameskip=1)
    with run.inference(model):
        played = run_episodes(model, cfg, run, shape, goal_episodes(cfg), videos=videos)
    steps = played["steps"][0]
    first = _check_video(Path(videos.written[0]), steps + FPS * HOLD_SECONDS)
    assert first.shape[1] >= 3 * 128  # the frame, the goal, the decoded prediction


def test_envs_lists_tworoom_and_says_why_others_do_not_render():
    out = _swm("envs", "swm/TwoRoom*")
    (row,) = out["tables"][0]["rows"]
    assert row[0] == "swm/TwoRoom-v0" and row[4] == "64x64" and row[5] == "yes"
    assert "Box(2,) float32 [-1, 1]" in row[3]
    out = _swm("envs")
    rows = {row[0]: row for row in out["tables"][0]["rows"]}
    assert "CartPole-v1" in rows and len(rows) == out["envs"]
    refused = [row for row in rows.values() if row[5] != "yes"]
    assert all(row[5] and "\n" not in row[5] for row in refused)
    result = runner.invoke(app, ["envs", "NoSuchEnv*"])
    assert result.exit_code == 2 and "no env id matches" in result.output
