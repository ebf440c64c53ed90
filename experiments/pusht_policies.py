"""Reproduces docs/reports/pusht.md, table 'The data', rows 'the pusher' and 'random actions'.

Does the data's policy push the block? swm's Push-T pusher (``--policy expert``) against
random actions on gym-pusht, on the same seeds.

    PYTHONPATH=. python experiments/pusht_policies.py [--episodes 20] [--steps 100]

Per policy: the share of episodes in which the block moves (its path longer than 10 px), its mean
path per episode, its mean displacement over 25 steps (the dataset protocol's goal offset: how far
a goal is from its start), and env steps per second (one process). Needs ``swmcli[pusht]``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from swmcli.envs.make import make_env
from swmcli.envs.policies import make_policy

PUSHT = "gym_pusht:gym_pusht/PushT-v0"
MOVED = 10.0  # px of block path
OFFSET = 25  # the dataset protocol's goal offset


def block_paths(policy: str, episodes: int, steps: int) -> tuple[np.ndarray, float]:
    """Per episode (block path, mean displacement over OFFSET steps), and env steps per second."""
    env = make_env(
        PUSHT, 64, steps, seed=0, kwargs={"observation_width": 64, "observation_height": 64}
    )
    rows, count, start = [], 0, time.perf_counter()
    for seed in range(episodes):
        act = make_policy(policy, env, seed)
        observation, _ = env.reset(seed=seed)
        blocks = [observation["state"][2:4]]
        done = False
        while not done:
            observation, _, terminated, truncated, _ = env.step(act(observation))
            blocks.append(observation["state"][2:4])
            done, count = terminated or truncated, count + 1
        blocks = np.array(blocks)
        path = np.linalg.norm(np.diff(blocks, axis=0), axis=1).sum()
        ahead = np.linalg.norm(blocks[OFFSET:] - blocks[:-OFFSET], axis=1).mean()
        rows.append((path, ahead))
    env.close()
    return np.array(rows), count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    print(f"{args.episodes} episodes of {args.steps} steps, seeds 0-{args.episodes - 1}")
    print("policy  | block moves | path/episode | displacement over 25 steps | steps/s")
    for policy in ("expert", "random"):
        rows, rate = block_paths(policy, args.episodes, args.steps)
        moved = int((rows[:, 0] > MOVED).sum())
        print(
            f"{policy:7} | {moved}/{args.episodes:<9} | {rows[:, 0].mean():9.0f} px |"
            f" {rows[:, 1].mean():23.0f} px | {rate:7.0f}"
        )


if __name__ == "__main__":
    main()
