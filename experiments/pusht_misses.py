"""Reproduces docs/reports/pusht.md, table 'What limits it', row 'the pushes'.

Where a Push-T run's misses lie: ``swm eval`` on the dataset protocol, with the closest
approach to each goal recorded, split by what the goal asks.

    PYTHONPATH=. python experiments/pusht_misses.py RUN [--set KEY=VALUE ...]

Plays ``swm eval RUN`` (its settings, or the ``--set`` given) with gym-pusht's success check
wrapped to record, at every env step, the agent's and the block's distance to the goal state
(arena pixels) and the block's angle to the goal angle (degrees). Then, for the planner and for
random actions on the same start rows: successes among the goals the agent alone can reach (the
block already within the success distance and angle of its goal pose at the start) and among
those that need the block moved, and how close the block came in the misses. Needs
``swmcli[pusht]`` and a run trained on gym-pusht.
"""

from __future__ import annotations

import argparse

import numpy as np
from rich.console import Console
from rich.table import Table

from swmcli.cli.app import app
from swmcli.envs import pusht

restore, reached = pusht.restore, pusht.reached  # gym-pusht's own, wrapped below
episodes: list[list[tuple]] = []  # per env step: pusht.goal_distances and success
kinds: list[str] = []  # per episode: what its goal asks (pusht.goal_asks)


def _restore(env, state, goal_state, seed):
    observation = restore(env, state, goal_state, seed)
    start = env.unwrapped.get_obs()
    episodes.append([(*pusht.goal_distances(start, goal_state), False)])
    kinds.append(pusht.goal_asks(start, goal_state))
    return observation


def _reached(env, terminated, info, goal_state):
    hit = reached(env, terminated, info, goal_state)
    episodes[-1].append((*pusht.goal_distances(env.unwrapped.get_obs(), goal_state), hit))
    return hit


def summary(played: list[np.ndarray], kinds: list[str]) -> dict:
    """Successes by kind of goal, and the block's closest approach in the misses."""
    rows = {"agent alone": [0, 0], "T must move": [0, 0]}
    closest = []
    for steps, kind in zip(played, kinds, strict=True):
        _, block, _, hits = steps.T
        success = bool(hits.any())
        rows[kind][0] += success
        rows[kind][1] += 1
        if not success and kind == "T must move":
            closest.append((block[0], block.min()))
    return {"rows": rows, "closest": np.array(closest).reshape(-1, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    args = parser.parse_args()
    pusht.restore, pusht.reached = _restore, _reached
    try:
        app(["eval", args.run, *[part for item in args.overrides for part in ("--set", item)]])
    except SystemExit as stop:
        if stop.code:
            raise
    played = [np.array(steps, np.float64) for steps in episodes]
    half = len(played) // 2  # the planner's episodes, then random actions on the same starts
    table = Table(title="Push-T goals by what they ask (dataset protocol)")
    columns = ("policy", "goal", "successes", "block at start (median px)", "closest (median px)")
    for column in columns:
        table.add_column(column)
    for policy, part in (("planner", slice(None, half)), ("random actions", slice(half, None))):
        result = summary(played[part], kinds[part])
        for kind, (wins, count) in result["rows"].items():
            misses = result["closest"] if kind == "T must move" else np.zeros((0, 2))
            medians = [f"{np.median(misses[:, i]):.0f}" if len(misses) else "-" for i in (0, 1)]
            table.add_row(policy, kind, f"{wins}/{count}", *medians)
    console = Console(width=120)
    console.print(table)
    console.print(
        "block at start / closest: the block's distance to its goal position at the start and at"
        " its closest, over the misses among goals that need the block moved"
    )


if __name__ == "__main__":
    main()
