"""The tiny pusht-64 run both Push-T test files train (gym-pusht's and stable-worldmodel's):
its settings, and collect + train into a directory. Imported after each file's importorskip."""

from pathlib import Path

from swmcli.commands.collect import run_collect
from swmcli.commands.train import run_train
from swmcli.config import resolve_config
from swmcli.memory.measure import MemoryMonitor

#: Everything but the env's own settings: 5 episodes, 3 steps, a model of a few kB, 3 goals.
TINY = {
    "env.resolution": 32,
    "env.max_episode_steps": 30,
    "collect.episodes": 5,
    "collect.random_episodes": 1,
    "train.steps": 3,
    "train.batch_size": 4,
    "model.cnn_width": 4,
    "model.predictor_depth": 1,
    "model.predictor_dim": 32,
    "data.num_workers": 0,
    "eval.heldout_episodes": 2,
    "eval.episodes": 3,
    "eval.goal_offset": 6,
    "eval.samples": 8,
    "eval.iterations": 1,
    "eval.elites": 2,
    "eval.keep_elites": 1,
}


def collect_and_train(root: Path, settings: dict) -> Path:
    """The pusht-64 preset with ``settings`` collected and trained under ``root``; the run."""
    data = root / "pusht.lance"
    flags = {**settings, "collect.out": data, "data.path": data, "train.out": root / "run"}
    cfg = resolve_config("pusht-64", flags=flags)
    run_collect(cfg, MemoryMonitor())
    run_train(cfg, MemoryMonitor())
    return root / "run"
