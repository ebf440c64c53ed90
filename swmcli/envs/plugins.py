"""What swm knows about a kind of env beyond gymnasium's API, one small plugin per kind.

A plugin may say how to draw the env's frame (``frame``), what the agent's own state is
(``proprio``: observed beside the frame, where the env's own observation lacks it), how to set
it back to a recorded state with a recorded goal state (``restore``: what ``swm eval --protocol
dataset`` needs), when that goal is reached (``reached``), and which scripted policy is its
``expert``. swm's own TwoRoom is one plugin; gym-pusht's Push-T is another; an env that follows
stable-worldmodel's convention (its ``reset`` takes ``options={"state", "goal_state"}``, it has
``_set_state`` and ``_set_goal_state``, and its own ``terminated`` fires at the goal, as its
``swm/PushT-v1`` does, whose observation holds ``proprio``) needs no plugin of its own;
``swm/PushT-v1``'s adds its own expert (``WeakPolicy``). Any other env gets the empty plugin:
it is collected, trained on and evaluated open-loop, and ``--protocol dataset`` refuses it in
one line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from swmcli.envs import pusht
from swmcli.envs.tworoom import TwoRoomEnv, tworoom_expert
from swmcli.errors import UsageError


@dataclass(frozen=True)
class EnvPlugin:
    """One kind of env: each part is None where swm has nothing beyond gymnasium's API."""

    name: str
    matches: Callable[[Any], bool]  # env.unwrapped -> whether this plugin is for it
    frame: Callable[[Any], np.ndarray] | None = None  # env.unwrapped -> (H, W, 3) uint8
    restore: Callable[..., Any] | None = None  # (env, state, goal_state, seed) -> raw observation
    reached: Callable[..., bool] | None = None  # (env, terminated, info, goal_state) -> success
    expert: Callable[..., Callable] | None = None  # (env, seed, noise) -> observation -> action
    proprio: Callable[[Any], np.ndarray] | None = None  # env.unwrapped -> the agent's own state
    proprio_size: int = 0  # values ``proprio`` returns


def _is_tworoom(unwrapped) -> bool:

    return isinstance(unwrapped, TwoRoomEnv)


def _tworoom_restore(env, state, goal_state, seed):
    options = {"start": tuple(state.tolist()), "goal": tuple(goal_state.tolist())}
    return env.reset(seed=seed, options=options)[0]


def _tworoom_expert(env, seed: int, noise: float):

    return tworoom_expert(env, seed, noise)


def _follows_stable_worldmodel(unwrapped) -> bool:
    return hasattr(unwrapped, "_set_state") and hasattr(unwrapped, "_set_goal_state")


def _options_restore(env, state, goal_state, seed):
    return env.reset(seed=seed, options={"state": state, "goal_state": goal_state})[0]


def _own_termination(env, terminated: bool, info: dict, goal_state) -> bool:
    return bool(terminated)


def _is_stable_worldmodel_pusht(unwrapped) -> bool:
    return type(unwrapped).__module__.startswith("stable_worldmodel.envs.pusht")


def _weak_policy(env, seed: int, noise: float):
    """stable-worldmodel's own Push-T collection policy (its ``WeakPolicy``: random targets
    kept within 100 pixels of the T), given the vectorized env it expects."""
    from types import SimpleNamespace

    from stable_worldmodel.envs.pusht import WeakPolicy

    policy = WeakPolicy(seed=seed)
    one_env = gym.spaces.Box(-1.0, 1.0, (1, *env.action_space.shape), np.float32)
    policy.set_env(SimpleNamespace(envs=[env], spec=env.spec, action_space=one_env))
    return lambda observation: policy.get_action(observation)[0]


def _is_gym_pusht(unwrapped) -> bool:
    return type(unwrapped).__module__.startswith("gym_pusht")


def _gym_pusht(part: str):
    def call(*args):

        return getattr(pusht, part)(*args)

    return call


PLUGINS = (
    EnvPlugin(
        "swm/TwoRoom-v0",
        _is_tworoom,
        restore=_tworoom_restore,
        reached=lambda env, terminated, info, goal_state: bool(info.get("success")),
        expert=_tworoom_expert,
    ),
    EnvPlugin(
        "gym-pusht",
        _is_gym_pusht,
        frame=_gym_pusht("frame"),
        restore=_gym_pusht("restore"),
        reached=_gym_pusht("reached"),
        expert=_gym_pusht("pusher"),
        proprio=_gym_pusht("proprio"),
        proprio_size=pusht.PROPRIO_SIZE,
    ),
    EnvPlugin(
        "swm/PushT-v1",
        _is_stable_worldmodel_pusht,
        restore=_options_restore,
        reached=_own_termination,
        expert=_weak_policy,
    ),
    EnvPlugin(
        "stable-worldmodel convention",
        _follows_stable_worldmodel,
        restore=_options_restore,
        reached=_own_termination,
    ),
)
NO_PLUGIN = EnvPlugin("gymnasium", lambda unwrapped: True)


def plugin_for(env) -> EnvPlugin:
    """The plugin of ``env``'s kind (the empty one when swm knows nothing more about it)."""
    unwrapped = env.unwrapped
    return next((plugin for plugin in PLUGINS if plugin.matches(unwrapped)), NO_PLUGIN)


def can_restore(env) -> bool:
    """Whether ``env`` can be set to a recorded state (what ``--protocol dataset`` needs)."""
    plugin = plugin_for(env)
    return plugin.restore is not None and plugin.reached is not None


def check_restorable(env) -> None:
    """Refuse, in one line, an env that cannot be set to a recorded state."""
    if not can_restore(env):
        raise UsageError(
            f"{env_name(env)} cannot be set to a recorded state, which --protocol dataset needs",
            hint="use --protocol random-goal, or an env swm can restore (swm/TwoRoom-v0, "
            "gym-pusht, or one with stable-worldmodel's state/goal_state reset options)",
        )


def restore_recorded(env, state: np.ndarray, goal_state: np.ndarray, seed: int):
    """``env`` set to a recorded ``state`` aiming at ``goal_state``: (env, first observation).

    The returned env reports ``info["success"]`` and ends the episode when the env's plugin says
    the goal is reached (for stable-worldmodel's envs: their own ``terminated``).
    """
    check_restorable(env)
    plugin = plugin_for(env)
    raw = plugin.restore(env, state, goal_state, seed)
    observation = env.observe(raw) if hasattr(env, "observe") else raw
    return RecordedGoal(env, plugin, goal_state), observation


class RecordedGoal(gym.Wrapper):
    """An episode aimed at a recorded goal state: success (``info["success"]``, ``terminated``)
    is the plugin's ``reached``, whatever else the env's own termination means."""

    def __init__(self, env, plugin: EnvPlugin, goal_state: np.ndarray):
        super().__init__(env)
        self.plugin, self.goal_state = plugin, goal_state

    def step(self, action):
        """Step the env; success when the plugin says the recorded goal is reached."""
        observation, reward, terminated, truncated, info = self.env.step(action)
        success = self.plugin.reached(self.env, terminated, info, self.goal_state)
        return observation, reward, success, truncated, {**info, "success": success}


def env_name(env) -> str:
    """The env's registered id, else its class name (for messages)."""
    spec = getattr(env, "spec", None)
    return spec.id if spec is not None else type(env.unwrapped).__name__
