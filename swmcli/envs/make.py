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

from swmcli.envs.plugins import env_name, plugin_for
from swmcli.errors import BudgetExceeded, UsageError, blame_user, first_line, remember_user_file
from swmcli.host import available_host_bytes
from swmcli.units import format_bytes

TWOROOM_ID = "swm/TwoRoom-v0"
MIN_RESOLUTION = 16


def register() -> None:
    """Register swm/TwoRoom-v0 with gymnasium; calling it again does nothing."""
    if TWOROOM_ID not in gym.envs.registry:
        gym.register(id=TWOROOM_ID, entry_point="swmcli.envs.tworoom:TwoRoomEnv")


register()


def make_env(
    env_id: str,
    resolution: int,
    max_episode_steps: int,
    seed: int | None = None,
    kwargs: dict | None = None,
):
    """A gymnasium env for ``env_id`` whose observations are ``{"pixels", ...}`` dicts.

    ``env_id`` is any registered id, or gymnasium's ``module:Id``, which imports ``module`` (that
    registers the env) first; ``kwargs`` go to ``gym.make``. TwoRoom renders natively at
    ``resolution``; any other id is made with ``render_mode="rgb_array"``, its frames resized, and
    a bounded Box action space rescaled to [-1, 1] (what the planners sample). Episodes are
    truncated after ``max_episode_steps``. The env is reset once with ``seed`` (and its action
    space seeded) so a missing renderer fails here, before any collection, and the episode stream
    is reproducible.
    """
    if resolution < MIN_RESOLUTION:
        raise UsageError(
            f"resolution {resolution} is too small",
            hint=f"use --resolution {MIN_RESOLUTION} or more (64 and 224 are the usual sizes)",
        )
    _check_frame_memory(resolution)
    _remember_env_module(env_id)
    with _usage_errors(env_id, kwargs):
        if env_id == TWOROOM_ID:
            env = gym.make(
                env_id,
                resolution=resolution,
                render_mode="rgb_array",
                max_episode_steps=max_episode_steps,
                **(kwargs or {}),
            )
        else:
            quiet_pygame()
            inner = gym.make(
                env_id,
                render_mode="rgb_array",
                max_episode_steps=max_episode_steps,
                **(kwargs or {}),
            )
            remember_env_class(inner)
            _check_renders(inner, env_id)
            env = PixelObservation(_unit_actions(inner), resolution)
        env.reset(seed=seed)
        env.action_space.seed(seed)
    return env


def _remember_env_module(env_id: str) -> None:
    """For ``module:Id``, check its form and note ``module``'s file as the user's code (its
    errors, even while it imports, are then named as theirs)."""
    import importlib.util

    module, sep, name = env_id.rpartition(":")
    if not sep:
        return
    if not name or not all(part.isidentifier() for part in module.split(".")):
        raise UsageError(
            f"--env {env_id!r} is not a gymnasium id nor module:Id",
            hint="e.g. --env CartPole-v1, or --env my_package.envs:MyEnv-v0",
        )
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return  # gymnasium says it, as for any missing module
    remember_user_file(spec.origin if spec else None)


def remember_env_class(env) -> None:
    """Note the file of ``env``'s class as the user's code, unless gymnasium or swm wrote it."""
    import contextlib
    import inspect

    module = type(env.unwrapped).__module__.split(".")[0]
    if module not in ("gymnasium", "swmcli"):
        with contextlib.suppress(TypeError):  # a class defined in C has no file
            remember_user_file(inspect.getfile(type(env.unwrapped)))


def quiet_pygame() -> None:
    """Envs drawn with pygame (gymnasium's classic control) initialise its display and audio,
    which print 'error: XDG_RUNTIME_DIR is invalid' on a machine without a desktop: swm draws
    off-screen (rgb_array), so they get SDL's dummy drivers unless the user chose others."""
    import os

    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")


def _check_renders(env, env_id: str) -> None:
    """Refuse an env that cannot draw ``rgb_array`` frames, before anything is stepped."""
    modes = env.unwrapped.metadata.get("render_modes", [])
    if "rgb_array" not in modes:
        env.close()
        raise UsageError(
            f"{env_id} has no rgb_array rendering (its render modes: {list(modes) or 'none'}), "
            "and swm learns from pixels",
            hint="use an env whose metadata lists 'rgb_array' among its render_modes",
        )


def _unit_actions(env):
    """``env`` with a bounded Box action space other than [-1, 1] rescaled to [-1, 1]."""
    space = env.action_space
    if not isinstance(space, gym.spaces.Box) or not space.is_bounded():
        return env
    if np.all(space.low == -1.0) and np.all(space.high == 1.0):
        return env
    ones = np.ones(space.shape, space.dtype)
    return gym.wrappers.RescaleAction(env, -ones, ones)


# Frames alive while rendering one step: the static background, the frame, masks and a resize.
_FRAMES_WHILE_RENDERING = 8


def _check_frame_memory(resolution: int) -> None:
    """Refuse a resolution whose frames alone the host cannot hold, before anything is drawn."""
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
            f"planning needs a goal-conditioned env, and {env_name(env)} gives no goal image",
            hint=f"evaluate planning on {TWOROOM_ID}",
        )
    return render_goal()


def has_goal_image(env) -> bool:
    """Whether ``env`` gives a goal image to plan toward (goal-conditioned envs such as TwoRoom)."""
    return getattr(env.unwrapped, "goal_pixels", None) is not None


def goal_kind(env) -> str:
    """The kind of the current goal as the env names it (TwoRoom: same or other room), or "all"."""
    describe = getattr(env.unwrapped, "goal_kind", None)
    return "all" if describe is None else describe()


class PixelObservation(gym.Wrapper):
    """Turns any ``rgb_array`` env into ``{"pixels", "state", ...}`` observations at one resolution.

    ``pixels`` is the env's frame (``env.render()``, or the frame its plugin draws) resized
    (bilinear) to resolution x resolution. A Box observation is kept as ``state``, flattened to
    float32; a Dict of Boxes keeps each of its keys so (``pixels`` excepted); ``proprio``, the
    agent's own state, is added where the env's plugin reads it (gym-pusht). That is what the
    dataset records per step, and what the dataset protocol sets the env back to.
    """

    def __init__(self, env: gym.Env, resolution: int):
        super().__init__(env)

        self.resolution = resolution
        plugin = plugin_for(env)
        self._draw = plugin.frame
        spaces = {"pixels": gym.spaces.Box(0, 255, (resolution, resolution, 3), np.uint8)}
        self._vectors = _vector_spaces(env.observation_space)
        for key, space in self._vectors.items():
            spaces[key] = gym.spaces.Box(
                space.low.reshape(-1).astype(np.float32),
                space.high.reshape(-1).astype(np.float32),
                dtype=np.float32,
            )
        self._proprio = None if "proprio" in spaces else plugin.proprio
        if self._proprio is not None:
            spaces["proprio"] = gym.spaces.Box(-np.inf, np.inf, (plugin.proprio_size,), np.float32)
        self.observation_space = gym.spaces.Dict(spaces)

    def reset(self, **kwargs):
        """Reset the wrapped env and observe its first frame."""
        observation, info = self.env.reset(**kwargs)
        return self.observe(observation), info

    def step(self, action):
        """Step the wrapped env and observe its new frame."""
        observation, reward, terminated, truncated, info = self.env.step(action)
        return self.observe(observation), reward, terminated, truncated, info

    def render(self):
        """The wrapped env's frame at the chosen resolution."""
        return self._pixels()

    def _pixels(self) -> np.ndarray:
        from PIL import Image

        frame = self.env.render() if self._draw is None else self._draw(self.env.unwrapped)
        if frame is None or np.ndim(frame) != 3 or np.shape(frame)[2] not in (3, 4):
            raise UsageError(
                f"{env_name(self)} did not render an RGB frame",
                hint="use an env that supports render_mode='rgb_array'",
            )
        image = Image.fromarray(np.asarray(frame, np.uint8)[..., :3])
        if image.size != (self.resolution, self.resolution):
            image = image.resize((self.resolution, self.resolution), Image.BILINEAR)
        return np.array(image)  # a writable copy: PIL's own buffer is read-only (torch warns)

    def observe(self, observation) -> dict[str, np.ndarray]:
        """The dict observation of the wrapped env's ``observation`` and its current frame."""
        result = {"pixels": self._pixels()}
        for key in self._vectors:
            value = (
                observation
                if key == "state" and not isinstance(observation, dict)
                else (observation[key])
            )
            result[key] = np.asarray(value, np.float32).reshape(-1)
        if self._proprio is not None:
            result["proprio"] = self._proprio(self.env.unwrapped)
        return result


def _vector_spaces(space) -> dict[str, gym.spaces.Box]:
    """The Box parts of an observation space by the key swm stores them under."""
    if isinstance(space, gym.spaces.Box):
        return {"state": space}
    if isinstance(space, gym.spaces.Dict):
        return {
            key: part
            for key, part in space.spaces.items()
            if isinstance(part, gym.spaces.Box) and key != "pixels" and len(part.shape) <= 1
        }
    return {}


@contextmanager
def _usage_errors(env_id: str, kwargs: dict | None = None):
    """Turns gymnasium's failures to make or render ``env_id`` into one-line UsageErrors."""
    try:
        yield
    except TypeError as error:
        if not kwargs or "argument" not in str(error) or blame_user(error) is not None:
            raise
        raise UsageError(
            f"{env_id} does not take env.kwargs {kwargs}: {first_line(error)}",
            hint="give only the keyword arguments its constructor takes (swm sets render_mode, "
            "max_episode_steps and TwoRoom's resolution itself)",
        ) from error
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
    """The ``pip install ...`` lines gymnasium's message names (in order), or a generic one."""
    packages = re.findall(r"pip install (\"[^\"]+\"|'[^']+'|\S+)", message)
    if packages:
        return " && ".join(f"pip install {package.strip('`')}" for package in packages)
    return "install the package named above with pip"


def _missing_module(error: ImportError) -> str:
    """The top-level module an import failed on (gymnasium re-raises without ``name``)."""
    name = error.name or getattr(error.__cause__, "name", None)
    if not name:
        match = re.search(r"No module named '([^']+)'", str(error))
        name = match.group(1) if match else "the missing module"
    return name.split(".")[0]
