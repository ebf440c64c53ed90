"""The model or the search? For each start row of ``swm eval``'s dataset protocol, the model's
cost of the recorded actions that led from the start to the goal, beside the cost of the first
plan the run's planner finds from the same start.

    PYTHONPATH=. python benchmarks/plan_or_model.py RUN [--set KEY=VALUE ...]

The recorded actions reach the goal (it is the state ``goal_offset`` steps on in the same
episode; the comparison needs the horizon in env steps to be the goal offset, as in pusht-64).
Where the planner's plan costs more than they do, the search fell short: a better plan exists
under the model's own cost. Where it costs less, the search did its job and the model's cost
ranks a plan ahead of one known to reach the goal. Needs no env: start and goal are
the recorded rows (frame, and agent state for a model trained with it); ``swm eval`` restores
the same frame, with the agent at rest.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from swmcli.commands.evaluate import load_model
from swmcli.config import SwmConfig, load_run_config
from swmcli.data.clips import fold_actions
from swmcli.data.formats import open_reader
from swmcli.models.rollout import encode_observation
from swmcli.models.runner import make_runner
from swmcli.planning.goals import goal_episodes
from swmcli.planning.planners import PLANNERS, plan_costs, planner_settings


def first_plan_costs(run: Path, cfg: SwmConfig) -> list[tuple[float, float]]:
    """Per start row of the dataset protocol (``cfg``: the run's), in ``swm eval``'s order: (the
    cost of the planner's first plan, the cost of the recorded actions over the same horizon)."""
    runner = make_runner()
    model, state = load_model(run, cfg, runner)
    shape = state["model_args"]
    settings = planner_settings(cfg.eval, shape["action_dim"])
    block, steps = shape["frameskip"] * shape["action_dim"], shape["frameskip"] * settings.horizon
    keys = ["pixels", "proprio"] if cfg.model.proprio else ["pixels"]
    reader = open_reader(cfg.data.path)
    costs = []
    with runner.inference(model):
        for episode in goal_episodes(cfg):
            index, step = episode.source
            rows = reader.read_episode(index, keys=[*keys, "action"])
            if step + steps > len(rows["action"]):
                continue  # the episode ends before the horizon: no recorded plan to compare
            start = {key: rows[key][[step]] for key in keys}
            goal = {"pixels": episode.goal_pixels, "proprio": episode.goal_proprio}
            goal = {key: goal[key][None] for key in keys}
            latent = encode_observation(model, runner.to_device(start))
            goal_latent = encode_observation(model, runner.to_device(goal))
            generator = torch.Generator(device=latent.device).manual_seed(episode.seed)
            mean = torch.zeros(settings.horizon, block, device=latent.device)
            plan = PLANNERS[cfg.eval.planner](model, latent, goal_latent, mean, settings, generator)
            recorded = fold_actions(rows["action"][step : step + steps], settings.horizon)
            recorded = torch.as_tensor(recorded).to(plan)
            both = plan_costs(
                model, latent, goal_latent, torch.stack([plan, recorded]), settings.cost,
                settings.proprio_weight,
            )  # fmt: skip
            costs.append((float(both[0]), float(both[1])))
    reader.close()
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    args = parser.parse_args()
    cfg = load_run_config(args.run, sets=args.overrides)  # as `swm eval RUN --set` resolves it
    costs = np.array(first_plan_costs(args.run, cfg))
    short = costs[:, 0] > costs[:, 1]
    table = Table(title="The planner's first plan against the recorded actions, under the model")
    for column in ("start rows", "search fell short", "the cost misranks", "median cost ratio"):
        table.add_column(column)
    ratio = np.median(costs[:, 0] / np.maximum(costs[:, 1], 1e-12))
    table.add_row(str(len(costs)), str(short.sum()), str((~short).sum()), f"{ratio:.2f}")
    console = Console(width=120)
    console.print(table)
    if cfg.data.frameskip * cfg.eval.horizon != cfg.eval.goal_offset:
        console.print(
            f"the horizon ({cfg.eval.horizon} blocks of {cfg.data.frameskip} steps) is not the "
            f"goal offset ({cfg.eval.goal_offset}): the recorded actions do not end at the goal"
        )
    console.print(
        "search fell short: the recorded actions cost less than the plan found; the cost "
        "misranks: the plan found costs less than actions known to reach the goal; ratio: the "
        "plan's cost over the recorded actions'"
    )


if __name__ == "__main__":
    main()
