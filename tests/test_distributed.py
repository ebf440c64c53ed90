"""Data-parallel training: real torchrun, two gloo processes on the CPU, the tiny preset.

2 ranks x 8 clips give the losses of 1 process x 16 (global batch statistics); rank 0 alone
writes the run and reports every rank's memory; a killed rank ends the run with one clear line
and ``--resume`` continues it.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from swmcli.commands.train import run_train
from swmcli.config import resolve_config
from swmcli.errors import UsageError
from swmcli.memory.measure import MemoryMonitor
from swmcli.memory.predict import PeakPredictor, Variant, configured_variant, ddp_bucket_bytes
from swmcli.training.checkpoints import load_checkpoint
from swmcli.training.distributed import World, check_batch_split, rank_share

ROOT = Path(__file__).parents[1]
STEPS = 16
TRAIN = ["--preset", "tiny", "--steps", str(STEPS), "--set", "train.log_every=1"]
TRAIN += ["--set", "train.checkpoint_every=2"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_each_rank_reads_a_disjoint_share_of_every_global_batch():
    order = np.random.default_rng(0).permutation(64)[:48]  # 3 batches of 16
    shares = [list(rank_share(order, 16, World(rank=r, size=2))) for r in range(2)]
    for batch in range(3):
        first, second = (share[batch * 8 : (batch + 1) * 8] for share in shares)
        assert not set(first) & set(second)
        assert list(first) + list(second) == list(order[batch * 16 : (batch + 1) * 16])
    with pytest.raises(UsageError, match="equal shares"):
        check_batch_split(World(size=3), 16)


def test_memprofile_predicts_one_ranks_peak_with_global_statistics_and_ddp_buckets():
    step = {"pixels": np.zeros((32, 32, 3), np.uint8), "action": np.zeros(2, np.float32)}
    predictor = PeakPredictor(resolve_config("tiny"), step)
    half = predictor.predict(Variant("train", False, 8, 3, 1))
    whole = predictor.predict(Variant("train", False, 16, 3, 1))
    rank = predictor.predict(Variant("train", False, 16, 3, 1, ranks=2))
    buckets = ddp_bucket_bytes(predictor.model(3, 1))
    assert rank.by_category["ddp_buckets"] == buckets > 0
    # A rank holds 8 clips, but SIGReg sees the latents of all 16 (gathered from every rank).
    assert half.peak_bytes + buckets < rank.peak_bytes < whole.peak_bytes + buckets


def _rank_pid(launcher: int, rank: int) -> int | None:
    """The pid of the child of ``launcher`` that torchrun started as ``rank``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if parent == launcher and f"RANK={rank}".encode() in environ:
            return int(entry.name)
    return None


def test_two_ranks_train_as_one_process_and_a_killed_rank_resumes(tiny_data, tmp_path):
    """``swm train --nproc 2``, one rank killed, then ``torchrun ... -m swmcli train --resume``:
    every step's figures equal a single process's with the same global batch."""
    single = tmp_path / "one"
    data = tiny_data
    flags = {"data.path": data, "train.out": single, "train.steps": STEPS, "train.log_every": 1}
    run_train(resolve_config("tiny", flags=flags), MemoryMonitor())

    run_dir = tmp_path / "two"
    command = [sys.executable, "-m", "swmcli", "train", *TRAIN, "--nproc", "2"]
    launcher = subprocess.Popen(
        [*command, "--data", str(data), "--out", str(run_dir)],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (run_dir / "checkpoint.pt").exists():
        assert launcher.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    victim = _rank_pid(launcher.pid, 1)
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    _, stderr = launcher.communicate(timeout=120)
    assert launcher.returncode == 1
    assert "rank 1 was killed by SIGKILL" in stderr and "--resume" in stderr
    assert "Traceback" not in stderr

    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    torchrun += ["--nproc-per-node", "2", "-m", "swmcli", "train", "--resume", "--json"]
    resumed = subprocess.run(
        [*torchrun, "--out", str(run_dir)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    one, two = _metrics(single), _metrics(run_dir)
    assert [row["step"] for row in two] == list(range(1, STEPS + 1))
    for a, b in zip(one, two, strict=True):
        for key in ("loss", "prediction", "regularizer", "latent_rank", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-4), (a["step"], key)
    result = json.loads(resumed.stdout)  # one report, from rank 0
    assert result["ranks"] == 2 and result["clips_per_rank"] == 8
    names = [phase["name"] for phase in result["memory"]["phases"]]
    assert names[-3:] == ["rank 0: whole run", "rank 1: whole run", "max over 2 ranks"]
    peaks = [phase["host_peak_rss_bytes"] for phase in result["memory"]["phases"][-3:]]
    assert peaks[2] == max(peaks[:2]) > 0
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["runtime"]["nproc"] == 2 and saved["train"]["batch_size"] == 16


def test_the_launcher_names_the_killed_rank_when_its_peer_exits_in_the_same_second():
    import signal

    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from swmcli.training.distributed import _failed_ranks_error

    killed = ProcessFailure(local_rank=1, pid=2, exitcode=-signal.SIGKILL, error_file="")
    peer = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file="")
    peer.timestamp = killed.timestamp
    error = _failed_ranks_error({0: peer, 1: killed})
    assert "rank 1 was killed by SIGKILL" in error.message


def test_sharded_ranks_accumulating_train_as_one_process(tiny_data, tmp_path):
    """``torchrun --nproc-per-node 2 -m swmcli train --set runtime.shard=true`` (FSDP2 on gloo),
    two micro-batches a step: the losses of one process on the global batch, and the memory
    memprofile predicts for a rank."""
    flags = {"train.steps": 3, "train.log_every": 1, "train.grad_accum": 2, "train.batch_size": 8}
    single = tmp_path / "one"
    run_train(
        resolve_config("tiny", flags={"data.path": tiny_data, "train.out": single, **flags}),
        MemoryMonitor(),
    )
    sharded = tmp_path / "sharded"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    torchrun += ["--nproc-per-node", "2", "-m", "swmcli", "train", "--preset", "tiny"]
    settings = [f"--set={key}={value}" for key, value in flags.items()]
    settings += ["--set=runtime.shard=true", "--data", str(tiny_data), "--out", str(sharded)]
    settings += ["--json"]
    result = subprocess.run(
        [*torchrun, *settings],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for a, b in zip(_metrics(single), _metrics(sharded), strict=True):
        for key in ("loss", "prediction", "regularizer", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-4), (a["step"], key)
    # The checkpoint holds the whole model, as one process's does: eval needs no ranks.
    from swmcli.training.checkpoints import load_checkpoint

    whole, parts = load_checkpoint(single)["model"], load_checkpoint(sharded)["model"]
    assert {k: v.shape for k, v in whole.items()} == {k: v.shape for k, v in parts.items()}
    # memprofile's per-rank prediction of the sharded step: within 5% of each rank's live peak.
    measured = json.loads(result.stdout)["memory"]["phases"][-1]
    assert measured["name"] == "max over 2 ranks"
    step = {"pixels": np.zeros((32, 32, 3), np.uint8), "action": np.zeros(2, np.float32)}
    cfg = resolve_config("tiny", flags={**flags, "runtime.nproc": 2, "runtime.shard": True})
    predicted = PeakPredictor(cfg, step).predict(configured_variant(cfg, 8)).peak_bytes
    assert predicted == pytest.approx(measured["live_tensor_peak_bytes"], rel=0.05)


def test_sigterm_to_one_rank_stops_every_rank_at_the_same_checkpointed_step(tiny_data, tmp_path):
    """Only rank 1 is told to stop, between the steps that log: the flag travels in the ranks'
    next meeting (about a second ahead), so rank 0 stops at the same step, the step is
    checkpointed and logged, and nothing prints a traceback."""
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "swmcli", "train", "--preset", "tiny", "--nproc", "2"]
    command += ["--steps", "400", "--set", "train.log_every=1000"]
    command += ["--set", "train.checkpoint_every=1000", "--data", str(tiny_data)]
    launcher = subprocess.Popen(
        [*command, "--out", str(run_dir)],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 600  # a wait, not a timing: a loaded machine starts slowly
    while not metrics.exists() or not metrics.read_text():  # the first step is logged
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()
        time.sleep(0.05)
    victim = _rank_pid(launcher.pid, 1)
    assert victim is not None
    os.kill(victim, signal.SIGTERM)
    stdout, stderr = launcher.communicate(timeout=300)
    assert launcher.returncode == 130, stdout + stderr
    assert "Traceback" not in stdout + stderr
    saved = load_checkpoint(run_dir)["step"]
    assert 1 < saved < 400 and saved == _metrics(run_dir)[-1]["step"]
