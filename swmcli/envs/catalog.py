"""Every env ``--env`` accepts, built here once each: swm's own, gymnasium's registry and the
plugins installed (gym-pusht, stable-worldmodel), with their spaces, their frame size and
whether they render here (and, in one line, why not).

Building every gymnasium env is fast (gymnasium 1.x, all of its registry: about half a second on
2 cores; an env whose package is missing fails at once): each is made with
``render_mode="rgb_array"``, reset with seed 0 and rendered once, under a time limit
(``BUILD_SECONDS``) so that an env that hangs is named, not waited for. swm's TwoRoom is drawn
with numpy: it needs no pygame.
"""

from __future__ import annotations

import fnmatch
import importlib
import importlib.util
import signal
import threading
import warnings
from contextlib import contextmanager
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from swmcli.envs.make import TWOROOM_ID, quiet_pygame
from swmcli.errors import first_line

BUILD_SECONDS = 10
# Plugins: (package, module that registers its envs on import, id prefix, how to install it).
PLUGIN_PACKAGES = (
    ("gym-pusht", "gym_pusht", "gym_pusht/", 'pip install "swmcli[pusht]"'),
    ("stable-worldmodel", "stable_worldmodel", "swm/", "pip install stable-worldmodel"),
)


@dataclass
class EnvEntry:
    """One env as ``--env`` names it, and what building it here showed (None: not known)."""

    id: str
    source: str  # swm, gymnasium, or the plugin's package
    observation: str | None = None
    action: str | None = None
    render_size: str | None = None  # HxW of rgb_array frames
    renders: str = "yes"  # or why not, in one line


def env_catalog(pattern: str | None = None) -> list[EnvEntry]:
    """The envs whose id matches ``pattern`` (a shell pattern, e.g. ``CartPole*``; all when
    None), swm's first, then each installed plugin's, then gymnasium's; each one matching built
    once here. A plugin that is not installed is one entry saying how to install it."""

    def wanted(name: str) -> bool:
        return pattern is None or fnmatch.fnmatch(name, pattern)

    quiet_pygame()
    missing, plugin_ids = [], set()
    named = [(TWOROOM_ID, "swm", TWOROOM_ID)]  # (as --env names it, source, registry id)
    for package, module, prefix, install in PLUGIN_PACKAGES:
        if importlib.util.find_spec(module) is None:
            row = EnvEntry(f"{module}:{prefix}*", package, renders=f"not installed: {install}")
            missing += [row] if wanted(row.id) else []
            continue
        with warnings.catch_warnings():  # its own notes on what it lacks: the rows say it
            warnings.simplefilter("ignore")
            importlib.import_module(module)  # registers its envs
        ids = [i for i in gym.envs.registry if i.startswith(prefix) and i != TWOROOM_ID]
        ids = [i for i in ids if gym.envs.registry[i].entry_point.split(".")[0].startswith(module)]
        plugin_ids.update(ids)
        # --env takes module:id, whose import registers the id
        named += [(f"{module}:{i}", package, i) for i in ids]
    rest = [i for i in gym.envs.registry if i not in plugin_ids and i != TWOROOM_ID]
    named += [(i, "gymnasium", i) for i in rest]
    built = [_built(name, source, env_id) for name, source, env_id in named if wanted(name)]
    ours = [entry for entry in built if entry.source == "swm"]
    return ours + missing + [entry for entry in built if entry.source != "swm"]


def _built(name: str, source: str, env_id: str) -> EnvEntry:
    """``name``'s entry (made as ``env_id``): spaces, frame size, renders."""
    entry = EnvEntry(name, source)
    env = None
    try:
        with _time_limit(BUILD_SECONDS), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            env = gym.make(env_id, render_mode="rgb_array")
            entry.observation = space_words(env.observation_space)
            entry.action = space_words(env.action_space)
            env.reset(seed=0)
            frame = env.render()
        if not isinstance(frame, np.ndarray) or frame.ndim != 3:
            entry.renders = f"render() gave {type(frame).__name__}, not an (H, W, 3) frame"
        else:
            entry.render_size = f"{frame.shape[0]}x{frame.shape[1]}"
    except Exception as err:  # any env's own error: the reason it does not render here
        entry.renders = f"{type(err).__name__}: {first_line(str(err)) or 'no message'}"
    finally:
        if env is not None:
            env.close()
    return entry


class _TooSlow(Exception):
    pass


@contextmanager
def _time_limit(seconds: int):
    """Raise ``_TooSlow`` in the ``with`` body after ``seconds`` (main thread, where the
    platform has SIGALRM; elsewhere no limit)."""
    if not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(*_):
        raise _TooSlow(f"not built within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def space_words(space) -> str:
    """A space in a few words: ``Box(4,) float32 [-1, 1]``, ``Discrete(2)``, ``Dict(pixels:
    Box(64, 64, 3) uint8, ...)``."""
    if isinstance(space, gym.spaces.Box):
        words = f"Box{tuple(space.shape)} {space.dtype}"
        low, high = np.unique(space.low), np.unique(space.high)
        if len(low) == 1 and len(high) == 1:
            words += f" [{low[0]:g}, {high[0]:g}]"
        return words
    if isinstance(space, gym.spaces.Dict):
        return "Dict(" + ", ".join(f"{k}: {space_words(s)}" for k, s in space.spaces.items()) + ")"
    if isinstance(space, gym.spaces.Tuple):
        return "Tuple(" + ", ".join(space_words(s) for s in space.spaces) + ")"
    return str(space)
