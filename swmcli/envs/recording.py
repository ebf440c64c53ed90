"""A policy rolled out in an env, row by row, laid out as datasets store it.

Row t of an episode holds observation t, what the env reported on arriving there (``reward``,
``terminated``, ``truncated``; zero and False on the first row) and the action taken from it; the
last row's action is NaN. ``swm collect`` writes these rows; ``swm memprofile`` samples a few
episodes of them to size the buffer and the disk.
"""

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from swmcli.config import SwmConfig, with_settings
from swmcli.envs.make import make_env
from swmcli.envs.policies import make_policy


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
        raw = policy(obs)
        yield step_row(
            obs, np.asarray(raw, dtype=np.float32).reshape(action_dim), reward, term, trunc
        )
        length += 1
        obs, reward, term, trunc, _ = env.step(raw)
    yield step_row(obs, np.full(action_dim, np.nan, np.float32), reward, term, trunc or not term)


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
    policy = make_policy(cfg.collect.policy, env, seed)
    action_dim = action_dim_of(env)
    result = []
    try:
        for index in range(episodes):
            rows = list(episode_rows(env, policy, action_dim, seed=seed + index))
            result.append({key: np.stack([row[key] for row in rows]) for key in rows[0]})
    finally:
        env.close()
    return result, action_dim
