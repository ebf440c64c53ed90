"""The README's commands are the ones CI and users run, and its figures name their commands."""

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text()


def _fenced_commands() -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", README, flags=re.S)


def test_ci_runs_the_readme_test_command():
    test_command = next(c for c in _fenced_commands() if "pytest" in c and "\n" not in c)
    assert test_command in (ROOT / ".ci" / "run").read_text()


def test_readme_has_one_command_for_the_main_job():
    main_job = next(c for c in _fenced_commands() if "swm collect --preset tiny" in c)
    assert "\n" not in main_job and main_job.startswith("pip install torch==2.13.0")
    for step in ("swm train --preset tiny", "swm eval runs/tiny", "swm memprofile"):
        assert step in main_job
