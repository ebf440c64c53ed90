"""What carrying a recurrent model's state saves the planner: seconds per env step, both ways.

    python3 benchmarks/recurrent_planning.py                  # tworoom-64's planner, RSSM at 64x64
    python3 benchmarks/recurrent_planning.py --horizons 5 15 --iterations 10

The RSSM of tests/models (a GRUCell deterministic path, Dreamer's sizes scaled down: deter 256,
stoch 32) plans with the preset's CEM (samples, iterations, elites, iCEM noise, frameskip) from
the same frames, two ways, interleaved round by round so that a busy machine loads them alike:

- ``stateless``: the model seen without ``initial_state`` (what a recurrent model written for
  the stateless protocol is): every ``predict`` call rebuilds the cell from zero over the whole
  imagined sequence, 2 + 3 + ... + (H + 1) cell steps per rollout of H blocks;
- ``carried``: the model itself; swm carries its state, H cell steps per rollout.

Each row gives the planner's seconds per env step (one plan per ``replan_every`` blocks of
``frameskip`` env steps), the cell steps per rollout (counted), and the ratio of the two rows.
"""

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RSSM = f"{ROOT / 'tests' / 'models' / 'rssm_world_model.py'}:build"


def stateless_view(model):
    """``model`` without ``initial_state``: swm then calls its stateless encode and predict."""
    from torch import nn

    class Stateless(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def encode(self, pixels):
            return self.model.encode(pixels)

        def predict(self, latents, actions):
            return self.model.predict(latents, actions)

    return Stateless()


def planner(model, cfg, horizon: int):
    """A receding-horizon planner with the preset's settings at ``horizon`` blocks."""
    from swmcli.planning.planners import RecedingHorizon, planner_settings

    settings = planner_settings(cfg.eval.model_copy(update={"horizon": horizon}), 2)
    return RecedingHorizon(model, cfg.eval.planner, settings, 2 * cfg.data.frameskip, seed=0)


def timed(model, cfg, horizon: int, frames, plans: int) -> tuple[float, int]:
    """Seconds per env step over ``plans`` plans, and the cell steps of one rollout."""
    import torch

    steps: list[int] = []
    handle = model_cell(model).register_forward_hook(lambda *_: steps.append(1))
    chosen = planner(model, cfg, horizon)
    planned = []  # cell steps in each plan's search (the frames seen aside)
    search = chosen.plan_once

    def counted(*arguments):
        before = len(steps)
        plan = search(*arguments)
        planned.append(len(steps) - before)
        return plan

    chosen.plan_once = counted
    with torch.inference_mode():
        chosen.reset(frames[0])
        began = time.perf_counter()
        for index in range(plans):
            chosen.act(frames[1 + index % (len(frames) - 1)])
        seconds = time.perf_counter() - began
    handle.remove()
    env_steps = plans * min(cfg.eval.replan_every, horizon) * cfg.data.frameskip
    return seconds / env_steps, planned[0] // cfg.eval.iterations


def model_cell(model):
    return model.model.cell if hasattr(model, "model") else model.cell


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tworoom-64", help="the planner and frames' preset")
    parser.add_argument("--horizons", type=int, nargs="+", default=[5, 15])
    parser.add_argument("--iterations", type=int, help="CEM iterations (default: the preset's)")
    parser.add_argument("--samples", type=int, help="plans per iteration (default: the preset's)")
    parser.add_argument("--plans", type=int, default=3, help="plans per row and round")
    parser.add_argument("--rounds", type=int, default=2, help="rows interleaved this many times")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    import torch

    from swmcli.config import resolve_config
    from swmcli.models.interface import load_factory

    torch.set_num_threads(args.threads)
    cfg = resolve_config(args.preset)
    changed = {"iterations": args.iterations, "samples": args.samples}
    changed = {key: value for key, value in changed.items() if value is not None}
    cfg = cfg.model_copy(update={"eval": cfg.eval.model_copy(update=changed)})
    side = cfg.env.resolution
    torch.manual_seed(0)
    sizes = {"width": 16, "stages": 3, "embed": 256, "deter": 256, "stoch": 32, "hidden": 256}
    model = load_factory(RSSM)(2, cfg.data.frameskip, side, **sizes)
    model.eval()
    frames = torch.randint(0, 256, (args.plans + 1, side, side, 3), dtype=torch.uint8)
    rows = {"stateless": stateless_view(model), "carried": model}
    parameters = sum(p.numel() for p in model.parameters()) / 1e6
    e = cfg.eval
    print(f"RSSM {parameters:.1f} M parameters, {side}x{side}; {args.preset}'s {e.planner}: "
          f"{e.samples} samples x {e.iterations} iterations, frameskip {cfg.data.frameskip}, "
          f"replan every {e.replan_every}; {args.plans} plans x {args.rounds} rounds; "
          f"load {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"{'horizon':>8}{'row':>11}{'s / env step (best)':>22}{'cell steps / rollout':>22}")
    for horizon in args.horizons:
        seconds = {row: [] for row in rows}
        cells = {}
        timed(model, cfg, horizon, frames, 1)  # warm-up
        for _ in range(args.rounds):
            for row, view in rows.items():
                spent, cells[row] = timed(view, cfg, horizon, frames, args.plans)
                seconds[row].append(spent)
        for row in rows:
            print(f"{horizon:>8}{row:>11}{min(seconds[row]):>22.4f}{cells[row]:>22}")
        ratio = min(seconds["stateless"]) / min(seconds["carried"])
        print(f"{horizon:>8}{'':>11}  carried is {ratio:.2f}x faster per env step")


if __name__ == "__main__":
    main()
