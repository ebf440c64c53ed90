"""`swm train` on the tiny preset: it learns, it does not collapse, it resumes bit for bit."""

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from swmcli.commands.collect import run_collect
from swmcli.commands.train import run_train
from swmcli.config import load_run_config, resolve_config, with_settings
from swmcli.errors import CheckpointError, SwmError, UsageError
from swmcli.memory.measure import MemoryMonitor
from swmcli.training.checkpoints import checkpoint_path, load_checkpoint
from swmcli.training.step import ClipOrder, learning_rate

ROOT = Path(__file__).parents[1]
TINY_SHAPE = {"resolution": 32, "action_dim": 2}  # the tiny data's clips, as model_args gives them


def _cfg(data: Path, out: Path, **flags):
    settings = {"data.path": data, "train.out": out, **flags}
    return resolve_config("tiny", flags=settings)


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_tiny_preset_learns_without_collapse(tiny_data, tmp_path):
    run_dir = tmp_path / "run"
    monitor = MemoryMonitor(track_tensors=True)
    result = run_train(_cfg(tiny_data, run_dir, **{"train.log_every": 1}), monitor)
    rows = _metrics(run_dir)
    assert [row["step"] for row in rows] == list(range(1, 41))
    first = np.mean([row["prediction"] for row in rows[:5]])
    last = np.mean([row["prediction"] for row in rows[-5:]])
    assert last < 0.7 * first, (first, last)
    # Not collapsed: latents of different frames stay spread over many dimensions.
    assert min(row["latent_rank"] for row in rows[-5:]) > 4
    assert result.fields["train_episodes"] == 8  # 10 collected, eval.heldout_episodes = 2 kept out
    # 39 steady steps (the first one is timed apart) of 16 clips each
    steady = 39 * 16 / result.fields["steady_seconds"]
    assert result.fields["steady_clips_per_s"] == pytest.approx(steady)
    assert [p.name for p in monitor.report.phases] == [
        "preflight",
        "load into memory",  # the tiny data fits the RAM budget: trained in memory
        "setup",
        "first step (incl. compile)",
        "steady state",
    ]
    assert load_run_config(run_dir).data.path == tiny_data.resolve()
    assert load_checkpoint(run_dir)["step"] == 40
    with Image.open(run_dir / "loss_curve.png") as picture:
        assert picture.size == (640, 360)


def _train_in_subprocess(data: Path, run_dir: Path, *extra: str) -> subprocess.Popen:
    code = (
        "import sys; from pathlib import Path\n"
        "from swmcli.config import resolve_config\n"
        "from swmcli.memory.measure import MemoryMonitor\n"
        "from swmcli.commands.train import run_train\n"
        "if __name__ == '__main__':\n"
        "    flags = {'data.path': sys.argv[1], 'train.out': sys.argv[2], 'train.steps': 400,\n"
        "             'train.checkpoint_every': 10, 'train.log_every': 1}\n"
        "    cfg = resolve_config('tiny', flags=flags)\n"
        "    run_train(cfg, MemoryMonitor(), resume='--resume' in sys.argv)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", code, str(data), str(run_dir), *extra],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def test_sigkill_then_resume_gives_the_uninterrupted_losses(tiny_data, tmp_path):
    killed = tmp_path / "killed"
    process = _train_in_subprocess(tiny_data, killed)
    deadline = time.monotonic() + 60
    while not checkpoint_path(killed).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    saved_step = load_checkpoint(killed)["step"]
    assert 10 <= saved_step < 400
    with open(killed / "metrics.jsonl", "a") as metrics:
        metrics.write('{"step": 399, "lo')  # a line cut short by the kill
    # The resumed run stops at step saved + 15; an uninterrupted run of the same config too.
    stop = saved_step + 15
    flags = {"train.checkpoint_every": 10, "train.log_every": 1}
    resumed_cfg = _cfg(tiny_data, killed, **{**flags, "train.steps": 400})
    straight_cfg = _cfg(tiny_data, tmp_path / "straight", **{**flags, "train.steps": 400})
    _run_until(resumed_cfg, stop, resume=True)
    _run_until(straight_cfg, stop, resume=False)
    resumed = {row["step"]: row["loss"] for row in _metrics(killed)}
    straight = {row["step"]: row["loss"] for row in _metrics(tmp_path / "straight")}
    assert sorted(resumed) == list(range(1, stop + 1))  # no step lost, none logged twice
    for step in range(saved_step + 1, stop + 1):
        assert resumed[step] == straight[step], step


def _run_until(cfg, stop: int, resume: bool) -> None:
    """Train ``cfg`` (400 planned steps) but stop after step ``stop``, like an interruption."""
    import swmcli.commands.train as train

    original = train.learning_rate  # called first in each step, with the step's index

    def step_then_maybe_stop(step, *schedule):
        if step >= stop:
            raise KeyboardInterrupt
        return original(step, *schedule)

    train.learning_rate = step_then_maybe_stop
    try:
        with pytest.raises(KeyboardInterrupt):
            run_train(cfg, MemoryMonitor(), resume=resume)
    finally:
        train.learning_rate = original


def test_fresh_run_refuses_a_trained_directory(tiny_data, tmp_path):
    cfg = _cfg(tiny_data, tmp_path / "run", **{"train.steps": 2})
    run_train(cfg, MemoryMonitor())
    with pytest.raises(UsageError, match="already holds"):
        run_train(_cfg(tiny_data, tmp_path / "run", **{"train.steps": 2}), MemoryMonitor())
    with pytest.raises(UsageError, match="already trained"):
        run_train(cfg, MemoryMonitor(), resume=True)


def test_missing_and_corrupted_checkpoints_are_clear_errors(tiny_data, tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(CheckpointError, match=r"config\.json"):
        run_train(_cfg(tiny_data, run_dir), MemoryMonitor(), resume=True)
    run_train(_cfg(tiny_data, run_dir, **{"train.steps": 2}), MemoryMonitor())
    path = checkpoint_path(run_dir)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="corrupted"):
        load_checkpoint(run_dir)
    path.unlink()
    with pytest.raises(CheckpointError, match="no checkpoint"):
        run_train(_cfg(tiny_data, run_dir, **{"train.steps": 4}), MemoryMonitor(), resume=True)


def test_gradient_accumulation_with_bf16_and_checkpointing_runs_as_predicted(tiny_data, tmp_path):
    flags = {"train.steps": 3, "train.grad_accum": 2, "train.batch_size": 4, "runtime.bf16": True}
    flags |= {"model.factory": f"{ROOT}/tests/models/conv_world_model.py:build"}
    flags |= {"runtime.activation_checkpointing": "ConvStage"}  # GroupNorm, recomputed in bf16
    monitor = MemoryMonitor(track_tensors=True)
    result = run_train(_cfg(tiny_data, tmp_path / "run", **flags), monitor)
    assert result.fields["dtype"] == "bfloat16"
    assert np.isfinite(result.fields["final_loss"])
    steady = next(p for p in monitor.report.phases if p.name == "steady state")
    assert result.fields["preflight_step_bytes"] == pytest.approx(
        steady.live_tensor_peak_bytes, rel=0.05
    )


def test_too_many_held_out_episodes_is_a_usage_error(tiny_data, tmp_path):
    cfg = _cfg(tiny_data, tmp_path / "run", **{"eval.heldout_episodes": 10})
    with pytest.raises(UsageError, match="held out"):
        run_train(cfg, MemoryMonitor())


def clip_order(*args, seed: int) -> np.ndarray:
    return np.array(list(ClipOrder(*args, seed)), dtype=np.int64)


def test_clip_order_is_a_function_of_seed_and_step():
    whole = clip_order(10, 4, 0, 10, seed=3)
    assert len(whole) == 40
    for epoch in range(4):
        assert sorted(whole[epoch * 10 : epoch * 10 + 10]) == list(range(10))
    assert np.array_equal(clip_order(10, 4, 3, 10, seed=3), whole[12:])
    assert not np.array_equal(clip_order(10, 4, 0, 10, seed=4), whole)


def test_learning_rate_warms_up_then_decays():
    rates = [learning_rate(step, 100, 1e-3) for step in range(100)]
    assert rates[0] < rates[4] == pytest.approx(1e-3)
    assert rates[-1] == pytest.approx(1e-4, rel=0.05)
    assert all(a >= b for a, b in itertools.pairwise(rates[5:]))


def test_compile_with_techniques_trains_to_the_eager_losses_and_saves_plain_weights(
    tiny_data, tmp_path
):
    from torch._dynamo.utils import counters

    counters.clear()
    run_dir = tmp_path / "run"
    techniques = {"runtime.activation_checkpointing": "layers"}
    techniques |= {"runtime.optimizer_in_backward": True}
    flags = {"train.steps": 3, "train.log_every": 1, "train.grad_clip": 0, **techniques}
    monitor = MemoryMonitor(track_tensors=True)  # as the CLI makes it
    result = run_train(_cfg(tiny_data, run_dir, **flags, **{"runtime.compile": True}), monitor)
    run_train(_cfg(tiny_data, tmp_path / "eager", **flags), MemoryMonitor())
    compiled, eager = _metrics(run_dir), _metrics(tmp_path / "eager")
    assert [row["loss"] for row in compiled] == pytest.approx([row["loss"] for row in eager], 1e-4)
    assert result.fields["compile"] is True
    # Tracking would have made compile a silent no-op: it is off, and graphs were compiled.
    first = next(p for p in monitor.report.phases if p.name.startswith("first step"))
    assert first.live_tensor_peak_bytes is None
    assert counters["stats"]["unique_graphs"] >= 2, "encoder and predictor each compiled"
    keys = load_checkpoint(run_dir)["model"].keys()
    assert not any("_orig_mod" in key for key in keys)
    assert np.isfinite(result.fields["final_loss"]) and torch.compiler is not None


def test_resume_trains_the_directory_it_is_given(tiny_data, tmp_path):
    import shutil

    original = tmp_path / "original"
    run_train(_cfg(tiny_data, original, **{"train.steps": 4}), MemoryMonitor())
    copy = tmp_path / "copy"
    shutil.copytree(original, copy)
    further = with_settings(_cfg(tiny_data, copy), {"train.steps": 6})
    run_train(further, MemoryMonitor(), resume=True)
    assert load_checkpoint(copy)["step"] == 6
    assert load_checkpoint(original)["step"] == 4, "the run it was copied from is untouched"
    assert load_run_config(copy).train.out == copy


def test_refuses_batches_larger_than_the_data_and_runs_inside_datasets(tiny_data, tmp_path):
    with pytest.raises(UsageError, match="training clips"):
        big = _cfg(tiny_data, tmp_path / "big", **{"train.batch_size": 100_000})
        run_train(big, MemoryMonitor())
    with pytest.raises(UsageError, match="is a dataset"):
        run_train(_cfg(tiny_data, tiny_data), MemoryMonitor())


def test_preflight_predicts_the_step_it_then_measures(tiny_data, tmp_path):
    from swmcli.memory.predict import check_training_fits

    cfg = _cfg(tiny_data, tmp_path / "run")
    predicted = check_training_fits(cfg, TINY_SHAPE, "cpu")
    monitor = MemoryMonitor(track_tensors=True)
    run_train(cfg, monitor)
    measured = next(p for p in monitor.report.phases if p.name == "steady state")
    assert abs(predicted - measured.live_tensor_peak_bytes) <= 0.05 * predicted


def test_preflight_refuses_a_step_the_host_cannot_hold(tiny_data, tmp_path):
    import re

    from swmcli.errors import BudgetExceeded
    from swmcli.host import available_host_bytes
    from swmcli.memory.predict import check_training_fits

    cfg = _cfg(tiny_data, tmp_path / "run", **{"train.batch_size": 1_000_000})
    with pytest.raises(BudgetExceeded) as caught:
        check_training_fits(cfg, TINY_SHAPE, "cpu")
    assert caught.value.needed > available_host_bytes()
    best = int(re.search(r"--batch-size (\d+)", caught.value.hint).group(1))
    # The hinted batch fits what was free at the refusal (free RAM moves on a shared host).
    try:
        cfg_best = with_settings(cfg, {"train.batch_size": best})
        needed = check_training_fits(cfg_best, TINY_SHAPE, "cpu")
    except BudgetExceeded as again:
        needed = again.needed
    assert needed <= caught.value.available


def test_train_and_eval_split_episodes_with_one_rule():
    from swmcli.data.clips import heldout_split

    assert heldout_split(10, 2) == (range(8), range(8, 10))
    assert heldout_split(1, 2) == (range(0), range(1))


@pytest.mark.parametrize("suffix", ["lance", "h5"])
def test_sigterm_checkpoints_the_current_step_and_prints_no_traceback(tmp_path, suffix):
    data = tmp_path / f"tiny.{suffix}"
    run_collect(resolve_config("tiny", flags={"collect.out": data}), MemoryMonitor())
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "swmcli", "train", "--preset", "tiny", "--data", str(data)]
    command += ["--out", str(run_dir)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    no_periodic_checkpoint = ["--set", "train.log_every=1", "--set", "train.checkpoint_every=1000"]
    process = subprocess.Popen(
        [*command, "--steps", "400", *no_periodic_checkpoint],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 600  # a wait, not a timing: a loaded machine starts slowly
    metrics = run_dir / "metrics.jsonl"
    while time.monotonic() < deadline and (
        not metrics.exists() or len(metrics.read_text().splitlines()) < 3
    ):
        assert process.poll() is None, process.communicate()
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=60)
    output = (stdout + stderr).decode()
    assert process.returncode == 130, output
    assert "Traceback" not in output
    saved = load_checkpoint(run_dir)["step"]
    assert 3 <= saved < 400 and saved == _metrics(run_dir)[-1]["step"]
    assert f"--resume continues from step {saved}" in output
    resume = [*command, "--resume", "--steps", str(saved + 2)]
    resumed = subprocess.run(resume, env=env, capture_output=True)
    assert resumed.returncode == 0, resumed.stderr.decode()
    assert load_checkpoint(run_dir)["step"] == saved + 2


def test_many_passes_warn_once_and_stay_in_json(tiny_data, tmp_path):
    from typer.testing import CliRunner

    from swmcli.cli import app
    from swmcli.training.sources import open_training_data

    clips = len(open_training_data(_cfg(tiny_data, tmp_path / "r"))[0])
    command = ["train", "--preset", "tiny", "--data", str(tiny_data), "--out", str(tmp_path / "r")]
    passes = ["--steps", "51", "--batch-size", str(clips)]  # each step one pass over the data
    result = CliRunner().invoke(app, [*command, *passes, "--json"])
    assert result.exit_code == 0, result.output
    warnings = json.loads(result.stdout)["warnings"]
    assert len(warnings) == 1 and "passes over" in warnings[0]
    assert result.stderr.count("passes over") == 1
    assert "estimate: about" in result.stderr


def test_refuses_an_out_directory_that_is_not_a_run(tiny_data, tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "metrics.jsonl").write_text("my own file\n")
    with pytest.raises(UsageError, match="not a swm run"):
        run_train(_cfg(tiny_data, notes, **{"train.steps": 2}), MemoryMonitor())
    assert (notes / "metrics.jsonl").read_text() == "my own file\n"
    assert sorted(p.name for p in notes.iterdir()) == ["metrics.jsonl"]


def test_resume_refuses_data_that_changed_since_the_run_started(tiny_data, tmp_path):
    import shutil

    data = tmp_path / "tiny.lance"
    shutil.copytree(tiny_data, data)
    run = tmp_path / "run"
    run_train(_cfg(data, run, **{"train.steps": 2}), MemoryMonitor())
    # (resuming on the same data: test_resume_trains_the_directory_it_is_given)
    more = resolve_config("tiny", flags={"collect.out": data, "collect.episodes": 2})
    run_collect(more, MemoryMonitor())
    with pytest.raises(UsageError, match=r"10 episodes .* then, 12 .* now"):
        run_train(with_settings(_cfg(data, run), {"train.steps": 4}), MemoryMonitor(), resume=True)
    assert load_checkpoint(run)["step"] == 2


def test_clip_order_holds_one_epoch_whatever_the_steps():
    order = ClipOrder(10, 8, 0, 100_000_000_000, seed=0)
    assert len(order) == 800_000_000_000
    first = list(itertools.islice(order, 25))  # drawn lazily: nothing of size --steps exists
    assert sorted(first[:10]) == list(range(10)) and sorted(first[10:20]) == list(range(10))


def _with_actions(tiny_data, path, value):
    """A copy of ``tiny_data`` whose episodes' actions are all ``value`` (but for the last row's
    end-of-episode marker), so that every clip meets one."""
    from swmcli.data.formats import open_reader, open_writer

    reader = open_reader(tiny_data)
    episodes = [reader.read_episode(i) for i in range(reader.num_episodes)]
    metadata = {k: reader.metadata[k] for k in ("env_id", "resolution", "action_dim")}
    reader.close()
    with open_writer(path, metadata=metadata) as writer:
        for episode in episodes:
            episode["action"][:-1] = value
            writer.write_episode(episode)
    return path


def test_infinite_actions_stop_training_with_the_reason(tiny_data, tmp_path):
    bad = _with_actions(tiny_data, tmp_path / "bad.lance", np.inf)
    with pytest.raises(SwmError, match="infinite actions"):
        run_train(_cfg(bad, tmp_path / "run", **{"train.steps": 3}), MemoryMonitor())


def test_nan_actions_inside_episodes_are_said_once(tiny_data, tmp_path, capsys):
    steps = {"train.steps": 3, "train.log_every": 1}
    clean = run_train(_cfg(tiny_data, tmp_path / "clean", **steps), MemoryMonitor())
    assert not any("NaN" in w for w in clean.warnings)  # the end-of-episode marker is no news
    capsys.readouterr()
    odd = _with_actions(tiny_data, tmp_path / "odd.lance", np.nan)
    result = run_train(_cfg(odd, tmp_path / "run", **steps), MemoryMonitor())
    said = [w for w in result.warnings if "NaN actions inside episodes" in w]
    assert len(said) == 1 and "reads them as 0" in said[0]
    assert capsys.readouterr().err.count("NaN actions inside episodes") == 1
    assert np.isfinite(result.fields["final_loss"])


def test_init_from_a_run_and_a_frozen_encoder_train_only_the_predictor(tiny_data, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    run_train(_cfg(tiny_data, first, **{"train.steps": 20}), MemoryMonitor())
    # A longer history: the predictor's position table changes shape and starts fresh.
    flags = {"train.init_from": first, "train.freeze": "encoder", "data.history_len": 4}
    run_train(_cfg(tiny_data, second, **{"train.steps": 20, **flags}), MemoryMonitor())
    before, after = load_checkpoint(first)["model"], load_checkpoint(second)["model"]
    encoder = [name for name in before if name.startswith("encoder.")]
    # Weights and the BatchNorm's running statistics alike: eval mode, no gradient.
    assert encoder and all(torch.equal(before[name], after[name]) for name in encoder)
    assert not torch.equal(before["predictor.out.weight"], after["predictor.out.weight"])
    assert after["predictor.position"].shape != before["predictor.position"].shape
    assert load_checkpoint(second)["optimizer"]["state"]  # the predictor's AdamW state


def test_a_state_readout_trains_plans_and_needs_a_recorded_state(tiny_data, tmp_path):
    from swmcli.commands.evaluate import run_eval
    from swmcli.models.interface import model_args

    run_dir = tmp_path / "run"
    # TwoRoom's state is the agent's centre in [0, 1]: in units of 0.05, about a wall's width.
    flags = {"model.state_weight": 1.0, "model.state_units": [0.05, 0.05], "train.log_every": 1}
    cfg = _cfg(tiny_data, run_dir, **flags)
    run_train(cfg, MemoryMonitor())
    rows = _metrics(run_dir)
    assert "state" in rows[0] and rows[-1]["state"] < 0.5 * rows[0]["state"]
    assert load_checkpoint(run_dir)["model_args"]["state_size"] == 2
    dataset_protocol = load_run_config(run_dir, sets=["eval.protocol=dataset"])
    result = run_eval(run_dir, MemoryMonitor(), dataset_protocol)
    assert result.fields["episodes"] == 4 and 0 <= result.fields["success_rate"] <= 1
    no_state = {"keys": {"pixels": ["|u1", [32, 32, 3]], "action": ["<f4", [2]]}}
    with pytest.raises(UsageError, match="records no 'state'"):
        model_args(cfg, {"resolution": 32, "action_dim": 2, **no_state})


def test_freeze_and_init_from_refuse_what_they_cannot_do(tiny_data, tmp_path):
    with pytest.raises(UsageError, match="does not have") as error:
        run_train(_cfg(tiny_data, tmp_path / "a", **{"train.freeze": "encodr"}), MemoryMonitor())
    assert "encoder" in error.value.hint and "predictor" in error.value.hint
    everything = {"train.freeze": "encoder,predictor"}
    with pytest.raises(UsageError, match="nothing of the model to train"):
        run_train(_cfg(tiny_data, tmp_path / "b", **everything), MemoryMonitor())
    with pytest.raises(UsageError, match="not a run directory"):
        missing = {"train.init_from": tmp_path / "nowhere"}
        run_train(_cfg(tiny_data, tmp_path / "c", **missing), MemoryMonitor())


def test_a_run_that_fails_before_its_first_checkpoint_leaves_no_trace(
    tiny_data, tmp_path, monkeypatch
):
    """The data missing, or the first step failing: no run directory, no config.json, no lock
    file, no folder made for it; a directory that was there keeps what it held."""
    monkeypatch.chdir(tmp_path)
    bad = _with_actions(tiny_data, tmp_path / "bad.lance", np.inf)  # fails in the first step
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(UsageError, match="no dataset at"):
        run_train(_cfg(tmp_path / "missing.lance", Path("runs/new/run")), MemoryMonitor())
    with pytest.raises(SwmError, match="infinite actions"):
        run_train(_cfg(bad, Path("runs/run"), **{"train.steps": 3}), MemoryMonitor())
    assert sorted(tmp_path.rglob("*")) == before
    untrained = tmp_path / "untrained"
    (untrained / "mine").mkdir(parents=True)
    (untrained / "config.json").write_text("{}\n")  # what an earlier run wrote before it failed
    (untrained / "notes.txt").write_text("mine\n")  # and what its user keeps beside it
    held = {p: p.read_bytes() if p.is_file() else None for p in untrained.rglob("*")}
    with pytest.raises(SwmError, match="infinite actions"):
        run_train(_cfg(bad, untrained, **{"train.steps": 3}), MemoryMonitor())
    assert {p: p.read_bytes() if p.is_file() else None for p in untrained.rglob("*")} == held
    other_tool = tmp_path / "model"  # another tool's folder with a config.json of its own
    other_tool.mkdir()
    (other_tool / "config.json").write_text('{"hidden_size": 768}\n')
    with pytest.raises(UsageError, match="not a swm run"):
        run_train(_cfg(tiny_data, other_tool), MemoryMonitor())
    assert [(p.name, p.read_text()) for p in other_tool.iterdir()] == [
        ("config.json", '{"hidden_size": 768}\n')
    ]
    trained = tmp_path / "trained"
    run_train(_cfg(tiny_data, trained, **{"train.steps": 2}), MemoryMonitor())
    files = {p: p.read_bytes() for p in trained.rglob("*") if p.is_file()}
    with pytest.raises(UsageError, match="already trained"):
        run_train(_cfg(tiny_data, trained, **{"train.steps": 2}), MemoryMonitor(), resume=True)
    assert {p: p.read_bytes() for p in trained.rglob("*") if p.is_file()} == files
    # What is no run directory is never touched: a dataset, a file.
    data_files = {p: p.read_bytes() for p in tiny_data.rglob("*") if p.is_file()}
    with pytest.raises(UsageError, match="is a dataset"):
        run_train(_cfg(tiny_data, tiny_data), MemoryMonitor())
    assert {p: p.read_bytes() for p in tiny_data.rglob("*") if p.is_file()} == data_files
    (tmp_path / "notes.txt").write_text("mine\n")
    with pytest.raises(UsageError, match="is a file"):
        run_train(_cfg(tiny_data, tmp_path / "notes.txt"), MemoryMonitor())
    assert (tmp_path / "notes.txt").read_text() == "mine\n"


def test_a_presets_missing_data_names_what_makes_it_and_leaves_nothing(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from swmcli.cli import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["train", "--preset", "pusht-state-64"])
    assert result.exit_code == 2, result.output
    assert "no dataset at" in result.output and "pusht-64-mixed.lance" in result.output
    assert "`swm collect` alone does not make it" in result.output
    assert "presets/pusht-state-64.toml" in result.output
    result = CliRunner().invoke(app, ["train", "--preset", "tiny"])
    assert "hint: collect it first: `swm collect` with this run's --preset" in result.output
    assert list(tmp_path.iterdir()) == []
