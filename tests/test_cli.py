"""The CLI's contract: help with examples, version, exit codes, one-line errors, --json."""

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from swmcli import __version__
from swmcli.cli import app
from swmcli.cli.options import SETTINGS

runner = CliRunner()


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output


@pytest.mark.parametrize("command", ["collect", "convert", "info", "train", "eval", "memprofile"])
def test_every_command_has_help_with_examples(command):
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == 0
    assert "Example" in result.output and f"swm {command}" in result.output


def test_help_does_not_import_heavy_modules():
    code = (
        "import sys; from swmcli.cli.app import app; "
        "heavy = [m for m in ('torch', 'lance', 'lancedb', 'h5py', 'gymnasium', 'pyarrow') "
        "if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "args",
    [["collect", "--no-such-flag"], ["nope"], ["convert", "only-src.lance"], ["eval"]],
)
def test_bad_usage_is_one_error_line_with_a_hint(args):
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error:") and "hint: see `" in result.stderr
    assert "╭" not in result.output  # not Typer's box


@pytest.mark.parametrize(
    "args",
    [
        ["collect", "--preset", "nope"],
        ["collect", "--set", "collect.episodes=-3"],
        ["collect", "--policy", "clever"],
        ["memprofile", "--budget", "lots"],
        ["memprofile", "--resolution", "-64"],
        ["train", "--config", "missing.toml"],
    ],
)
def test_bad_config_exits_2_with_one_line_and_hint(args):
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error:") and "hint:" in result.output
    assert "Traceback" not in result.output


def test_known_errors_stay_one_line_under_debug():
    env = {**os.environ, "SWM_DEBUG": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "swmcli", "collect", "--preset", "nope"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: no preset named 'nope'")


def test_json_error_path_keeps_stdout_clean():
    result = runner.invoke(app, ["memprofile", "--budget", "lots", "--json"])
    assert result.exit_code == 2
    assert result.stdout == ""  # nothing a script would parse as a result
    assert "error:" in result.stderr and "lots" in result.stderr


def test_every_settings_option_is_a_config_field_with_its_description_as_help():
    import typer.main

    from swmcli.config import SwmConfig

    commands = typer.main.get_command(app).commands
    for command, params in ((name, commands[name].params) for name in SETTINGS):
        generated = [p for p in params if "__" in p.name]
        assert [p.name.replace("__", ".") for p in generated] == list(SETTINGS[command])
        for param in generated:
            section, key = param.name.split("__")
            field = SwmConfig.model_fields[section].annotation.model_fields[key]
            own = (field.json_schema_extra or {}).get("help_in", {}).get(command)
            assert param.help.startswith(own or field.description), (command, param.name)
    # Only the settings' options are made from the config: no help text is written twice.
    other = [p.help for c in commands.values() for p in c.params if "__" not in p.name]
    descriptions = {
        field.description
        for section in SwmConfig.model_fields.values()
        for field in section.annotation.model_fields.values()
    }
    assert not descriptions & set(other)


def test_every_commands_help_is_its_own():
    """No flag's help tells what another command does ("collect stops ...", "swm train launches
    ..."): a setting shared by commands says what it does in each."""
    import re

    import typer.main

    commands = typer.main.get_command(app).commands
    names = "|".join(commands)
    verbs = "stops|launches|writes|reads|runs|collects|trains|plans|predicts|measures|keeps|saves"
    behaviour = re.compile(rf"\b(?:swm )?({names})\s+(?:{verbs})\b")
    borrowed = [
        (command, param.opts[0], found)
        for command, cli_command in commands.items()
        for param in cli_command.params
        for found in behaviour.findall(param.help or "")
        if found != command
    ]
    assert borrowed == []
    shown = runner.invoke(app, ["memprofile", "--help"], env={"COLUMNS": "400"}).output
    checkpointing = " ".join(shown.split("--activation-checkpointing", 1)[1].split()[:40])
    assert "every child of the model's nn.ModuleLists" in checkpointing


def test_the_users_words_are_first_class():
    """--max-steps is the ReplayBuffer's capacity on collect, memprofile and online train, listed
    in --help; eval has no --budget or --max-steps (its planning budget is --step-budget)."""
    for command in ("collect", "memprofile", "train"):
        shown = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"}).output
        assert "--max-steps" in shown, command
    eval_help = runner.invoke(app, ["eval", "--help"], env={"COLUMNS": "200"}).output
    assert "--step-budget" in eval_help and "--budget " not in eval_help
    assert "--max-steps" not in eval_help


def test_collect_max_steps_runs_without_a_warning(tmp_path):
    """The headline command's flag, as the user writes it: no warning, the buffer it names."""
    out = tmp_path / "d.lance"
    args = ["collect", "--preset", "tiny", "--max-steps", "300", "--out", str(out), "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "warning" not in result.stderr
    assert json.loads(result.stdout)["buffer_max_steps"] == 300


def test_format_h5_means_hdf5(tmp_path):
    out = tmp_path / "cp"
    args = ["collect", "--preset", "tiny", "--episodes", "1", "--format", "h5", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert out.is_file() and out.read_bytes()[:4] == b"\x89HDF"


@pytest.mark.parametrize("command", ["collect", "train", "memprofile", "eval", "convert"])
def test_help_names_types_in_words_and_shows_defaults(command):
    output = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"}).output
    assert "<" not in output and "{" not in output  # no <bool>, <int>, {path}
    if command in ("collect", "memprofile"):
        assert "INTEGER" in output and "--resolution" in output and "(default: 64)" in output
    if command == "train":
        assert "(default: --fp32)" in output and "(default: data/tworoom.lance)" in output


@pytest.mark.parametrize(
    "args",
    [
        ["info", "nope.lance"],
        ["convert", "nope.lance", "x.h5"],
        ["train", "--data", "nope.lance"],
        ["eval", "nope_run"],
        ["memprofile", "--run", "nope_run"],
        ["collect", "--config", "nope.toml"],
        ["preview", "nope.lance"],
    ],
)
def test_a_missing_path_is_a_usage_error_in_every_command(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "error:" in result.stderr and "Traceback" not in result.output


def test_bad_input_is_a_usage_error_not_a_bug(tmp_path):
    deep = tmp_path / "deep.toml"
    deep.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    cases = [
        (["train", "--config", str(deep)], "nested too deeply"),
        (["train", "--preset", "tiny", "--seed", "-5"], "greater than or equal to 0"),
        (["collect", "--preset", "tiny", "--seed", str(2**70)], "less than or equal to"),
        (["train", "--preset", "tiny", "--set", "train.lr=nan"], "train.lr"),
    ]
    for args, message in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output and "bug in swm" not in result.output


def test_a_huge_value_in_an_error_is_cut(tmp_path):
    result = runner.invoke(app, ["info", str(tmp_path / ("x" * 200) / ("y" * 200) / ("z" * 200))])
    assert result.exit_code == 2
    first = result.output.splitlines()[0]
    assert "more characters)" in result.output and len(result.output) < 1200, first
