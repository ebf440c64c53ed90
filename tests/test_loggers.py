"""Loggers besides metrics.jsonl: the flag's forms, W&B offline, and a missing package.

TensorBoard is read back with its own reader in tests/test_wheel.py, on the run the installed
wheel trains (one tiny run serves both).
"""

import sys

import numpy as np
import pytest
import wandb
from PIL import Image
from typer.testing import CliRunner

from swmcli.cli import app
from swmcli.config import resolve_config
from swmcli.errors import UsageError
from swmcli.training.loggers import open_loggers


@pytest.mark.parametrize(
    "flag",
    [["tensorboard", "wandb"], ["tensorboard,wandb"], ["wandb, tensorboard", "wandb"]],
)
def test_several_loggers_by_repeating_the_flag_or_a_comma_list(flag):
    cfg = resolve_config("tiny", flags={"train.loggers": flag})
    assert sorted(cfg.train.loggers) == ["tensorboard", "wandb"]
    assert resolve_config("tiny").train.loggers == [], "metrics.jsonl alone by default"


def test_an_unknown_logger_is_a_usage_error():
    with pytest.raises(UsageError, match="tensorboard"):
        resolve_config("tiny", sets=["train.loggers=mlflow"])


def test_a_missing_logger_package_is_one_line_with_the_pip_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if wandb were not installed
    result = CliRunner().invoke(
        app, ["train", "--preset", "tiny", "--logger", "wandb", "--out", str(tmp_path / "r")]
    )
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert lines[0].startswith("error: --logger wandb needs the wandb package")
    assert lines[1] == "hint: pip install 'swmcli[wandb]'  (or: pip install wandb)"
    assert not (tmp_path / "r").exists(), "refused before any work"


def test_wandb_offline_keeps_every_step_and_the_picture_without_a_network(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    picture = tmp_path / "curve.png"
    Image.fromarray(np.full((8, 8, 3), 200, np.uint8)).save(picture)
    with open_loggers(["wandb"], tmp_path) as loggers:
        for step in (1, 5, 10):
            loggers.scalars(step, {"step": step, "loss": 1.0 / step, "latent_rank": 3})
        loggers.picture("train/loss_curve", picture, 10)
    wandb.teardown()  # waits for W&B's service to write everything down, as at a process's exit
    (record,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    data = record.read_bytes()
    assert data.count(b"train/loss") >= 3 and b"train/latent_rank" in data
    assert list(tmp_path.glob("wandb/offline-run-*/files/media/images/train/loss_curve_10_*.png"))
    run_id = (tmp_path / "wandb-run-id").read_text().strip()
    assert record.name == f"run-{run_id}.wandb", "resume and eval log into the same W&B run"


def test_tensorboard_after_a_resume_shows_the_resumed_steps(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with open_loggers(["tensorboard"], tmp_path) as loggers:  # interrupted after step 8,
        for step in (1, 4, 8):  # its checkpoint at step 4
            loggers.scalars(step, {"loss": float(step)})
    with open_loggers(["tensorboard"], tmp_path, first_step=4) as loggers:  # --resume
        for step in (5, 8):
            loggers.scalars(step, {"loss": -float(step)})
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    logged = {event.step: event.value for event in events.Scalars("train/loss")}
    assert logged == {1: 1.0, 4: 4.0, 5: -5.0, 8: -8.0}
