"""The layout rule is kept by import-linter (pyproject.toml), and the check fails on a knot."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(tree: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=tree, env=env, capture_output=True, text=True
    )


def copy_of_the_package(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "swmcli", tmp_path / "swmcli", ignore=shutil.ignore_patterns("*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


def test_the_package_keeps_its_contracts(tmp_path):
    result = lint_imports(copy_of_the_package(tmp_path))
    assert result.returncode == 0, result.stdout
    assert "4 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "knot", "broken"),
    [
        ("commands/evaluate.py", "from swmcli.commands import train", "evaluate -> swmcli.comm"),
        ("data/clips.py", "from swmcli import report", "swmcli.data.clips -> swmcli.report"),
        ("data/buffer.py", "from swmcli.models import runner", "buffer -> swmcli.models"),
        ("training/step.py", "from swmcli.memory import predict", "step -> swmcli.memory.predict"),
        ("memory/trace.py", "from swmcli import report", "swmcli.memory.trace -> swmcli.report"),
        ("config.py", "from swmcli.data import clips", "swmcli.config -> swmcli.data.clips"),
        ("commands/train.py", "from swmcli.zoo import pusht_state", "train -> swmcli.zoo"),
        ("zoo/pusht_state.py", "from swmcli.training import step", "pusht_state -> swmcli.train"),
    ],
)
def test_a_knot_breaks_the_check(tmp_path, module, knot, broken):
    tree = copy_of_the_package(tmp_path)
    path = tree / "swmcli" / module
    path.write_text(path.read_text() + f"\n{knot}  # noqa\n")
    result = lint_imports(tree)
    assert result.returncode != 0
    assert broken in result.stdout


def test_the_cli_imports_what_it_runs():
    """No job named by a string: every command function imports its job, so import-linter and
    a reader both see cli -> command."""
    source = (ROOT / "swmcli" / "cli" / "app.py").read_text()
    assert "importlib" not in source and "import_module" not in source
    for job in ("collect", "convert", "train", "evaluate", "memprofile"):
        assert f"from swmcli.commands.{job} import run_" in source


def test_a_training_step_is_three_swm_frames_under_the_command_line(tmp_path, monkeypatch):
    """`swm train` -> optimizer.step(): the CLI's command, the job, the step (main() above them
    when run as `swm`); the step memprofile traces is the one that runs."""
    import traceback

    import torch
    from typer.testing import CliRunner

    from swmcli.cli import app

    stacks = []
    step = torch.optim.AdamW.step

    def recorded(self, *args, **kwargs):
        frames = traceback.extract_stack()
        names = [f"{Path(f.filename).name}:{f.name}" for f in frames if "swmcli" in f.filename]
        stacks.append(names)
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", recorded)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    assert runner.invoke(app, ["collect", "--preset", "tiny", "--episodes", "6"]).exit_code == 0
    result = runner.invoke(app, ["train", "--preset", "tiny", "--steps", "2"])
    assert result.exit_code == 0, result.output
    preflight = [stack for stack in stacks if any(n.startswith("predict.py:") for n in stack)]
    real = [stack for stack in stacks if stack not in preflight]
    assert preflight and any("predict.py:train_step" in stack for stack in preflight)
    assert real and all(
        stack == ["app.py:train", "train.py:run_train", "step.py:optimizer_step"] for stack in real
    ), real


def test_the_layout_page_names_every_module_and_only_those():
    """docs/layout.md tells the truth: every module of swmcli/ is in its tables, and every module
    it names exists."""
    import re

    page = (ROOT / "docs" / "layout.md").read_text()
    named = set(re.findall(r"`(swmcli/[\w/]+\.py)`", page))
    modules = {
        str(path.relative_to(ROOT))
        for path in (ROOT / "swmcli").rglob("*.py")
        if path.name != "__init__.py"
    }
    assert modules - named == set(), "modules missing from docs/layout.md"
    assert named - modules == set(), "docs/layout.md names modules that do not exist"
