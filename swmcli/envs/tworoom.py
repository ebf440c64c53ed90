"""swm/TwoRoom-v0: a point agent in two rooms joined by a door, rendered with numpy.

Geometry lives in continuous coordinates [0, 1]^2, independent of the resolution: ``x`` grows to
the right (image columns), ``y`` grows downwards (image rows). An outer wall frames the square, a
vertical wall at ``x = 0.5`` splits it into a left and a right room, and a door in that wall spans
``y`` in [0.4, 0.6]. The agent is a disc; its centre is the state. An action in [-1, 1]^2 is a
velocity: the centre moves by at most ``MAX_STEP`` per axis per step and slides along walls, so
the only way into the other room is through the door.

Observations are ``{"pixels": (res, res, 3) uint8, "state": (2,) float32 agent centre, "goal":
(2,) float32 goal centre}``. The goal is *not* drawn in the frame: planners get it as an image,
the frame with the agent drawn at the goal (``goal_pixels``), as in LeWM / DINO-WM.

Reward is sparse: 1.0 on the step that brings the agent within ``GOAL_RADIUS`` of the goal (which
also terminates the episode), 0.0 otherwise. ``info["success"]`` says whether that happened.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import ClassVar

import gymnasium as gym
import numpy as np

BORDER = 0.02  # outer wall thickness
WALL_X = 0.5  # centre line of the wall between the rooms
WALL_HALF = 0.02  # half thickness of that wall
DOOR_Y = 0.5  # centre of the door
DOOR_HALF = 0.1  # half height of the door
AGENT_RADIUS = 0.04
MAX_STEP = 0.03  # largest move per axis per step (action 1.0)
GOAL_RADIUS = 0.05  # success when the centre is this close to the goal
MIN_GOAL_DISTANCE = 0.2  # a fresh goal is at least this far from the start

# Where the agent's centre may be: the walls grown by the agent's radius.
LOW = BORDER + AGENT_RADIUS
HIGH = 1.0 - BORDER - AGENT_RADIUS
LEFT_X_MAX = WALL_X - WALL_HALF - AGENT_RADIUS
RIGHT_X_MIN = WALL_X + WALL_HALF + AGENT_RADIUS
DOOR_LOW = DOOR_Y - DOOR_HALF + AGENT_RADIUS
DOOR_HIGH = DOOR_Y + DOOR_HALF - AGENT_RADIUS

WALL_RGB = (50, 50, 60)
LEFT_FLOOR_RGB = (214, 229, 245)
RIGHT_FLOOR_RGB = (245, 232, 206)
AGENT_RGB = (220, 50, 50)


def room_of(x: float) -> int:
    """The room a centre at ``x`` belongs to: 0 left, 1 right (the doorway splits at the wall)."""
    return 0 if x < WALL_X else 1


def is_free(x: float, y: float) -> bool:
    """Whether the agent's centre may be at (x, y): inside the frame and clear of the walls."""
    if not (LOW <= x <= HIGH and LOW <= y <= HIGH):
        return False
    return not (LEFT_X_MAX < x < RIGHT_X_MIN) or DOOR_LOW <= y <= DOOR_HIGH


def snap_free(x: float, y: float, tolerance: float = 1e-5) -> tuple[float, float]:
    """(x, y) moved onto free space when it is within ``tolerance`` of it, else unchanged.

    A state recorded in float32 can sit a hair inside a wall the agent was sliding along; set back
    from a dataset it must be the free position it was.
    """
    if is_free(x, y):
        return x, y
    near_x = min(max(x, LOW), HIGH)
    near_y = min(max(y, LOW), HIGH)
    if LEFT_X_MAX < near_x < RIGHT_X_MIN and not DOOR_LOW <= near_y <= DOOR_HIGH:
        in_door = min(max(near_y, DOOR_LOW), DOOR_HIGH)
        beside = LEFT_X_MAX if near_x < WALL_X else RIGHT_X_MIN
        if abs(in_door - near_y) <= abs(beside - near_x):
            near_y = in_door
        else:
            near_x = beside
    if max(abs(near_x - x), abs(near_y - y)) <= tolerance:
        return near_x, near_y
    return x, y


def move(x: float, y: float, dx: float, dy: float) -> tuple[float, float]:
    """Move the centre by (dx, dy), sliding along walls; only the door joins the rooms.

    The axes are resolved one after the other (y, then x), so a free position stays free: inside
    the doorway y is held within the door, and outside the door band x is held on its own side.
    """
    in_doorway = LEFT_X_MAX < x < RIGHT_X_MIN
    new_y = min(max(y + dy, LOW), HIGH)
    if in_doorway:
        new_y = min(max(new_y, DOOR_LOW), DOOR_HIGH)
    new_x = min(max(x + dx, LOW), HIGH)
    if not DOOR_LOW <= new_y <= DOOR_HIGH:
        new_x = min(new_x, LEFT_X_MAX) if x < WALL_X else max(new_x, RIGHT_X_MIN)
    return new_x, new_y


def _covers(resolution: int, low: float, high: float) -> np.ndarray:
    """Pixels (along one axis) whose centre lies in [low, high], and at least the middle one.

    Centre sampling keeps walls at their true thickness; the middle pixel keeps a wall thinner
    than a pixel (at low resolutions) visible.
    """
    centres = (np.arange(resolution) + 0.5) / resolution
    covered = (centres >= low) & (centres <= high)
    covered[min(int(0.5 * (low + high) * resolution), resolution - 1)] = True
    return covered


@functools.lru_cache(maxsize=8)
def canvas(resolution: int) -> tuple[np.ndarray, np.ndarray]:
    """The static background (res, res, 3) uint8 and the agent's disc stamp, built once per size.

    Both are read-only: every frame is a copy of the background with the stamp painted on it.
    """
    centres = (np.arange(resolution) + 0.5) / resolution
    left = centres < WALL_X
    background = np.empty((resolution, resolution, 3), np.uint8)
    background[:, left] = LEFT_FLOOR_RGB
    background[:, ~left] = RIGHT_FLOOR_RGB
    frame = _covers(resolution, 0.0, BORDER) | _covers(resolution, 1.0 - BORDER, 1.0)
    door = np.abs(centres - DOOR_Y) <= DOOR_HALF
    wall = frame[:, None] | frame[None, :]
    wall |= ~door[:, None] & _covers(resolution, WALL_X - WALL_HALF, WALL_X + WALL_HALF)[None, :]
    background[wall] = WALL_RGB
    background.setflags(write=False)

    radius = max(AGENT_RADIUS * resolution, 0.5)
    reach = math.ceil(radius)
    offsets = np.arange(-reach, reach + 1)
    stamp = offsets[:, None] ** 2 + offsets[None, :] ** 2 <= radius**2
    stamp.setflags(write=False)
    return background, stamp


def draw(resolution: int, x: float, y: float) -> np.ndarray:
    """A fresh frame with the agent's disc centred on the pixel that holds (x, y)."""
    background, stamp = canvas(resolution)
    frame = background.copy()
    reach = stamp.shape[0] // 2
    row = min(int(y * resolution), resolution - 1) - reach
    col = min(int(x * resolution), resolution - 1) - reach
    size = stamp.shape[0]
    # Clip the stamp at the image edges (tiny resolutions put the disc past the border wall).
    top, left = max(row, 0), max(col, 0)
    bottom, right = min(row + size, resolution), min(col + size, resolution)
    mask = stamp[top - row : bottom - row, left - col : right - col]
    frame[top:bottom, left:right][mask] = AGENT_RGB
    return frame


class TwoRoomEnv(gym.Env):
    """Goal-conditioned point navigation between two rooms; see the module docstring."""

    metadata: ClassVar[dict] = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, resolution: int = 64, render_mode: str | None = None):
        if resolution < 16:
            raise ValueError(f"TwoRoom needs a resolution of at least 16 pixels, got {resolution}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"TwoRoom renders only 'rgb_array', got render_mode={render_mode!r}")
        self.resolution = resolution
        self.render_mode = render_mode
        position = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
        self.observation_space = gym.spaces.Dict(
            {
                "pixels": gym.spaces.Box(0, 255, (resolution, resolution, 3), np.uint8),
                "state": position,
                "goal": position,
            }
        )
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self._position = (0.5 * (LOW + LEFT_X_MAX), 0.5)
        self._goal = (0.5 * (RIGHT_X_MIN + HIGH), 0.5)
        self._frame = draw(resolution, *self._position)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Start a new episode: start and goal drawn uniformly over both rooms, unless given.

        ``options={"start": (x, y), "goal": (x, y)}`` pins either one (each must be free space):
        that is how a recorded state is set back (``swm eval --protocol dataset``).
        """
        super().reset(seed=seed)
        options = options or {}
        start = self._chosen(options, "start") or self._sample_free()
        goal = self._chosen(options, "goal")
        while goal is None or (
            "goal" not in options and math.dist(start, goal) < MIN_GOAL_DISTANCE
        ):
            goal = self._sample_free()
        self._position, self._goal = start, goal
        return self._observe(), {"success": False}

    def step(self, action):
        """Move by ``clip(action, -1, 1) * MAX_STEP``; reward 1.0 and terminate at the goal."""
        dx, dy = np.clip(np.asarray(action, dtype=np.float64), -1.0, 1.0) * MAX_STEP
        self._position = move(*self._position, float(dx), float(dy))
        success = math.dist(self._position, self._goal) <= GOAL_RADIUS
        return self._observe(), float(success), success, False, {"success": success}

    def render(self):
        """The current frame (the same array as the last observation's ``pixels``)."""
        if self.render_mode == "rgb_array":
            return self._frame
        return None

    def goal_pixels(self) -> np.ndarray:
        """The frame a planner aims for: the background with the agent drawn at the goal."""
        return draw(self.resolution, *self._goal)

    @property
    def position(self) -> tuple[float, float]:
        """The agent's centre (x, y)."""
        return self._position

    @property
    def goal(self) -> tuple[float, float]:
        """The goal centre (x, y)."""
        return self._goal

    def _observe(self) -> dict[str, np.ndarray]:
        self._frame = draw(self.resolution, *self._position)
        return {
            "pixels": self._frame,
            "state": np.array(self._position, np.float32),
            "goal": np.array(self._goal, np.float32),
        }

    def _sample_free(self) -> tuple[float, float]:
        # Pick a room first so each room gets half the points whatever their areas.
        low, high = (LOW, LEFT_X_MAX) if self.np_random.random() < 0.5 else (RIGHT_X_MIN, HIGH)
        return float(self.np_random.uniform(low, high)), float(self.np_random.uniform(LOW, HIGH))

    def goal_kind(self) -> str:
        """What kind of goal this episode has: ``"same room"`` or ``"other room"`` as the agent."""
        same = room_of(self._position[0]) == room_of(self._goal[0])
        return "same room" if same else "other room"

    @staticmethod
    def _chosen(options: dict, key: str) -> tuple[float, float] | None:
        if options.get(key) is None:
            return None
        x, y = snap_free(*(float(v) for v in options[key]))
        if not is_free(x, y):
            raise ValueError(f"TwoRoom {key} {(x, y)} is inside a wall or outside the rooms")
        return x, y


DOOR_APPROACH = 0.1  # the expert lines up this far in front of the door, on either side
DOOR_ALIGNED = 0.04  # |y - door centre| under which the expert heads straight through


def tworoom_expert(env, seed: int, noise: float) -> Callable[[dict], np.ndarray]:
    """TwoRoom's expert: toward the goal (via the door), plus Gaussian ``noise``, clipped."""
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
    if room_of(x) == room_of(goal_x):
        return goal_x, goal_y
    side = -1.0 if x < WALL_X else 1.0
    in_doorway = LEFT_X_MAX < x < RIGHT_X_MIN
    if in_doorway or abs(y - DOOR_Y) <= DOOR_ALIGNED:
        return WALL_X - side * DOOR_APPROACH, DOOR_Y
    return WALL_X + side * DOOR_APPROACH, DOOR_Y
