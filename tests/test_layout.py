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
    assert "2 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "knot", "broken"),
    [
        ("evaluate.py", "from swmcli import train", "swmcli.evaluate -> swmcli.train"),
        ("core/clips.py", "from swmcli import report", "swmcli.core.clips -> swmcli.report"),
        (
            "training.py",
            "from swmcli.memory import predict",
            "swmcli.training -> swmcli.memory.predict",
        ),
        ("memory/trace.py", "from swmcli import report", "swmcli.memory.trace -> swmcli.report"),
    ],
)
def test_a_knot_breaks_the_check(tmp_path, module, knot, broken):
    tree = copy_of_the_package(tmp_path)
    path = tree / "swmcli" / module
    path.write_text(path.read_text() + f"\n{knot}  # noqa\n")
    result = lint_imports(tree)
    assert result.returncode != 0
    assert broken in result.stdout
