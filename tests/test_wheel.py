"""swm as users install it: the wheel and sdist build and pass twine's checks, and the wheel alone,
installed into a fresh virtual environment (not editable), runs the quick start from an empty
directory, so the presets and every data file ship inside it. The same run logs to TensorBoard,
read back here with TensorBoard's own reader. The quick start is the tiny preset's header; every
other preset's header commands (read from the preset file, so a header that drifts fails here)
run from an empty directory of their own too, with tiny overrides appended (``TINY``), and leave
what each command should (datasets with their episodes, checkpoints, pictures).

To stay fast the venv sees this environment's packages (``--system-site-packages``, and those of
the interpreter running the tests: torch, Lance, gym-pusht where installed ...), the wheel goes
in with ``--no-deps``, and the presets' commands run in two processes of one thread each, one
command after another through the function the ``swm`` script calls (a process per command
would import torch and Lance each time); the test checks that the ``swmcli`` the venv imports is
the wheel's, not this checkout.
"""

import itertools
import json
import os
import shlex
import site
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from preset_headers import header_commands

from swmcli.config import preset_names, resolve_config
from swmcli.data.formats import open_reader

ROOT = Path(__file__).parents[1]
# What each command gets appended to its header's flags (the last flag given wins): a few short
# episodes, one step of a small batch on a one-layer model (eager), one episode of a tiny
# planner, one held-out episode.
TINY = {
    "collect": ["--episodes", "3", "--set", "env.max_episode_steps=40"],
    "merge": ["--heldout", "1"],
    "train": ["--steps", "1", "--batch-size", "2", "--eager", "--set", "eval.heldout_episodes=1",
              "--set", "data.num_workers=0", "--set", "model.vit_depth=1",
              "--set", "model.predictor_depth=1"],
    "eval": ["--episodes", "1", "--samples", "4", "--iterations", "1", "--elites", "2",
             "--set", "eval.keep_elites=0", "--goal-offset", "5", "--step-budget", "10"],
    "memprofile": ["--set", "model.vit_depth=1", "--set", "model.predictor_depth=1"],
}  # fmt: skip
# What a preset's model factory takes to be as small (TINY's model.* settings shape swm's own
# model): LeWM with one ViT layer and one predictor layer.
FACTORY_TINY = {"swmcli.zoo.lewm:build": ["--set", "model.kwargs.vit=[192, 1, 3]", "--set",
                                           "model.kwargs.depth=1"]}  # fmt: skip


def tiny(name: str, kind: str) -> list[str]:
    """``TINY``'s arguments for a ``kind`` command of preset ``name``, with its factory's."""
    small = FACTORY_TINY.get(resolve_config(name).model.factory or "", [])
    return [*TINY[kind], *(small if kind in ("train", "memprofile") else [])]


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
    # The packages of the interpreter running the tests (a venv of its own, say, with gym-pusht)
    # after the venv's own: the wheel's swmcli still comes first.
    purelib = run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=home)
    Path(purelib.stdout.strip(), "_tests_site.pth").write_text("\n".join(site.getsitepackages()))
    (wheel,) = dist.glob("*.whl")
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps"]
    run(*pip, "--force-reinstall", "--no-warn-script-location", wheel, cwd=home)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # not this checkout
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    work = home / "work"
    work.mkdir()
    # The quick start is the tiny preset's header; its run also logs to TensorBoard.
    logged = ["--logger", "tensorboard"]
    commands = [c + logged * (c[1] == "train") for c in header_commands("tiny")]
    chain = " && ".join(shlex.join(command) for command in commands)
    return {
        "python": python,
        "swm": swm,
        "env": env,
        "venv": venv,
        "home": home,
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
    # Asked from bash, as a user types it: typer names the shell by the process's ancestors (a
    # pytest started by an IDE or a bare process runner has no shell above it).
    script = run("bash", "-c", f"'{swm}' --show-completion; exit $?", cwd=work, env=env).stdout
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


def needs_pusht(name: str) -> bool:
    return resolve_config(name).env.id.startswith("gym_pusht")


# Runs presets' header commands one after another in one process of the venv, each preset in an
# empty directory of its own, through the function the `swm` script calls; prints, as JSON, per
# preset, None or what the first command that failed said.
DRIVER = """
import contextlib, io, json, os, sys
from swmcli.cli.app import main

def failure(commands):
    for args in commands:
        sys.argv, said = ["swm", *args], io.StringIO()
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
            try:
                main()
            except SystemExit as done:
                if done.code:
                    return f"swm {' '.join(args)}: exit {done.code}\\n{said.getvalue()[-3000:]}"

failures = {}
for name, commands in json.loads(sys.argv[1]).items():
    os.mkdir(name)
    os.chdir(name)
    failures[name] = failure(commands)
    os.chdir("..")
print(json.dumps(failures))
"""


@pytest.fixture(scope="module")
def preset_runs(installed) -> dict[str, str | None]:
    """Each preset's header commands with ``TINY`` appended (but tiny's: the quick start
    above), from an empty directory of its own, by the venv's swmcli (``DRIVER``, two
    processes); per preset, None where every command did what it should, else what went
    wrong. Presets whose env is gym-pusht's run where the venv imports ``gym_pusht``."""
    probe = [installed["python"], "-c", "import gym_pusht"]
    pusht = subprocess.run(probe, capture_output=True).returncode == 0
    names = [n for n in preset_names() if n != "tiny" and (pusht or not needs_pusht(n))]
    halves = [names[0::2], names[1::2]]  # alphabetical: the 224-px presets fall in both

    def run_half(half: list[str]) -> dict:
        commands = {n: [[*c[1:], *tiny(n, c[1])] for c in header_commands(n)] for n in half}
        args = [installed["python"], "-c", DRIVER, json.dumps(commands)]
        one_thread = {**installed["env"], "OMP_NUM_THREADS": "1"}  # a core for each process
        done = run(*args, cwd=installed["home"], env=one_thread)
        return json.loads(done.stdout.splitlines()[-1])

    with ThreadPoolExecutor(2) as pool:
        failures = {k: v for half in pool.map(run_half, halves) for k, v in half.items()}
    home = installed["home"]
    return {n: failures[n] or _not_left(home / n, header_commands(n), n) for n in names}


def _option(command: list[str], flag: str) -> str | None:
    return command[command.index(flag) + 1] if flag in command else None


def _episodes(path: Path) -> int:
    """Episodes in the dataset at ``path`` (0 where there is none)."""
    if not path.exists():
        return 0
    reader = open_reader(path)
    try:
        return reader.num_episodes
    finally:
        reader.close()


def _not_left(work: Path, commands: list[list[str]], name: str) -> str | None:
    """What ``commands`` should have left in ``work`` and did not (None: all of it): each
    collect's episodes, each merge's sources' episodes, each train's checkpoint, each eval's
    pictures, each memprofile's picture."""
    cfg, collected = resolve_config(name), {}
    for command in (c for c in commands if c[1] == "collect"):
        out = work / (_option(command, "--out") or cfg.collect.out)
        collected[out] = collected.get(out, 0) + 3
    missing = [f"{n} episodes in {out}" for out, n in collected.items() if _episodes(out) != n]
    for kind, *args in (command[1:] for command in commands):
        paths = list(itertools.takewhile(lambda arg: not arg.startswith("-"), args))
        merged = sum(_episodes(work / source) for source in paths[:-1])
        if kind == "merge" and _episodes(work / paths[-1]) != merged:
            missing.append(f"every episode of {', '.join(paths[:-1])} in {paths[-1]}")
        if kind == "train" and not (work / cfg.train.out / "checkpoint.pt").is_file():
            missing.append(f"{cfg.train.out}/checkpoint.pt")
        if kind == "eval" and not any((work / args[0] / "eval").glob("*_strip.png")):
            missing.append(f"a picture strip in {args[0]}/eval")
        picture = _option(args, "--picture")
        if kind == "memprofile" and picture and not (work / picture).is_file():
            missing.append(picture)
    return "; ".join(missing) or None


@pytest.mark.parametrize("name", [n for n in preset_names() if n != "tiny"])
def test_every_presets_header_runs_from_the_wheel(name, preset_runs):
    if name not in preset_runs:
        pytest.skip(f"preset {name} plays gym-pusht's Push-T: pip install gym-pusht to run it")
    assert preset_runs[name] is None, preset_runs[name]
