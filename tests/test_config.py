"""Config: presets validate, precedence holds, bad values are reported all at once."""

import json
import warnings

import pytest
from preset_headers import header_commands, header_lines
from pydantic import ValidationError

from swmcli.config import (
    RenamedSetting,
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
    from swmcli.models.world_model import build_world_model

    cfg = resolve_config(preset=name)
    model = build_world_model(
        cfg.model,
        resolution=cfg.env.resolution,
        action_dim=2,
        frameskip=cfg.data.frameskip,
        history_len=cfg.data.history_len,
    )
    assert sum(p.numel() for p in model.parameters()) > 0
    assert cfg.eval.elites <= cfg.eval.samples and cfg.eval.keep_elites <= cfg.eval.elites


@pytest.mark.parametrize("name", ["lewm-224", "pusht-224"])
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


def test_settings_that_moved_to_runtime_name_their_new_key():
    for old in ("train.bf16", "eval.compile", "train.cpu_threads"):
        with pytest.raises(UsageError, match=rf"{old}: did you mean runtime\.") as caught:
            resolve_config(sets=[f"{old}=1"])
        assert caught.value.exit_code == 2


def test_a_run_saved_before_the_runtime_section_still_loads(tmp_path):
    saved = resolve_config("tiny").model_dump(mode="json")
    runtime = saved.pop("runtime")
    saved["train"].update(bf16=True, compile=False, cpu_threads=runtime["cpu_threads"])
    saved["eval"].update(bf16=False, compile=False, cpu_threads=None)
    (tmp_path / "config.json").write_text(json.dumps(saved))
    cfg = load_run_config(tmp_path)
    assert cfg.runtime.bf16 is True and cfg.runtime.cpu_threads == 1


def _old_style(cfg: SwmConfig) -> dict:
    """``cfg`` as a run saved it before each buffer capacity had its own name (and before
    runtime): ``data.max_steps`` capped the buffer training read from, online's ring was it or
    ``collect.max_steps``, ``eval.max_steps`` was the planning budget."""
    saved = cfg.model_dump(mode="json")
    saved["data"]["max_steps"] = saved["data"].pop("newest_steps")
    saved["eval"]["max_steps"] = saved["eval"].pop("step_budget")
    del saved["online"]["max_steps"]
    runtime = saved["runtime"]
    saved["train"].update({key: runtime.pop(key) for key in ("bf16", "compile", "cpu_threads")})
    return saved


def test_an_old_run_directory_loads_with_each_setting_under_its_new_name(tmp_path):
    tiny = resolve_config("tiny")
    old = _old_style(tiny)
    assert old["collect"]["max_steps"] == 5000 and old["eval"]["max_steps"] == 30
    (tmp_path / "config.json").write_text(json.dumps(old))
    cfg = load_run_config(tmp_path)
    assert cfg.collect.max_steps == 5000 and cfg.eval.step_budget == 30
    assert cfg.data.newest_steps is None and cfg.online.max_steps == 5000  # as it trained
    assert cfg == tiny.model_copy(update={"online": cfg.online})
    # A run that capped its buffer: the cap was the newest episodes or online's ring alike.
    old["data"]["max_steps"] = 300
    (tmp_path / "config.json").write_text(json.dumps(old))
    cfg = load_run_config(tmp_path, flags={"eval.max_steps": 7})  # eval's old --max-steps
    assert (cfg.data.newest_steps, cfg.online.max_steps, cfg.eval.step_budget) == (300, 300, 7)


def test_a_run_directory_of_the_interim_names_loads(tmp_path):
    """Runs saved while the capacities were buffer_steps, ring_steps and memory_steps."""
    tiny = resolve_config("tiny", flags={"data.newest_steps": 400, "online.max_steps": 900})
    saved = tiny.model_dump(mode="json")
    saved["collect"]["buffer_steps"] = saved["collect"].pop("max_steps")
    saved["online"]["ring_steps"] = saved["online"].pop("max_steps")
    saved["data"]["memory_steps"] = saved["data"].pop("newest_steps")
    saved["data"]["workers"] = saved["data"].pop("worker_kind")
    (tmp_path / "config.json").write_text(json.dumps(saved))
    with pytest.warns(RenamedSetting):
        assert load_run_config(tmp_path) == tiny


def test_old_keys_in_presets_files_and_sets_load_under_their_new_names(tmp_path):
    old_preset = tmp_path / "old.toml"
    old_preset.write_text("[collect]\nbuffer_steps = 4000\n[eval]\nmax_steps = 20\n")
    with pytest.warns(RenamedSetting) as said:
        cfg = resolve_config(config_file=old_preset, sets=["data.max_steps=900"])
    assert {str(w.message) for w in said} == {
        "collect.buffer_steps is now collect.max_steps",
        "eval.max_steps is now eval.step_budget",
        "data.max_steps is now data.newest_steps and online.max_steps",
    }
    assert (cfg.collect.max_steps, cfg.eval.step_budget) == (4000, 20)
    assert (cfg.data.newest_steps, cfg.online.max_steps) == (900, 900)
    cfg = resolve_config(config_file=old_preset, sets=["collect.max_steps=50"])  # a later source
    assert cfg.collect.max_steps == 50 and cfg.online.max_steps == 200_000
    with pytest.warns(RenamedSetting, match="online.ring_steps is now online.max_steps"):
        assert resolve_config(sets=["online.ring_steps=70"]).online.max_steps == 70


def test_an_old_name_beside_its_new_one_is_refused():
    """`--max-steps 300 --buffer-steps 900`: which one was meant cannot be told."""
    with pytest.raises(UsageError, match="given twice"):
        resolve_config(flags={"collect.max_steps": 300, "collect.buffer_steps": 900})
    with pytest.raises(UsageError, match="given twice"):
        resolve_config(sets=["data.memory_steps=5", "data.newest_steps=6"])


def test_shipped_presets_use_current_names_only():
    """A preset is the user's first config: loading one never warns of a renamed setting."""
    for name in preset_names():
        with warnings.catch_warnings():
            warnings.simplefilter("error", RenamedSetting)
            resolve_config(name)


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
