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
import importlib.util
from collections.abc import Callable

import numpy as np

from swmcli.config import CollectConfig
from swmcli.envs.plugins import plugin_for
from swmcli.errors import UsageError, remember_user_file

POLICIES = ("random", "expert")
EXPERT_NOISE = CollectConfig.model_fields["noise"].default  # ``collect.noise``'s default


def make_policy(
    name: str, env, seed: int, *, noise: float = EXPERT_NOISE
) -> Callable[[dict], np.ndarray]:
    """A seeded policy ``observation -> action`` for ``env``.

    ``random`` samples the env's action space. ``expert`` is the env plugin's scripted expert
    (TwoRoom's steers toward the goal, via the door when the goal is in the other room) with
    noise ``noise`` (action units, ``collect.noise``), so the data holds varied actions.
    ``module:factory`` is ``factory(env, seed)``.
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
        spec = importlib.util.find_spec(module_name)
        remember_user_file(spec.origin if spec else None)  # its errors are named as the user's
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

    expert = plugin_for(env).expert
    if expert is None:
        raise UsageError(
            f"swm has no expert policy for {type(env.unwrapped).__name__} (it has one for "
            "swm/TwoRoom-v0, gym-pusht's Push-T and stable-worldmodel's swm/PushT-v1)",
            hint="use --policy random, or your own --policy module:factory",
        )
    if noise < 0:
        raise UsageError(f"expert noise must be >= 0, got {noise}", hint="try 0.3")
    return expert(env, seed, noise)
