"""A script of the repository (an experiment, a benchmark) run as a user runs it from a checkout."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_script(path: str, *args: str) -> subprocess.CompletedProcess:
    """``python PATH ARGS``, PATH relative to the checkout and ``PYTHONPATH`` the checkout."""
    return subprocess.run(
        [sys.executable, str(ROOT / path), *args],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300,
    )  # fmt: skip
