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


def test_the_readme_reads_in_three_minutes():
    assert len(README.splitlines()) <= 250, "detail goes into docs/"


def _links() -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", README)


def _anchor(heading: str) -> str:
    """A heading's anchor as GitHub and the docs site write it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_in_the_readme_resolves():
    for link in _links():
        if "://" in link:
            continue
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.exists(), link
        if anchor:
            headings = re.findall(r"^#+ (.+)$", target.read_text(), flags=re.M)
            assert anchor in {_anchor(h) for h in headings}, link


def test_a_newcomer_finds_data_model_and_several_gpus_in_one_click():
    links = _links()
    assert "docs/bring-your-data.md" in links
    assert "docs/bring-your-model.md" in links
    assert "docs/beyond-one-machine.md#several-gpus-or-machines-data-parallel-training" in links
