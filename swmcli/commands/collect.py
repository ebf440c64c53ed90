"""`swm collect`: roll out a policy through the capped ReplayBuffer into an on-disk dataset.

Row t of an episode holds observation t, what the env reported on arriving there (``reward``,
``terminated``, ``truncated``; zero and False on the first row) and the action taken from it; the
last row's action is NaN. Each finished episode goes through the buffer and is appended to the
dataset in one atomic write, so a killed process keeps every episode that finished.

With ``collect.workers`` N > 1, N spawned processes (one env and one torch thread each) roll out
whole episodes, ``2 N`` ahead of the writer; this process takes them in episode order, cuts the
last one to ``--steps`` where needed, and writes them as one process would: the dataset is the
same, row for row, for any N. Worth it where the env's own step (physics, drawing) dominates, as
Push-T's 512 x 512 canvas does (``benchmarks/collect_workers.py``).
"""

import os
import time

import numpy as np

from swmcli.config import SwmConfig
from swmcli.data.buffer import ReplayBuffer
from swmcli.data.formats import open_reader, open_writer
from swmcli.data.storage import location
from swmcli.envs.make import make_env
from swmcli.envs.policies import make_policy
from swmcli.envs.recording import (
    action_dim_of,
    cut_episode,
    env_metadata,
    episode_rows,
    episode_seed,
    step_row,
)
from swmcli.errors import SwmError, blame_user, describe_unexpected
from swmcli.interrupts import deferred_interrupts
from swmcli.report import CommandResult, progress


def step_target(settings) -> int | None:
    """Steps to collect: ``--steps``; else none with ``--episodes``; else the buffer's worth."""
    if settings.steps is not None:
        return settings.steps
    return None if settings.episodes is not None else settings.max_steps


def buffer_capacity(cfg: SwmConfig) -> tuple[int, str | None]:
    """The buffer's capacity: ``--max-steps``, or less when ``--steps`` or ``--episodes`` asks for
    less (an episode is at most ``env.max_episode_steps`` steps plus its last observation's
    row); the note says so when it is less."""
    settings = cfg.collect
    if settings.steps is not None:
        asked, why = settings.steps, f"--steps {settings.steps:,}"
    elif settings.episodes is not None:
        asked = settings.episodes * (cfg.env.max_episode_steps + 1)
        why = f"--episodes {settings.episodes:,} x at most {cfg.env.max_episode_steps + 1:,} rows"
    else:
        return settings.max_steps, None
    if asked >= settings.max_steps:
        return settings.max_steps, None
    return asked, (
        f"buffer sized for {asked:,} steps ({why}), not the --max-steps of "
        f"{settings.max_steps:,}"
    )


def run_collect(cfg: SwmConfig, monitor) -> CommandResult:
    """Collect ``--episodes`` episodes, or exactly ``--steps`` steps (default: the buffer's
    worth, ``--max-steps``)."""
    settings = cfg.collect
    with monitor.phase("setup"):
        env = make_env(
            cfg.env.id,
            cfg.env.resolution,
            cfg.env.max_episode_steps,
            seed=settings.seed,
            kwargs=cfg.env.kwargs,
        )
        # A policy the env cannot run is refused here, before anything is written.
        make_policy(settings.policy, env, settings.seed, noise=settings.noise)
        action_dim = action_dim_of(env)
        max_steps, max_steps_note = buffer_capacity(cfg)
        buffer = ReplayBuffer(max_steps, seed=settings.seed)
        # Preflight and allocate before anything is written, from a row like the rollouts' (without
        # asking the policy, whose seeded stream the rollouts then start from).
        obs, _ = env.reset(seed=settings.seed)
        buffer.allocate(step_row(obs, np.full(action_dim, np.nan, np.float32), 0.0, False, False))
        metadata = env_metadata(cfg, action_dim, settings.policy)
        metadata["random_episodes"] = settings.random_episodes
        writer = open_writer(settings.out, settings.format, mode="append", metadata=metadata)

    target = step_target(settings)
    episodes = steps = 0
    start = time.perf_counter()
    total = target or settings.episodes
    with (
        monitor.phase("collect"),
        writer,
        progress("collect", total) as advance,
        deferred_interrupts() as interrupted,
    ):
        try:
            if settings.workers > 1:
                episodes, steps = _pooled_rollouts(
                    cfg, buffer, writer, target, action_dim, advance, interrupted
                )
            else:
                episodes, steps = _rollouts(
                    env, buffer, writer, settings, target, action_dim, advance, interrupted
                )
        except KeyboardInterrupt:
            raise SwmError(
                f"interrupted: every finished episode is saved in {settings.out}",
                hint="run the same command again to append more: new episodes get new seeds",
                exit_code=130,
            ) from None
        except SwmError:
            raise
        except Exception as error:  # the object store (or the disk) failed mid-collect
            message, hint = describe_unexpected(error)
            raise SwmError(
                f"{message}; {settings.out} keeps the {writer.num_episodes} episodes written "
                "before it",
                hint=hint,
            ) from error
        finally:
            env.close()
    seconds = time.perf_counter() - start


    reader = open_reader(settings.out)
    out = location.as_location(settings.out)
    config_path = location.with_name(out, location.name(out) + ".config.json")
    location.write_text(config_path, cfg.model_dump_json(indent=2) + "\n")
    result = CommandResult(
        title="collect",
        fields={
            "out": str(settings.out),
            "format": reader.format,
            "env": cfg.env.id,
            "policy": settings.policy,
            "episodes": episodes,
            "steps": steps,
            "evicted_episodes": buffer.evicted_episodes,
            "steps_per_s": round(steps / max(seconds, 1e-9), 1),
            "buffer_allocated_bytes": buffer.nbytes,
            "buffer_max_steps": max_steps,
            "buffer_max_bytes": max_steps * buffer.bytes_per_step,
            "dataset_episodes": reader.num_episodes,
            "dataset_steps": reader.num_steps,
            "dataset_on_disk_bytes": reader.nbytes_on_disk,
        },
        notes=[*filter(None, [max_steps_note]), f"resolved config saved to {config_path}"],
    )
    reader.close()
    return result


def _rollouts(
    env, buffer, writer, settings, target, action_dim, advance, interrupted
) -> tuple[int, int]:
    """Roll out episodes until ``settings.episodes`` are saved, or exactly ``target`` steps.

    Ctrl-C or SIGTERM (``interrupted()``) stops between rows, never inside a write: the episode
    in progress is dropped and every finished one is already on disk.
    """
    episodes = steps = 0
    while True:
        limit = None if target is None else target - steps
        seed, name = _episode_plan(settings, writer.num_episodes)
        policy = make_policy(name, env, seed, noise=settings.noise)
        for row in episode_rows(env, policy, action_dim, seed=seed, limit=limit):
            if interrupted():
                raise KeyboardInterrupt
            buffer.add(row)
            if target is not None:
                advance(1)
        buffer.end_episode()
        episode = buffer.last_episode()
        writer.write_episode(episode)
        episodes, steps = episodes + 1, steps + len(episode["action"])
        advance(0 if target else 1, episodes=episodes, steps=steps)
        done = steps >= target if target is not None else episodes >= settings.episodes
        if done:
            return episodes, steps


def _episode_plan(settings, index: int) -> tuple[int, str]:
    """The seed and the policy of the dataset's episode ``index``: its first
    ``random_episodes`` are random actions, then the chosen policy's."""
    name = "random" if index < settings.random_episodes else settings.policy
    return episode_seed(settings.seed, index), name


def _pooled_rollouts(
    cfg: SwmConfig, buffer, writer, target, action_dim, advance, interrupted
) -> tuple[int, int]:
    """``_rollouts`` with ``collect.workers`` processes rolling out whole episodes (see the
    module docstring); Ctrl-C stops between episodes, the workers ignore it and are ended."""
    import multiprocessing
    from collections import deque
    from concurrent.futures import ProcessPoolExecutor

    settings = cfg.collect
    context = multiprocessing.get_context("spawn")  # Lance and torch are not fork-safe
    window = 2 * settings.workers
    episodes = steps = 0
    # A failing worker raises here (through its future), a dead one as BrokenProcessPool.
    pool = ProcessPoolExecutor(settings.workers, context, _worker_start, (cfg.model_dump(),))
    try:
        first = writer.num_episodes
        pending = deque(pool.submit(_worker_episode, first + k) for k in range(window))
        while True:
            episode = pending.popleft().result()
            pending.append(pool.submit(_worker_episode, first + episodes + window))
            if interrupted():
                raise KeyboardInterrupt
            if target is not None:
                episode = cut_episode(episode, target - steps)
            buffer.add_episode(episode)
            writer.write_episode(buffer.last_episode())
            length = len(episode["action"])
            episodes, steps = episodes + 1, steps + length
            advance(length if target else 1, episodes=episodes, steps=steps)
            done = steps >= target if target is not None else episodes >= settings.episodes
            if done:
                return episodes, steps
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


_WORKER: dict = {}  # a worker process's config, env and action dimension


def _worker_start(config: dict) -> None:
    """A worker: one torch thread, Ctrl-C left to the main process (nothing here can fail)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    _WORKER["config"] = config


def _worker_episode(index: int) -> dict[str, np.ndarray]:
    """Episode ``index`` of the dataset, rolled out whole in this worker (its env made once).
    An error of the user's policy or env is named here, where its traceback still is."""
    try:
        return _rolled_out(index)
    except (Exception, SystemExit) as error:
        blamed = blame_user(error)
        if blamed is None:
            raise
        raise blamed from None


def _rolled_out(index: int) -> dict[str, np.ndarray]:
    if "env" not in _WORKER:
        cfg = SwmConfig.model_validate(_WORKER["config"])
        env = make_env(
            cfg.env.id,
            cfg.env.resolution,
            cfg.env.max_episode_steps,
            cfg.collect.seed,
            cfg.env.kwargs,
        )
        _WORKER.update(cfg=cfg, env=env, action_dim=action_dim_of(env))
    env, settings = _WORKER["env"], _WORKER["cfg"].collect
    seed, name = _episode_plan(settings, index)
    policy = make_policy(name, env, seed, noise=settings.noise)
    rows = list(episode_rows(env, policy, _WORKER["action_dim"], seed=seed))
    return {key: np.stack([row[key] for row in rows]) for key in rows[0]}
