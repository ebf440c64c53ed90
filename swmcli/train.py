"""`swm train`: train the JEPA world model on clips from a dataset, or collected online.

The run reads top to bottom: ``_set_up`` opens the data, builds the model and AdamW and restores
a checkpoint if resuming; ``_train`` is then one loop over the steps: each step runs
``grad_accum`` micro-batches through ``training.optimizer_step`` (forward under the runner's
autocast, backward, clip, AdamW: the very step ``swm memprofile`` traces), logs, and checkpoints
(``_Run.checkpoint``) every ``checkpoint_every`` steps; ``_result`` reports.

The loop reads its clips through ``TrainingData`` only: a dataset's training episodes (held-out
ones excluded) streamed from disk or loaded into a ReplayBuffer when they fit the RAM budget
(``_StoredData``, ``core/source.py``), or episodes a policy collects into a capped buffer while
the model trains (``_OnlineData``, ``online.py``).

Reproducible: the clip order of every step is a function of (seed, step) (see ``ClipOrder``), the
model init and SIGReg's random directions come from torch's seeded generator, and checkpoints
carry that generator's state, so ``--resume`` continues with exactly the losses an uninterrupted
run would have had, streamed or in memory (the two read the same clips).

Data-parallel under torchrun (``core.distributed``): every rank runs this loop on its share of
each global batch, DDP averages the gradients, batch statistics see the global batch, and rank 0
alone writes the run directory and reports (with every rank's memory peaks).
``runtime.nproc`` > 1 outside torchrun launches the ranks with torchrun.
"""

import json
import os
import time
from collections.abc import Iterator
from contextlib import ExitStack, closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from swmcli.config import CONFIG_FILE, SwmConfig, resume_config, save_config, with_settings
from swmcli.errors import SwmError, UsageError
from swmcli.loggers import check_installed, log_once, open_loggers
from swmcli.models.checkpoint import checkpoint_path
from swmcli.report import CommandResult, format_seconds, info, progress, silence, warn
from swmcli.training import (
    ClipOrder,
    build_model,
    learning_rate,
    model_args,
    model_bytes,
    open_training_data,
    optimizer_step,
)
from swmcli.units import format_bytes

METRICS_FILE = "metrics.jsonl"
LOSS_CURVE_FILE = "loss_curve.png"
PASSES_WARNING = 50  # more passes than this over the training clips and the model memorises them
# Steady steps counted by the live-tensor tracker (CPU): the first sees the weights and AdamW state
# only as it touches them, the second counts them from its start; later steps are alike, untracked.
TRACKED_STEADY_STEPS = 2


def _is_dataset(path: Path) -> bool:
    from swmcli.core.storage import detect

    try:
        detect(path)
    except SwmError:
        return False
    return True


def _prepare_run(cfg: SwmConfig, resume: bool, steps: int | None, world, given) -> SwmConfig:
    """The config this run trains with, saved into a fresh run's directory (by rank 0).

    A fresh run refuses a directory that already has a checkpoint. A resumed run takes the saved
    config (the model must match its checkpoint) with what may change on resume from ``given``
    (the explicit flags and --set items; others are refused), and trains to its planned steps,
    or to ``steps`` (an explicit ``--steps``) when given. Its config.json is rewritten with its
    next checkpoint (``save_checkpoint``), which it belongs to.
    """
    run_dir = Path(cfg.train.out)
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"--out {run_dir} is a file", hint="pass a directory for the run")
    if _is_dataset(run_dir):
        raise UsageError(f"--out {run_dir} is a dataset", hint="pass a new directory for the run")
    if resume:
        # The run lives where it is now (it may have been copied or moved since).
        flags, sets = given
        cfg = resume_config(run_dir, {**flags, "train.out": run_dir, "train.steps": steps}, sets)
        info(f"resuming {run_dir} with its saved config, to step {cfg.train.steps}")
        if cfg.runtime.nproc != world.size:
            info(
                f"it trained on {cfg.runtime.nproc} rank(s), this run has {world.size}: the same "
                "global batches, losses equal up to float rounding (not bit for bit)"
            )
    elif checkpoint_path(run_dir).exists():
        raise UsageError(
            f"{run_dir} already holds a trained run",
            hint="pass --resume to continue it, or --out for a new run directory",
        )
    elif run_dir.is_dir() and any(run_dir.iterdir()) and not (run_dir / CONFIG_FILE).exists():
        raise UsageError(
            f"--out {run_dir} is a directory that is not a swm run; its files would be overwritten",
            hint="pass a new or empty directory for the run",
        )
    if cfg.online.enabled and cfg.online.record is not None:
        # `swm eval RUN_DIR` reads held-out episodes from the data the run recorded.
        cfg = with_settings(cfg, {"data.path": cfg.online.record})
    if not cfg.online.enabled:  # the run plays the env its data came from (`swm eval RUN_DIR`)
        from swmcli.rollout import env_of_dataset

        cfg = env_of_dataset(cfg)
    from swmcli.core.storage import location

    # An absolute data path, so `swm eval RUN_DIR` finds the data from any directory.
    data_path = location.resolve(location.as_location(cfg.data.path))
    from swmcli.models.protocol import portable_factory

    factory = portable_factory(cfg.model.factory)
    settings = {"data.path": data_path, "runtime.nproc": world.size, "model.factory": factory}
    cfg = with_settings(cfg, settings)
    if world.is_main and not resume:
        save_config(cfg, run_dir)
    return cfg


def _data_fingerprint(lengths) -> dict:
    """What the run's data looks like: a resumed run refuses data that changed since (its
    held-out split and batches would differ, and the result would no longer be bit-exact)."""
    import hashlib

    import numpy as np

    lengths = np.asarray(lengths, dtype=np.int64)
    return {
        "episodes": len(lengths),
        "steps": int(lengths.sum()),
        "episode_lengths_sha1": hashlib.sha1(lengths.tobytes()).hexdigest(),
    }


class _ActionCheck:
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
        import torch

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
        import torch

        flat = action.flatten(1)  # (clips, history_len * frameskip * action_dim), row order
        return bool(torch.isnan(flat[:, : -self.action_dim]).any())


def _loader(cfg: SwmConfig, dataset, first_step: int, world):
    """A DataLoader yielding this rank's share of the batches of steps ``first_step ..
    train.steps-1``, in order.

    The batches follow ``ClipOrder`` instead of shuffled epochs, so that a resumed run reads
    what an uninterrupted one would have.
    """
    from swmcli.core.data import make_loader
    from swmcli.core.distributed import rank_share

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
        processes=cfg.data.workers == "processes",
    )


def trim_metrics(path: Path, last_step: int) -> int:
    """Keep the logged steps up to ``last_step``: later ones will be trained again.

    Unreadable lines are dropped: the last one cut short by a killed process, and any damaged
    line before it, whose number is returned (said by the caller: the logged history lost them).
    """
    if not path.exists():
        return 0
    rows, damaged = _metric_rows(path)
    kept = [json.dumps(row) + "\n" for row in rows if row["step"] <= last_step]
    path.write_text("".join(kept))
    return damaged


def _metric_rows(path: Path) -> tuple[list[dict], int]:
    """The readable rows of ``metrics.jsonl``, and how many lines before the last one are not
    (a last line cut short by a kill is no damage)."""
    lines = [line for line in path.read_bytes().decode(errors="replace").splitlines() if line]
    rows, damaged = [], 0
    for number, line in enumerate(lines):
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            row = None
        numbers = isinstance(row, dict) and all(
            isinstance(value, int | float) for value in row.values()
        )
        if numbers and isinstance(row.get("step"), int):
            rows.append(row)
        elif number < len(lines) - 1:
            damaged += 1
    return rows, damaged


def run_train(
    cfg: SwmConfig,
    monitor,
    resume: bool = False,
    steps: int | None = None,
    json_output: bool = False,
    given_flags: dict | None = None,
    given_sets: list[str] | None = None,
) -> CommandResult | None:
    """Train (or, with ``resume``, continue training) into the run directory ``cfg.train.out``.

    Writes ``config.json``, ``checkpoint.pt`` (atomic, every ``train.checkpoint_every`` steps and
    at the end), ``metrics.jsonl`` and ``loss_curve.png``. Phases for the memory report: setup,
    the first step (including compilation) and the steady state. Under torchrun every rank runs
    this and rank 0 returns the result (the others None); with ``runtime.nproc`` > 1 outside
    torchrun it launches the ranks and returns None (rank 0 reports, with ``json_output`` as JSON).
    ``given_flags`` and ``given_sets`` (the explicit flags and --set items) are what a resume
    may change.
    Rank 0 holds the run directory's writer lock: a second writer is refused, naming it.
    """
    from swmcli.core import distributed
    from swmcli.core.storage.lock import run_lock

    given = ({k: v for k, v in (given_flags or {}).items() if v is not None}, given_sets or [])

    world = distributed.world_from_env()
    if world.size == 1 and cfg.runtime.nproc > 1:
        distributed.check_batch_split(
            distributed.World(size=cfg.runtime.nproc), cfg.train.batch_size
        )
        return _launch(cfg, resume, steps, json_output, given)
    if not world.is_main:
        silence()
    lock = run_lock(cfg.train.out) if world.is_main else None  # before anything is written
    distributed.start(world)
    try:
        return _train(cfg, monitor, resume, steps, world, given)
    except Exception as error:
        if world.size > 1 and distributed.is_lost_rank(error):
            raise distributed.lost_rank_error(error, world, cfg.train.out) from error
        raise
    finally:
        distributed.stop(world)
        if lock is not None:
            lock.release()


def _launch(cfg: SwmConfig, resume: bool, steps: int | None, json_output: bool, given) -> None:
    """``swm train --nproc N``: the same training as ``N`` torchrun ranks on this machine, each
    reading this resolved config (and, resuming, the settings given, as --set items)."""
    import tempfile

    from swmcli.core.distributed import launch

    with tempfile.TemporaryDirectory(prefix="swm-launch-") as directory:
        config_file = Path(directory) / "config.json"
        config_file.write_text(cfg.model_dump_json())
        arguments = ["train", "--config", str(config_file)]
        arguments += ["--resume"] if resume else []
        if resume:
            flags, sets = given
            items = [f"{key}={json.dumps(_plain(value))}" for key, value in flags.items()]
            arguments += [f"--set={item}" for item in [*items, *sets]]
        arguments += ["--steps", str(steps)] if steps is not None else []
        arguments += ["--json"] if json_output else []
        info(f"launching {cfg.runtime.nproc} data-parallel processes with torchrun")
        launch(cfg.runtime.nproc, arguments)


def _plain(value):
    """A flag's value as TOML reads it back from JSON (a path as its string)."""
    return str(value) if isinstance(value, Path) else value


@dataclass
class _Run:
    """What the training loop trains with (``_set_up`` builds it)."""

    cfg: SwmConfig  # the run's config, as saved in its directory
    world: Any
    runner: Any
    data: "TrainingData"
    model: Any  # the world model, as checkpoints hold it
    net: Any  # what a step runs: the model, or its data-parallel wrapper
    optimizer: Any
    args: dict[str, int]  # ``model_args``: the clip shape the model is built for
    start: int  # the first step to train (0, or the checkpoint's step)
    batches: Iterator[dict]  # the host batches of steps ``start ..``, in order
    fingerprint: dict | None  # what the stored data looks like (``_data_fingerprint``)

    def checkpoint(self, step: int) -> None:
        """Save the run at ``step`` with its config and data fingerprint (rank 0; atomic)."""
        from swmcli.config import config_text
        from swmcli.memory.levers import training_state
        from swmcli.models.checkpoint import save_checkpoint

        # Every rank: a sharded run gathers its shards here; rank 0 writes.
        model_state, optimizer_state = training_state(
            self.model, self.net, self.optimizer, self.cfg.runtime.shard
        )
        if self.world.is_main:
            save_checkpoint(
                Path(self.cfg.train.out),
                model=model_state,
                optimizer=optimizer_state,
                step=step,
                model_args=self.args,
                config_text=config_text(self.cfg),
                data_fingerprint=self.fingerprint,
            )


def _set_up(cfg: SwmConfig, monitor, resume: bool, steps: int | None, world, given) -> _Run:
    """The run directory, device, data, model, optimizer and first step of this rank's run."""
    from swmcli.core import distributed
    from swmcli.core.runner import make_runner, untrack_tensors_if_compiling
    from swmcli.memory.levers import make_optimizer, restore_optimizer, shard
    from swmcli.memory.predict import check_training_fits
    from swmcli.models.checkpoint import (
        check_data_fingerprint,
        load_checkpoint,
        restore_model,
        restore_rng,
    )
    from swmcli.models.protocol import Objective

    check_installed(cfg.train.loggers)
    cfg = _prepare_run(cfg, resume, steps, world, given)
    run_dir = Path(cfg.train.out)
    state = load_checkpoint(run_dir) if resume else None  # verified, with its config.json
    fingerprint = None
    runner = make_runner(
        bf16=cfg.runtime.bf16,
        compile=cfg.runtime.compile,
        device=distributed.rank_device(world),
        cpu_threads=cfg.runtime.cpu_threads,
    )
    if note := untrack_tensors_if_compiling(runner, monitor):
        info(note)
    compiled = "on" if runner.compile else "off"
    info(f"device {runner.device}; {runner.dtype_reason}; compile {compiled}")
    if world.size > 1:
        share = distributed.check_batch_split(world, cfg.train.batch_size)
        info(f"data-parallel: {world.size} ranks, each reads {share} clips of every batch")
    with monitor.phase("preflight", track_tensors=False):
        if cfg.online.enabled and world.size > 1:
            raise UsageError(
                "--online collects and trains in one process: it does not run data-parallel",
                hint="drop --nproc (or torchrun), or train data-parallel from a dataset",
            )
        data: TrainingData = (
            _OnlineData(cfg, resume) if cfg.online.enabled else _StoredData(cfg, world)
        )
        args = model_args(cfg, data.metadata)
        needed = check_training_fits(cfg, args["resolution"], args["action_dim"], runner.device)
        info(f"preflight: a training step needs about {format_bytes(needed)}: it fits")
        if data.episode_lengths is not None:  # a stored dataset: resuming needs the same one
            fingerprint = _data_fingerprint(data.episode_lengths)
            check_data_fingerprint(run_dir, fingerprint, state, write=world.is_main)
    if data.loads:
        with monitor.phase("load into memory"):
            data.load()
    with monitor.phase("setup"):
        model = build_model(cfg, data.metadata)
        start = state["step"] if state else 0
        if start >= cfg.train.steps:
            raise UsageError(
                f"{run_dir} is already trained to step {start}",
                hint=f"pass --steps larger than {start} to train further",
            )
        if state:
            restore_model(model, state, checkpoint_path(run_dir))
        runner.prepare(model)
        objective = Objective(model, cfg.model)
        sharded = cfg.runtime.shard
        if sharded:
            net = shard(objective, runner.device)
        else:
            net = distributed.wrap(objective, world, runner.device)
        # After .to(device) and sharding: the optimizer's state sits where the parameters do.
        optimizer = make_optimizer(model, cfg.train, cfg.runtime.optimizer_in_backward)
        if state:
            restore_optimizer(net, optimizer, state["optimizer"], sharded)
        data.use_model(model, runner)
        batches = data.batches(start)  # a DataLoader's iterator draws from torch's generator ...
        if state:
            restore_rng(state)  # ... so the checkpointed state is restored after it
        if world.is_main and (damaged := trim_metrics(run_dir / METRICS_FILE, start)):
            warn(f"{run_dir / METRICS_FILE}: {damaged} damaged line(s) dropped")
    model.train()
    return _Run(cfg, world, runner, data, model, net, optimizer, args, start, batches, fingerprint)


def _train(cfg: SwmConfig, monitor, resume: bool, steps: int | None, world, given):
    """``run_train``'s work, as one rank of ``world``: set up, then one loop over the steps.

    The first step is measured alone (it compiles), then the steady state. Ctrl-C or SIGTERM
    stops after the step in progress (on every rank, the same step), with a checkpoint at that
    step, so ``--resume`` continues from there (exit code 130).
    """
    from swmcli.core.distributed import any_rank
    from swmcli.core.interrupts import deferred_interrupts

    run = _set_up(cfg, monitor, resume, steps, world, given)
    cfg, data = run.cfg, run.data
    run_dir, last_step = Path(cfg.train.out), cfg.train.steps
    check = _ActionCheck(cfg.data.path, run.args["action_dim"], data.warnings)
    metrics_file = run_dir / METRICS_FILE if world.is_main else os.devnull
    clips_per_step = cfg.train.batch_size * cfg.train.grad_accum
    last: dict[str, float] = {}
    steady_seconds = 0.0
    with (
        closing(data),
        progress("train", total=last_step - run.start) as advance,
        open(metrics_file, "a") as metrics,
        open_loggers(
            cfg.train.loggers if world.is_main else [], run_dir, first_step=run.start
        ) as loggers,
        deferred_interrupts() as interrupted,
        ExitStack() as phase,
    ):
        for step in range(run.start, last_step):
            if step == run.start:
                phase.enter_context(monitor.phase("first step (incl. compile)"))
            elif step == run.start + 1:
                phase.close()
                phase.enter_context(monitor.phase("steady state"))
            began = time.perf_counter()
            micro = [next(run.batches) for _ in range(cfg.train.grad_accum)]
            check(micro)
            last = _train_step(run, micro, step)
            if step - run.start >= TRACKED_STEADY_STEPS:
                monitor.stop_tracking()  # their peak is every step's; the rest runs untracked
            seconds = time.perf_counter() - began
            steady_seconds += seconds if step > run.start else 0.0
            last["clips_per_s"] = clips_per_step / seconds
            done = step + 1
            if done % cfg.train.log_every == 0 or done == last_step or step == run.start:
                metrics.write(json.dumps({"step": done, **last}) + "\n")
                metrics.flush()
                loggers.scalars(done, last)
            stop = any_rank(interrupted(), world)
            if stop or done % cfg.train.checkpoint_every == 0 or done == last_step:
                run.checkpoint(done)
            advance(1, loss=last["loss"], clips_per_s=round(last["clips_per_s"], 1))
            if step == run.start + 1 and done < last_step:
                info(
                    f"estimate: about {format_seconds((last_step - done) * seconds)} for the "
                    f"remaining {last_step - done} steps ({seconds:.3g} s per step, measured on "
                    f"step {done})"
                )
            if stop:
                _stopped(done, run_dir, world)
    steady_steps = last_step - run.start - 1
    summary = {
        "final_loss": last.get("loss"),
        "final_prediction_loss": last.get("prediction"),
        "final_latent_rank": last.get("latent_rank"),
        "steady_clips_per_s": clips_per_step * steady_steps / steady_seconds
        if steady_steps
        else None,
        "steady_seconds": steady_seconds,
    }
    return _result(run, monitor, summary, resume)


def _train_step(run: _Run, micro: list[dict], step: int) -> dict[str, float]:
    """Optimizer step ``step`` over the host batches ``micro`` (``grad_accum`` of them): its
    learning rate, then ``training.optimizer_step``; returns the figures logged (the global
    batch's: the mean over the ranks)."""
    from swmcli.core.distributed import mean_over_ranks

    train = run.cfg.train
    for group in run.optimizer.param_groups:
        group["lr"] = learning_rate(step, train.steps, train.lr)
    # A generator: each micro-batch moves to the device only when its turn comes.
    device_batches = (run.runner.to_device(batch) for batch in micro)
    parts, grad_norm = optimizer_step(
        run.net, run.optimizer, device_batches, run.runner, train.grad_clip, len(micro)
    )
    means = {key: sum(float(p[key]) for p in parts) / len(parts) for key in parts[0]}
    means = mean_over_ranks(means, run.world)
    return {**means, "grad_norm": float(grad_norm), "lr": run.optimizer.param_groups[0]["lr"]}


def _stopped(step: int, run_dir: Path, world) -> None:
    """Leave after an interrupted ``step`` (checkpointed): rank 0 reports it for every rank."""
    if not world.is_main:
        raise SystemExit(130)
    raise SwmError(
        f"interrupted after step {step}: checkpoint saved in {run_dir}",
        hint=f"swm train --out {run_dir} --resume continues from step {step}",
        exit_code=130,
    )


def _result(run: _Run, monitor, summary: dict, resume: bool) -> CommandResult | None:
    """The run's result (rank 0; every rank's memory peaks), its loss curve drawn and logged."""
    from swmcli.core import distributed

    cfg, world, model, runner = run.cfg, run.world, run.model, run.runner
    run_dir = Path(cfg.train.out)
    every_rank = distributed.gather_objects(monitor.report.phases, world)
    if not world.is_main:
        return None
    if world.size > 1:
        monitor.report.phases += rank_peaks(every_rank)
    curve = draw_loss_curve(run_dir / METRICS_FILE, run_dir / LOSS_CURVE_FILE)
    log_once(cfg.train.loggers, run_dir, cfg.train.steps, pictures={"train/loss_curve": curve})
    parameters = sum(p.numel() for p in model.parameters())
    return CommandResult(
        title="swm train",
        fields={
            "run_dir": str(run_dir),
            "steps": cfg.train.steps,
            "resumed_from_step": run.start if resume else None,
            **run.data.fields(),
            "model_bytes": model_bytes(model, run.optimizer),
            "parameters": parameters,
            "device": str(runner.device),
            "dtype": str(runner.dtype).removeprefix("torch."),
            "compile": runner.compile,
            "ranks": world.size,
            "clips_per_rank": cfg.train.batch_size // world.size,
            **summary,
            "checkpoint": str(checkpoint_path(run_dir)),
            "loss_curve": str(run_dir / LOSS_CURVE_FILE),
        },
        notes=[runner.dtype_reason, *run.data.notes],
        warnings=run.data.warnings,
    )


class TrainingData(Protocol):
    """Where a run's clips come from: a dataset (``_StoredData``) or a policy collecting while
    the model trains (``_OnlineData``). The loop reads only this."""

    metadata: dict  # what ``model_args`` reads: resolution, action_dim
    episode_lengths: Any  # a dataset's, fingerprinted for --resume; None online
    loads: bool  # ``load`` has work to do (measured as its own phase)
    notes: list[str]
    warnings: list[str]

    def load(self) -> None: ...
    def use_model(self, model, runner) -> None: ...
    def batches(self, first_step: int) -> Iterator[dict]: ...
    def fields(self) -> dict: ...
    def close(self) -> None: ...


class _StoredData:
    """Clips of a dataset's training episodes: streamed from disk, or loaded into a ReplayBuffer
    when they fit the RAM budget (``--in-memory`` insists, ``--no-in-memory`` streams)."""

    def __init__(self, cfg: SwmConfig, world):
        from swmcli.core.source import choose_source, ram_budget

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
        from swmcli.core.source import load_clips

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


class _OnlineData:
    """Clips of episodes a policy collects while the model trains (``swmcli.online``)."""

    def __init__(self, cfg: SwmConfig, resume: bool):
        from swmcli.core.source import ram_budget
        from swmcli.online import OnlineFeed

        if cfg.data.in_memory is not None:
            raise UsageError(
                "--online trains from the buffer it fills: --in-memory and --no-in-memory "
                "choose how a dataset is read",
                hint="drop --in-memory/--no-in-memory (--ring-steps caps the online buffer)",
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
            f"{cfg.online.warmup_steps} warm-up steps, buffer of {self.feed.cap:,} steps"
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


def rank_peaks(every_rank: list) -> list:
    """Memory-panel rows for a data-parallel run: each rank's peaks over the whole run, and the
    largest of them (what one device must hold)."""
    from dataclasses import replace

    from swmcli.memory.measure import combined_peak

    rows = []
    for rank, phases in enumerate(every_rank):
        whole = combined_peak(f"rank {rank}: whole run", phases)
        rows.append(replace(whole, seconds=sum(p.seconds for p in phases)))
    return [*rows, combined_peak(f"max over {len(rows)} ranks", rows)]


def _passes_warning(cfg: SwmConfig, train_clips: int) -> list[str]:
    """Warn (once, now) when the run makes more than ``PASSES_WARNING`` passes over the data."""
    passes = cfg.train.steps * cfg.train.batch_size * cfg.train.grad_accum / train_clips
    if passes <= PASSES_WARNING:
        return []
    return [
        warn(
            f"{cfg.train.steps} steps make {passes:.0f} passes over {train_clips} training clips: "
            "the model will memorise them and plan poorly. Collect more data "
            "(swm collect --buffer-steps 200000) or lower --steps"
        )
    ]


def draw_loss_curve(metrics_path: Path, picture_path: Path) -> Path | None:
    """A PNG of the total and prediction losses against the step, from ``metrics.jsonl``.

    Log-scaled when every loss is positive (losses fall by orders of magnitude, then flatten),
    with labelled axes, a grid and a legend; nothing is drawn for fewer than two logged steps.
    """
    rows, _ = _metric_rows(metrics_path)
    if len(rows) < 2:
        return None
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=80)
    labels = {"loss": "total loss", "prediction": "prediction MSE (next latent)"}
    for key, label in labels.items():
        points = [(row["step"], row[key]) for row in rows if key in row]
        axes.plot(*zip(*points, strict=True), label=label, linewidth=1.5)
    if all(row[key] > 0 for row in rows for key in labels if key in row):
        axes.set_yscale("log")
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("training loss")
    axes.set_title(f"{picture_path.parent.name}: training loss")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(picture_path)
    plt.close(figure)
    return picture_path
