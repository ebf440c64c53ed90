"""The experiments of docs/reports/ that run without gym-pusht, at a toy size (the Push-T ones are
tests/test_pusht.py's; experiments/plan_or_model.py is tests/test_eval.py's)."""

import os
import subprocess
import sys

import torch
from repo_scripts import ROOT, run_script

from swmcli.commands.evaluate import load_model
from swmcli.commands.train import run_train
from swmcli.config import load_run_config, resolve_config
from swmcli.memory.measure import MemoryMonitor
from swmcli.models.runner import make_runner
from swmcli.planning.planners import plan_costs


def test_predictor_ensemble_plans_with_the_sum_of_its_members_costs(tiny_data, tmp_path):
    """experiments/predictor_ensemble.py: two predictors on one frozen encoder, one run."""
    first, second, both = tmp_path / "first", tmp_path / "second", tmp_path / "both"
    flags = {"data.path": tiny_data, "train.steps": 10}
    frozen = {"train.init_from": first, "train.freeze": "encoder", "train.seed": 1}
    for out, more in ((first, {}), (second, frozen)):
        cfg = resolve_config("tiny", flags={**flags, **more, "train.out": out})
        run_train(cfg, MemoryMonitor())
    made = run_script("experiments/predictor_ensemble.py", str(both), str(first), str(second))
    assert made.returncode == 0, made.stderr[-2000:]
    assert "2 predictors on one encoder" in made.stdout
    runs = (first, second, both)
    models = [load_model(run, load_run_config(run), make_runner())[0].eval() for run in runs]
    pixels, goal_pixels = torch.randint(0, 256, (2, 1, 32, 32, 3), dtype=torch.uint8)
    plans = torch.randn(5, 3, 2)
    with torch.no_grad():
        costs = [plan_costs(m, m.encode(pixels), m.encode(goal_pixels), plans) for m in models]
    torch.testing.assert_close(costs[2], costs[0] + costs[1])
    assert not torch.allclose(costs[0], costs[1])  # two predictors, not one twice
    done = subprocess.run(  # `swm eval OUT`, as the experiment's docstring says
        [sys.executable, "-m", "swmcli", "eval", str(both), "--episodes", "1"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
