"""Reproduces docs/reports/pusht.md, table 'What limits it', row 'the model or the cost'.

The model or the search? For each start row of ``swm eval``'s dataset protocol, the model's
cost of the recorded actions that led from the start to the goal, beside the cost of the first
plan the run's planner finds from the same start.

    PYTHONPATH=. python experiments/plan_or_model.py RUN [--set KEY=VALUE ...]

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
from swmcli.envs.make import make_env
from swmcli.envs.plugins import restore_recorded
from swmcli.models.rollout import encode_observation
from swmcli.models.runner import make_runner
from swmcli.planning.goals import goal_episodes
from swmcli.planning.planners import PLANNERS, latent_costs, plan_costs, planner_settings


def first_plan_costs(run: Path, cfg: SwmConfig, play: bool = False) -> list[dict]:
    """Per start row of the dataset protocol (``cfg``: the run's), in ``swm eval``'s order:
    ``model``, the cost under the model of (the planner's first plan, the recorded actions over
    the same horizon); with ``play``, also ``env``, their costs from the observations the env
    reached, ``reached``, whether each reached the goal, and ``env_image``, the image's share of
    the distance to the goal after each block (the agent's state left out), per block."""
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
            both = torch.stack([plan, recorded])
            cost = (settings.cost, settings.proprio_weight)
            row = {"model": plan_costs(model, latent, goal_latent, both, *cost).tolist()}
            if play:
                played = [_play(cfg, shape, episode, blocks, runner, keys) for blocks in both]
                reached = torch.stack([encode_observation(model, seen) for seen, _ in played])
                row["env"] = latent_costs(model, reached, goal_latent, *cost).tolist()
                # The image's share of the distance after each block (the agent's state left out).
                image = [
                    latent_costs(model, reached[:, :end], goal_latent, "terminal", 0.0)
                    for end in range(1, settings.horizon + 1)
                ]
                row["env_image"] = torch.stack(image).tolist()
                row["reached"] = [hit for _, hit in played]
            costs.append(row)
    reader.close()
    return costs


def _play(cfg: SwmConfig, shape: dict, episode, blocks: torch.Tensor, runner, keys: list[str]):
    """``blocks`` run in the env from the episode's restored start: (the observations after each
    block, batched on the device; whether the goal was reached on the way)."""
    seed = episode.seed
    env = make_env(cfg.env.id, shape["resolution"], cfg.env.max_episode_steps, seed, cfg.env.kwargs)
    env, observation = restore_recorded(env, episode.state, episode.goal_state, seed)
    seen, reached = [], False
    for block in blocks.float().cpu().numpy():
        for action in block.reshape(-1, shape["action_dim"]):
            observation, _, _, _, info = env.step(action)
            reached = reached or bool(info.get("success"))
        seen.append(observation)
    env.close()
    batch = {key: np.stack([observation[key] for observation in seen]) for key in keys}
    return runner.to_device(batch), reached


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    parser.add_argument("--play", action="store_true", help="also run both in the env")
    args = parser.parse_args()
    cfg = load_run_config(args.run, sets=args.overrides)  # as `swm eval RUN --set` resolves it
    rows = first_plan_costs(args.run, cfg, args.play)
    costs = np.array([row["model"] for row in rows])
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
    if args.play:
        console.print(_played_table(rows))
        image = np.median([row["env_image"] for row in rows], axis=0)  # (blocks, 2)
        for i, name in enumerate(("the first plan", "the recorded actions")):
            distances = ", ".join(f"{value:.3g}" for value in image[:, i])
            console.print(f"{name}: the image's distance to the goal after each block: {distances}")
        env = np.array([row["env"] for row in rows])
        console.print(
            f"the recorded actions cost less than the plan in the env in "
            f"{(env[:, 1] < env[:, 0]).sum()}/{len(rows)} rows, under the model in "
            f"{short.sum()}/{len(rows)}: where the env ranks the plan first, the cost itself "
            "prefers it to a path known to reach the goal"
        )


def _played_table(rows: list[dict]) -> Table:
    """Predicted beside reached costs, and goals reached, for the plan and the recorded actions."""
    predicted, reached = (np.array([row[key] for row in rows]) for key in ("model", "env"))
    hits = np.array([row["reached"] for row in rows])
    table = Table(title=f"The same actions run in the env from the restored start: {len(rows)}")
    columns = (
        "actions",
        "cost under the model (median)",
        "cost in the env (median)",
        "env cost / model cost (median)",
        "goal reached",
    )
    for column in columns:
        table.add_column(column)
    for i, name in enumerate(("the first plan", "the recorded actions")):
        ratio = np.median(reached[:, i] / np.maximum(predicted[:, i], 1e-12))
        medians = (f"{np.median(costs[:, i]):.4g}" for costs in (predicted, reached))
        table.add_row(name, *medians, f"{ratio:.2f}", f"{hits[:, i].sum()}/{len(rows)}")
    return table


if __name__ == "__main__":
    main()
