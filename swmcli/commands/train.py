"""`swm train`: train a world model on clips from a dataset, or collected online.

Read top to bottom: ``_set_up`` builds what a run trains with (``_Run``): the run's config and
device, then the data, the model (``training.recipe``: seeded, its memory techniques on), the
optimizer, the checkpoint when resuming; ``run_train`` takes the run directory's lock, sets up,
then loops over the steps: ``grad_accum`` micro-batches through ``training.step.optimizer_step``
(the very step ``swm memprofile`` traces), a log line, a checkpoint every ``checkpoint_every``
steps; ``_result`` reports.

The loop reads its clips through ``training.sources.TrainingData`` only: a dataset's episodes
streamed from disk or loaded into a ReplayBuffer when they fit the RAM budget (``StoredData``),
or a policy's episodes in a capped ring while the model trains (``training.online.OnlineData``).

Reproducible: the clip order of every step is a function of (seed, step) (``ClipOrder``), init
and SIGReg's directions come from torch's seeded generator, which checkpoints carry: ``--resume``
continues with the losses an uninterrupted run has, streamed or in memory.

Data-parallel under torchrun (``training.distributed``): every rank runs this loop on its share
of each global batch, DDP averages the gradients, batch statistics see the global batch, rank 0
alone writes and reports; ``runtime.nproc`` > 1 outside torchrun launches the ranks.
"""

import gc
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, closing
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from swmcli import config
from swmcli.errors import UsageError
from swmcli.host import keep_freed_memory
from swmcli.interrupts import deferred_interrupts
from swmcli.memory.measure import rank_peaks
from swmcli.memory.predict import check_training_fits
from swmcli.models.interface import model_args
from swmcli.models.outputs import check_finite, faults_named
from swmcli.models.runner import make_runner, untrack_tensors_if_compiling
from swmcli.report import CommandResult, format_seconds, info, progress, silence, warn
from swmcli.training import (
    checkpoints,
    distributed,
    lewm_checkpoints,
    recipe,
    run_directory,
    techniques,
)
from swmcli.training.loggers import check_installed, log_once
from swmcli.training.metrics import (
    LOSS_CURVE_FILE,
    METRICS_FILE,
    draw_loss_curve,
    metrics_log,
    trim_metrics,
)
from swmcli.training.online import OnlineData
from swmcli.training.sources import ActionCheck, StoredData, TrainingData
from swmcli.training.step import RankMeetings, learning_rate, model_bytes, optimizer_step
from swmcli.units import format_bytes

# Steady steps counted by the live-tensor tracker (CPU): the first sees the weights and AdamW state
# only as it touches them, the second counts them from its start; later steps are alike, untracked.
TRACKED_STEADY_STEPS = 2
NOT_LOSS = ("grad_norm", "lr", "clips_per_s")  # logged figures that are not the model's loss terms


@dataclass
class _Run:
    """What the training loop trains with (``_set_up`` builds it)."""

    cfg: config.SwmConfig  # the run's config, as saved in its directory
    run_dir: Path
    world: Any
    runner: Any
    data: TrainingData
    model: Any  # the world model, as checkpoints hold it
    net: Any  # what a step runs: the model's objective, or its data-parallel wrapper
    optimizer: Any
    args: dict[str, int]  # ``model_args``: the clip shape the model is built for
    predicted_bytes: int  # the preflight's prediction of a training step's peak
    start: int  # the first step to train (0, or the checkpoint's step)
    batches: Iterator[dict]  # the host batches of steps ``start ..``, in order
    fingerprint: dict | None  # what the stored data looks like (``data_fingerprint``)

    def checkpoint(self, step: int) -> None:
        """Save the run at ``step`` with its config and data fingerprint (rank 0; atomic)."""
        # Every rank: a sharded run gathers its shards here; rank 0 writes.
        model_state, optimizer_state = techniques.training_state(
            self.model, self.net, self.optimizer, self.cfg.runtime.shard
        )
        if self.world.is_main:
            checkpoints.save_checkpoint(
                self.run_dir,
                model=model_state,
                optimizer=optimizer_state,
                step=step,
                model_args=self.args,
                config_text=config.config_text(self.cfg, own_loss=hasattr(self.model, "loss")),
                data_fingerprint=self.fingerprint,
            )


def _set_up(cfg: config.SwmConfig, monitor, resume: bool, world) -> _Run:
    """What the run trains with: its config and directory, the device, then the data, the model,
    the optimizer and the first step."""
    check_installed(cfg.train.loggers)
    cfg = run_directory.run_config(cfg, resume, world)
    run_dir = Path(cfg.train.out)
    state = checkpoints.load_checkpoint(run_dir) if resume else None  # verified
    start = state["step"] if state else 0
    if start >= cfg.train.steps:
        raise UsageError(
            f"{run_dir} is already trained to step {start}",
            hint=f"pass --steps larger than {start} to train further",
        )
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
    fingerprint = None
    with monitor.phase("preflight", track_tensors=False):
        if cfg.online.enabled and world.size > 1:
            raise UsageError(
                "--online collects and trains in one process: it does not run data-parallel",
                hint="drop --nproc (or torchrun), or train data-parallel from a dataset",
            )
        data = OnlineData(cfg, resume) if cfg.online.enabled else StoredData(cfg, world)
        args = model_args(cfg, data.metadata)
        needed = check_training_fits(cfg, args, runner.device)
        info(f"preflight: a training step needs about {format_bytes(needed)}: it fits")
        if data.episode_lengths is not None:  # a stored dataset: resuming needs the same one
            fingerprint = checkpoints.data_fingerprint(data.episode_lengths)
            checkpoints.check_data_fingerprint(run_dir, fingerprint, state, write=world.is_main)
    if data.loads:
        with monitor.phase("load into memory"):
            data.load()
    with monitor.phase("setup"):
        model = recipe.model_to_train(cfg, data.metadata)
        if state:
            checkpoints.restore_model(model, state, checkpoints.checkpoint_path(run_dir))
        elif cfg.train.init_from:
            info(lewm_checkpoints.init_from_run(model, cfg.train.init_from))
        if not state:  # a checkpoint's values were checked when it was saved
            checkpoints.check_starts_finite(model)
        runner.prepare(model)
        if note := runner.compile_note(model):
            info(note)
        net = recipe.net_to_train(model, cfg, world, runner.device)
        # After .to(device) and sharding: the optimizer's state sits where the parameters do.
        optimizer = recipe.make_optimizer(model, cfg.train, cfg.runtime.optimizer_in_backward)
        if state:
            techniques.restore_optimizer(net, optimizer, state["optimizer"], cfg.runtime.shard)
        data.use_model(model, runner)
        batches = data.batches(start)  # a DataLoader's iterator draws from torch's generator ...
        if state:
            checkpoints.restore_rng(state)  # ... so the checkpointed state is restored after it
        if world.is_main and (damaged := trim_metrics(run_dir / METRICS_FILE, start)):
            warn(f"{run_dir / METRICS_FILE}: {damaged} damaged line(s) dropped")
    model.train()
    return _Run(cfg, run_dir, world, runner, data, model, net, optimizer, args, needed, start,
                batches, fingerprint)  # fmt: skip


def run_train(cfg: config.SwmConfig, monitor, resume: bool = False, as_json: bool = False):
    """Train into the run directory ``cfg.train.out``; with ``resume``, continue its checkpoint
    with ``cfg`` (the run's saved config, changed only where a resume may change it).

    Writes ``config.json``, ``checkpoint.pt`` (atomic, every ``train.checkpoint_every`` steps and
    at the end), ``metrics.jsonl`` and ``loss_curve.png`` under the directory's writer lock.
    Memory phases: preflight, setup, the first step (with compilation), the steady state. Ctrl-C
    or SIGTERM stops after the step in progress (every rank at the same one) with a checkpoint
    (exit 130). Returns the result; None on ranks but 0, and when it launches ``runtime.nproc``
    torchrun ranks itself (they report, as JSON with ``as_json``).
    """
    keep_freed_memory()  # each step's activations reused, not faulted in again (as `swm` does)
    world = distributed.world_from_env()
    techniques.check_combination(cfg, ranks=max(world.size, cfg.runtime.nproc))  # before any work
    if world.size == 1 and cfg.runtime.nproc > 1:
        return _launch(cfg, resume, as_json)
    if not world.is_main:
        silence()
    with ExitStack() as held:
        # Before anything is written: a second writer is refused, named; a failure before the
        # first checkpoint leaves no trace.
        held.enter_context(run_directory.held_until_checkpointed(cfg.train.out, world.is_main))
        held.enter_context(distributed.joined(world, cfg.train.out))
        run = _set_up(cfg, monitor, resume, world)
        cfg, data, run_dir, last_step = run.cfg, run.data, run.run_dir, run.cfg.train.steps
        check = ActionCheck(cfg.data.path, run.args["action_dim"], data.warnings)
        clips_per_step = cfg.train.batch_size * cfg.train.grad_accum
        last: dict[str, float] = {}
        steady_seconds = seconds = 0.0
        meetings = RankMeetings(world, cfg.train.log_every, last_step)
        with (
            closing(data),
            progress("train", total=last_step - run.start) as advance,
            metrics_log(run_dir, cfg.train.loggers, run.start, world.is_main) as log,
            deferred_interrupts() as interrupted,
            ExitStack() as phase,
        ):
            for step in range(run.start, last_step):
                if step == run.start:
                    phase.enter_context(monitor.phase("first step (incl. compile)"))
                elif step == run.start + 1:
                    phase.close()
                    phase.enter_context(monitor.phase("steady state"))
                began, done = time.perf_counter(), step + 1
                micro = [next(run.batches) for _ in range(cfg.train.grad_accum)]
                check(micro)
                for group in run.optimizer.param_groups:
                    group["lr"] = learning_rate(step, last_step, cfg.train.lr)
                on_device = (run.runner.to_device(batch) for batch in micro)  # each in its turn
                again = partial(run.runner.to_device, micro[0])  # for a diagnosis, if it fails
                with faults_named(run.model, run.optimizer, again, first=step == run.start):
                    step_of = (run.net, run.optimizer, on_device, run.runner, cfg.train.grad_clip)
                    parts, grad_norm = optimizer_step(*step_of, len(micro))
                    figures = (parts, grad_norm, run.optimizer, interrupted(), seconds)
                    last, stop = meetings.figures(done, *figures)
                check_finite(last["loss"], done, run.model, again)
                if step - run.start >= TRACKED_STEADY_STEPS:
                    monitor.stop_tracking()  # their peak is every step's; the rest runs untracked
                seconds = time.perf_counter() - began
                steady_seconds += seconds if step > run.start else 0.0
                last["clips_per_s"] = clips_per_step / seconds
                if stop or step == run.start or meetings.logs(done):
                    log(done, last)
                if stop or done % cfg.train.checkpoint_every == 0 or done == last_step:
                    run.checkpoint(done)
                advance(1, loss=last["loss"], clips_per_s=round(last["clips_per_s"], 1))
                if step == run.start + 1 and done < last_step:
                    info(
                        f"estimate: about {format_seconds((last_step - done) * seconds)} for the "
                        f"remaining {last_step - done} steps ({seconds:.3g} s per step, measured "
                        f"on step {done})"
                    )
                if stop:
                    run_directory.stopped_after(done, run_dir, world)
        steady_steps = last_step - run.start - 1  # the first step compiles: not steady
        steady = clips_per_step * steady_steps / steady_seconds if steady_steps else None
        result = _result(run, monitor, last, steady, steady_seconds, resume)
        # DDP holds the process group: drop it now, so the group (and gloo's threads) goes when
        # `joined` destroys it, not in a garbage collection during interpreter exit, where
        # gloo's threads abort the process ("terminate called without an active exception").
        run = step_of = None
        gc.collect()
        return result


def _launch(cfg: config.SwmConfig, resume: bool, as_json: bool) -> None:
    """``swm train --nproc N``: ``N`` torchrun ranks on this machine, each reading this config."""
    distributed.check_batch_split(distributed.World(size=cfg.runtime.nproc), cfg.train.batch_size)
    with tempfile.TemporaryDirectory(prefix="swm-launch-") as directory:
        config_file = Path(directory) / "config.json"
        config_file.write_text(cfg.model_dump_json())
        arguments = ["train", "--config", str(config_file)]
        if resume:
            items = run_directory.resumable_items(cfg)
            arguments += ["--resume", *(f"--set={item}" for item in items)]
        arguments += ["--json"] if as_json else []
        info(f"launching {cfg.runtime.nproc} data-parallel processes with torchrun")
        distributed.launch(cfg.runtime.nproc, arguments)


def _result(run: _Run, monitor, last: dict, steady, steady_seconds: float, resume: bool):
    """The run's result (rank 0; every rank's memory peaks), its loss curve drawn and logged."""
    cfg, world, model, runner, run_dir = run.cfg, run.world, run.model, run.runner, run.run_dir
    every_rank = distributed.gather_objects(monitor.report.phases, world)
    if not world.is_main:
        return None
    if world.size > 1:
        monitor.report.phases += rank_peaks(every_rank)
    curve = draw_loss_curve(run_dir / METRICS_FILE, run_dir / LOSS_CURVE_FILE)
    log_once(cfg.train.loggers, run_dir, cfg.train.steps, pictures={"train/loss_curve": curve})
    return CommandResult(
        title="swm train",
        fields={
            "run_dir": str(run_dir),
            "steps": cfg.train.steps,
            "resumed_from_step": run.start if resume else None,
            **run.data.fields(),
            "model_bytes": model_bytes(model, run.optimizer),
            "preflight_step_bytes": run.predicted_bytes,  # the steady state's peak, predicted
            "parameters": sum(p.numel() for p in model.parameters()),
            "device": str(runner.device),
            "dtype": str(runner.dtype).removeprefix("torch."),
            "compile": runner.compile,
            "ranks": world.size,
            "clips_per_rank": cfg.train.batch_size // world.size,
            **{f"final_{key}": value for key, value in last.items() if key not in NOT_LOSS},
            "steady_clips_per_s": steady,
            "steady_seconds": steady_seconds,
            "checkpoint": str(checkpoints.checkpoint_path(run_dir)),
            "loss_curve": str(run_dir / LOSS_CURVE_FILE),
        },
        notes=[runner.dtype_reason, *run.data.notes],
        warnings=run.data.warnings,
    )
