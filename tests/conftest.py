"""Fixtures several test modules share."""

from pathlib import Path

import pytest

from swmcli.commands.collect import run_collect
from swmcli.config import resolve_config
from swmcli.memory.measure import MemoryMonitor


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """Ten TwoRoom episodes at 32x32 (the tiny preset), in Lance; tests only read it."""
    out = tmp_path_factory.mktemp("data") / "tiny.lance"
    cfg = resolve_config("tiny", flags={"collect.out": out, "collect.episodes": 10})
    run_collect(cfg, MemoryMonitor())
    return out
