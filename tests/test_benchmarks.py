"""The benchmarks the docs quote still run, at a toy size (their figures are in docs/)."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = ROOT.parent / "shared" / "bench"
needs_synth = pytest.mark.skipif(
    not (BENCH_DIR / "synth.py").is_file(), reason=f"no shared episodes at {BENCH_DIR}"
)


def _run(script: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@needs_synth
def test_loader_benchmark_runs_every_row(tmp_path):
    out = _run(
        "loader.py", "--episodes", "12", "--length", "40", "--resolution", "32", "--batches", "3",
        "--repeats", "1", "--dir", str(tmp_path), "--bench-dir", str(BENCH_DIR),
    )  # fmt: skip
    for row in ("lance ", "hdf5 ", "lance, processes", "hdf5, processes", "buffer"):
        assert row in out
    assert "first batches identical across every row: True" in out


@needs_synth
def test_object_store_benchmark_runs_against_moto():
    pytest.importorskip("moto")
    out = _run(
        "object_store.py", "--steps", "480", "--episode-len", "40", "--resolution", "32",
        "--batches", "3", "--bench-dir", str(BENCH_DIR),
    )  # fmt: skip
    assert "first batches identical: True" in out


def test_tracking_benchmark_reports_the_same_peak_tracked_on_the_first_steps():
    out = _run("tracking.py", "--steps", "3", "--rounds", "1", "--batch-size", "2")
    for row in ("untracked", "every step tracked", "first steps tracked"):
        assert row in out
    assert "same live peak reported by both tracked rows: True" in out


def test_collect_workers_benchmark_runs_one_and_two_processes():
    out = _run(
        "collect_workers.py", "--env", "swm/TwoRoom-v0", "--resolution", "32",
        "--episodes", "2", "--workers", "1", "2",
    )  # fmt: skip
    assert "workers 1:" in out and "workers 2:" in out and "x one process" in out


def test_overhead_benchmark_runs_swm_the_bare_loop_and_the_ceiling(tmp_path):
    """benchmarks/overhead.py at a toy size: its figures are docs/benchmarks.md's, not checked
    here; that it runs, and that the bare loop's losses equal swm's, is."""
    out = _run(
        "overhead.py", "--episodes", "8", "--steps", "3", "--rounds", "1", "--paths", "memory",
        "--dir", str(tmp_path),
    )  # fmt: skip
    for row in ("memory  swm ", "memory  bare ", "memory  ceiling ", "swm / bare", "load average"):
        assert row in out
    assert out.splitlines()[-2].endswith("True")  # swm / bare: the same losses at every step


def test_memprofile_time_benchmark_times_start_up_and_a_command():
    """benchmarks/memprofile_time.py, once, on the tiny preset: it runs and prints each row."""
    out = _run("memprofile_time.py", "--repeats", "1", "--commands", "tiny")
    rows = ("start-up: imports ", "start-up: imports + torch._dynamo ", "tiny ", "load average")
    for row in rows:
        assert row in out


def test_independent_peak_agrees_with_memprofiles_cpu_prediction():
    """benchmarks/independent_peak.py (no swm inside) against `swm memprofile --predict-for cpu`
    for the conv + GroupNorm test model with bf16 and checkpointing, at a toy size."""
    import json

    from swmcli.config import resolve_config
    from swmcli.memory.predict import PeakPredictor, configured_variant

    model = f"{ROOT}/tests/models/conv_world_model.py:build"
    shape = ["--resolution", "32", "--batch-size", "4", "--history-len", "3", "--frameskip", "1"]
    techniques = ["--bf16", "--checkpoint", "ConvStage"]
    measured = json.loads(_run("independent_peak.py", "--model", model, *shape, *techniques))
    flags = {"model.factory": model, "train.batch_size": 4, "runtime.bf16": True}
    cfg = resolve_config("tiny", flags={**flags, "runtime.activation_checkpointing": "ConvStage"})
    step = {"pixels": np.zeros((32, 32, 3), np.uint8), "action": np.zeros(2, np.float32)}
    predicted = PeakPredictor(cfg, step, "cpu").predict(configured_variant(cfg, 4)).peak_bytes
    assert measured["count"] == "profiler"  # torch.profiler's allocator events
    assert predicted == pytest.approx(measured["peak_bytes"], rel=0.05)
