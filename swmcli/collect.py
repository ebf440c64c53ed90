"""`swm collect`: roll out a policy through the capped ReplayBuffer into an on-disk dataset.

Row t of an episode holds observation t, what the env reported on arriving there (``reward``,
``terminated``, ``truncated``; zero and False on the first row) and the action taken from it; the
last row's action is NaN. Each finished episode goes through the buffer and is appended to the
dataset in one atomic write, so a killed process keeps every episode that finished.
"""

import time

import numpy as np

from swmcli.config import SwmConfig
from swmcli.errors import SwmError
from swmcli.report import CommandResult, progress
from swmcli.rollout import action_dim_of, env_metadata, episode_rows, episode_seed, step_row


def step_target(settings) -> int | None:
    """Steps to collect: ``--steps``; else none with ``--episodes``; else the buffer's worth."""
    if settings.steps is not None:
        return settings.steps
    return None if settings.episodes is not None else settings.buffer_steps


def buffer_capacity(cfg: SwmConfig) -> tuple[int, str | None]:
    """The buffer's cap: ``--buffer-steps``, or less when ``--steps`` or ``--episodes`` asks for
    less (an episode is at most ``env.max_episode_steps`` steps plus its last observation's
    row); the note says so when it is less."""
    settings = cfg.collect
    if settings.steps is not None:
        asked, why = settings.steps, f"--steps {settings.steps:,}"
    elif settings.episodes is not None:
        asked = settings.episodes * (cfg.env.max_episode_steps + 1)
        why = f"--episodes {settings.episodes:,} x at most {cfg.env.max_episode_steps + 1:,} rows"
    else:
        return settings.buffer_steps, None
    if asked >= settings.buffer_steps:
        return settings.buffer_steps, None
    return asked, (
        f"buffer sized for {asked:,} steps ({why}), not the --buffer-steps cap of "
        f"{settings.buffer_steps:,}"
    )


def run_collect(cfg: SwmConfig, monitor) -> CommandResult:
    """Collect ``--episodes`` episodes, or exactly ``--steps`` steps (default: the buffer's
    worth, ``--buffer-steps``)."""
    from swmcli.core.buffer import ReplayBuffer
    from swmcli.core.interrupts import deferred_interrupts
    from swmcli.core.storage import open_writer
    from swmcli.envs import make_env
    from swmcli.envs.policies import make_policy

    settings = cfg.collect
    with monitor.phase("setup"):
        env = make_env(
            cfg.env.id,
            cfg.env.resolution,
            cfg.env.max_episode_steps,
            seed=settings.seed,
            kwargs=cfg.env.kwargs,
        )
        make_policy(settings.policy, env, settings.seed)  # refuses a policy the env cannot run
        action_dim = action_dim_of(env)
        cap, cap_note = buffer_capacity(cfg)
        buffer = ReplayBuffer(cap, seed=settings.seed)
        # A first row triggers the buffer's preflight and allocation before anything is written
        # (without asking the policy, whose seeded stream the rollouts then start from).
        obs, _ = env.reset(seed=settings.seed)
        buffer.add(step_row(obs, np.full(action_dim, np.nan, np.float32), 0.0, False, False))
        buffer.clear()
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
            episodes, steps = _rollouts(
                env, buffer, writer, settings, target, action_dim, advance, interrupted
            )
        except KeyboardInterrupt:
            raise SwmError(
                f"interrupted: every finished episode is saved in {settings.out}",
                hint="run the same command again to append more: new episodes get new seeds",
                exit_code=130,
            ) from None
        finally:
            env.close()
    seconds = time.perf_counter() - start

    from swmcli.core.storage import location, open_reader

    reader = open_reader(settings.out)
    config_path = location.with_name(settings.out, location.name(settings.out) + ".config.json")
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
            "buffer_cap_steps": cap,
            "buffer_cap_bytes": cap * buffer.bytes_per_step,
            "dataset_episodes": reader.num_episodes,
            "dataset_steps": reader.num_steps,
            "dataset_on_disk_bytes": reader.nbytes_on_disk,
        },
        notes=[*([cap_note] if cap_note else []), f"resolved config saved to {config_path}"],
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
    from swmcli.envs.policies import make_policy

    episodes = steps = 0
    while True:
        limit = None if target is None else target - steps
        seed = episode_seed(settings.seed, writer.num_episodes)
        # The dataset's first random_episodes are random actions, then the chosen policy's.
        name = "random" if writer.num_episodes < settings.random_episodes else settings.policy
        policy = make_policy(name, env, seed)
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
