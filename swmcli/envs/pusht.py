"""gym-pusht's Push-T (``--env gym_pusht:gym_pusht/PushT-v0``, ``pip install swmcli[pusht]``).

What the plugin adds to the env (see ``plugins``):

- ``frame``: the env's observation image, without the marker ``render()`` draws at the last
  action's target (which would show the model the action it is asked to predict from).
- ``restore``: the recorded ``[agent_x, agent_y, block_x, block_y, block_angle]`` set back
  through the env's own bodies. gym-pusht's ``reset_to_state`` sets the T's position before
  its angle, and pymunk turns a body about its centre of gravity, so the T would land
  elsewhere than recorded (its own docstring warns of it): the angle is set first here.
- ``reached``: stable-worldmodel's Push-T success, applied to gym-pusht's state: agent and T
  positions within 20 (one norm over the four coordinates) and the T's angle within pi/9 of
  the goal state. gym-pusht's own ``terminated`` is about its fixed green target, not a goal
  state.
- ``proprio``: the agent's own state, position and velocity ``[x, y, vx, vy]`` (what
  stable-worldmodel's ``swm/PushT-v1`` observes as ``proprio``), recorded beside ``state``; a
  model trained with ``model.proprio`` takes it as input and plans with it in its cost.
- ``pusher`` (``--policy expert``): a scripted policy that pushes the T: it picks a
  direction, goes round to the T's far side, pushes through it for a while, then picks
  another, with Gaussian noise on its targets, each at most ``MAX_MOVE`` from the agent.

Positions are pixels of gym-pusht's 512 x 512 arena; its actions (absolute agent targets in
[0, 512]) reach the policy rescaled to [-1, 1] (``make_env``).
"""

from __future__ import annotations

import numpy as np

ARENA = 512.0
SUCCESS_DISTANCE = 20.0
SUCCESS_ANGLE = np.pi / 9
CENTRE_OFFSET = 45.0  # the T's centre of gravity below its body origin (body frame, pixels)
CLEARANCE = 110.0  # from the T's centre to where the pusher lines up (its reach + the agent's)
PUSH_THROUGH = 60.0  # how far past the centre the pusher aims while pushing
PUSH_STEPS = (6, 14)  # steps of one push, drawn uniformly
LINED_UP = 25.0  # within this of the line-up point, the push starts
TARGET_NOISE = 10.0  # pixels, std of the noise on every target
MAX_MOVE = 40.0  # the target is at most this far from the agent: pushes, not kicks
PROPRIO_SIZE = 4  # x, y, vx, vy


def frame(pusht) -> np.ndarray:
    """The observation image (observation_width x observation_height), no action marker."""
    return pusht._render(visualize=False)


def proprio(pusht) -> np.ndarray:
    """The agent's position and velocity ``[x, y, vx, vy]`` (arena pixels, pixels per second)."""
    return np.array([*pusht.agent.position, *pusht.agent.velocity], np.float32)


def restore(env, state: np.ndarray, goal_state: np.ndarray, seed: int):
    """Reset ``env`` with ``seed``, then put the agent and the T where ``state`` says."""
    env.reset(seed=seed)
    pusht = env.unwrapped
    state = np.asarray(state, np.float64)
    pusht.agent.velocity = (0.0, 0.0)
    pusht.agent.position = state[:2].tolist()
    pusht.block.velocity = (0.0, 0.0)
    pusht.block.angular_velocity = 0.0
    pusht.block.angle = float(state[4])
    pusht.block.position = state[2:4].tolist()
    pusht.space.step(pusht.dt)  # as the env's own setter does: shapes follow their bodies
    return pusht.get_obs()


def reached(env, terminated: bool, info: dict, goal_state: np.ndarray) -> bool:
    """Whether the agent and the T are at ``goal_state`` (stable-worldmodel's Push-T criterion)."""
    agent, tee, angle = goal_distances(env.unwrapped.get_obs(), goal_state)
    return bool(np.hypot(agent, tee) < SUCCESS_DISTANCE and angle < SUCCESS_ANGLE)


def goal_distances(state: np.ndarray, goal_state: np.ndarray) -> tuple[float, float, float]:
    """The agent's and the T's distance to their goal positions (arena pixels; the success
    distance is their joint norm) and the T's angle to its goal angle (radians, at most pi).
    """
    state, goal = np.asarray(state, np.float64), np.asarray(goal_state, np.float64)
    angle = abs(float(state[4]) - float(goal[4])) % (2 * np.pi)
    return (
        float(np.linalg.norm(state[:2] - goal[:2])),
        float(np.linalg.norm(state[2:4] - goal[2:4])),
        min(angle, 2 * np.pi - angle),
    )


def goal_asks(state: np.ndarray, goal_state: np.ndarray) -> str:
    """What a goal asks from ``state``: "agent alone" (the T already within the success
    distance and angle of its goal pose) or "T must move"."""
    _, tee, angle = goal_distances(state, goal_state)
    at_goal = tee < SUCCESS_DISTANCE and angle < SUCCESS_ANGLE
    return "agent alone" if at_goal else "T must move"


def t_centre(state: np.ndarray) -> np.ndarray:
    """The T's centre of gravity in the arena, from its body origin and angle."""
    x, y, angle = float(state[2]), float(state[3]), float(state[4])
    return np.array([x - CENTRE_OFFSET * np.sin(angle), y + CENTRE_OFFSET * np.cos(angle)])


def pusher(env, seed: int, noise: float):
    """``--policy expert`` on gym-pusht: observation -> action in [-1, 1]^2 (see the module).

    ``noise`` scales the target noise (0.3, the TwoRoom expert's default, gives ``TARGET_NOISE``
    pixels).
    """
    rng = np.random.default_rng(seed)
    sigma = TARGET_NOISE * noise / 0.3
    plan = {"direction": None, "pushing": 0}

    def act(observation: dict) -> np.ndarray:
        state = np.asarray(observation["state"], np.float64)
        agent, centre = state[:2], t_centre(state)
        if plan["direction"] is None:
            turn = rng.uniform(0, 2 * np.pi)
            plan["direction"] = np.array([np.cos(turn), np.sin(turn)])
        direction = plan["direction"]
        line_up = centre - CLEARANCE * direction
        if plan["pushing"] == 0 and np.linalg.norm(agent - line_up) < LINED_UP:
            plan["pushing"] = int(rng.integers(*PUSH_STEPS))
        if plan["pushing"] > 0:
            target = centre + PUSH_THROUGH * direction
            plan["pushing"] -= 1
            if plan["pushing"] == 0:
                plan["direction"] = None
        else:
            target = _around(agent, centre, line_up)
        step = target - agent
        step *= min(1.0, MAX_MOVE / max(float(np.linalg.norm(step)), 1e-9))
        target = np.clip(agent + step + rng.normal(0.0, sigma, 2), 15.0, ARENA - 15.0)
        return (target / (ARENA / 2) - 1.0).astype(np.float32)

    return act


def _around(agent: np.ndarray, centre: np.ndarray, line_up: np.ndarray) -> np.ndarray:
    """The next target on the way to ``line_up`` that keeps clear of the T: straight there
    when the T is not in between, else sideways round it."""
    to_goal = line_up - agent
    to_t = centre - agent
    along = float(np.dot(to_t, to_goal)) / max(float(np.dot(to_goal, to_goal)), 1e-9)
    closest = agent + np.clip(along, 0.0, 1.0) * to_goal
    if np.linalg.norm(closest - centre) >= CLEARANCE * 0.8:
        return line_up
    away = closest - centre
    if np.linalg.norm(away) < 1e-6:
        away = np.array([-to_goal[1], to_goal[0]])
    return centre + CLEARANCE * away / np.linalg.norm(away)
