"""The benchmarks the docs quote still run, at a toy size (their figures are in
docs/reports/performance.md)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
LOADER_TOY = ("--episodes", "12", "--length", "40", "--resolution", "32", "--batches", "3")


def _run(script: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _benchmark(name: str, monkeypatch):
    """``benchmarks/NAME.py`` imported as a module (its siblings importable, as when it runs)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_synthetic_episodes_are_a_function_of_the_seed_alone(monkeypatch):
    """benchmarks/synth.py: both sides of a comparison write the very same bytes."""
    synth = _benchmark("synth", monkeypatch)
    first, again, other = (synth.make_episode(seed, length=20, res=32) for seed in (3, 3, 4))
    assert all(np.array_equal(first[k], again[k], equal_nan=True) for k in first)
    assert not np.array_equal(first["pixels"], other["pixels"])
    assert first["pixels"].shape == (20, 32, 32, 3) and first["pixels"].dtype == np.uint8
    assert np.isnan(first["action"][-1]).all() and not np.isnan(first["action"][:-1]).any()


def test_loader_benchmark_runs_every_row(tmp_path):
    out = _run("loader.py", *LOADER_TOY, "--repeats", "1", "--dir", str(tmp_path))
    for row in ("lance ", "hdf5 ", "lance, processes", "hdf5, processes", "buffer"):
        assert row in out
    assert "first batches identical across every row: True" in out


def test_loader_benchmarks_upstream_row_runs_stable_worldmodels_own_loader(
    tmp_path, upstream_python
):
    """The upstream row: benchmarks/upstream_loader_bench.py in the interpreter of a venv that
    holds stable-worldmodel (SWM_UPSTREAM_PYTHON), writing and reading the same episodes."""
    out = _run(
        "loader.py", *LOADER_TOY, "--repeats", "1", "--dir", str(tmp_path),
        "--upstream-python", upstream_python,
    )  # fmt: skip
    assert "upstream benchmark failed" not in out
    upstream = next(line for line in out.splitlines() if line.startswith("upstream lance"))
    assert float(upstream.split()[2]) > 0  # its clips/s
    assert "first batches identical across every row: True" in out


def test_object_store_benchmark_runs_against_moto():
    pytest.importorskip("moto")
    out = _run(
        "object_store.py", "--steps", "480", "--episode-len", "40", "--resolution", "32",
        "--batches", "3",
    )  # fmt: skip
    assert "first batches identical: True" in out


def test_import_speed_benchmark_streams_stable_worldmodels_layout_direct_and_converted():
    """benchmarks/import_speed.py without upstream's venv: the episodes in upstream's Lance
    layout by swm's export, read as they are and after `swm convert`."""
    out = _run("import_speed.py", *LOADER_TOY, "--repeats", "1")
    assert "swm, direct" in out and "swm, converted" in out and "swm convert:" in out


def test_scale_benchmark_prints_each_size_with_its_ratio(tmp_path):
    """benchmarks/scale.py at a toy size, one format (each runs the same code)."""
    out = _run(
        "scale.py", "--formats", "hdf5", "--sizes", "10", "20", "--batches", "2", "--rounds",
        "1", "--buffer-steps", "100", "200", "--buffer-rounds", "2", "--dir", str(tmp_path),
        "--resolution", "16",
    )  # fmt: skip
    assert "16x16 frames" in out and "| hdf5 | 10 |" in out and "| hdf5 | 20 |" in out
    assert "x) |" in out
    assert "buffer of 200 steps" in out
    assert list(tmp_path.iterdir()) == []  # every dataset deleted


def test_scale_benchmark_assembles_the_fragments_and_rows_the_writer_leaves(tmp_path, monkeypatch):
    """scale.py --assemble: a dataset written in one go in the fragments the tiers leave holds
    what the writer writes episode by episode, in the same fragments (merged by tier, into
    fragments of the largest size, then on close)."""
    import lance

    from swmcli.data.storage import lance as lance_storage

    monkeypatch.setattr(lance_storage, "_FRAGMENT_BYTES", 1)  # the largest: 1,024 rows
    monkeypatch.setattr(lance_storage, "_SMALL_BYTES", 20_000)  # merged on close: under 97 rows
    monkeypatch.setattr(lance_storage, "MERGE_FAN_IN", 16)  # no tier reaches 512 rows first
    scale = _benchmark("scale", monkeypatch)
    written, assembled = tmp_path / "written.lance", tmp_path / "assembled.lance"
    scale.write(written, "lance", 600)
    assert scale.assemble(assembled, "lance", 600) == dict.fromkeys(
        ["write_ms", "longest_write_s", "write_rss"]
    )
    layouts = [
        [fragment.count_rows() for fragment in lance.dataset(str(path)).get_fragments()]
        for path in (written, assembled)
    ]
    assert layouts[0] == layouts[1]
    assert layouts[0][:5] == [1030] * 5 and sum(layouts[0][5:]) == 850  # then tiers, the close's
    _assert_same_episodes(written, assembled, (0, 299, 599))


def test_scale_benchmark_assembles_the_hdf5_file_the_writer_leaves(tmp_path, monkeypatch):
    """scale.py --assemble for HDF5: episodes written a block at a time make the file the writer
    makes episode by episode: the same datasets, chunking and values, and the same episodes."""
    import h5py

    scale = _benchmark("scale", monkeypatch)
    monkeypatch.setattr(scale, "EPISODES_A_WRITE", 7)  # blocks of 7, the last of 2
    written, assembled = tmp_path / "written.h5", tmp_path / "assembled.h5"
    scale.write(written, "hdf5", 30)
    scale.assemble(assembled, "hdf5", 30)
    with h5py.File(written, "r") as first, h5py.File(assembled, "r") as second:
        assert list(first) == list(second) and dict(first.attrs) == dict(second.attrs)
        for name, dataset in first.items():
            other = second[name]
            assert (dataset.shape, dataset.chunks, dataset.dtype) == (
                other.shape, other.chunks, other.dtype
            ), name  # fmt: skip
            if dataset.ndim < 4:  # frames are LZ4 chunks h5py cannot decode; the reader does
                assert np.array_equal(dataset[()], other[()], equal_nan=True), name
    _assert_same_episodes(written, assembled, range(30))


def _assert_same_episodes(written: Path, assembled: Path, indices) -> None:
    """The two datasets hold the same metadata, row checksums and episodes ``indices``."""
    from swmcli.data.formats import open_reader

    readers = [open_reader(path) for path in (written, assembled)]
    rows = np.arange(readers[0].num_steps)
    assert readers[0].num_episodes == readers[1].num_episodes
    assert readers[0].metadata == readers[1].metadata
    assert np.array_equal(*(reader.read_row_checksums(rows) for reader in readers))
    for index in indices:
        first, second = (reader.read_episode(index) for reader in readers)
        assert all(np.array_equal(first[k], second[k], equal_nan=True) for k in first)
    for reader in readers:
        reader.close()


def test_write_throughput_benchmark_prints_each_format_and_kind(tmp_path):
    """benchmarks/write_throughput.py at a toy size, one format: two writes, one process each."""
    out = _run(
        "write_throughput.py", "--episodes", "1", "--length", "2", "--res", "16", "--rounds", "1",
        "--formats", "lance", "--dir", str(tmp_path),
    )  # fmt: skip
    assert "| lance | noise |" in out and "| lance | synthetic |" in out
    assert list(tmp_path.iterdir()) == []  # every dataset deleted


def test_buffer_benchmark_prints_every_row_against_its_numpy_baseline():
    out = _run("buffer.py", "--resolutions", "32", "--max-steps", "2000")
    for row in ("add (ring full, evicting)", "add_episode", "sample(64, out=)", "naive"):
        assert row in out
    assert "32x32 sample(64):" in out


def test_cli_startup_benchmark_times_swm_help_against_its_floor_and_torch():
    out = _run("cli_startup.py", "--repeats", "1")
    for row in ("python -c pass", "swm --help", "swm collect --help", "import torch'"):
        assert row in out
    assert "swm --help / import torch:" in out


def test_env_benchmark_prints_step_rates_and_the_policies_success():
    out = _run("env.py", "--steps", "50", "--episodes", "2")
    assert "TwoRoom 64x64:" in out and "TwoRoom 224x224:" in out and "frame copy" in out
    assert "expert policy: success" in out and "random policy: success" in out


def test_disk_peak_benchmark_reports_the_peak_over_the_final_size():
    out = _run("disk_peak.py", "3")
    assert "episodes 3: peak" in out and "ratio" in out


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
    """benchmarks/overhead.py at a toy size: its figures are the performance report's, not
    checked here; that it runs, and that the bare loop's losses equal swm's, is."""
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


def test_recurrent_planning_benchmark_counts_h_cell_steps_carried_and_more_rebuilt():
    out = _run("recurrent_planning.py", "--horizons", "3", "--iterations", "1", "--samples", "4",
               "--plans", "1", "--rounds", "1")  # fmt: skip
    rows = {line.split()[1]: line.split() for line in out.splitlines() if len(line.split()) == 4}
    assert rows["carried"][-1] == "3" and rows["stateless"][-1] == "9"  # 2 + 3 + 4
    assert "faster per env step" in out


def test_lance_take_span_benchmark_prints_each_size_with_its_ratio(tmp_path):
    """benchmarks/lance_take_span.py at toy sizes, each in one fragment and in two."""
    args = ("--rows", "700", "1400", "--takes", "2", "--fragments", "1", "2", "--resolution", "16")
    out = _run("lance_take_span.py", *args, "--dir", str(tmp_path))
    for rows in ("700", "1,400"):
        assert f"| {rows} | " in out and f"| {rows} in 2 fragments | " in out
    assert "x) |" in out
    assert list(tmp_path.iterdir()) == []  # the scratch files deleted
