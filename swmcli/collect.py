"""`swm collect`: roll out a policy through the capped ReplayBuffer into an on-disk dataset.

Row t of an episode holds observation t, what the env reported on arriving there (``reward``,
``terminated``, ``truncated``; zero and False on the first row) and the action taken from it; the
last row's action is NaN. Each finished episode goes through the buffer and is appended to the
dataset in one atomic write, so a killed process keeps every episode that finished.
"""

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from swmcli.config import SwmConfig
from swmcli.errors import SwmError
from swmcli.report import CommandResult, progress


def _row(obs: Mapping[str, Any], action: np.ndarray, reward: float, term: bool, trunc: bool):
    row = {key: np.asarray(value) for key, value in obs.items()}
    row["action"] = action
    row["reward"] = np.float32(reward)
    row["terminated"] = np.bool_(term)
    row["truncated"] = np.bool_(trunc)
    return row


def _as_action(action: Any, action_dim: int) -> np.ndarray:
    return np.asarray(action, dtype=np.float32).reshape(action_dim)


def _action_dim(env) -> int:
    shape = env.action_space.shape
    return int(np.prod(shape)) if shape else 1


def run_collect(cfg: SwmConfig, monitor) -> CommandResult:
    """Collect ``cfg.collect.episodes`` episodes (or exactly ``cfg.collect.steps`` steps)."""
    from swmcli.core.buffer import ReplayBuffer
    from swmcli.core.storage import open_writer
    from swmcli.envs import make_env
    from swmcli.envs.policies import make_policy

    settings = cfg.collect
    with monitor.phase("setup"):
        env = make_env(
            cfg.env.id, cfg.env.resolution, cfg.env.max_episode_steps, seed=settings.seed
        )
        policy = make_policy(settings.policy, env, settings.seed)
        action_dim = _action_dim(env)
        obs, _ = env.reset(seed=settings.seed)
        buffer = ReplayBuffer(settings.max_steps, seed=settings.seed)
        # The first row triggers the buffer's preflight and allocation, before anything is written.
        first = _row(obs, np.full(action_dim, np.nan, np.float32), 0.0, False, False)
        buffer.add(first)
        buffer.clear()
        metadata = {
            "env_id": cfg.env.id,
            "resolution": cfg.env.resolution,
            "action_dim": action_dim,
            "policy": settings.policy,
        }
        writer = open_writer(settings.out, settings.format, mode="append", metadata=metadata)

    total = settings.steps or settings.episodes
    episodes = steps = 0
    start = time.perf_counter()
    with monitor.phase("collect"), writer, progress("collect", total) as advance:
        try:
            episodes, steps = _rollouts(env, policy, buffer, writer, settings, action_dim, advance)
        except KeyboardInterrupt:
            raise SwmError(
                f"interrupted: every finished episode is saved in {settings.out}",
                hint="run the same command again to append more",
                exit_code=130,
            ) from None
        finally:
            env.close()
    seconds = time.perf_counter() - start

    from swmcli.core.storage import detect, open_reader

    reader = open_reader(settings.out)
    config_path = settings.out.with_name(settings.out.name + ".config.json")
    config_path.write_text(cfg.model_dump_json(indent=2) + "\n")
    return CommandResult(
        title="collect",
        fields={
            "out": str(settings.out),
            "format": detect(settings.out),
            "env": cfg.env.id,
            "policy": settings.policy,
            "episodes": episodes,
            "steps": steps,
            "evicted_episodes": buffer.evicted_episodes,
            "steps_per_s": round(steps / max(seconds, 1e-9), 1),
            "buffer_allocated_bytes": buffer.nbytes,
            "buffer_cap_bytes": settings.max_steps * buffer.bytes_per_step,
            "dataset_episodes": reader.num_episodes,
            "dataset_steps": reader.num_steps,
            "dataset_on_disk_bytes": reader.nbytes_on_disk,
        },
        notes=[f"resolved config saved to {config_path}"],
    )


def _rollouts(env, policy, buffer, writer, settings, action_dim, advance) -> tuple[int, int]:
    """Step the env until enough episodes (or steps) are saved; returns (episodes, steps) saved."""
    nan_action = np.full(action_dim, np.nan, np.float32)
    episodes = steps = length = 0
    obs, _ = env.reset(seed=settings.seed)
    reward, term, trunc = 0.0, False, False
    while True:
        cut = settings.steps is not None and steps + length + 1 >= settings.steps
        if not (term or trunc or cut):
            raw = policy(obs)
            buffer.add(_row(obs, _as_action(raw, action_dim), reward, term, trunc))
            length += 1
            obs, reward, term, trunc, _ = env.step(raw)
            if settings.steps is not None:
                advance(1)
            continue
        # A cut by --steps marks the episode truncated: it still ends cleanly on disk.
        buffer.add(_row(obs, nan_action, reward, term, trunc or not term))
        buffer.end_episode()
        writer.write_episode(buffer.last_episode())
        episodes, steps, length = episodes + 1, steps + length + 1, 0
        advance(1, episodes=episodes, steps=steps)  # one episode, or its last step
        done = steps >= settings.steps if settings.steps else episodes >= settings.episodes
        if done:
            return episodes, steps
        obs, _ = env.reset()
        reward, term, trunc = 0.0, False, False
