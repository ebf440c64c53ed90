"""Config: presets validate, precedence holds, bad values are reported all at once."""

import json

import pytest
from preset_headers import header_commands, header_lines
from pydantic import ValidationError

from swmcli.config import (
    SwmConfig,
    load_run_config,
    preset_names,
    resolve_config,
    save_config,
    with_settings,
)
from swmcli.errors import CheckpointError, UsageError
from swmcli.units import format_bytes, format_gb, parse_size


def test_required_presets_exist():
    required = {"tiny", "tworoom-64", "tworoom-224", "gpu24-224-bf16", "lewm-224"}
    assert required <= set(preset_names())


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_validates(name):
    cfg = resolve_config(preset=name)
    assert isinstance(cfg, SwmConfig)
    # A preset trains on the data it collects, or on data its header's commands make from it
    # (pusht-state-64: `swm merge` of pusht-64's episodes and noisier pushes).
    made = any(str(cfg.data.path) in command for command in header_commands(name))
    assert cfg.collect.out == cfg.data.path or made, "a preset trains on the data it collects"


@pytest.mark.parametrize("name", preset_names())
def test_every_presets_header_gives_only_swm_commands(name):
    """What a user who installed the wheel can run: no script, no path into a checkout (the
    commands themselves run from the wheel in tests/test_wheel.py)."""
    lines = header_lines(name)
    assert lines and all(line.startswith("swm ") for line in lines), lines
    for command in header_commands(name):
        assert not any(arg.startswith(("benchmarks/", "tests/", "swmcli/", "experiments/"))
                       for arg in command), command  # fmt: skip


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_builds_its_model(name):
    from swmcli.models.world_model import build_jepa

    cfg = resolve_config(preset=name)
    model = build_jepa(
        cfg.model,
        resolution=cfg.env.resolution,
        action_dim=2,
        frameskip=cfg.data.frameskip,
        history_len=cfg.data.history_len,
    )
    assert sum(p.numel() for p in model.parameters()) > 0
    assert cfg.eval.elites <= cfg.eval.samples and cfg.eval.keep_elites <= cfg.eval.elites


@pytest.mark.parametrize("name", ["pusht-224"])  # lewm-224 is LeWM itself: tests/test_lewm.py
def test_lewm_sized_presets_mirror_lewm_and_their_predicted_peak_fits_24_gib(name):
    import numpy as np

    from swmcli.memory.predict import PeakPredictor, Variant

    cfg = resolve_config(preset=name)
    model, data, train = cfg.model, cfg.data, cfg.train
    assert (model.encoder, cfg.env.resolution, model.vit_patch, model.vit_dim) == (
        "vit",
        224,
        14,
        192,
    )
    assert (model.predictor_depth, model.predictor_dim, model.regularizer) == (6, 192, "sigreg")
    assert (data.history_len, data.frameskip, train.batch_size, cfg.runtime.bf16) == (
        3,
        5,
        128,
        True,
    )
    step = {"pixels": np.zeros((224, 224, 3), np.uint8), "action": np.zeros(2, np.float32)}
    variant = Variant("train", True, train.batch_size, data.history_len, data.frameskip)
    assert PeakPredictor(cfg, step).needed_bytes(variant) <= 24 * 2**30


def test_gpu_preset_turns_on_bf16_and_compile():
    cfg = resolve_config(preset="gpu24-224-bf16")
    assert cfg.env.resolution == 224 and cfg.runtime.bf16 and cfg.runtime.compile


def test_precedence_defaults_preset_file_set_flags(tmp_path):
    file = tmp_path / "c.toml"
    file.write_text("[train]\nlr = 0.002\nsteps = 7\nbatch_size = 3\n")
    cfg = resolve_config(
        preset="tiny",
        config_file=file,
        sets=["train.steps=9", "train.batch_size=5"],
        flags={"train.batch_size": 11, "train.seed": None},
    )
    assert cfg.env.resolution == 32  # preset over default
    assert cfg.train.lr == 0.002  # file over preset
    assert cfg.train.steps == 9  # --set over file
    assert cfg.train.batch_size == 11  # flag over --set
    assert cfg.train.seed == 0  # an absent flag overrides nothing


def test_set_parses_toml_values():
    cfg = resolve_config(sets=["runtime.bf16=true", "model.latent_dim=16", "collect.out=x/y.h5"])
    assert cfg.runtime.bf16 is True and cfg.model.latent_dim == 16
    assert str(cfg.collect.out) == "x/y.h5"


def test_all_bad_fields_reported_at_once():
    with pytest.raises(UsageError) as err:
        resolve_config(sets=["train.lr=-1", "env.colour=3", "env.resolution=0"])
    message = err.value.message
    assert "train.lr" in message and "env.colour" in message and "env.resolution" in message
    assert err.value.exit_code == 2


@pytest.mark.parametrize(
    "kwargs",
    [{"preset": "nope"}, {"sets": ["novalue"]}, {"sets": ["train.lr.x=1"]}],
)
def test_bad_usage_is_a_usage_error(kwargs):
    with pytest.raises(UsageError):
        resolve_config(**kwargs)


def test_missing_and_broken_config_files(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        resolve_config(config_file=tmp_path / "missing.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("[train\n")
    with pytest.raises(UsageError, match="not valid TOML"):
        resolve_config(config_file=broken)


def test_saved_config_round_trips(tmp_path):
    cfg = resolve_config(preset="tiny", sets=["train.lr=0.01"])
    path = save_config(cfg, tmp_path / "run")
    assert json.loads(path.read_text())["train"]["lr"] == 0.01
    assert load_run_config(tmp_path / "run") == cfg
    with pytest.raises(CheckpointError):
        load_run_config(tmp_path / "elsewhere")


def test_sizes():
    assert parse_size("24GiB") == 24 * 2**30
    assert parse_size("30GB") == 30 * 10**9
    assert parse_size("1.5 kb") == 1500
    assert parse_size(4096) == 4096
    assert resolve_config(sets=['memprofile.budget="24GiB"']).memprofile.budget == 24 * 2**30
    for bad in ("lots", "12XB", "-3GB", "0"):
        with pytest.raises(UsageError):
            parse_size(bad)
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(512) == "512 B"
    assert format_gb(200_000 * 224 * 224 * 3) == "30.1 GB"


def test_config_files_that_are_not_tables_of_settings(tmp_path):
    listing = tmp_path / "list.json"
    listing.write_text("[1, 2]")
    with pytest.raises(UsageError, match="table of settings"):
        resolve_config(config_file=listing)
    with pytest.raises(UsageError, match="cannot read config"):
        resolve_config(config_file=tmp_path)
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UsageError):
        resolve_config(config_file=binary)


def test_run_config_overrides_are_validated(tmp_path):
    save_config(resolve_config(preset="tiny"), tmp_path)
    with pytest.raises(UsageError, match=r"eval\.planner"):
        load_run_config(tmp_path, {"eval.planner": "weird"})
    assert load_run_config(tmp_path, {"eval.episodes": 3}).eval.episodes == 3


def test_a_resolved_config_is_frozen_and_with_settings_derives_a_new_one():
    cfg = resolve_config("tiny")
    with pytest.raises(ValidationError):
        cfg.train.steps = 5
    longer = with_settings(cfg, {"train.steps": 500, "runtime.bf16": True})
    assert (longer.train.steps, longer.runtime.bf16) == (500, True)
    assert (cfg.train.steps, cfg.runtime.bf16) == (40, False)
    with pytest.raises(UsageError, match=r"train\.steps"):
        with_settings(cfg, {"train.steps": 0})


def test_every_setting_has_a_description():
    for name, section in SwmConfig.model_fields.items():
        for key, field in section.annotation.model_fields.items():
            assert field.description, f"{name}.{key}"


def test_an_env_named_over_a_preset_does_not_inherit_the_presets_env_kwargs():
    # gym-pusht's observation_width would break stable-worldmodel's PushT constructor.
    other = resolve_config("pusht-64", flags={"env.id": "stable_worldmodel:swm/PushT-v1"})
    assert other.env.id == "stable_worldmodel:swm/PushT-v1" and other.env.kwargs == {}
    own = resolve_config(
        "pusht-64",
        flags={"env.id": "stable_worldmodel:swm/PushT-v1"},
        sets=["env.kwargs={resolution=64, with_target=false}"],
    )
    assert own.env.kwargs == {"resolution": 64, "with_target": False}
    same = resolve_config("pusht-64", flags={"env.id": "gym_pusht:gym_pusht/PushT-v0"})
    pusht_kwargs = {"observation_width": 64, "observation_height": 64, "disable_env_checker": True}
    assert same.env.kwargs == pusht_kwargs
    one_more = resolve_config("pusht-64", sets=["env.kwargs.observation_width=32"])
    assert one_more.env.kwargs == {**pusht_kwargs, "observation_width": 32}
