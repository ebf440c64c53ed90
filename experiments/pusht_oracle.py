"""Reproduces docs/reports/pusht.md, table 'What limits it', row 'the physics as the model'.

The planner's ceiling on Push-T: the run's planner with gym-pusht's own physics as its model.

    PYTHONPATH=. python experiments/pusht_oracle.py RUN [--samples 100 --iterations 10]
        [--score criterion|latent] [--set ...]

Plays ``swm eval RUN``'s dataset protocol (the same start rows and goals, budget and receding
horizon) with the run's CEM (its samples, iterations, elites, iCEM noise and kept elites, cost
over the trajectory or at its end), but each candidate plan is simulated in the env from the
exact current state (velocities included), and scored after each block by:

- ``criterion`` (the default): the success criterion's own distances to the goal state,
  ``(agent^2 + block^2) / 20^2 + (angle / 20 degrees)^2``, below about 1 inside the success
  region. No model and no pixels: what this planner and budget reach with perfect dynamics.
- ``latent``: the run's own cost: the frame the env draws there (and the agent's state),
  encoded by the run's model, against the goal's latent. Perfect dynamics under the model's
  cost: where this falls short of ``criterion``, the latent cost does; where the run's
  ``swm eval`` falls short of this, its predictor does.

Each plan simulates samples x iterations x horizon env steps in Python, so ``--samples`` and
``--iterations`` default to a ninth of pusht-64's work (100 x 10). Needs ``swmcli[pusht]`` and a
run trained on gym-pusht.
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

import numpy as np
import torch
from pymunk import Vec2d
from rich.console import Console
from rich.table import Table

from swmcli.commands.evaluate import load_model
from swmcli.config import eval_budget, load_run_config
from swmcli.envs import pusht
from swmcli.envs.make import make_env
from swmcli.envs.plugins import restore_recorded
from swmcli.models.rollout import encode_observation
from swmcli.models.runner import make_runner
from swmcli.planning import planners
from swmcli.planning.goals import goal_episodes, wilson_interval
from swmcli.planning.planners import block_costs, latent_costs

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
    """Put ``physics_state``'s bodies back (the angle first: pymunk turns about the centre)."""
    agent, block = env.agent, env.block
    agent.position, agent.velocity = state[0], state[1]
    block.angle, block.position = state[3], state[2]
    block.velocity, block.angular_velocity = state[4], state[5]


def simulate(env, actions: np.ndarray, frameskip: int, observe, every_block: bool) -> list:
    """Play ``actions`` (env steps, arena pixels) with gym-pusht's step, no drawing; then
    ``observe(env)`` after each block of ``frameskip`` steps (only the last: ``every_block``
    False)."""
    substeps = int(1 / (env.dt * env.control_hz))
    ends = []
    for step, action in enumerate(actions):
        target = Vec2d(*action)
        for _ in range(substeps):
            acceleration = env.k_p * (target - env.agent.position) - env.k_v * env.agent.velocity
            env.agent.velocity += acceleration * env.dt
            env.space.step(env.dt)
        last = step == len(actions) - 1
        if (step + 1) % frameskip == 0 and (every_block or last):
            ends.append(observe(env))
    return ends


def state_of(env) -> np.ndarray:
    """``[agent_x, agent_y, block_x, block_y, angle]``, as gym-pusht records it."""
    return np.array([*env.agent.position, *env.block.position, env.block.angle])


def criterion_cost(state: np.ndarray, goal_state: np.ndarray) -> float:
    """The success criterion's distances as one number: below about 1 inside the region."""
    agent, block, angle = pusht.goal_distances(state, goal_state)
    return (agent**2 + block**2) / pusht.SUCCESS_DISTANCE**2 + (angle / pusht.SUCCESS_ANGLE) ** 2


class Criterion:
    """Scores simulated plans by the success criterion's distances to the goal state."""

    every_block = True

    def goal(self, episode):
        return episode.goal_state

    def observe(self, env) -> np.ndarray:
        return state_of(env)

    def costs(self, observed: list[list], goal, cost: str, _weight) -> torch.Tensor:
        per_block = np.array([[criterion_cost(state, goal) for state in row] for row in observed])
        return block_costs(torch.tensor(per_block), cost)


class RunLatent:
    """Scores simulated plans by the run's own cost: the frames reached, encoded by its model."""

    def __init__(self, run: Path, cfg):
        runner = make_runner()
        self.model, _ = load_model(run, cfg, runner)
        self.model.eval()
        self.keys = ["pixels", "proprio"] if cfg.model.proprio else ["pixels"]
        self.every_block = cfg.eval.cost != "terminal"  # drawing is the slow part

    def _encode(self, pixels: np.ndarray, proprio: np.ndarray) -> torch.Tensor:
        observation = {"pixels": torch.as_tensor(pixels), "proprio": torch.as_tensor(proprio)}
        with torch.inference_mode():
            return encode_observation(self.model, {key: observation[key] for key in self.keys})

    def goal(self, episode) -> torch.Tensor:
        return self._encode(episode.goal_pixels[None], episode.goal_proprio[None])

    def observe(self, env) -> tuple[np.ndarray, np.ndarray]:
        return pusht.frame(env), pusht.proprio(env)

    def costs(self, observed: list[list], goal, cost: str, weight: float) -> torch.Tensor:
        count, blocks = len(observed), len(observed[0])
        pixels = np.stack([frame for row in observed for frame, _ in row])
        proprio = np.stack([state for row in observed for _, state in row])
        latents = self._encode(pixels, proprio).reshape(count, blocks, -1)
        return latent_costs(self.model, latents, goal, cost, weight)


def physics_costs(
    env, saved, goal, plans: torch.Tensor, cost: str, weight, state=None, *, score
) -> torch.Tensor:
    """``planners.plan_costs`` with the env as the model: ``saved`` its state (``state``, a
    recurrent model's, is None: the env holds its own), ``goal`` what ``score`` measures against;
    each plan ``(H, frameskip * 2)`` in [-1, 1] simulated from ``saved``."""
    count, _, block = plans.shape
    targets = (plans.numpy().reshape(count, -1, ACTION_DIM) + 1.0) * (pusht.ARENA / 2)
    observed = []
    for actions in targets:
        set_physics_state(env, saved)
        ends = simulate(env, actions, block // ACTION_DIM, score.observe, score.every_block)
        observed.append(ends)
    set_physics_state(env, saved)
    return score.costs(observed, goal, cost, weight)


def plan_in_physics(physics, mean, generator, settings, goal) -> torch.Tensor:
    """CEM's plan from the env's current state, its candidates simulated (``physics_costs``)."""
    return planners.cem(physics, physics_state(physics), goal, mean, settings, generator)


def play(cfg, episode, settings, plan_from, on_step=None) -> bool:
    """One start row: ``plan_from(gym-pusht's env, warm start, generator)`` plans from the
    current state; the first ``replan_every`` blocks run in the env; repeat. With ``on_step``,
    called with gym-pusht's env and each action before it runs, the whole budget is played
    (past a success: what the planner does there is data too)."""
    budget = eval_budget(cfg)
    limit = max(cfg.env.max_episode_steps, budget)
    env = make_env(cfg.env.id, cfg.env.resolution, limit, episode.seed, cfg.env.kwargs)
    env, _ = restore_recorded(env, episode.state, episode.goal_state, episode.seed)
    generator = torch.Generator().manual_seed(episode.seed)
    mean = torch.zeros(settings.horizon, cfg.data.frameskip * ACTION_DIM)
    steps, reached = 0, False
    try:
        while steps < budget:
            blocks_left = -(-(budget - steps) // cfg.data.frameskip)  # no plan past the budget
            plan = plan_from(env.unwrapped, mean[:blocks_left], generator)
            executed = min(settings.replan_every, len(plan))
            mean = torch.cat([plan[executed:], torch.zeros_like(plan[:executed])])
            for action in plan[:executed].reshape(-1, ACTION_DIM).numpy():
                if on_step is not None:
                    on_step(env.unwrapped, action)
                _, _, success, truncated, _ = env.step(action)
                steps += 1
                reached = reached or success
                if (reached and on_step is None) or truncated or steps >= budget:
                    return reached
        return reached
    finally:
        env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--score", choices=["criterion", "latent"], default="criterion")
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    args = parser.parse_args()
    sets = [*args.overrides, f"eval.samples={args.samples}", f"eval.iterations={args.iterations}"]
    cfg = load_run_config(args.run, sets=sets)  # as `swm eval RUN --set` resolves it
    if not cfg.env.id.startswith("gym_pusht:"):
        raise SystemExit(
            f"error: {args.run} plays {cfg.env.id}; the oracle simulates gym-pusht's physics only\n"
            "hint: pass a run trained with --preset pusht-64 (pip install 'swmcli[pusht]')"
        )
    settings = planners.planner_settings(cfg.eval, ACTION_DIM)
    score = Criterion() if args.score == "criterion" else RunLatent(args.run, cfg)
    planners.plan_costs = partial(physics_costs, score=score)  # cem's candidates, simulated
    episodes = goal_episodes(cfg)
    rows = {"agent alone": [0, 0], "T must move": [0, 0]}
    console = Console(width=120)
    for index, episode in enumerate(episodes, 1):
        kind = pusht.goal_asks(episode.state, episode.goal_state)
        plan_from = partial(plan_in_physics, settings=settings, goal=score.goal(episode))
        rows[kind][0] += play(cfg, episode, settings, plan_from)
        rows[kind][1] += 1
        console.print(f"{index}/{len(episodes)}: {rows}", highlight=False)
    table = Table(title="The run's planner with gym-pusht's physics as its model")
    for column in ("samples x iterations", "score", "cost", "goal", "successes", "95% interval"):
        table.add_column(column)
    rows["all"] = [sum(wins for wins, _ in rows.values()), len(episodes)]
    for kind, (wins, count) in rows.items():
        low, high = wilson_interval(wins, count)
        rate = f"{wins}/{count} = {wins / max(count, 1):.0%}"
        budget = f"{settings.samples} x {settings.iterations}"
        table.add_row(budget, args.score, settings.cost, kind, rate, f"{low:.0%}-{high:.0%}")
    console.print(table)


if __name__ == "__main__":
    main()
