"""swm as users install it: the wheel and sdist build and pass twine's checks, and the wheel alone,
installed into a fresh virtual environment (not editable), runs the quick start from an empty
directory, so the presets and every data file ship inside it. The same run logs to TensorBoard,
read back here with TensorBoard's own reader.

To stay fast the venv sees this environment's packages (``--system-site-packages``: torch,
Lance, ...) and the wheel goes in with ``--no-deps``; the test checks that the ``swmcli`` the venv
imports is the wheel's, not this checkout.
"""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def run(*args, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, f"{args}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The sdist, and the wheel built from it (``python -m build``'s way)."""
    out = tmp_path_factory.mktemp("dist")
    # --no-isolation: hatchling comes with the test extra, so the build needs no network.
    run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, ROOT, cwd=out)
    return out


@pytest.fixture(scope="module")
def installed(dist, tmp_path_factory) -> dict:
    """A fresh venv holding the wheel, and the quick start run by its ``swm`` in an empty dir."""
    home = tmp_path_factory.mktemp("user")
    venv = home / "venv"
    run(sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv, cwd=home)
    python, swm = venv / "bin" / "python", venv / "bin" / "swm"
    (wheel,) = dist.glob("*.whl")
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps"]
    run(*pip, "--force-reinstall", "--no-warn-script-location", wheel, cwd=home)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # not this checkout
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    work = home / "work"
    work.mkdir()
    chain = (
        "swm collect --preset tiny && swm train --preset tiny --logger tensorboard "
        "&& swm eval runs/tiny"
    )
    return {
        "python": python,
        "swm": swm,
        "env": env,
        "venv": venv,
        "work": work,
        "chain": run("bash", "-c", chain, cwd=work, env=env),
    }


def test_wheel_and_sdist_pass_twine_check(dist):
    result = run(sys.executable, "-m", "twine", "check", "--strict", *dist.iterdir(), cwd=dist)
    assert result.stdout.count("PASSED") == 2


def test_the_wheel_ships_the_presets_and_every_data_file(dist):
    (wheel,) = dist.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for preset in (ROOT / "presets").glob("*.toml"):
        assert f"swmcli/presets/{preset.name}" in names
    for path in (ROOT / "swmcli").rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            assert path.relative_to(ROOT).as_posix() in names


def test_the_venv_runs_the_wheel_not_this_checkout(installed):
    where = run(
        installed["python"],
        "-c",
        "import swmcli; print(swmcli.__file__)",
        cwd=installed["work"],
        env=installed["env"],
    ).stdout.strip()
    assert Path(where).is_relative_to(installed["venv"]), where


def test_the_installed_swm_runs_the_quick_start(installed):
    work = installed["work"]
    assert (work / "data" / "tiny.lance").is_dir()
    assert (work / "runs" / "tiny" / "checkpoint.pt").is_file()
    assert "swm eval" in installed["chain"].stdout


def test_version_and_shell_completion(installed):
    from swmcli import __version__

    swm, env, work = installed["swm"], installed["env"], installed["work"]
    assert run(swm, "--version", cwd=work, env=env).stdout.strip() == f"swm {__version__}"
    script = run(swm, "--show-completion", "bash", cwd=work, env=env).stdout
    assert "_SWM_COMPLETE=complete_bash" in script
    # What the installed script asks when a user presses TAB after `swm tr`:
    env = {**env, "_SWM_COMPLETE": "complete_bash", "COMP_WORDS": "swm tr", "COMP_CWORD": "1"}
    assert run(swm, cwd=work, env=env).stdout.split() == ["train"]


def test_tensorboard_holds_the_loss_of_every_logged_step(installed):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = installed["work"] / "runs" / "tiny"
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    logged = {event.step: event.value for event in events.Scalars("train/loss")}
    assert logged == pytest.approx({row["step"]: row["loss"] for row in metrics})
    for key in metrics[-1]:
        if key != "step":
            assert f"train/{key}" in events.Tags()["scalars"], key
    assert {"eval/success_rate", "eval/open_loop_mse_first"} <= set(events.Tags()["scalars"])
    assert {"train/loss_curve", "eval/strip"} <= set(events.Tags()["images"])
