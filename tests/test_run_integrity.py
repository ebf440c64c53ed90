"""A run directory is verified and has one writer: checksummed checkpoints, config.json and
data.json checked against them, resume rules, impossible settings refused, concurrent writers
refused (real processes), and one-bit flips over every file of a run caught or harmless."""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from swmcli.cli import app
from swmcli.commands.train import run_train
from swmcli.config import load_run_config, resolve_config
from swmcli.data.storage.lock import writer_lock_path
from swmcli.errors import CheckpointError
from swmcli.memory.measure import MemoryMonitor
from swmcli.training.checkpoints import (
    PREVIOUS_FILE,
    checkpoint_path,
    load_checkpoint,
    save_checkpoint,
    state_digest,
)

ROOT = Path(__file__).parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def tiny_run(tiny_data, tmp_path_factory) -> Path:
    """A tiny run of 4 steps, checkpointed at 2 and 4 (so a previous checkpoint is kept)."""
    run_dir = tmp_path_factory.mktemp("runs") / "run"
    flags = {"data.path": tiny_data, "train.out": run_dir, "train.steps": 4}
    cfg = resolve_config("tiny", flags={**flags, "train.checkpoint_every": 2})
    run_train(cfg, MemoryMonitor())
    return run_dir


@pytest.fixture
def run_copy(tiny_run, tmp_path) -> Path:
    return Path(shutil.copytree(tiny_run, tmp_path / "run"))


def _flip(path: Path, offset: int, mask: int = 0x01) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def test_one_bit_flips_in_every_file_of_a_run_are_caught_or_harmless(tiny_run, tmp_path):
    """eval and --resume never read a flipped run as if it were intact: 0 silent changes, 0
    tracebacks, 0 hangs (sampled offsets of every file; the benchmark sweeps more)."""
    generator = random.Random(0)
    flips = [
        f"{file.relative_to(tiny_run)}:{offset}"
        for file in sorted(p for p in tiny_run.rglob("*") if p.is_file())
        for offset in sorted(generator.sample(range(file.stat().st_size), 10))
    ]
    command = [sys.executable, str(ROOT / "tests" / "run_flip_sweep.py"), str(tiny_run)]
    done = subprocess.run(
        [*command, str(tmp_path), *flips], env=ENV, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines] == flips, done.stdout  # none died or hung
    outcomes = [line.split()[1] for line in lines]
    assert set(outcomes) <= {"error", "intact"}, done.stdout  # 0 silent changes
    assert "error" in outcomes


def test_a_damaged_checkpoint_names_itself_and_the_last_good_one(run_copy):
    path = checkpoint_path(run_copy)
    _flip(path, path.stat().st_size // 2)
    with pytest.raises(CheckpointError, match="damaged") as caught:
        load_checkpoint(run_copy)
    assert (
        f"the last good checkpoint is {run_copy / PREVIOUS_FILE} (step 2)" in caught.value.message
    )
    shutil.copy(run_copy / PREVIOUS_FILE, path)  # what the hint says to do
    assert load_checkpoint(run_copy)["step"] == 2


def test_a_checkpoint_without_its_checksum_is_refused(run_copy):
    path = checkpoint_path(run_copy)
    state = torch.load(path, weights_only=True)
    del state["checksum"]
    torch.save(state, path)
    with pytest.raises(CheckpointError, match="do not match their checksum"):
        load_checkpoint(run_copy)


def test_non_finite_weights_are_refused_on_load_and_never_saved(run_copy):
    path = checkpoint_path(run_copy)
    state = torch.load(path, weights_only=True)
    name = next(iter(state["model"]))
    state["model"][name].view(-1)[0] = float("nan")
    del state["checksum"]
    state["checksum"] = state_digest(state)  # a consistent checkpoint of a diverged run
    torch.save(state, path)
    with pytest.raises(CheckpointError, match=f"non-finite values in model.{name}"):
        load_checkpoint(run_copy)

    before = (run_copy / PREVIOUS_FILE).read_bytes()
    shutil.copy(run_copy / PREVIOUS_FILE, path)
    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.weight[0, 0] = float("inf")
    with pytest.raises(CheckpointError, match=r"diverged.*step 2 is kept"):
        save_checkpoint(
            run_copy,
            model=model.state_dict(),
            optimizer=None,
            step=3,
            model_args={},
            config_text="{}",
        )
    assert path.read_bytes() == before  # the last good checkpoint stays


def test_a_damaged_or_edited_config_json_is_named(run_copy):
    config = run_copy / "config.json"
    text = config.read_bytes()
    config.write_bytes(text[:40] + b"\xff" + text[41:])
    with pytest.raises(CheckpointError, match=r"config\.json is damaged: .*not text") as caught:
        load_run_config(run_copy)
    assert "TOML" not in caught.value.hint
    config.write_bytes(text.replace(b'"lr": 0.0005', b'"lr": 0.0001'))
    load_run_config(run_copy)  # a valid config: only the checkpoint can tell it changed
    with pytest.raises(CheckpointError, match=r"config.json is not the config .*train\.lr"):
        load_checkpoint(run_copy)
    moved = json.loads(text)
    moved["data"]["path"] = str(run_copy / "moved.lance")  # a moved dataset: eval checks it
    config.write_text(json.dumps(moved))
    assert load_checkpoint(run_copy)["step"] == 4


def _swm(*args: str):
    return CliRunner().invoke(app, list(args))


def test_resume_applies_runtime_flags_refuses_the_rest_and_restores_data_json(run_copy, tiny_data):
    out = ["--out", str(run_copy), "--data", str(tiny_data)]
    refused = _swm("train", "--preset", "tiny", *out, "--resume", "--frameskip", "2")
    assert refused.exit_code == 2, refused.output
    assert "--resume cannot change data.frameskip (1 in the run, 2 given)" in refused.output
    (run_copy / "data.json").unlink()
    metrics = run_copy / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    metrics.write_text("".join([lines[0].replace('"step"', '"st\x01p"'), *lines[1:]]))
    resumed = _swm("train", "--preset", "tiny", *out, "--resume", "--steps", "6", "--bf16")
    assert resumed.exit_code == 0, resumed.output
    said = " ".join(resumed.output.split())
    assert "was missing: rewritten" in said  # after data.json's path, which may fold
    assert "1 damaged line(s) dropped" in said
    assert load_run_config(run_copy).runtime.bf16  # applied and saved with the run
    assert load_checkpoint(run_copy)["step"] == 6
    assert json.loads((run_copy / "data.json").read_text())["episodes"] == 10


def test_impossible_settings_are_refused_before_any_work(tiny_run):
    planner = _swm("eval", str(tiny_run), "--elites", "100", "--samples", "4")
    assert planner.exit_code == 2
    assert "elites (100) cannot be more than samples (4)" in planner.output
    rate = _swm("train", "--preset", "tiny", "--set", "train.lr=inf", "--set", "eval.keep_elites=9")
    assert rate.exit_code == 2
    assert "train.lr: Input should be a finite number" in rate.output
    assert "keep_elites (9) cannot be more than elites (4)" in rate.output  # all at once


def _swm_process(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "swmcli", *args],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(path: Path, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while not path.exists():
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
        time.sleep(0.05)


def test_a_run_directory_has_one_writer(tiny_data, tmp_path):
    """A fresh train, a resume and an eval of a run another process is training are refused,
    naming it; the first one goes on and loses nothing."""
    run_dir = tmp_path / "run"
    data = ["--data", str(tiny_data), "--out", str(run_dir)]
    every = ["--set", "train.checkpoint_every=5", "--set", "train.log_every=1"]
    first = _swm_process("train", "--preset", "tiny", *data, "--steps", "100000", *every)
    _wait_for(run_dir / "config.json", first)  # written under the lock
    assert writer_lock_path(run_dir.resolve()).exists()
    others = [
        _swm_process("train", "--preset", "tiny", *data, "--steps", "10"),
        _swm_process("train", "--preset", "tiny", *data, "--resume", "--steps", "200000"),
        _swm_process("eval", str(run_dir)),
    ]
    for other in others:
        _, err = other.communicate(timeout=120)
        assert other.returncode == 1, err
        assert f"being written by process {first.pid} (swm train --preset tiny" in err
        assert "Traceback" not in err
    _wait_for(checkpoint_path(run_dir), first)
    first.send_signal(signal.SIGTERM)  # it stops after its step in progress, with a checkpoint
    _, err = first.communicate(timeout=120)
    assert first.returncode == 130, err
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").open()]
    assert steps == list(range(1, len(steps) + 1))  # one writer: no line lost or interleaved
    assert load_checkpoint(run_dir)["step"] == steps[-1]  # verified against its config.json
    assert load_run_config(run_dir).train.steps == 100000
    assert not writer_lock_path(run_dir.resolve()).exists()
