"""The model protocol: a model brought with --model trains, plans in eval and is named when
it lacks a method; swm's own model goes through the same code path."""

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from swmcli.cli import app
from swmcli.commands.evaluate import run_eval
from swmcli.commands.train import run_train
from swmcli.config import load_run_config, resolve_config
from swmcli.errors import UsageError
from swmcli.memory.measure import MemoryMonitor
from swmcli.models.interface import build_model, load_factory

MODELS = Path(__file__).parent / "models" / "mlp_world_model.py"
SHAPE = {"resolution": 32, "action_dim": 2, "frameskip": 1, "history_len": 3}


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _train(tiny_data, run_dir: Path, factory: str) -> tuple[list[dict], dict]:
    """The logged rows and the summary's fields of a run of the tiny preset with ``factory``."""
    flags = {"data.path": tiny_data, "train.out": run_dir, "train.log_every": 1}
    cfg = resolve_config("tiny", flags={**flags, "model.factory": factory})
    result = run_train(cfg, MemoryMonitor())
    rows = _metrics(run_dir)
    first = np.mean([row["loss"] for row in rows[:5]])
    last = np.mean([row["loss"] for row in rows[-5:]])
    assert last < 0.8 * first, (first, last)
    return rows, result.fields


def _saved_model_settings(run_dir: Path) -> dict:
    return json.loads((run_dir / "config.json").read_text())["model"]


def test_a_user_model_trains_with_its_own_loss_and_plans_on_tworoom(
    tiny_data, tmp_path, monkeypatch
):
    run_dir = tmp_path / "run"
    monkeypatch.chdir(Path(__file__).parent)  # a relative path, as a user types it
    rows, summary = _train(tiny_data, run_dir, "models/mlp_world_model.py:build")
    assert "consistency" in rows[-1]  # its own loss's terms, in the summary too
    assert summary["final_consistency"] == rows[-1]["consistency"]
    assert summary["final_loss"] == rows[-1]["loss"] and "final_latent_rank" not in summary
    # The run records the settings that apply to it: none of swm's model's or loss's.
    # model.proprio applies to a user model too (encode(pixels, proprio)): it is recorded; so
    # is model.state_weight, which has the batch carry the data's state for its loss
    saved = {"factory": f"{MODELS}:build", "kwargs": {}, "proprio": False, "state_weight": 0.0}
    assert _saved_model_settings(run_dir) == saved
    # Saved with an absolute path: eval finds the model from anywhere.
    assert load_run_config(run_dir).model.factory == f"{MODELS}:build"
    monkeypatch.chdir(tmp_path)
    result = run_eval(run_dir, MemoryMonitor(), load_run_config(run_dir, sets=["eval.episodes=2"]))
    assert result.fields["episodes"] == 2
    assert 0 <= result.fields["success_rate"] <= 1


def test_a_frozen_encoder_model_trains_its_predictor_with_swms_loss(tiny_data, tmp_path):
    rows, summary = _train(tiny_data, tmp_path / "run", f"{MODELS}:build_frozen")
    assert "prediction" in rows[-1] and "regularizer" in rows[-1]  # swm's JEPA terms
    assert summary["final_regularizer"] == rows[-1]["regularizer"]
    saved = _saved_model_settings(tmp_path / "run")  # swm's loss settings apply, its model's not
    assert "regularizer_weight" in saved and "latent_dim" not in saved


def test_factories_get_their_keyword_arguments_and_the_shape_they_name():
    cfg = resolve_config(
        "tiny", sets=[f'model.factory="{MODELS}:build"', "model.kwargs.latent_dim=12"]
    )
    model = build_model(cfg.model, SHAPE)
    assert model.encoder[-1].out_features == 12
    assert model.dynamics[0].in_features == 12 + 2  # latent + one action block (frameskip 1)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nowhere", "is not module:function"),
        ("no_such_package.models:build", "cannot import 'no_such_package.models'"),
        (f"{MODELS}:nothing", "has no function 'nothing'"),
        ("missing/file.py:build", "missing/file.py does not exist"),
    ],
)
def test_a_bad_factory_is_one_line(spec, message):
    with pytest.raises(UsageError, match=message):
        load_factory(spec)


def test_a_model_lacking_a_method_is_named_on_the_command_line(tiny_data, tmp_path):
    flags = ["--preset", "tiny", "--data", str(tiny_data), "--out", str(tmp_path / "r")]
    flags += ["--model", f"{MODELS}:build_without_predict"]
    result = CliRunner().invoke(app, ["train", *flags])
    assert result.exit_code == 2
    assert "has no method predict(latents, actions) -> next latents" in result.output
    assert "Traceback" not in result.output
