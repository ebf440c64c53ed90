"""A policy rolled out in an env, row by row, laid out as datasets store it.

Row t of an episode holds observation t, what the env reported on arriving there (``reward``,
``terminated``, ``truncated``; zero and False on the first row) and the action taken from it: the
one the env executed (a policy's Box action clipped to the space's bounds), not the one the policy
returned; the last row's action is NaN. ``swm collect`` writes these rows; ``swm memprofile``
samples a few episodes of them to size the buffer and the disk.
"""

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from swmcli.config import SwmConfig, with_settings
from swmcli.envs.make import make_env
from swmcli.envs.policies import make_policy
from swmcli.errors import UsageError, shown_path


def step_row(obs: Mapping[str, Any], action: np.ndarray, reward: float, term: bool, trunc: bool):
    """One stored row: the observation's keys, the action taken from it, and what the env
    reported on arriving there."""
    row = {key: np.asarray(value) for key, value in obs.items()}
    row["action"] = action
    row["reward"] = np.float32(reward)
    row["terminated"] = np.bool_(term)
    row["truncated"] = np.bool_(trunc)
    return row


def episode_seed(seed: int, index: int) -> int:
    """The seed of episode ``index`` of a dataset collected with ``--seed seed``.

    A function of (seed, index) only, so appending continues with new episodes instead of
    repeating the first ones, and two runs of 20 episodes write what one run of 40 writes.
    """
    return int(np.random.SeedSequence([seed, index]).generate_state(1)[0])


def env_metadata(cfg: SwmConfig, action_dim: int, policy: str) -> dict:
    """What a dataset records of the env and policy that made it (``env_of_data`` reads it)."""
    return {
        "env_id": cfg.env.id,
        "env_kwargs": dict(cfg.env.kwargs),
        "max_episode_steps": cfg.env.max_episode_steps,
        "resolution": cfg.env.resolution,
        "action_dim": action_dim,
        "policy": policy,
    }


def env_of_data(cfg: SwmConfig, metadata: Mapping[str, Any]) -> SwmConfig:
    """``cfg`` with its ``env`` section set to the env the data came from (its metadata), so a
    run trained on it, and ``swm eval`` of that run, play that env. Metadata without an env id
    (foreign datasets) leaves ``cfg`` as it is."""
    if not metadata.get("env_id"):
        return cfg
    settings: dict[str, Any] = {"env.id": metadata["env_id"]}
    if isinstance(metadata.get("env_kwargs"), dict):
        settings["env.kwargs"] = metadata["env_kwargs"]
    if metadata.get("max_episode_steps"):
        settings["env.max_episode_steps"] = int(metadata["max_episode_steps"])
    resolution = metadata.get("resolution")
    side = resolution[0] if isinstance(resolution, list) and resolution else resolution
    if isinstance(side, int):
        settings["env.resolution"] = side
    return with_settings(cfg, settings)


def action_dim_of(env) -> int:
    """Floats in one stored action (1 for a discrete action space)."""
    shape = env.action_space.shape
    return int(np.prod(shape)) if shape else 1


def episode_rows(
    env, policy, action_dim: int, seed: int | None = None, limit: int | None = None
) -> Iterator[dict[str, np.ndarray]]:
    """The rows of one episode, from ``env.reset(seed=seed)`` to its last (NaN-action) row.

    ``limit`` cuts the episode at that many rows; the cut row is marked truncated, so the episode
    still ends cleanly on disk.
    """
    obs, _ = env.reset(seed=seed)
    reward, term, trunc, length = 0.0, False, False, 0
    while not (term or trunc or (limit is not None and length + 1 >= limit)):
        executed = executed_action(env.action_space, policy(obs), policy)
        yield step_row(
            obs, np.asarray(executed, dtype=np.float32).reshape(action_dim), reward, term, trunc
        )
        length += 1
        obs, reward, term, trunc, _ = env.step(executed)
    yield step_row(obs, np.full(action_dim, np.nan, np.float32), reward, term, trunc or not term)


def executed_action(space, action, policy=None):
    """The action the env executes for what ``policy`` returned, which is what a dataset
    records: a Box action clipped to the space's bounds (TwoRoom would clip it itself; a
    rescaled env would refuse it), a Discrete one as the integer it names. Anything the space
    cannot hold (text, NaN, another shape, a number out of a discrete range) is a UsageError
    naming the policy."""
    import gymnasium as gym

    try:
        if isinstance(space, gym.spaces.Box):
            value = np.asarray(action, dtype=np.float64)
            if value.size == int(np.prod(space.shape)) and np.isfinite(value).all():
                value = value.reshape(space.shape)
                return np.clip(value, space.low, space.high).astype(space.dtype)
        elif isinstance(space, gym.spaces.Discrete):
            value = np.asarray(action)
            whole = value.size == 1 and value.dtype.kind in "iuf" and float(value) == int(value)
            if whole and space.start <= int(value) < space.start + space.n:
                return np.int64(int(value))
        elif space.contains(action):
            return action
    except (TypeError, ValueError, OverflowError):
        pass
    raise UsageError(
        f"the policy {describe_callable(policy)} returned {_shown(action)}, which the env's "
        f"action space {space} cannot take",
        hint="return a finite number per action dimension (numpy array of the space's shape); "
        "Box actions outside the bounds are clipped to them",
    )


def describe_callable(function) -> str:
    """``name (file:line)`` of a Python function (a policy), else its type's name."""
    code = getattr(function, "__code__", None)
    name = getattr(function, "__qualname__", type(function).__name__)
    if code is None:
        return name
    return f"{name} ({shown_path(code.co_filename)}:{code.co_firstlineno})"


def _shown(value) -> str:
    text = repr(value)
    return (text[:60] + "...") if len(text) > 60 else text


def cut_episode(episode: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    """The first ``rows`` rows of a whole episode, ended as ``episode_rows(limit=rows)`` ends it
    (NaN action, truncated), so a cut episode is the one a limited rollout would have given."""
    if rows >= len(episode["action"]):
        return episode
    cut = {key: value[:rows].copy() for key, value in episode.items()}
    cut["action"][-1] = np.nan
    cut["truncated"][-1] = True
    return cut


def sample_episodes(cfg: SwmConfig, episodes: int) -> tuple[list[dict[str, np.ndarray]], int]:
    """A few real episodes of ``cfg.env`` with ``cfg.collect.policy``, laid out as collect does.

    Row ``t`` holds observation ``t``, the reward and flags of arriving there and the action taken
    from it (NaN on the last row). Returns the episodes and the env's action dimension.
    """
    seed = cfg.collect.seed
    env = make_env(cfg.env.id, cfg.env.resolution, cfg.env.max_episode_steps, seed, cfg.env.kwargs)
    policy = make_policy(cfg.collect.policy, env, seed, noise=cfg.collect.noise)
    action_dim = action_dim_of(env)
    result = []
    try:
        for index in range(episodes):
            rows = list(episode_rows(env, policy, action_dim, seed=seed + index))
            result.append({key: np.stack([row[key] for row in rows]) for key in rows[0]})
    finally:
        env.close()
    return result, action_dim
