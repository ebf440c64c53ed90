"""Where training reads its clips: a dataset streamed from disk, or a ReplayBuffer loaded with it.

``TrainingData`` is what the training loop reads, whichever the source: ``StoredData`` here (a
dataset's training episodes, the held-out ones excluded), or ``online.OnlineData`` (a policy
collecting while the model trains); ``ActionCheck`` checks each batch's actions on the way in.

In memory a batch is one ``np.take`` per key, with no read, decompression or worker in between,
but the buffer holds every training step at once: it is chosen only when that fits the RAM budget
(``--ram-budget``, default ``data.ram_share`` of the RAM available). The check is the buffer's own
preflight, made before anything is allocated. A loaded buffer numbers its clips as the dataset
does (episode by episode, every valid start), so one clip order reads the same clips from either
source and a run's losses do not depend on where its clips came from.
"""

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from swmcli.config import SwmConfig, preset_names, preset_path, resolve_config
from swmcli.data.buffer import ReplayBuffer, preflight, schema_bytes
from swmcli.data.clips import heldout_split
from swmcli.data.formats import open_reader
from swmcli.data.storage import location
from swmcli.data.storage.checksums import check_episode
from swmcli.data.storage.schema import Schema
from swmcli.data.streaming import load_dataset, make_loader
from swmcli.envs.recording import env_of_data
from swmcli.errors import BudgetExceeded, DatasetError, MissingPathError, SwmError, UsageError
from swmcli.host import available_host_bytes
from swmcli.report import info, warn
from swmcli.training.distributed import rank_share
from swmcli.training.step import ClipOrder, train_keys
from swmcli.units import format_bytes


@dataclass(frozen=True)
class SourceChoice:
    """Stream or hold in memory, why, and the bytes the buffer takes."""

    in_memory: bool
    reason: str
    buffer_bytes: int


def ram_budget(budget: int | None, share: float) -> int:
    """Bytes the buffer may take: ``budget``, else ``share`` of the RAM available now."""
    return int(budget) if budget is not None else int(share * available_host_bytes())


def newest_episodes(lengths: np.ndarray, episodes: Sequence[int], max_steps: int | None):
    """The newest of ``episodes`` whose lengths add up to at most ``max_steps``, oldest first
    (all of them when ``max_steps`` is None)."""
    episodes = np.asarray(episodes, dtype=np.int64)
    if max_steps is None:
        return episodes
    newest_first = np.cumsum(np.asarray(lengths, dtype=np.int64)[episodes][::-1])
    kept = int(np.searchsorted(newest_first, max_steps, side="right"))
    if kept == 0:
        raise UsageError(
            f"--newest-steps {max_steps:,} holds no whole episode (the newest has "
            f"{int(newest_first[0]) if len(newest_first) else 0:,} steps)",
            hint="raise --newest-steps, or leave it out to train on every episode",
        )
    return episodes[len(episodes) - kept :]


def choose_source(
    schema: Schema, steps: int, in_memory: bool | None, budget: int, budget_words: str
) -> SourceChoice:
    """In memory when ``steps`` rows of ``schema`` fit ``budget`` bytes, unless ``in_memory`` says.

    ``in_memory=True`` that does not fit raises ``BudgetExceeded`` (before any allocation);
    ``None`` falls back to streaming and says why. ``budget_words`` names the budget for the
    reason ("--ram-budget", "50% of the available RAM").
    """
    row_bytes = schema_bytes(schema)
    needed = steps * row_bytes
    if in_memory is False:
        return SourceChoice(False, "streamed from disk: --no-in-memory", 0)
    try:
        preflight(steps, row_bytes, budget)
    except BudgetExceeded as refused:
        if in_memory:
            fits = budget // row_bytes
            raise BudgetExceeded(
                f"--in-memory: the {steps:,} training steps need {format_bytes(needed)} of RAM "
                f"but {budget_words} allows {format_bytes(budget)} ({fits:,} steps)",
                hint=f"pass --no-in-memory to stream them, --newest-steps {fits:,} to train on the "
                "newest that fit, or a larger --ram-budget",
                needed=needed,
                available=budget,
            ) from refused
        reason = (
            f"streamed from disk: the {steps:,} training steps need {format_bytes(needed)}, "
            f"more than {budget_words} ({format_bytes(budget)})"
        )
        return SourceChoice(False, reason, 0)
    words = "--in-memory" if in_memory else f"they fit {budget_words} ({format_bytes(budget)})"
    reason = f"in memory: {steps:,} training steps take {format_bytes(needed)}; {words}"
    return SourceChoice(True, reason, needed)


def fill_buffer(
    buffer: ReplayBuffer,
    path: Path,
    episodes: Sequence[int],
    keys: Sequence[str] | None,
    damaged: dict[int, str] | None = None,
) -> ReplayBuffer:
    """Add ``episodes`` of the dataset at ``path`` (``keys`` of them; all when None) to
    ``buffer``, in order; the first one runs the buffer's preflight before anything is held.
    Each episode is checked against its checksums first: a damaged one is a DatasetError, or,
    when a ``damaged`` dict is given, is left out and recorded there with why."""
    reader = open_reader(path)
    try:
        for index in episodes:
            episode = reader.read_episode(int(index), keys=keys)
            try:
                check_episode(reader, int(index), episode)
            except DatasetError as error:
                if damaged is None:
                    raise
                damaged[int(index)] = error.message.rsplit("(", 1)[-1].rstrip(")")
                continue
            buffer.add_episode(episode)
    finally:
        reader.close()
    return buffer


def load_clips(dataset, budget: int, seed: int) -> ReplayBuffer:
    """A ReplayBuffer holding exactly ``dataset``'s episodes (a ``ClipDataset``), clip ``i`` of
    the one being clip ``i`` of the other."""
    steps = int(dataset.episode_lengths[dataset.episodes].sum())
    buffer = ReplayBuffer(
        steps, dataset.history_len, dataset.frameskip, seed=seed, max_bytes=budget
    )
    damaged = dataset.damaged if dataset.skip_damaged else None
    return fill_buffer(buffer, dataset.path, dataset.episodes, list(dataset.keys), damaged)


def open_training_data(cfg: SwmConfig):
    """The clips to train on (all episodes but the last ``eval.heldout_episodes``; with
    ``data.newest_steps``, the newest of those that fit it).

    Returns ``(dataset, episodes, metadata)``. The dataset is indexed by ``load_dataset`` itself
    (not by opening a reader here), so this process stays safe to fork DataLoader workers from.
    """
    def load(episodes):
        return load_dataset(
            cfg.data.path,
            keys_to_load=train_keys(cfg),
            history_len=cfg.data.history_len,
            frameskip=cfg.data.frameskip,
            cache_dir=cfg.data.cache_dir,
            episodes=episodes,
            skip_damaged=cfg.data.skip_damaged,
        )

    try:
        everything = load(None)
    except MissingPathError as error:
        raise MissingPathError(error.message, hint=how_to_make(cfg)) from None
    usable = check_usable(everything.keys, cfg.data.path)
    total = len(everything.episode_lengths)
    episodes, _ = heldout_split(total, cfg.eval.heldout_episodes)
    if not episodes:
        raise UsageError(
            f"{cfg.data.path} has {total} episodes; {cfg.eval.heldout_episodes} are held out "
            "for evaluation, leaving none to train on",
            hint="collect more episodes or lower eval.heldout_episodes",
        )
    episodes = newest_episodes(everything.episode_lengths, episodes, cfg.data.newest_steps)
    dataset = load(episodes)
    per_step = cfg.train.batch_size * cfg.train.grad_accum
    if per_step > len(dataset):
        raise UsageError(
            f"a step needs {per_step} clips (batch size x grad_accum) but {cfg.data.path} has "
            f"{len(dataset)} training clips",
            hint=f"lower --batch-size to at most {len(dataset) // cfg.train.grad_accum}, "
            "or collect more episodes",
        )
    # The loaded keys' shapes, for data whose metadata does not list them (model_args reads them).
    return dataset, episodes, {"keys": everything.keys, **everything.metadata, **usable}


def check_usable(schema, path) -> dict[str, int]:
    """The resolution and action_dim of data swm can train on (square RGB uint8 frames, float
    actions of one dimension); else one "cannot use" line naming the key and what is supported."""
    dtype, shape = np.dtype(schema["pixels"][0]), tuple(schema["pixels"][1])
    fix = _FRAME_FIXES.get(shape[2:]) if len(shape) == 3 else None
    if dtype != np.uint8:
        fix = "store frames as uint8 (0..255)"
    elif len(shape) == 3 and shape[2] == 3 and shape[0] != shape[1]:
        fix = f"crop or resize the {shape[0]}x{shape[1]} frames to a square"
    if fix is not None or len(shape) != 3:
        raise UsageError(
            f"cannot use pixels {dtype.name} {shape} of {path}: swm trains on square RGB frames, "
            "uint8 of shape (N, N, 3)",
            hint=fix or "give pixels the shape (N, N, 3)",
        )
    dtype, action = np.dtype(schema["action"][0]), tuple(schema["action"][1])
    if dtype.kind != "f" or len(action) != 1:
        raise UsageError(
            f"cannot use action {dtype.name} {action} of {path}: swm trains on float actions "
            "of shape (A,) (one vector a step, NaN after an episode's last observation)",
            hint="store each step's action as one vector of floats (a single number as shape (1,))",
        )
    return {"resolution": shape[0], "action_dim": int(np.prod(action))}


_FRAME_FIXES = {
    (1,): "convert the grayscale frames to RGB (3 channels)",
    (4,): "drop the alpha channel (RGBA -> RGB)",
}


PASSES_WARNING = 50  # more passes than this over the training clips and the model memorises them


def _loader(cfg: SwmConfig, dataset, first_step: int, world):
    """A DataLoader yielding this rank's share of the batches of steps ``first_step ..
    train.steps-1``, in order.

    The batches follow ``ClipOrder`` instead of shuffled epochs, so that a resumed run reads
    what an uninterrupted one would have.
    """
    per_step = cfg.train.batch_size * cfg.train.grad_accum
    order = ClipOrder(dataset.num_clips, per_step, first_step, cfg.train.steps, cfg.train.seed)
    order = rank_share(order, cfg.train.batch_size, world)
    return make_loader(
        dataset,
        cfg.train.batch_size // world.size,
        num_workers=cfg.data.num_workers,
        seed=cfg.train.seed,
        prefetch_factor=cfg.data.prefetch_factor,
        order=order,
        processes=cfg.data.worker_kind == "processes",
    )


class TrainingData(Protocol):
    """Where a run's clips come from: a dataset (``StoredData``) or a policy collecting while
    the model trains (``online.OnlineData``). The training loop reads only this."""

    metadata: dict  # what ``models.interface.model_args`` reads: resolution, action_dim
    episode_lengths: Any  # a dataset's, fingerprinted for --resume; None online
    loads: bool  # ``load`` has work to do (measured as its own phase)
    notes: list[str]
    warnings: list[str]

    def load(self) -> None: ...
    def use_model(self, model, runner) -> None: ...
    def batches(self, first_step: int) -> Iterator[dict]: ...
    def fields(self) -> dict: ...
    def close(self) -> None: ...


class StoredData:
    """Clips of a dataset's training episodes: streamed from disk, or loaded into a ReplayBuffer
    when they fit the RAM budget (``--in-memory`` insists, ``--no-in-memory`` streams)."""

    def __init__(self, cfg: SwmConfig, world):
        if cfg.online.record is not None:
            raise UsageError(
                "--record saves the episodes of an online run, and this run is not online",
                hint="add --online --env ID, or drop --record",
            )
        self.cfg, self.world = cfg, world
        self.dataset, self.episodes, self.metadata = open_training_data(cfg)
        self.episode_lengths = self.dataset.episode_lengths
        self.warnings = _passes_warning(cfg, len(self.dataset))
        self.budget = ram_budget(cfg.data.ram_budget, cfg.data.ram_share)
        words = (
            "--ram-budget"
            if cfg.data.ram_budget is not None
            else f"{cfg.data.ram_share:.0%} of the RAM available"
        )
        steps = int(self.dataset.episode_lengths[self.dataset.episodes].sum())
        self.source = choose_source(
            self.dataset.keys, steps, cfg.data.in_memory, self.budget, words
        )
        info(f"clips {self.source.reason}")
        self.notes = [f"clips {self.source.reason}"]
        self.loads = self.source.in_memory
        self.clips = self.dataset

    def load(self) -> None:
        self.clips = load_clips(self.dataset, self.budget, self.cfg.train.seed)

    def use_model(self, model, runner) -> None:
        """A dataset's clips do not depend on the model."""

    def batches(self, first_step: int):
        return iter(_loader(self.cfg, self.clips, first_step, self.world))

    def fields(self) -> dict:
        damaged = self.dataset.damaged  # found while reading; skipped with --skip-damaged
        if damaged:
            shown = "; ".join(f"episode {e}: {why}" for e, why in sorted(damaged.items())[:5])
            self.warnings.append(warn(f"skipped {len(damaged)} damaged episodes: {shown}"))
        return {
            "train_episodes": len(self.episodes),
            "train_clips": len(self.dataset),
            "clip_source": "memory" if self.source.in_memory else "stream",
            "buffer_bytes": self.source.buffer_bytes,
            "skipped_damaged_episodes": len(damaged),
        }

    def close(self) -> None:
        """Nothing to close: the loader's workers end with it."""


def _passes_warning(cfg: SwmConfig, train_clips: int) -> list[str]:
    """Warn (once, now) when the run makes more than ``PASSES_WARNING`` passes over the data
    with swm's own model (what it memorises was measured; a model of the user's may differ:
    the Push-T state model's small predictor takes hundreds of passes)."""
    passes = cfg.train.steps * cfg.train.batch_size * cfg.train.grad_accum / train_clips
    if passes <= PASSES_WARNING or cfg.model.factory is not None:
        return []
    return [
        warn(
            f"{cfg.train.steps} steps make {passes:.0f} passes over {train_clips} training clips: "
            "the model will memorise them and plan poorly. Collect more data "
            "(swm collect --max-steps 200000) or lower --steps"
        )
    ]


def how_to_make(cfg: SwmConfig) -> str:
    """How to make the missing dataset ``cfg.data.path``: ``swm collect`` with the run's own
    settings where they write it; a preset's header where it is that preset's dataset and more
    than ``swm collect`` makes it (pusht-state-64's merges three collects)."""
    wanted = location.resolve(location.as_location(cfg.data.path))
    if wanted == location.resolve(location.as_location(cfg.collect.out)):
        return "collect it first: `swm collect` with this run's --preset, --config and --set"
    for name in preset_names():
        preset = resolve_config(name)
        made_alone = preset.collect.out == preset.data.path
        if not made_alone and location.resolve(location.as_location(preset.data.path)) == wanted:
            return (
                f"`swm collect` alone does not make it: run the commands at the top of preset "
                f"{name}'s file, {preset_path(name)}"
            )
    return f"pass --data DATASET, or collect it with `swm collect --out {cfg.data.path}`"


def env_of_training_data(cfg: SwmConfig) -> SwmConfig:
    """``cfg`` with the env its dataset was collected in (``envs.recording.env_of_data``, from the
    metadata of ``cfg.data.path``), so that the run and ``swm eval`` of it play that env; ``cfg``
    as it is when there is no dataset there yet (reading the data reports that)."""
    try:
        reader = open_reader(cfg.data.path)
    except MissingPathError:
        return cfg
    try:
        return env_of_data(cfg, reader.metadata)
    finally:
        reader.close()


class ActionCheck:
    """Checks each batch's actions before they reach the model.

    An infinite action makes the loss NaN for good: training stops with the reason. NaN is the
    end-of-episode marker (no action follows an episode's last observation; it can only be the
    last ``action_dim`` values of a clip) and the model reads it as 0. A NaN anywhere else is
    damaged or unusual data, read as 0 as well, and said once.
    """

    def __init__(self, data_path, action_dim: int, warnings: list[str]):
        self.data_path, self.action_dim, self.warnings = data_path, action_dim, warnings
        self.said = False

    def __call__(self, batches) -> None:
        for batch in batches:
            action = batch["action"]
            if torch.isinf(action).any():
                raise SwmError(
                    f"{self.data_path} holds infinite actions: training on them would only "
                    "produce NaN",
                    hint="fix or filter those episodes, or collect the data again",
                )
            if not self.said and self._nan_before_the_end(action):
                self.said = True
                self.warnings.append(
                    warn(
                        f"{self.data_path} holds NaN actions inside episodes (not only the "
                        "end-of-episode marker): the model reads them as 0"
                    )
                )

    def _nan_before_the_end(self, action) -> bool:
        flat = action.flatten(1)  # (clips, history_len * frameskip * action_dim), row order
        return bool(torch.isnan(flat[:, : -self.action_dim]).any())
