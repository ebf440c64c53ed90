"""Fixtures several test modules share."""

import importlib.util
import os
import sys
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


@pytest.fixture(scope="session")
def upstream_python() -> str:
    """The interpreter of a venv holding stable-worldmodel 0.1.1 (it pulls its own torch, so never
    swm's): ``SWM_UPSTREAM_PYTHON``, or this one where the package imports; a visible skip else."""
    python = os.environ.get("SWM_UPSTREAM_PYTHON")
    if python is None and importlib.util.find_spec("stable_worldmodel") is not None:
        python = sys.executable
    if python is None:
        pytest.skip("stable-worldmodel is not importable: set SWM_UPSTREAM_PYTHON to a venv's "
                    "python that has stable-worldmodel==0.1.1")  # fmt: skip
    return python
