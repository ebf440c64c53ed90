"""Online training's data: a policy fills the capped ReplayBuffer while the trainer samples it.

Before optimizer step ``k`` the collector has written ``warmup_steps + k / updates_per_step``
rows (rows are observations: an env step each, plus one per episode for its last observation);
then every micro-batch draws its clips uniformly from the sealed episodes with a generator seeded
by (seed, step, micro-batch). Episodes run from ``envs.recording.episode_rows`` with ``collect``'s
per-episode seeds, so episode ``i`` of an online run is episode ``i`` of ``swm collect --seed``.
When the ring is full the buffer evicts whole oldest episodes, never the one being written, and
with ``--record`` each finished episode is appended to a dataset in one atomic write: a killed run
keeps every finished episode, and ``--resume`` refills the buffer with the newest of them.
The policy is ``expert``, ``random``, or ``planner``: the model being trained, planning toward
the env's goal with exploration noise (``NoisyPlanner``).

One process, not a collector process writing into a shared-memory ring: on 2 cores an env step
and its row cost microseconds next to an optimizer step's tenths of a second (at 64x64, about
20 rows per step cost ~1% of it), so a second process would only take a core from the trainer's
threads and add a shared ring's locking for nothing.
"""

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from swmcli.config import SwmConfig
from swmcli.data.buffer import ReplayBuffer
from swmcli.data.formats import detect, open_reader, open_writer
from swmcli.data.streaming import collate_clips
from swmcli.envs.make import goal_pixels, has_goal_image, make_env
from swmcli.envs.policies import make_policy
from swmcli.envs.recording import action_dim_of, env_metadata, episode_rows, episode_seed, step_row
from swmcli.errors import UsageError
from swmcli.planning.planners import RecedingHorizon, planner_settings
from swmcli.training.sources import fill_buffer, newest_episodes, ram_budget
from swmcli.training.step import train_keys


class OnlineFeed:
    """The env, the policy's episodes, the capped buffer and the record dataset of one run."""

    def __init__(self, cfg: SwmConfig, budget: int):

        self.cfg = cfg
        self.seed = cfg.train.seed
        self.env = make_env(
            cfg.env.id, cfg.env.resolution, cfg.env.max_episode_steps, self.seed, cfg.env.kwargs
        )
        if cfg.online.policy == "planner":
            _check_plannable(self.env, cfg.env.id)
        else:  # refuses a policy the env cannot run
            make_policy(cfg.online.policy, self.env, self.seed, noise=cfg.collect.noise)
        self.model = self.runner = None  # what --policy planner plans with (``plan_with``)
        self.action_dim = action_dim_of(self.env)
        self.max_steps = cfg.online.max_steps
        self.buffer = ReplayBuffer(
            self.max_steps,
            cfg.data.history_len,
            cfg.data.frameskip,
            seed=self.seed,
            max_bytes=budget,
        )
        # The buffer's preflight and allocation, before the model is built.
        obs, _ = self.env.reset(seed=self.seed)
        nan = np.full(self.action_dim, np.nan, np.float32)
        self.buffer.allocate(step_row(obs, nan, 0.0, False, False))
        self.writer = None
        self.episodes = self.rows = 0  # finished episodes and rows collected, record included
        self.refilled = 0
        self._episode: Iterator | None = None

    @property
    def metadata(self) -> dict:
        """What ``model_args`` and a record dataset need to know about the data."""
        return env_metadata(self.cfg, self.action_dim, self.cfg.online.policy)

    def open_record(self, resume: bool) -> None:
        """Open ``--record`` for appending; when resuming, refill the buffer from it first."""
        record = self.cfg.online.record
        if record is None:
            if resume:
                raise UsageError(
                    "an online run resumes from its --record dataset, and this one has none",
                    hint="start a new run with --record DATASET so that it can be resumed",
                )
            return
        if resume and Path(record).exists():
            detect(record)
            reader = open_reader(record)
            lengths, self.episodes, self.rows = (
                reader.episode_lengths,
                reader.num_episodes,
                reader.num_steps,
            )
            reader.close()
            newest = newest_episodes(lengths, range(self.episodes), self.max_steps)
            fill_buffer(self.buffer, record, newest, None)
            self.refilled = len(newest)
        self.writer = open_writer(record, mode="append", metadata=self.metadata)

    def plan_with(self, model, runner) -> None:
        """The model being trained, and its runner: ``--policy planner`` plans with them."""
        self.model, self.runner = model, runner

    def collect_until(self, rows: int) -> None:
        """Roll out until ``rows`` rows are collected and at least one clip can be sampled."""
        while self.rows < rows or self.buffer.num_clips == 0:
            if self._episode is None:
                seed = episode_seed(self.seed, self.episodes)
                if self.cfg.online.policy == "planner":
                    policy = NoisyPlanner(self.model, self.runner, self.cfg, self.env, seed)
                else:
                    noise = self.cfg.collect.noise  # the expert's, as in `swm collect`
                    policy = make_policy(self.cfg.online.policy, self.env, seed, noise=noise)
                self._episode = episode_rows(self.env, policy, self.action_dim, seed=seed)
            row = next(self._episode, None)
            if row is None:
                self._finish_episode()
                continue
            self.buffer.add(row)
            self.rows += 1

    def _finish_episode(self) -> None:
        self.buffer.end_episode()
        if self.writer is not None:
            self.writer.write_episode(self.buffer.last_episode())
        self.episodes += 1
        self._episode = None

    def batches(self, first_step: int) -> Iterator[dict]:
        """The micro-batches of steps ``first_step .. train.steps-1``, collecting before each
        step what that step is due."""
        train, online = self.cfg.train, self.cfg.online
        for step in range(first_step, train.steps):
            self.collect_until(online.warmup_steps + int(step / online.updates_per_step))
            for micro in range(train.grad_accum):
                rng = np.random.default_rng([self.seed, step, micro])
                indices = rng.integers(0, self.buffer.num_clips, train.batch_size)
                batch = self.buffer.read_batch(indices)
                yield collate_clips({key: batch[key] for key in train_keys(self.cfg)})

    def fields(self) -> dict:
        """Figures for the run's result."""
        return {
            "env": self.cfg.env.id,
            "policy": self.cfg.online.policy,
            "collected_episodes": self.episodes,
            "collected_steps": self.rows,
            "refilled_episodes": self.refilled,
            "buffer_episodes": self.buffer.num_episodes,
            "buffer_filled_steps": len(self.buffer),
            "evicted_episodes": self.buffer.evicted_episodes,
            "record": None if self.cfg.online.record is None else str(self.cfg.online.record),
        }

    def close(self) -> None:
        """Close the record dataset and the env (the episode in progress is not kept)."""
        if self.writer is not None:
            self.writer.close()
        self.env.close()


class NoisyPlanner:
    """``--policy planner``: the model being trained plans toward the env's goal with the run's
    ``[eval]`` planner (receding horizon, one plan per ``replan_every`` blocks of ``frameskip``
    env steps) from the current frame; every planned action gets Gaussian noise of std
    ``online.noise`` and is clipped to the action space. Planning runs in eval mode without
    gradients; the model goes back to training after each plan."""

    def __init__(self, model, runner, cfg: SwmConfig, env, seed: int):

        self.model, self.runner, self.env = model, runner, env
        self.action_dim = action_dim_of(env)
        settings = planner_settings(cfg.eval, self.action_dim)
        block = cfg.data.frameskip * self.action_dim
        self.planner = RecedingHorizon(model, cfg.eval.planner, settings, block, seed)
        self.noise = cfg.online.noise
        self.rng = np.random.default_rng(seed)
        self.queue: list[np.ndarray] = []
        self.goal_set = False

    def __call__(self, observation: dict) -> np.ndarray:
        if not self.queue:
            self.queue = list(self._plan(observation["pixels"]))
        action = self.queue.pop(0) + self.rng.normal(0.0, self.noise, self.action_dim)
        space = self.env.action_space
        return np.clip(action, space.low, space.high).astype(np.float32)

    def _plan(self, pixels: np.ndarray) -> np.ndarray:
        """The actions of the blocks to execute now, ``(steps, action_dim)``."""
        with self.runner.inference(self.model):
            if not self.goal_set:  # the env was reset just before the first action
                goal = goal_pixels(self.env)
                self.planner.reset(self.runner.to_device({"goal": goal})["goal"])
                self.goal_set = True
            frame = self.runner.to_device({"pixels": pixels})["pixels"]
            blocks = self.planner.act(frame).float().cpu().numpy()
        return blocks.reshape(-1, self.action_dim)


def _check_plannable(env, env_id: str) -> None:
    """``--policy planner`` needs a goal image to plan toward and continuous actions."""
    import gymnasium as gym


    if not has_goal_image(env) or not isinstance(env.action_space, gym.spaces.Box):
        raise UsageError(
            f"--policy planner plans toward the env's goal image, and {env_id} has no goal "
            "image or no continuous actions",
            hint="use --policy expert or random, or a goal-conditioned env (swm/TwoRoom-v0)",
        )


class OnlineData:
    """Clips of episodes a policy collects while the model trains (``swmcli.training.online``)."""

    def __init__(self, cfg: SwmConfig, resume: bool):
        if cfg.data.in_memory is not None:
            raise UsageError(
                "--online trains from the buffer it fills: --in-memory and --no-in-memory "
                "choose how a dataset is read",
                hint="drop --in-memory/--no-in-memory (--max-steps caps the online buffer)",
            )
        self.feed = OnlineFeed(cfg, ram_budget(cfg.data.ram_budget, cfg.data.ram_share))
        self.loads = resume  # a resumed run refills its buffer from --record (``load``)
        if not resume:
            self.feed.open_record(resume=False)
        self.metadata = self.feed.metadata
        self.episode_lengths = None  # collected as it trains: nothing to compare on --resume
        self.warnings: list[str] = []
        self.notes = [
            f"online: {cfg.online.policy} policy in {cfg.env.id}, "
            f"{cfg.online.updates_per_step:g} optimizer steps per env step after "
            f"{cfg.online.warmup_steps} warm-up steps, buffer of {self.feed.max_steps:,} steps"
        ]

    def load(self) -> None:
        self.feed.open_record(resume=True)

    def use_model(self, model, runner) -> None:
        self.feed.plan_with(model, runner)  # --policy planner plans with the model it trains

    def batches(self, first_step: int):
        return self.feed.batches(first_step)

    def fields(self) -> dict:
        return {**self.feed.fields(), "buffer_bytes": self.feed.buffer.nbytes}

    def close(self) -> None:
        self.feed.close()
