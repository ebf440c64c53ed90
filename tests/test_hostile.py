"""The hostile-input corpus (``tests/hostile.py``), each case run through the CLI in this process:
its exact outcome (refused with its line, or read correctly), never a traceback nor "bug in swm",
and nothing written anywhere under its root but where the command writes."""

import os
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from hostile import CASES, make, swm_data, tree, written_outside
from typer.testing import CliRunner

from swmcli.cli import app

runner = CliRunner()


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_case(name, tmp_path, monkeypatch, capfd):
    root = tmp_path / "root"
    case = make(name, root)
    monkeypatch.chdir(root)
    monkeypatch.syspath_prepend(str(root / "code"))
    for key, value in case.env.items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    before = tree(root)
    result = runner.invoke(app, case.args)
    if "wandb" in sys.modules:  # W&B keeps its settings for the process: the next test's own
        sys.modules["wandb"].teardown()
    output = result.output + capfd.readouterr().err  # what C libraries print reaches fd 2
    assert result.exit_code == case.code, output
    assert case.says in output, output
    assert "bug in swm" not in output and "Traceback" not in output, output
    assert "XDG_RUNTIME_DIR" not in output and "fake_tensor" not in output, output
    assert written_outside(before, tree(root), case.writes) == []
    if case.check is not None:
        case.check(root)


def test_every_case_is_collected():
    assert len(CASES) >= 60 and all("_" not in name for name in CASES)


def test_info_while_a_writer_replaces_its_temporaries(tmp_path):
    """``swm info`` on a dataset whose writer makes and deletes temporary files meanwhile (what
    a collect does) never fails on a file that vanished between the listing and the stat."""
    data = swm_data(tmp_path / "data.lance")
    stop = threading.Event()

    def churn() -> None:
        count = 0
        while not stop.is_set():
            temporary = data / "data" / f".tmp-{count % 7}.lance"
            temporary.write_bytes(b"x" * 4096)
            temporary.unlink()
            count += 1

    writer = threading.Thread(target=churn)
    writer.start()
    try:
        results = [runner.invoke(app, ["info", str(data), "--json"]) for _ in range(20)]
    finally:
        stop.set()
        writer.join()
    assert [r.exit_code for r in results] == [0] * 20, [r.output for r in results if r.exit_code]


def test_load_dataset_raises_swms_documented_errors(tmp_path):
    from swmcli import load_dataset
    from swmcli.errors import SwmError

    hostile = ("export-metadata-hostile", "export-metadata-garbage", "lerobot-shape-huge")
    hostile += ("lerobot-template-width", "lance-step-repeated", "empty-upstream-hdf5")
    for name in hostile:
        root = tmp_path / name
        case = make(name, root)
        source = Path(next(a for a in case.args if str(root / "in") in a))
        with pytest.raises(SwmError):
            load_dataset(source)


def test_an_error_in_user_code_names_the_line(tmp_path, monkeypatch):
    """The innermost frame of the user's file is named, not the torch line under it."""
    case = make("encode-fails-in-torch", tmp_path)
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, case.args)
    (file,) = (tmp_path / "code").glob("*.py")
    lines = file.read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if "mean(-1)" in text)
    assert f"in encode (code{os.sep}{file.name}:{line})" in result.output, result.output


def test_policy_actions_are_recorded_as_executed_for_discrete_spaces():
    import gymnasium as gym

    from swmcli.envs.recording import executed_action
    from swmcli.errors import UsageError

    space = gym.spaces.Discrete(3, start=1)
    assert executed_action(space, np.float32(2.0)) == 2
    for bad in (0, 4, 1.5, "1"):
        with pytest.raises(UsageError, match="cannot take"):
            executed_action(space, bad)
    box = gym.spaces.Box(-1, 1, (2,), np.float32)
    np.testing.assert_array_equal(executed_action(box, [3, -0.5]), [1.0, -0.5])



def test_a_changed_dataset_is_said_by_its_counts_or_its_lengths():
    from swmcli.training.checkpoints import data_fingerprint, fingerprint_change

    then = data_fingerprint([3, 5])
    assert fingerprint_change(then, data_fingerprint([3, 5, 2])) == (
        "2 episodes (8 steps) then, 3 (10 steps) now"
    )
    assert "in episodes of other lengths" in fingerprint_change(then, data_fingerprint([5, 3]))
