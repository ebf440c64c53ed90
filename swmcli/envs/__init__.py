"""Environments for swm: the built-in swm/TwoRoom-v0 and any gymnasium id, as pixel envs.

``make_env`` gives a gymnasium env whose observations are dicts with at least ``pixels``
(resolution, resolution, 3) uint8. Importing this package registers ``swm/TwoRoom-v0`` with
gymnasium (which costs about 0.15 s of import, so the CLI imports it inside its commands).
"""

from __future__ import annotations

import re
from contextlib import contextmanager

import gymnasium as gym
import numpy as np

from swmcli.errors import UsageError, first_line

TWOROOM_ID = "swm/TwoRoom-v0"
MIN_RESOLUTION = 16


def register() -> None:
    """Register swm/TwoRoom-v0 with gymnasium; calling it again does nothing."""
    if TWOROOM_ID not in gym.envs.registry:
        gym.register(id=TWOROOM_ID, entry_point="swmcli.envs.tworoom:TwoRoomEnv")


register()


def make_env(env_id: str, resolution: int, max_episode_steps: int, seed: int | None = None):
    """A gymnasium env for ``env_id`` whose observations are ``{"pixels", ...}`` dicts.

    TwoRoom renders natively at ``resolution``; any other id is made with
    ``render_mode="rgb_array"`` and its frames resized. Episodes are truncated after
    ``max_episode_steps``. The env is reset once with ``seed`` (and its action space seeded) so a
    missing renderer fails here, before any collection, and the episode stream is reproducible.
    """
    if resolution < MIN_RESOLUTION:
        raise UsageError(
            f"resolution {resolution} is too small",
            hint=f"use --resolution {MIN_RESOLUTION} or more (64 and 224 are the usual sizes)",
        )
    _check_frame_memory(resolution)
    with _usage_errors(env_id):
        if env_id == TWOROOM_ID:
            env = gym.make(
                env_id,
                resolution=resolution,
                render_mode="rgb_array",
                max_episode_steps=max_episode_steps,
            )
        else:
            inner = gym.make(env_id, render_mode="rgb_array", max_episode_steps=max_episode_steps)
            env = PixelObservation(inner, resolution)
        env.reset(seed=seed)
        env.action_space.seed(seed)
    return env


# Frames alive while rendering one step: the static background, the frame, masks and a resize.
_FRAMES_WHILE_RENDERING = 8


def _check_frame_memory(resolution: int) -> None:
    """Refuse a resolution whose frames alone the host cannot hold, before anything is drawn."""
    from swmcli.errors import BudgetExceeded
    from swmcli.memory.measure import available_host_bytes
    from swmcli.units import format_bytes

    needed = _FRAMES_WHILE_RENDERING * resolution * resolution * 3
    available = available_host_bytes()
    if needed > available:
        largest = int((available / (_FRAMES_WHILE_RENDERING * 3)) ** 0.5)
        raise BudgetExceeded(
            f"rendering at resolution {resolution} needs about {format_bytes(needed)} of RAM but "
            f"the host has {format_bytes(available)} available",
            hint=f"use --resolution {largest} or less (64 and 224 are the usual sizes)",
            needed=needed,
            available=available,
        )


def goal_pixels(env) -> np.ndarray:
    """The goal as an image (resolution, resolution, 3) uint8, for planning toward it.

    Only goal-conditioned envs (TwoRoom) have one: the frame with the agent drawn at the goal.
    """
    render_goal = getattr(env.unwrapped, "goal_pixels", None)
    if render_goal is None:
        raise UsageError(
            f"planning needs a goal-conditioned env, and {_env_name(env)} gives no goal image",
            hint=f"evaluate planning on {TWOROOM_ID}",
        )
    return render_goal()


def has_goal_image(env) -> bool:
    """Whether ``env`` gives a goal image to plan toward (goal-conditioned envs such as TwoRoom)."""
    return getattr(env.unwrapped, "goal_pixels", None) is not None


def reset_to_recorded(env, state: np.ndarray, goal_state: np.ndarray, seed: int) -> dict:
    """Reset ``env`` with the agent at a recorded ``state`` and the goal at ``goal_state``.

    This is what the dataset protocol of ``swm eval`` needs; only envs that can be set to a
    recorded state (TwoRoom, whose state is the agent's position) support it.
    """
    from swmcli.envs.tworoom import TwoRoomEnv

    if not isinstance(env.unwrapped, TwoRoomEnv):
        raise UsageError(
            f"{_env_name(env)} cannot be set to a recorded state, which --protocol dataset needs",
            hint="use --protocol random-goal (or evaluate on swm/TwoRoom-v0)",
        )
    options = {"start": tuple(state.tolist()), "goal": tuple(goal_state.tolist())}
    observation, _ = env.reset(seed=seed, options=options)
    return observation


def goal_kind(env) -> str:
    """The kind of the current goal as the env names it (TwoRoom: same or other room), or "all"."""
    describe = getattr(env.unwrapped, "goal_kind", None)
    return "all" if describe is None else describe()


class PixelObservation(gym.Wrapper):
    """Turns any ``rgb_array`` env into ``{"pixels", "state"}`` observations at one resolution.

    ``pixels`` is ``env.render()`` resized (bilinear) to resolution x resolution; ``state`` is the
    original observation, flattened to float32, when that is a Box (absent otherwise).
    """

    def __init__(self, env: gym.Env, resolution: int):
        super().__init__(env)
        self.resolution = resolution
        spaces = {"pixels": gym.spaces.Box(0, 255, (resolution, resolution, 3), np.uint8)}
        original = env.observation_space
        self._has_state = isinstance(original, gym.spaces.Box)
        if self._has_state:
            spaces["state"] = gym.spaces.Box(
                original.low.reshape(-1).astype(np.float32),
                original.high.reshape(-1).astype(np.float32),
                dtype=np.float32,
            )
        self.observation_space = gym.spaces.Dict(spaces)

    def reset(self, **kwargs):
        """Reset the wrapped env and observe its first frame."""
        observation, info = self.env.reset(**kwargs)
        return self._observe(observation), info

    def step(self, action):
        """Step the wrapped env and observe its new frame."""
        observation, reward, terminated, truncated, info = self.env.step(action)
        return self._observe(observation), reward, terminated, truncated, info

    def render(self):
        """The wrapped env's frame at the chosen resolution."""
        return self._pixels()

    def _pixels(self) -> np.ndarray:
        from PIL import Image

        frame = self.env.render()
        if frame is None or np.ndim(frame) != 3 or np.shape(frame)[2] not in (3, 4):
            raise UsageError(
                f"{_env_name(self)} did not render an RGB frame",
                hint="use an env that supports render_mode='rgb_array'",
            )
        image = Image.fromarray(np.asarray(frame, np.uint8)[..., :3])
        if image.size != (self.resolution, self.resolution):
            image = image.resize((self.resolution, self.resolution), Image.BILINEAR)
        return np.asarray(image)

    def _observe(self, observation) -> dict[str, np.ndarray]:
        result = {"pixels": self._pixels()}
        if self._has_state:
            result["state"] = np.asarray(observation, np.float32).reshape(-1)
        return result


@contextmanager
def _usage_errors(env_id: str):
    """Turns gymnasium's failures to make or render ``env_id`` into one-line UsageErrors."""
    try:
        yield
    except gym.error.DependencyNotInstalled as error:
        raise UsageError(
            f"{env_id} needs a package that is not installed: {first_line(error)}",
            hint=_pip_hint(str(error)),
        ) from error
    except ImportError as error:
        package = _missing_module(error)
        raise UsageError(
            f"{env_id} needs the Python module {package!r}, which is not installed",
            hint=f"pip install {package}",
        ) from error
    except (gym.error.UnregisteredEnv, gym.error.DeprecatedEnv) as error:
        raise UsageError(
            f"unknown gymnasium env {env_id!r}: {first_line(error)}",
            hint='list the ids with: python -c "import gymnasium; '
            'print(list(gymnasium.envs.registry))"',
        ) from error
    except gym.error.Error as error:
        raise UsageError(
            f"cannot make {env_id}: {first_line(error)}",
            hint="the env must support render_mode='rgb_array'",
        ) from error


def _pip_hint(message: str) -> str:
    """The ``pip install ...`` line gymnasium's message names, or a generic one."""
    match = re.search(r"pip install (\"[^\"]+\"|'[^']+'|\S+)", message)
    if match:
        return f"pip install {match.group(1).strip('`')}"
    return "install the package named above with pip"


def _missing_module(error: ImportError) -> str:
    """The top-level module an import failed on (gymnasium re-raises without ``name``)."""
    name = error.name or getattr(error.__cause__, "name", None)
    if not name:
        match = re.search(r"No module named '([^']+)'", str(error))
        name = match.group(1) if match else "the missing module"
    return name.split(".")[0]


def _env_name(env) -> str:
    spec = getattr(env, "spec", None)
    return spec.id if spec is not None else type(env.unwrapped).__name__
