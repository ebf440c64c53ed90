"""`swm train` from a ReplayBuffer loaded with the dataset: the same losses as streaming, chosen
when it fits the RAM budget, refused before loading anything when it does not."""

import json
from pathlib import Path

import numpy as np
import pytest

from swmcli.commands.train import run_train
from swmcli.config import resolve_config
from swmcli.errors import BudgetExceeded, UsageError
from swmcli.memory.measure import MemoryMonitor
from swmcli.training.sources import newest_episodes


def _cfg(data: Path, out: Path, **flags):
    settings = {"data.path": data, "train.out": out, "train.log_every": 1, **flags}
    return resolve_config("tiny", flags=settings)


def _losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["loss"] for row in rows}


def test_in_memory_gives_the_streamed_losses_and_resumes_bit_for_bit(tiny_data, tmp_path):
    import swmcli.commands.train as train

    steps = {"train.steps": 12, "train.checkpoint_every": 6}
    streamed = run_train(
        _cfg(tiny_data, tmp_path / "streamed", **steps, **{"data.in_memory": False}),
        MemoryMonitor(),
    )
    assert streamed.fields["clip_source"] == "stream"
    assert streamed.fields["buffer_bytes"] == 0
    # In memory by default (the tiny data fits half the RAM), stopped after step 8 ...
    in_memory = _cfg(tiny_data, tmp_path / "memory", **steps)
    original = train.learning_rate  # called first in each step, with the step's index

    def stop_after_eight(step, *schedule):
        if step == 8:
            raise KeyboardInterrupt
        return original(step, *schedule)

    train.learning_rate = stop_after_eight
    try:
        with pytest.raises(KeyboardInterrupt):
            run_train(in_memory, MemoryMonitor())
    finally:
        train.learning_rate = original
    # ... and resumed from its checkpoint at step 6.
    monitor = MemoryMonitor()
    resumed = run_train(in_memory, monitor, resume=True)
    assert resumed.fields["clip_source"] == "memory"
    assert "in memory" in resumed.notes[-1] and "fit 50% of the RAM available" in resumed.notes[-1]
    assert "load into memory" in [phase.name for phase in monitor.report.phases]
    # pixels (32x32x3 uint8) and the action (2 float32) of every training step
    steps_held = resumed.fields["buffer_bytes"] // (32 * 32 * 3 + 8)
    assert resumed.fields["buffer_bytes"] == steps_held * (32 * 32 * 3 + 8) > 0
    assert resumed.fields["model_bytes"] >= 3 * 4 * resumed.fields["parameters"]
    assert _losses(tmp_path / "memory") == _losses(tmp_path / "streamed")


def test_in_memory_is_refused_before_loading_when_it_does_not_fit(tiny_data, tmp_path):
    monitor = MemoryMonitor()
    cfg = _cfg(tiny_data, tmp_path / "run", **{"data.in_memory": True, "data.ram_budget": "64KiB"})
    with pytest.raises(BudgetExceeded, match=r"--in-memory: the .* training steps need") as error:
        run_train(cfg, monitor)
    assert "--no-in-memory" in error.value.hint and error.value.available == 64 * 1024
    assert error.value.exit_code == 2
    # Refused in the preflight: nothing was loaded and no model was built.
    assert [phase.name for phase in monitor.report.phases] == ["preflight"]


def test_streams_when_the_buffer_does_not_fit_and_says_why(tiny_data, tmp_path):
    flags = {"data.ram_budget": "64KiB", "train.steps": 2}
    result = run_train(_cfg(tiny_data, tmp_path / "run", **flags), MemoryMonitor())
    assert result.fields["clip_source"] == "stream"
    assert "more than --ram-budget (64.00 KiB)" in result.notes[-1]


def test_max_steps_keeps_the_newest_whole_episodes():
    lengths = np.array([30, 40, 25, 35])
    assert newest_episodes(lengths, range(4), None).tolist() == [0, 1, 2, 3]
    assert newest_episodes(lengths, range(4), 60).tolist() == [2, 3]
    assert newest_episodes(lengths, range(4), 100).tolist() == [1, 2, 3]
    assert newest_episodes(lengths, [0, 1, 2], 70).tolist() == [1, 2]
    with pytest.raises(UsageError, match="holds no whole episode"):
        newest_episodes(lengths, range(4), 20)
