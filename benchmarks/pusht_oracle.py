"""The planner's ceiling on Push-T: the run's planner with gym-pusht's own physics as its model.

    PYTHONPATH=. python benchmarks/pusht_oracle.py RUN [--samples 100 --iterations 10] [--set ...]

Plays ``swm eval RUN``'s dataset protocol (the same start rows and goals, budget and receding
horizon) with the run's CEM (its samples, iterations, elites, iCEM noise and kept elites, cost
over the trajectory or at its end), but each candidate plan is scored by simulating it in the
env from the exact current state (velocities included) and measuring the success criterion's
own distances to the goal state: ``(agent^2 + block^2) / 20^2 + (angle / 20 degrees)^2``, the
success region being where it is below 1 (roughly). No world model and no pixels: a model
can do at most this well with this planner and budget, unless its cost ranks plans better than
the criterion does. Each plan simulates samples x iterations x horizon env steps in Python,
so ``--samples`` and ``--iterations`` default to a tenth of pusht-64's work (100 x 10).
Needs ``swmcli[pusht]`` and a run trained on gym-pusht.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from pymunk import Vec2d
from rich.console import Console
from rich.table import Table

from swmcli.config import eval_budget, load_run_config
from swmcli.envs import pusht
from swmcli.envs.make import make_env
from swmcli.envs.plugins import restore_recorded
from swmcli.planning import planners
from swmcli.planning.goals import goal_episodes, wilson_interval

ACTION_DIM = 2


def physics_state(env) -> tuple:
    """Everything gym-pusht's step depends on: the agent's and the block's bodies."""
    agent, block = env.agent, env.block
    return (
        Vec2d(*agent.position),
        Vec2d(*agent.velocity),
        Vec2d(*block.position),
        float(block.angle),
        Vec2d(*block.velocity),
        float(block.angular_velocity),
    )


def set_physics_state(env, state: tuple) -> None:
    agent, block = env.agent, env.block
    agent.position, agent.velocity = state[0], state[1]
    block.angle, block.position = state[3], state[2]
    block.velocity, block.angular_velocity = state[4], state[5]


def simulate(env, actions: np.ndarray, frameskip: int) -> list[np.ndarray]:
    """Play ``actions`` (env steps, arena pixels) with gym-pusht's step, no drawing: the state
    ``[agent_x, agent_y, block_x, block_y, angle]`` after each block of ``frameskip`` steps."""
    substeps = int(1 / (env.dt * env.control_hz))
    ends = []
    for step, action in enumerate(actions):
        target = Vec2d(*action)
        for _ in range(substeps):
            acceleration = env.k_p * (target - env.agent.position) - env.k_v * env.agent.velocity
            env.agent.velocity += acceleration * env.dt
            env.space.step(env.dt)
        if (step + 1) % frameskip == 0:
            ends.append(np.array([*env.agent.position, *env.block.position, env.block.angle]))
    return ends


def criterion_cost(state: np.ndarray, goal_state: np.ndarray) -> float:
    """The success criterion's distances as one number: below about 1 inside the region."""
    agent, block, angle = pusht.goal_distances(state, goal_state)
    return (agent**2 + block**2) / pusht.SUCCESS_DISTANCE**2 + (angle / pusht.SUCCESS_ANGLE) ** 2


def physics_costs(env, saved, goal_state, plans: torch.Tensor, cost: str, _weight) -> torch.Tensor:
    """``planners.plan_costs`` with the env as the model: ``saved`` its state, ``goal_state``
    the goal; each plan ``(H, frameskip * 2)`` in [-1, 1] simulated from ``saved``."""
    count, _, block = plans.shape
    targets = (plans.numpy().reshape(count, -1, ACTION_DIM) + 1.0) * (pusht.ARENA / 2)
    costs = []
    for actions in targets:
        set_physics_state(env, saved)
        ends = simulate(env, actions, block // ACTION_DIM)
        per_block = [criterion_cost(state, goal_state) for state in ends]
        costs.append(per_block[-1] if cost == "terminal" else float(np.mean(per_block)))
    set_physics_state(env, saved)
    return torch.tensor(costs)


def play(cfg, episode, settings, frameskip: int, resolution: int) -> bool:
    """One start row: plan in the physics, run the first ``replan_every`` blocks, repeat."""
    budget = eval_budget(cfg)
    env = make_env(
        cfg.env.id, resolution, max(cfg.env.max_episode_steps, budget), episode.seed, cfg.env.kwargs
    )
    env, _ = restore_recorded(env, episode.state, episode.goal_state, episode.seed)
    physics = env.unwrapped
    generator = torch.Generator().manual_seed(episode.seed)
    mean = torch.zeros(settings.horizon, frameskip * ACTION_DIM)
    steps = 0
    try:
        while steps < budget:
            saved = physics_state(physics)
            plan = planners.cem(physics, saved, episode.goal_state, mean, settings, generator)
            executed = min(settings.replan_every, len(plan))
            mean = torch.cat([plan[executed:], torch.zeros_like(plan[:executed])])
            for action in plan[:executed].reshape(-1, ACTION_DIM).numpy():
                _, _, success, truncated, _ = env.step(action)
                steps += 1
                if success:
                    return True
                if truncated or steps >= budget:
                    return False
        return False
    finally:
        env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    args = parser.parse_args()
    sets = [*args.overrides, f"eval.samples={args.samples}", f"eval.iterations={args.iterations}"]
    cfg = load_run_config(args.run, sets=sets)  # as `swm eval RUN --set` resolves it
    settings = planners.planner_settings(cfg.eval, ACTION_DIM)
    settings.elites = min(settings.elites, settings.samples // 3)
    planners.plan_costs = physics_costs  # cem scores its candidates in the physics
    episodes = goal_episodes(cfg)
    rows = {"agent alone": [0, 0], "block must move": [0, 0]}
    console = Console(width=120)
    for index, episode in enumerate(episodes, 1):
        kind = pusht.goal_asks(episode.state, episode.goal_state)
        rows[kind][0] += play(cfg, episode, settings, cfg.data.frameskip, cfg.env.resolution)
        rows[kind][1] += 1
        console.print(f"{index}/{len(episodes)}: {rows}", highlight=False)
    table = Table(title="The run's planner with gym-pusht's physics as its model")
    for column in ("samples x iterations", "cost", "goal", "successes", "95% interval"):
        table.add_column(column)
    rows["all"] = [sum(wins for wins, _ in rows.values()), len(episodes)]
    for kind, (wins, count) in rows.items():
        low, high = wilson_interval(wins, count)
        rate = f"{wins}/{count} = {wins / max(count, 1):.0%}"
        budget = f"{settings.samples} x {settings.iterations}"
        table.add_row(budget, settings.cost, kind, rate, f"{low:.0%}-{high:.0%}")
    console.print(table)


if __name__ == "__main__":
    main()
