"""swmcli.envs.make: the TwoRoom env, make_env for any gymnasium id, goal images and policies."""

import math
import warnings
from typing import ClassVar

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given
from hypothesis import strategies as st

from swmcli.envs import tworoom as tr
from swmcli.envs.make import TWOROOM_ID, goal_pixels, make_env, register
from swmcli.envs.policies import make_policy
from swmcli.errors import UsageError


class TinyEnv(gym.Env):
    """A real gymnasium env that renders 30x40 RGB frames with numpy (no pygame)."""

    metadata: ClassVar[dict] = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, render_mode=None):
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2, 2), np.float64)
        self.action_space = gym.spaces.Discrete(3)
        self._value = 0.0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._value = float(self.np_random.uniform(-1, 1))
        return np.full((2, 2), self._value), {}

    def step(self, action):
        self._value = float(np.clip(self._value + (int(action) - 1) * 0.1, -1, 1))
        return np.full((2, 2), self._value), 0.0, False, False, {}

    def render(self):
        shade = int((self._value + 1) * 127)
        return np.full((30, 40, 3), shade, np.uint8)


TINY_ID = "swmtest/Tiny-v0"
if TINY_ID not in gym.envs.registry:
    gym.register(id=TINY_ID, entry_point=TinyEnv)


def run_episodes(env, policy, seeds) -> float:
    """Success rate of ``policy`` over one episode per seed."""
    successes = 0
    for seed in seeds:
        observation, _ = env.reset(seed=seed)
        done = False
        while not done:
            observation, _, terminated, truncated, info = env.step(policy(observation))
            done = terminated or truncated
        successes += info["success"]
    return successes / len(seeds)


def test_registration_is_idempotent():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # gymnasium warns when an id is registered twice
        register()
    assert gym.spec(TWOROOM_ID).entry_point == "swmcli.envs.tworoom:TwoRoomEnv"


@pytest.mark.parametrize("resolution", [32, 64])
def test_tworoom_passes_the_gymnasium_env_checker(resolution):
    env = make_env(TWOROOM_ID, resolution, 100, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the checker warns on anything questionable
        check_env(env.unwrapped)


@pytest.mark.parametrize("resolution", [16, 17, 33, 64, 100, 224])
def test_pixels_have_the_requested_shape_and_dtype(resolution):
    env = make_env(TWOROOM_ID, resolution, 100, seed=0)
    observation, _ = env.reset(seed=1)
    assert observation["pixels"].shape == (resolution, resolution, 3)
    assert observation["pixels"].dtype == np.uint8
    assert observation["state"].dtype == observation["goal"].dtype == np.float32
    observation, *_ = env.step(env.action_space.sample())
    assert env.observation_space.contains(observation)
    assert env.render() is observation["pixels"]


def test_the_frame_shows_the_agent_but_not_the_goal():
    env = make_env(TWOROOM_ID, 64, 100, seed=0)
    observation, _ = env.reset(seed=2)
    agent = np.all(observation["pixels"] == tr.AGENT_RGB, axis=-1)
    _, stamp = tr.canvas(64)
    assert agent.sum() == stamp.sum()  # one disc: the agent; the goal is not drawn
    rows, cols = np.nonzero(agent)
    x, y = observation["state"]
    assert abs(cols.mean() + 0.5 - x * 64) <= 1 and abs(rows.mean() + 0.5 - y * 64) <= 1


def test_rooms_have_distinct_floors_and_a_door_in_the_wall():
    background, _ = tr.canvas(64)
    assert tuple(background[16, 16]) == tr.LEFT_FLOOR_RGB
    assert tuple(background[16, 48]) == tr.RIGHT_FLOOR_RGB
    wall_column = background[:, 32]
    assert tuple(wall_column[10]) == tr.WALL_RGB
    assert tuple(wall_column[32]) != tr.WALL_RGB  # the door


def test_seeded_resets_are_reproducible():
    first = make_env(TWOROOM_ID, 32, 100, seed=7)
    second = make_env(TWOROOM_ID, 32, 100, seed=7)
    for seed in (3, 4):
        a, _ = first.reset(seed=seed)
        b, _ = second.reset(seed=seed)
        for key in ("pixels", "state", "goal"):
            np.testing.assert_array_equal(a[key], b[key])
    c, _ = first.reset(seed=5)
    assert not np.array_equal(c["state"], a["state"])
    # Unseeded resets after make_env(seed=...) continue one reproducible stream.
    np.testing.assert_array_equal(
        make_env(TWOROOM_ID, 32, 100, seed=9).reset()[0]["goal"],
        make_env(TWOROOM_ID, 32, 100, seed=9).reset()[0]["goal"],
    )


def test_starts_and_goals_cover_both_rooms():
    env = make_env(TWOROOM_ID, 16, 100, seed=0)
    crossings = 0
    for seed in range(200):
        observation, _ = env.reset(seed=seed)
        start, goal = observation["state"], observation["goal"]
        assert tr.is_free(*start) and tr.is_free(*goal)
        assert math.dist(start, goal) >= tr.MIN_GOAL_DISTANCE - 1e-6
        crossings += tr.room_of(start[0]) != tr.room_of(goal[0])
    assert 60 < crossings < 140  # about half the episodes need the door


def test_walls_block_except_through_the_door():
    env = make_env(TWOROOM_ID, 32, 200, seed=0)
    push_right = np.array([1.0, 0.0], np.float32)
    env.reset(options={"start": (0.2, 0.2), "goal": (0.9, 0.9)})
    for _ in range(60):
        observation, *_ = env.step(push_right)
    assert observation["state"][0] == pytest.approx(tr.LEFT_X_MAX)  # stopped at the wall

    env.reset(options={"start": (0.2, tr.DOOR_Y), "goal": (0.9, 0.9)})
    for _ in range(60):
        observation, *_ = env.step(push_right)
    assert observation["state"][0] == pytest.approx(tr.HIGH)  # through the door to the far wall


free_points = st.tuples(st.floats(0, 1), st.floats(0, 1)).filter(lambda p: tr.is_free(*p))
steps = st.floats(-tr.MAX_STEP, tr.MAX_STEP)


@given(free_points, steps, steps)
def test_moves_stay_free_and_change_room_only_in_the_door(point, dx, dy):
    x, y = tr.move(*point, dx, dy)
    assert tr.is_free(x, y)
    if tr.room_of(x) != tr.room_of(point[0]):
        assert tr.DOOR_LOW <= y <= tr.DOOR_HIGH


def test_reaching_the_goal_terminates_with_reward_and_success():
    env = make_env(TWOROOM_ID, 32, 100, seed=0)
    _, info = env.reset(options={"start": (0.2, 0.2), "goal": (0.27, 0.2)})
    assert info["success"] is False
    _, reward, terminated, truncated, info = env.step(np.array([1.0, 0.0], np.float32))
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)


def test_episodes_are_truncated_at_max_episode_steps():
    env = make_env(TWOROOM_ID, 32, 5, seed=0)
    env.reset(seed=0)
    stay = np.zeros(2, np.float32)
    flags = [env.step(stay)[2:4] for _ in range(5)]
    assert flags[-1] == (False, True) and all(flags[i] == (False, False) for i in range(4))


def test_bad_reset_options_are_refused():
    env = make_env(TWOROOM_ID, 32, 100, seed=0)
    with pytest.raises(ValueError, match="inside a wall"):
        env.reset(options={"start": (0.5, 0.1)})


def test_goal_pixels_show_the_agent_at_the_goal():
    env = make_env(TWOROOM_ID, 48, 100, seed=0)
    observation, _ = env.reset(seed=11)
    goal_image = goal_pixels(env)
    assert goal_image.shape == (48, 48, 3) and goal_image.dtype == np.uint8
    assert not np.array_equal(goal_image, observation["pixels"])
    goal = tuple(observation["goal"])
    at_goal, _ = env.reset(options={"start": goal, "goal": goal})
    np.testing.assert_array_equal(goal_image, at_goal["pixels"])


def test_expert_reaches_goals_far_more_often_than_random():
    env = make_env(TWOROOM_ID, 32, 100, seed=0)
    seeds = range(100, 120)
    expert = run_episodes(env, make_policy("expert", env, seed=0), seeds)
    random = run_episodes(env, make_policy("random", env, seed=0), seeds)
    assert expert >= 0.9 and random <= 0.3


def test_policies_are_seeded_and_stay_in_the_action_space():
    env = make_env(TWOROOM_ID, 32, 100, seed=0)
    observation, _ = env.reset(seed=0)
    for name in ("random", "expert"):
        first, again = make_policy(name, env, seed=3), make_policy(name, env, seed=3)
        np.testing.assert_array_equal(
            [first(observation) for _ in range(5)], [again(observation) for _ in range(5)]
        )
        policy = make_policy(name, env, seed=4)
        actions = np.stack([policy(observation) for _ in range(50)])
        assert all(env.action_space.contains(a) for a in actions)
        assert actions.std(axis=0).min() > 0.05  # varied actions, not one repeated


def test_random_policy_drives_an_env_that_keys_a_dict_on_its_discrete_action():
    env = gym.make("FrozenLake-v1")  # no render_mode: stepping it needs no pygame
    observation, _ = env.reset(seed=0)
    policy = make_policy("random", env, seed=0)
    seen = set()
    for _ in range(30):
        action = policy(observation)
        seen.add(int(action))
        observation, _, terminated, truncated, _ = env.step(action)  # P[s][action]: hashed
        if terminated or truncated:
            observation, _ = env.reset()
    assert seen <= {0, 1, 2, 3} and len(seen) > 1


def test_unknown_policy_and_expert_off_tworoom_are_usage_errors():
    env = make_env(TWOROOM_ID, 32, 100, seed=0)
    with pytest.raises(UsageError, match="unknown policy 'greedy'") as caught:
        make_policy("greedy", env, seed=0)
    assert "random" in caught.value.hint
    tiny = make_env(TINY_ID, 32, 10, seed=0)
    with pytest.raises(UsageError, match="no expert policy for TinyEnv"):
        make_policy("expert", tiny, seed=0)


def test_any_rgb_array_env_gets_resized_pixels_and_flat_state():
    env = make_env(TINY_ID, 24, 10, seed=0)
    observation, _ = env.reset(seed=1)
    assert observation["pixels"].shape == (24, 24, 3) and observation["pixels"].dtype == np.uint8
    assert observation["pixels"].flags.writeable  # torch warns on a read-only array
    assert observation["state"].shape == (4,) and observation["state"].dtype == np.float32
    shade = observation["pixels"][0, 0, 0]
    assert shade == int((observation["state"][0] + 1) * 127)  # the env's own frame, resized
    policy = make_policy("random", env, seed=0)
    truncations = []
    for _ in range(10):
        observation, _, _, truncated, _ = env.step(policy(observation))
        assert env.observation_space.contains(observation)
        truncations.append(truncated)
    assert truncations == [False] * 9 + [True]
    check_env(env.unwrapped)


def test_goal_pixels_needs_a_goal_conditioned_env():
    env = make_env(TINY_ID, 24, 10, seed=0)
    with pytest.raises(UsageError, match="planning needs a goal-conditioned env"):
        goal_pixels(env)


class NeedsBox2dEnv(TinyEnv):
    """An env whose optional package is missing, as gymnasium's Box2D envs fail without it."""

    def __init__(self, render_mode=None):
        raise gym.error.DependencyNotInstalled(
            "Box2D is not installed, you can install it by run `pip install swig` followed by "
            '`pip install "gymnasium[box2d]"`'
        )


def test_a_missing_package_is_a_usage_error_with_the_pip_line():
    if "swmtest/NeedsBox2d-v0" not in gym.envs.registry:
        gym.register(id="swmtest/NeedsBox2d-v0", entry_point=NeedsBox2dEnv)
    with pytest.raises(UsageError, match="swmtest/NeedsBox2d-v0 needs a package") as caught:
        make_env("swmtest/NeedsBox2d-v0", 64, 50)
    assert caught.value.hint == 'pip install swig && pip install "gymnasium[box2d]"'


def test_unknown_ids_and_tiny_resolutions_are_usage_errors():
    with pytest.raises(UsageError, match="unknown gymnasium env 'NoSuchEnv-v0'") as caught:
        make_env("NoSuchEnv-v0", 64, 50)
    assert "gymnasium.envs.registry" in caught.value.hint
    with pytest.raises(UsageError, match="module 'swm_no_such_module'") as caught:
        make_env("swm_no_such_module:Foo-v0", 64, 50)
    assert caught.value.hint == "pip install swm_no_such_module"
    with pytest.raises(UsageError, match="resolution 8 is too small"):
        make_env(TWOROOM_ID, 8, 50)


def test_pusht_goal_distances_split_the_success_norm_and_wrap_the_angle():
    from swmcli.envs import pusht

    goal = np.array([100.0, 100.0, 200.0, 200.0, 0.05])
    state = np.array([103.0, 104.0, 212.0, 191.0, 2 * np.pi - 0.05])  # 0.1 rad the short way
    agent, block, angle = pusht.goal_distances(state, goal)
    assert (agent, block) == (5.0, 15.0)
    assert angle == pytest.approx(0.1)
    # stable-worldmodel's criterion is one norm over the four coordinates: here 15.8 < 20.
    assert math.hypot(agent, block) == pytest.approx(np.linalg.norm(state[:4] - goal[:4]))
