"""Reproduces docs/reports/pusht.md, table 'What limits it', row 'the planner's plans as data'.

Push-T data from the planner's own plans: a run's planner played from training start rows
toward their recorded goals, every step recorded, the same held-out episodes last.

    PYTHONPATH=. python experiments/pusht_planner_data.py RUN OUT [--episodes 200] [--seed 5000]
        [--repeat 1] [--set KEY=VALUE ...]

Draws ``--episodes`` start rows and goals as ``swm eval``'s dataset protocol does, but from the
training episodes of RUN's dataset, never the held-out ones; plays RUN's planner (its settings,
or the ``--set`` given, as ``swm eval RUN --set`` resolves them) for the protocol's whole budget
(past a success, so every episode has the same length), recording each step as ``swm collect``
does. Then writes OUT: the dataset's training episodes, the planner's episodes, then its held-out
episodes (each planner episode ``--repeat`` times, to weigh it more in the clips a run draws), so
a run trained on OUT is evaluated on the very start rows and goals of runs trained on the
dataset. What the model predicts worst is where the search goes (``plan_or_model.py --play``);
these episodes are the search's own choices, run in the env. Needs gym-pusht.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np

from swmcli.commands.evaluate import load_model
from swmcli.config import eval_budget, load_run_config
from swmcli.data.clips import heldout_split
from swmcli.data.formats import open_reader, open_writer
from swmcli.envs.make import make_env
from swmcli.envs.plugins import restore_recorded
from swmcli.envs.recording import episode_rows
from swmcli.models.runner import make_runner
from swmcli.planning.episodes import planner_actor
from swmcli.planning.goals import dataset_episodes
from swmcli.report import progress


class FromRecorded(gym.Wrapper):
    """The env whose reset restores a recorded start state (the episode's success does not end
    it: the whole budget is recorded)."""

    def __init__(self, env, episode):
        super().__init__(env)
        self.episode = episode

    def reset(self, *, seed=None, options=None):
        """The recorded start row, restored as ``swm eval`` restores it."""
        episode = self.episode
        _, observation = restore_recorded(self.env, episode.state, episode.goal_state, episode.seed)
        return observation, {}


def planner_episodes(run: Path, cfg, starts) -> Iterator[dict[str, np.ndarray]]:
    """The planner of ``run`` played from each of ``starts`` (``GoalEpisode``s) for the budget,
    one episode at a time (written as it ends, never all held in memory)."""
    runner = make_runner(cpu_threads=cfg.runtime.cpu_threads)  # as swm eval: beside other jobs
    model, state = load_model(run, cfg, runner)
    shape = state["model_args"]
    budget = eval_budget(cfg)
    limit = max(cfg.env.max_episode_steps, budget)  # the env's own limit, as swm eval sets it
    with runner.inference(model), progress("planner episodes", total=len(starts)) as advance:
        for episode in starts:
            env = make_env(cfg.env.id, shape["resolution"], limit, episode.seed, cfg.env.kwargs)
            act = planner_actor(model, cfg, runner, shape, env, episode)
            queued: list[np.ndarray] = []

            def policy(observation, act=act, queued=queued):
                if not queued:
                    queued.extend(act(observation))
                return queued.pop(0)

            restored = FromRecorded(env, episode)
            rows = list(episode_rows(restored, policy, shape["action_dim"], limit=budget + 1))
            env.close()
            yield {key: np.stack([row[key] for row in rows]) for key in rows[0]}
            advance(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a run trained on gym-pusht's dataset protocol")
    parser.add_argument("out", type=Path, help="the dataset to write (must not exist)")
    parser.add_argument("--episodes", type=int, default=200, help="planner episodes to record")
    parser.add_argument("--seed", type=int, default=5000, help="draws the start rows")
    parser.add_argument("--repeat", type=int, default=1, help="copies of each planner episode")
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    args = parser.parse_args()
    cfg = load_run_config(args.run, sets=args.overrides)
    settings = cfg.eval.model_copy(update={"episodes": args.episodes, "seed": args.seed})
    source = open_reader(cfg.data.path)
    training, heldout = heldout_split(source.num_episodes, settings.heldout_episodes)
    starts = dataset_episodes(cfg.data.path, settings, among=training)
    metadata = {**source.metadata, "policy": f"planner of {args.run.name}"}
    with tempfile.TemporaryDirectory(dir=args.out.parent) as scratch:
        staged = Path(scratch) / args.out.name  # written whole, then moved: no half dataset
        with open_writer(staged, mode="error", metadata=metadata) as writer:
            for index in training:
                writer.write_episode(source.read_episode(index))
            for episode in planner_episodes(args.run, cfg, starts):
                for _ in range(args.repeat):
                    writer.write_episode(episode)
            for index in heldout:
                writer.write_episode(source.read_episode(index))
        staged.rename(args.out)
    source.close()
    print(f"{args.out}: {len(training)} + {len(starts)} planner + {len(heldout)} held out episodes")


if __name__ == "__main__":
    main()
