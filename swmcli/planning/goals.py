"""Goal-reaching protocols of `swm eval`: which episodes a planner (and the random policy) play.

- ``random-goal``: episode ``i`` is the env reset with seed ``eval.seed + i``: a fresh random
  start and goal (TwoRoom: anywhere in either room).
- ``dataset`` (stable-worldmodel's protocol): episode ``i`` starts from the recorded state of a
  held-out dataset episode at some step ``t`` and aims for the observation recorded
  ``goal_offset`` env steps later in that same episode; success is reaching that step's state.
  Starts ``(episode, t)`` are drawn without replacement from every valid one (with replacement
  only when there are fewer than asked), seeded by ``eval.seed``.

Both give a list of ``GoalEpisode`` that the planner and the random baseline play alike, so the
two are compared on the same episodes. ``wilson_interval`` is the 95% interval reported with
every success rate.
"""

import math
from dataclasses import dataclass

import numpy as np

from swmcli.data.clips import heldout_split
from swmcli.data.formats import open_reader
from swmcli.errors import UsageError

WILSON_Z = 1.959964  # two-sided 95%


@dataclass
class GoalEpisode:
    """One evaluation episode: its env seed and, for the dataset protocol, where it comes from."""

    seed: int
    state: np.ndarray | None = None  # the recorded start state (None: the env's random reset)
    goal_state: np.ndarray | None = None
    goal_pixels: np.ndarray | None = None  # the recorded goal observation
    goal_proprio: np.ndarray | None = None  # the agent's recorded state there (model.proprio)
    source: tuple[int, int] | None = None  # (dataset episode, start step)


def goal_episodes(cfg) -> list[GoalEpisode]:
    """The episodes ``cfg.eval.protocol`` asks for."""
    settings = cfg.eval
    if settings.protocol == "random-goal":
        if cfg.model.proprio:
            raise UsageError(
                "a model trained with model.proprio plans toward a goal image and the agent's "
                "state there, and random goals give only the image",
                hint="use --protocol dataset (its goals are recorded rows, proprio included)",
            )
        return [GoalEpisode(settings.seed + i) for i in range(settings.episodes)]
    return dataset_episodes(cfg.data.path, settings)


def dataset_episodes(path, settings, among: range | None = None) -> list[GoalEpisode]:
    """Start states and goal observations ``settings.goal_offset`` steps apart, drawn from the
    dataset episodes ``among``: by default the held-out ones (the last
    ``settings.heldout_episodes``, split as training splits them)."""
    reader = open_reader(path)
    try:
        if among is None:
            _, among = heldout_split(reader.num_episodes, settings.heldout_episodes)
        if "state" not in reader.keys:
            raise UsageError(
                f"{path} records no 'state', which --protocol dataset sets the env to",
                hint="collect from an env whose observation holds its state (swm/TwoRoom-v0, "
                "gym-pusht), or use --protocol random-goal",
            )
        starts = _draw_starts(reader.episode_lengths, among, settings)
        keys = ["state", "pixels"] + (["proprio"] if "proprio" in reader.keys else [])
        episodes = []
        for i, (episode, step) in enumerate(starts):
            rows = reader.read_episode(episode, keys=keys)
            goal_step = step + settings.goal_offset
            # Taken by a list (a copy): a plain row would keep its whole episode alive, read-only.
            row = {key: value[[step, goal_step]] for key, value in rows.items()}
            episodes.append(
                GoalEpisode(
                    seed=settings.seed + i,
                    state=row["state"][0],
                    goal_state=row["state"][1],
                    goal_pixels=row["pixels"][1],
                    goal_proprio=row["proprio"][1] if "proprio" in row else None,
                    source=(episode, step),
                )
            )
        return episodes
    finally:
        reader.close()


def _draw_starts(lengths: np.ndarray, heldout: range, settings) -> list[tuple[int, int]]:
    """``settings.episodes`` (episode, step) pairs whose goal step lies inside the episode."""
    offset = settings.goal_offset
    pairs = [
        (episode, step) for episode in heldout for step in range(int(lengths[episode]) - offset)
    ]
    if not pairs:
        longest = max((int(lengths[episode]) for episode in heldout), default=0)
        raise UsageError(
            f"no held-out episode is longer than --goal-offset {offset} steps "
            f"(the longest has {longest} rows)",
            hint="lower --goal-offset, or hold out more episodes (--set eval.heldout_episodes=N)",
        )
    rng = np.random.default_rng(settings.seed)
    picks = rng.choice(len(pairs), settings.episodes, replace=settings.episodes > len(pairs))
    return [pairs[i] for i in picks]


def wilson_interval(successes: int, trials: int) -> tuple[float, float]:
    """The Wilson score 95% interval of a success rate (sound at 0 and at n/n, unlike p +- 2se)."""
    if trials == 0:
        return 0.0, 1.0
    rate = successes / trials
    z2 = WILSON_Z**2
    centre = (rate + z2 / (2 * trials)) / (1 + z2 / trials)
    half = WILSON_Z * math.sqrt(rate * (1 - rate) / trials + z2 / (4 * trials**2))
    half /= 1 + z2 / trials
    return max(0.0, centre - half), min(1.0, centre + half)
