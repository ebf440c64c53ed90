"""What `swm eval --compile` compiles for a recurrent model: once, in the warm-up, any horizon.

    python3 benchmarks/eval_compile.py                 # the RSSM of tests/models at 32x32
    python3 benchmarks/eval_compile.py --horizons 1 2 3 4 5 6 --samples 32

The RSSM's ``encode`` and ``predict`` are compiled as ``swm eval --compile`` compiles them
(``Runner.prepare``) and warmed up as eval warms them up (``evaluate.warm_up``); then the planner
plans from a frame at each horizon in turn (one plan each, the tiny preset's CEM). Two rows, the
same model:

- ``carried``: the model itself; swm carries its state, every ``predict`` call has one position;
- ``stateless``: the model seen without ``initial_state``: ``predict`` is given 1, 2, ... H + 1
  positions, and its loop over positions is compiled again for each length.

Each row gives the seconds of the warm-up (where compilation belongs), the graphs torch.compile
made there, then the seconds and graphs of planning every horizon after it (0 graphs: nothing was
compiled again).
"""

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
RSSM = f"{ROOT / 'tests' / 'models' / 'rssm_world_model.py'}:build"


def graphs() -> int:
    """Graphs torch.compile has made in this process so far."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def measured(view, cfg, runner, shape, horizons, frame) -> dict:
    """Warm-up seconds and graphs, then planning's over every horizon, for the compiled ``view``."""
    from recurrent_planning import planner

    from swmcli.commands.evaluate import warm_up

    runner.prepare(view)
    row = {}
    with runner.inference(view):  # eval's frames are made here: inference tensors
        frame = frame.clone()
        before, began = graphs(), time.perf_counter()
        warm_up(view, shape, runner)
        row["warm-up s"], row["warm-up graphs"] = time.perf_counter() - began, graphs() - before
        before, began = graphs(), time.perf_counter()
        for horizon in horizons:
            chosen = planner(view, cfg, horizon)
            chosen.reset(frame)
            chosen.act(frame)
        row["planning s"], row["planning graphs"] = time.perf_counter() - began, graphs() - before
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny", help="the planner and frames' preset")
    parser.add_argument("--horizons", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6])
    parser.add_argument("--samples", type=int, help="plans per iteration (default: the preset's)")
    args = parser.parse_args()
    import torch
    from recurrent_planning import stateless_view

    from swmcli.config import resolve_config
    from swmcli.models.interface import load_factory
    from swmcli.models.runner import make_runner

    cfg = resolve_config(args.preset)
    if args.samples:
        cfg = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"samples": args.samples})})
    side, frameskip = cfg.env.resolution, cfg.data.frameskip
    shape = {"resolution": side, "frameskip": frameskip, "action_dim": 2}
    frame = torch.zeros(side, side, 3, dtype=torch.uint8)
    print(f"RSSM at {side}x{side}, {args.preset}'s {cfg.eval.planner} ({cfg.eval.samples} samples "
          f"x {cfg.eval.iterations} iterations); one plan at each horizon {args.horizons}; "
          f"torch {torch.__version__}, {cfg.runtime.cpu_threads} thread(s)")  # fmt: skip
    columns = ["warm-up s", "warm-up graphs", "planning s", "planning graphs"]
    print(f"{'row':>10}" + "".join(f"{name:>17}" for name in columns))
    for row in ("carried", "stateless"):
        torch.manual_seed(0)
        torch._dynamo.reset()
        model = load_factory(RSSM)(2, frameskip, side).eval()
        view = model if row == "carried" else stateless_view(model)
        runner = make_runner(compile=True, cpu_threads=cfg.runtime.cpu_threads)
        values = measured(view, cfg, runner, shape, args.horizons, frame)
        cells = (f"{values[name]:>17.1f}" if name.endswith(" s") else f"{values[name]:>17}"
                 for name in columns)  # fmt: skip
        print(f"{row:>10}" + "".join(cells))


if __name__ == "__main__":
    main()
