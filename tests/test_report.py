"""Results read whole at 80 columns, on a terminal or piped to a log file."""

from rich.console import Console

from swmcli import report
from swmcli.memory.measure import MemoryReport, PhasePeak


def rendered(renderable, width: int = 80) -> list[str]:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(renderable)
    return console.export_text().splitlines()


def test_a_table_too_wide_for_its_names_wraps_its_rows_under_them():
    names = ["gradient-free eval + bf16", "frameskip 1, same span (15 frames)"]
    columns = ["technique", *(f"category {i}" for i in range(8))]
    spec = report.Table("by category", columns, [[name, *["4816.7"] * 8] for name in names])
    lines = rendered(report._rich_table(spec, 80))
    assert all(len(line) <= 80 for line in lines)
    for name in names:
        row = lines.index(name)  # alone on its line, its values on the next
        assert lines[row + 1].split() == ["4816.7"] * 8
    narrow = rendered(report._rich_table(spec, 40), width=40)
    assert names[1] in narrow and "  category 7: 4816.7" in narrow


def test_the_cuda_memory_panel_fits_80_columns():
    gib = 2**30
    phase = PhasePeak(
        name="first step (incl. compile)",
        seconds=49.0,
        host_peak_rss_bytes=3 * gib,
        cuda_allocated_bytes=21 * gib,
        cuda_reserved_bytes=23 * gib,
        cuda_device_bytes=24 * gib,
        cuda_alloc_retries=0,
        cuda_ooms=0,
    )
    lines = rendered(report.memory_panel(MemoryReport(cuda="cuda", phases=[phase])))
    assert all(len(line) <= 80 for line in lines)
    assert any("first step (incl. compile)" in line for line in lines)
    assert not any("…" in line for line in lines)
