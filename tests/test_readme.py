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


def _prose() -> str:
    """The README without its fenced code blocks: what a reader reads."""
    return re.sub(r"```.*?```", " ", README, flags=re.S)


def test_the_readme_reads_in_three_minutes():
    words = len(_prose().split())
    assert words <= 800, f"{words} words: results go into docs/reports/, detail into docs/"


def test_no_table_cell_hides_a_paragraph():
    rows = [line for line in README.splitlines() if line.startswith("|")]
    cells = [cell.strip() for row in rows for cell in row.strip("|").split("|")]
    long = [cell for cell in cells if len(cell) > 160]
    assert rows and not long, long


def test_the_readme_tells_no_history():
    """What swm is and does, not how it got there: git keeps the history."""
    told = re.findall(r"\b(?:was|were|before|until|used to|no longer|anymore)\b", _prose(), re.I)
    assert not told, told


def test_every_results_table_says_when_and_where_it_was_measured():
    tables = re.findall(r"((?:^\|.*\n)+)\n(.*)", README, flags=re.M)
    results = [(table, after) for table, after in tables if re.search(r"\d+/\d+|\d s\b", table)]
    assert results
    for table, after in results:
        assert re.match(r"Measured on \d{4}-\d{2}-\d{2}", after), table.splitlines()[0]


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
