"""Scripted policies for collection: ``random`` (any env) and a noisy ``expert`` (TwoRoom).

A policy is a plain callable from one observation dict to one action array, seeded at creation.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np

from swmcli.errors import UsageError

POLICIES = ("random", "expert")
DOOR_APPROACH = 0.1  # the expert lines up this far in front of the door, on either side
DOOR_ALIGNED = 0.04  # |y - door centre| under which the expert heads straight through


def make_policy(name: str, env, seed: int, *, noise: float = 0.3) -> Callable[[dict], np.ndarray]:
    """A seeded policy ``observation -> action`` for ``env``.

    ``random`` samples the env's action space. ``expert`` (TwoRoom only) steers toward the goal,
    via the door when the goal is in the other room, with Gaussian noise of standard deviation
    ``noise`` (in action units) added and the result clipped to the action space, so the data
    holds varied actions.
    """
    if name == "random":
        return _random_policy(env, seed)
    if name == "expert":
        return _expert_policy(env, seed, noise)
    raise UsageError(f"unknown policy {name!r}", hint=f"use one of: {', '.join(POLICIES)}")


def _random_policy(env, seed: int) -> Callable[[dict], np.ndarray]:
    # A private copy, so seeding it neither depends on nor disturbs the env's own action space.
    space = copy.deepcopy(env.action_space)
    space.seed(seed)

    def act(observation: dict) -> np.ndarray:
        # The space's own sample: a Discrete space's is a hashable np.int64, which envs such as
        # FrozenLake use as a dict key (a 0-d array is not hashable).
        return space.sample()

    return act


def _expert_policy(env, seed: int, noise: float) -> Callable[[dict], np.ndarray]:
    from swmcli.envs.tworoom import MAX_STEP, TwoRoomEnv

    if not isinstance(env.unwrapped, TwoRoomEnv):
        raise UsageError(
            f"the expert policy only knows swm/TwoRoom-v0, not {type(env.unwrapped).__name__}",
            hint="use --policy random for other envs",
        )
    if noise < 0:
        raise UsageError(f"expert noise must be >= 0, got {noise}", hint="try 0.3")
    rng = np.random.default_rng(seed)

    def act(observation: dict) -> np.ndarray:
        x, y = (float(v) for v in observation["state"])
        goal_x, goal_y = (float(v) for v in observation["goal"])
        target_x, target_y = expert_waypoint(x, y, goal_x, goal_y)
        # Full speed toward the waypoint, slowing only within one step of it; the max-norm
        # keeps the direction when scaling into the action box.
        action = np.array([target_x - x, target_y - y]) / MAX_STEP
        action /= max(1.0, float(np.abs(action).max()))
        action += rng.normal(0.0, noise, size=2)
        return np.clip(action, -1.0, 1.0).astype(np.float32)

    return act


def expert_waypoint(x: float, y: float, goal_x: float, goal_y: float) -> tuple[float, float]:
    """Where the expert heads from (x, y): the goal if it is in the same room, else the door.

    Through the door in two legs: first a point in front of it on the agent's side, then, once
    lined up with it (or already in the doorway), a point in front of it on the far side.
    """
    from swmcli.envs.tworoom import DOOR_Y, LEFT_X_MAX, RIGHT_X_MIN, WALL_X, room_of

    if room_of(x) == room_of(goal_x):
        return goal_x, goal_y
    side = -1.0 if x < WALL_X else 1.0
    in_doorway = LEFT_X_MAX < x < RIGHT_X_MIN
    if in_doorway or abs(y - DOOR_Y) <= DOOR_ALIGNED:
        return WALL_X - side * DOOR_APPROACH, DOOR_Y
    return WALL_X + side * DOOR_APPROACH, DOOR_Y
