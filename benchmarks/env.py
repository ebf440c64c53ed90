"""TwoRoom throughput (env.step + render) and the scripted policies' success rates.

    python3 benchmarks/env.py [--steps 5000] [--episodes 50]

The baseline, measured in the same run, is a bare copy of one frame per step: the least any
renderer has to do. The ratio says how close step + render gets to that floor; the targets (well
over 5,000 steps/s at 64x64 and 1,500 at 224x224 on one core) are printed alongside.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from swmcli.envs.make import TWOROOM_ID, make_env
from swmcli.envs.policies import make_policy

TARGETS = {64: 5_000, 224: 1_500}


def steps_per_second(resolution: int, steps: int) -> float:
    """env.step + env.render per second under uniform random actions."""
    env = make_env(TWOROOM_ID, resolution, max_episode_steps=10**9, seed=0)
    actions = np.random.default_rng(0).uniform(-1, 1, (steps, 2)).astype(np.float32)
    env.step(actions[0])  # warm-up: the first step runs gymnasium's passive checks
    start = time.perf_counter()
    for action in actions:
        env.step(action)
        env.render()
    return steps / (time.perf_counter() - start)


def copies_per_second(resolution: int, steps: int) -> float:
    """The baseline: one plain numpy copy of a (resolution, resolution, 3) uint8 frame per step."""
    frame = np.zeros((resolution, resolution, 3), np.uint8)
    start = time.perf_counter()
    for _ in range(steps):
        frame.copy()
    return steps / (time.perf_counter() - start)


def success_rate(policy_name: str, episodes: int, resolution: int = 64) -> tuple[float, float]:
    """Success rate and mean episode length of a policy over seeded 100-step episodes."""
    env = make_env(TWOROOM_ID, resolution, max_episode_steps=100, seed=0)
    policy = make_policy(policy_name, env, seed=0)
    successes, lengths = 0, []
    for episode in range(episodes):
        observation, _ = env.reset(seed=10_000 + episode)
        length, done = 0, False
        while not done:
            observation, _, terminated, truncated, info = env.step(policy(observation))
            length, done = length + 1, terminated or truncated
        successes += info["success"]
        lengths.append(length)
    return successes / episodes, float(np.mean(lengths))


def main() -> None:
    """Print steps/s against the copy baseline, then the policies' success rates."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5_000)
    parser.add_argument("--episodes", type=int, default=50)
    args = parser.parse_args()
    for resolution, target in TARGETS.items():
        env_rate = steps_per_second(resolution, args.steps)
        copy_rate = copies_per_second(resolution, args.steps)
        print(
            f"TwoRoom {resolution}x{resolution}: {env_rate:,.0f} steps/s "
            f"(target {target:,}: {env_rate / target:.1f}x), frame copy {copy_rate:,.0f}/s, "
            f"ratio {env_rate / copy_rate:.2f}"
        )
    for name in ("expert", "random"):
        rate, length = success_rate(name, args.episodes)
        print(
            f"{name:>6} policy: success {rate:.0%} over {args.episodes} episodes, "
            f"mean length {length:.1f} steps"
        )


if __name__ == "__main__":
    main()
