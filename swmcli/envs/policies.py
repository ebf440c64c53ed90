"""Policies for collection: ``random`` (any env), the env's noisy ``expert`` (TwoRoom's, and
those of the env plugins that ship one), and ``module:factory``, a callable of your own.

A policy is a plain callable from one observation dict to one action array, seeded at creation.
``module:factory`` names a function ``factory(env, seed)`` that returns such a callable; ``env``
is the env as swm wraps it (``{"pixels", "state", ...}`` observations, bounded Box actions
rescaled to [-1, 1]).
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable

import numpy as np

from swmcli.errors import UsageError

POLICIES = ("random", "expert")
DOOR_APPROACH = 0.1  # the expert lines up this far in front of the door, on either side
DOOR_ALIGNED = 0.04  # |y - door centre| under which the expert heads straight through


def make_policy(name: str, env, seed: int, *, noise: float = 0.3) -> Callable[[dict], np.ndarray]:
    """A seeded policy ``observation -> action`` for ``env``.

    ``random`` samples the env's action space. ``expert`` is the env plugin's scripted expert
    (TwoRoom's steers toward the goal, via the door when the goal is in the other room) with
    noise ``noise`` (action units), so the data holds varied actions. ``module:factory`` is
    ``factory(env, seed)``.
    """
    if name == "random":
        return _random_policy(env, seed)
    if name == "expert":
        return _expert_policy(env, seed, noise)
    if ":" in name:
        return _factory_policy(name, env, seed)
    raise UsageError(
        f"unknown policy {name!r}", hint=f"use one of: {', '.join(POLICIES)}, or module:factory"
    )


def _factory_policy(name: str, env, seed: int) -> Callable[[dict], np.ndarray]:
    """``module:factory``'s policy: ``factory(env, seed)``, checked to be a callable."""
    module_name, _, attribute = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        missing = (error.name or module_name).split(".")[0]
        raise UsageError(
            f"--policy {name}: cannot import {module_name!r} ({error})",
            hint=f"pip install {missing}, or put the module on PYTHONPATH",
        ) from error
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise UsageError(
            f"--policy {name}: {module_name} has no callable {attribute!r}",
            hint="name a function factory(env, seed) that returns observation -> action",
        )
    policy = factory(env, seed)
    if not callable(policy):
        raise UsageError(
            f"--policy {name}: {attribute}(env, seed) returned {type(policy).__name__}, "
            "not a callable",
            hint="the factory must return a function observation -> action",
        )
    return policy


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
    from swmcli.envs.plugins import plugin_for

    expert = plugin_for(env).expert
    if expert is None:
        raise UsageError(
            f"swm has no expert policy for {type(env.unwrapped).__name__} (it has one for "
            "swm/TwoRoom-v0 and gym-pusht's Push-T)",
            hint="use --policy random, or your own --policy module:factory",
        )
    if noise < 0:
        raise UsageError(f"expert noise must be >= 0, got {noise}", hint="try 0.3")
    return expert(env, seed, noise)


def tworoom_expert(env, seed: int, noise: float) -> Callable[[dict], np.ndarray]:
    """TwoRoom's expert: toward the goal (via the door), plus Gaussian ``noise``, clipped."""
    from swmcli.envs.tworoom import MAX_STEP

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
