"""`swm memprofile`: predict (any machine) and measure (CUDA) peak memory per memory technique.

Prediction runs one training step (forward, backward, clip, AdamW step: twice, so optimizer
state exists) and one eval step of the configured world model on fake tensors, and reports the
peak of live tensor bytes by category (``swmcli.memory.trace.trace_step_peak``), as the step runs
on CUDA (the default) or on the CPU (``memprofile.predict_for``). Each technique is one row: fp32
vs bf16 autocast, train vs eval with gradients vs gradient-free eval, each technique of the
training step (activation checkpointing, the optimizer in backward, sharding); then the extra
rows, other clip shapes (frameskip, history length, batch size), which a model that cannot take
them skips with a note; torch.compile cannot be traced on fake CPU tensors and is measured on
a GPU. On a GPU every row is also run for real after a warm-up step and its allocator peaks are
printed next to the prediction. Always: the ReplayBuffer's host RAM for
``collect.max_steps``, the on-disk size of that many steps (scaled from a small real sample),
and, with budgets, the largest batch size (GPU) and ``max_steps`` (host RAM) that fit.
"""

import gc
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from swmcli.config import SwmConfig
from swmcli.data.buffer import ReplayBuffer, step_bytes
from swmcli.data.formats import open_reader, open_writer
from swmcli.envs.recording import sample_episodes
from swmcli.errors import SwmError, UsageError, first_line
from swmcli.host import available_host_bytes
from swmcli.memory.fitting import (
    Combination,
    Technique,
    applicable_techniques,
    cheapest_fitting,
    check_picture,
    combinations,
    draw_combinations,
    plan_sentence,
    without_techniques,
)
from swmcli.memory.predict import (
    PeakPredictor,
    Variant,
    clip_batch,
    configured_variant,
    cuda_runner,
    ddp_bucket_bytes,
    eval_step,
    largest_fitting,
    traced_grad_clip,
    traced_micro_batches,
    train_step,
)
from swmcli.memory.trace import (
    ALLOCATOR_OVERHEAD,
    CATEGORIES,
    CUDA_CONTEXT_BYTES,
    CUDA_WORKSPACE_BYTES,
    StepPeak,
    cuda_allowance_bytes,
)
from swmcli.models.interface import Objective
from swmcli.report import CommandResult, Table
from swmcli.training.recipe import make_optimizer
from swmcli.training.techniques import check_combination
from swmcli.units import format_bytes, format_gb

DEVICE_WORDS = {"cuda": "CUDA", "cpu": "the CPU"}
SNAPSHOT_ENTRIES = 100_000  # allocator events kept for --snapshot (a ring; oldest dropped)
CATEGORY_LABELS = {
    "parameters": "params",
    "buffers": "buffers",
    "gradients": "grads",
    "optimizer_state": "optimizer",
    "inputs": "inputs",
    "activations": "activations",
    "temporaries": "temporaries",
    "ddp_buckets": "DDP buckets",
    "fsdp_gathered": "FSDP gathered",
}


@dataclass
class Row:
    """One technique: its settings, the prediction and (on a GPU) the measured peaks."""

    technique: str
    variant: Variant
    predicted: StepPeak | None = None
    measured_allocated_bytes: int | None = None
    measured_reserved_bytes: int | None = None
    out_of_memory: bool = False
    extra: bool = False  # another clip shape than the config's: skipped if the model cannot take it


# --- host RAM and disk -----------------------------------------------------------------------


def disk_bytes_per_step(
    episodes: list[dict[str, np.ndarray]], metadata: dict[str, Any], formats=("lance", "hdf5")
) -> dict[str, float | str]:
    """Bytes on disk per step in each format, from writing ``episodes`` to a temporary dir.

    A format that cannot be written here (its package missing) gives the reason instead.
    """
    steps = sum(len(episode["pixels"]) for episode in episodes)
    per_step: dict[str, float | str] = {}
    with tempfile.TemporaryDirectory(prefix="swm-memprofile-") as tmp:
        for fmt in formats:
            path = Path(tmp) / ("sample.h5" if fmt == "hdf5" else f"sample.{fmt}")
            try:
                per_step[fmt] = _written_bytes(path, fmt, episodes, metadata) / steps
            except (ImportError, SwmError) as err:
                per_step[fmt] = f"{type(err).__name__}: {err}"
    return per_step


def _written_bytes(path: Path, fmt: str, episodes, metadata: dict[str, Any]) -> int:

    writer = open_writer(path, fmt, mode="overwrite", metadata=metadata)
    try:
        for episode in episodes:
            writer.write_episode(episode)
    finally:
        writer.close()
    reader = open_reader(path)
    try:
        return reader.nbytes_on_disk
    finally:
        reader.close()


# --- measurement on a GPU --------------------------------------------------------------------


def measure_rows(rows: list[Row], predictor: PeakPredictor, monitor, snapshot: Path | None):
    """Run each row for real on CUDA: one warm-up step, then one measured step per phase.

    The measured step is a phase of ``monitor`` (allocator peaks reset at its start), named after
    the row. With ``snapshot``, allocator history (Python stacks, at most SNAPSHOT_ENTRIES events)
    is recorded from the first measured step and dumped for PyTorch's memory_viz.
    """
    import torch

    recording = False
    for row in rows:
        step = None
        try:
            step = _real_step(row.variant, predictor)
            step()  # warm-up: compiles, creates optimizer state, picks cuDNN algorithms
            torch.cuda.synchronize()
            if snapshot is not None and not recording:
                torch.cuda.memory._record_memory_history(
                    max_entries=SNAPSHOT_ENTRIES, stacks="python"
                )
                recording = True
            with monitor.phase(f"measure: {row.technique}"):
                step()
            phase = monitor.report.phases[-1]
            row.measured_allocated_bytes = phase.cuda_allocated_bytes
            row.measured_reserved_bytes = phase.cuda_reserved_bytes
        except torch.cuda.OutOfMemoryError:
            row.out_of_memory = True  # a row past the device (a budget above it): say so, go on
        finally:
            del step
            gc.collect()
            torch.cuda.empty_cache()
    if recording:
        snapshot.parent.mkdir(parents=True, exist_ok=True)
        torch.cuda.memory._dump_snapshot(str(snapshot))
        torch.cuda.memory._record_memory_history(enabled=None)


def _real_step(variant: Variant, predictor: PeakPredictor) -> Callable[[], Any]:
    """A fresh CUDA model, batch and (for training) optimizer, bound into one step callable."""
    import copy

    runner = cuda_runner(variant)
    plain = predictor.model(variant.history_len, variant.frameskip, variant.checkpointing)
    model = runner.prepare(copy.deepcopy(plain))
    batch = clip_batch(predictor.step, variant, device="cuda")
    if variant.kind == "train":
        model.train()
        optimizer = make_optimizer(model, predictor.cfg.train, variant.in_backward)
        grad_clip = traced_grad_clip(predictor.cfg, variant)
        micro_batches = traced_micro_batches(predictor.cfg, variant)
        objective = Objective(model, predictor.cfg.model)
        return lambda: train_step(objective, optimizer, batch, runner, grad_clip, micro_batches)
    return lambda: eval_step(model, batch, runner, variant.grad_free)


# --- the rows and the result -----------------------------------------------------------------


def technique_rows(cfg: SwmConfig, techniques: list[Technique]) -> list[Row]:
    """One row per technique, each against the fp32 eager training baseline (the first row);
    each of the training step's ``techniques`` is one row too, and the combination the config
    asks for is one. A row run with the configured techniques (compile's, other clip shapes)
    names them in its title."""
    configured = _configured(cfg)
    base = without_techniques(configured)
    history, frameskip = base.history_len, base.frameskip
    asked = _asked(configured, techniques)
    with_asked = f", {asked}" if asked else ""
    rows = [
        Row("fp32 train (baseline)", base),
        Row("bf16 autocast train", replace(base, bf16=True)),
        Row(f"torch.compile train{with_asked}", replace(configured, compile=True)),
        Row("eval with gradients", replace(base, kind="eval")),
        Row("gradient-free eval", replace(base, kind="eval", grad_free=True)),
        Row("gradient-free eval + bf16", replace(base, kind="eval", grad_free=True, bf16=True)),
    ]
    for technique in techniques[1:]:  # bf16 has its rows above
        rows.append(Row(technique.name, replace(base, **dict(technique.settings))))
    if configured not in [row.variant for row in rows]:
        rows.append(Row(f"as asked: {asked}", configured))
    if frameskip > 1:
        same_span = replace(configured, history_len=history * frameskip, frameskip=1)
        span = f"frameskip 1, same span ({history * frameskip} frames){with_asked}"
        rows.append(Row(span, same_span, extra=True))
    # Half the history when that still leaves a target to predict, else double it.
    other_history = history // 2 if history >= 4 else 2 * history
    shorter = replace(configured, history_len=other_history)
    rows.append(Row(f"history {other_history}{with_asked}", shorter, extra=True))
    if base.batch_size > 1:
        half = replace(configured, batch_size=base.batch_size // 2)
        rows.append(Row(f"batch {half.batch_size}{with_asked}", half, extra=True))
    return rows


def _asked(variant: Variant, techniques: list[Technique]) -> str:
    """The names of the ``techniques`` that ``variant`` runs with ("" for none)."""
    on = [one for one in techniques if all(getattr(variant, k) == v for k, v in one.settings)]
    return " + ".join(one.name for one in on)


def predict_rows(rows: list[Row], predictor: PeakPredictor) -> tuple[list[Row], list[str]]:
    """Predict every row but compile's; an extra row the model cannot take (a clip longer than
    it holds, a batch it refuses) is left out with a one-line note naming why. Returns the rows
    kept and the notes."""
    kept, notes = [], []
    for row in rows:
        try:
            if not row.variant.compile:
                row.predicted = predictor.predict(row.variant)
        except Exception as err:
            if not row.extra:
                raise
            notes.append(
                f"row {row.technique!r} skipped: the model cannot take "
                f"{row.variant.describe()} ({type(err).__name__}: {first_line(err)})"
            )
            continue
        kept.append(row)
    return kept, notes


def run_memprofile(cfg: SwmConfig, monitor, snapshot: Path | None = None) -> CommandResult:
    """Predict (and on CUDA measure) peak memory per technique; buffer RAM, disk and budgets."""
    import torch

    check_combination(cfg)
    picture = cfg.memprofile.picture
    if picture is not None and picture.is_dir():
        raise UsageError(
            f"--picture {picture} is a directory",
            hint=f"name the PNG to write, e.g. --picture {picture / 'memory.png'}",
        )
    device = cfg.memprofile.predict_for
    on_cuda = torch.cuda.is_available() and device == "cuda"  # measure what is predicted
    if snapshot is not None and not on_cuda:
        raise UsageError(
            "--snapshot records CUDA allocator history and this machine has no CUDA device"
            if device == "cuda"
            else "--snapshot records CUDA allocator history: it goes with --predict-for cuda",
            hint="run it on a GPU machine, or drop --snapshot",
        )
    if cfg.memprofile.picture is not None:
        check_picture(cfg.memprofile.picture)
    with monitor.phase("sample"):
        episodes, action_dim = sample_episodes(cfg, cfg.memprofile.sample_episodes)
        step = {key: value[0] for key, value in episodes[0].items()}
        metadata = {
            "env_id": cfg.env.id,
            "resolution": cfg.env.resolution,
            "action_dim": action_dim,
        }
        disk = disk_bytes_per_step(episodes, metadata)
    sample_steps = sum(len(episode["pixels"]) for episode in episodes)
    del episodes

    predictor = PeakPredictor(cfg, step, device)
    techniques = applicable_techniques(cfg, predictor)
    with monitor.phase("predict"):
        rows, skipped = predict_rows(technique_rows(cfg, techniques), predictor)
        budget_fit = _fit_budget(cfg, predictor, rows, _asked(_configured(cfg), techniques))
        options = (
            combinations(predictor, _configured(cfg), techniques) if cfg.memprofile.budget else []
        )
    if on_cuda and cfg.runtime.nproc == 1:
        measure_rows(rows, predictor, monitor, snapshot)

    fields = _fields(cfg, predictor, step, disk, sample_steps, budget_fit)
    tables = [_technique_table(rows, on_cuda, device), _category_table(rows)]
    notes = [*skipped, *_notes(on_cuda, fields, snapshot)]
    if options:
        budget = cfg.memprofile.budget
        fields["plan"] = plan_sentence(options, budget, cfg.env.resolution)
        chosen = cheapest_fitting(options, budget)
        fields["plan_techniques"] = [one.name for one in chosen.techniques] if chosen else None
        tables.append(_combination_table(options, budget))
        notes.insert(0, fields["plan"])
    if cfg.memprofile.picture is not None:
        title = f"{fields['model']}: B={cfg.train.batch_size} at {cfg.env.resolution}"
        drawn = options or [_as_combination(row, predictor) for row in rows if row.predicted]
        fields["picture"] = str(
            draw_combinations(drawn, cfg.memprofile.budget, title, cfg.memprofile.picture)
        )
    return CommandResult(title="memprofile", fields=fields, tables=tables, notes=notes)


def _as_combination(row: Row, predictor: PeakPredictor) -> Combination:
    """A technique row drawn as a bar (no budget asked: the rows are the bars)."""
    bar = Technique(row.technique, 0, ())
    return Combination((bar,), row.variant, row.predicted, predictor.needed_bytes(row.variant))


def _combination_table(options: list[Combination], budget: int) -> Table:
    columns = ["techniques", "price", "predicted_peak_bytes", "needs_bytes", "fits"]
    columns += ["model_state_bytes", "activation_bytes"]
    model_state = ("parameters", "buffers", "gradients", "optimizer_state", "ddp_buckets")
    cells = []
    for option in sorted(options, key=lambda option: (option.cost, option.needed_bytes)):
        by_category = option.peak.by_category
        state = sum(by_category[c] for c in (*model_state, "fsdp_gathered"))
        cells.append(
            [
                option.name,
                option.cost,
                option.peak.peak_bytes,
                option.needed_bytes,
                "yes" if option.needed_bytes <= budget else "no",
                state,
                option.peak.peak_bytes - state,
            ]
        )
    return Table(
        "training step per combination of techniques (needs = peak + CUDA allowance; price: lower "
        "is cheaper; model state = weights, gradients, optimizer; activations incl. inputs)",
        columns,
        cells,
    )


def _configured(cfg: SwmConfig, kind: str = "train") -> Variant:
    """The variant the config runs: training (with its techniques), or gradient-free eval, at its
    precision."""
    if kind == "train":
        return configured_variant(cfg, cfg.train.batch_size)
    return Variant(
        kind,
        bf16=cfg.runtime.bf16,
        batch_size=cfg.train.batch_size,
        history_len=cfg.data.history_len,
        frameskip=cfg.data.frameskip,
        grad_free=True,
    )


def _fit_budget(cfg: SwmConfig, predictor: PeakPredictor, rows: list[Row], asked: str):
    """(batch, needed bytes) of the largest configured training batch within the budget.

    Adds a row for that batch (its title naming the ``asked`` techniques), so it is measured too
    on a GPU.
    """
    budget = cfg.memprofile.budget
    if budget is None:
        return None
    configured = _configured(cfg)

    def need(batch_size: int) -> int:
        return predictor.needed_bytes(replace(configured, batch_size=batch_size))

    batch = configured.batch_size
    # The search starts from two predictions: the rows of this step at other batch sizes (the
    # half-batch row) are already made; twice the batch is predicted only without one.
    known = {batch: need(batch)}
    for row in rows:
        if row.predicted and replace(row.variant, batch_size=batch) == configured:
            known[row.variant.batch_size] = need(row.variant.batch_size)
    if len(known) < 2:
        known[2 * batch] = need(2 * batch)
    best = largest_fitting(need, budget, known) // configured.ranks * configured.ranks
    if not best:
        return 0, None
    variant = replace(configured, batch_size=best)
    title = f"batch {best}: largest in budget" + (f", {asked}" if asked else "")
    rows.append(Row(title, variant, predictor.predict(variant)))
    return best, need(best)


def _fields(cfg, predictor, step, disk, sample_steps, budget_fit) -> dict[str, Any]:

    peak = predictor.predict(_configured(cfg)).peak_bytes
    model = predictor.model(cfg.data.history_len, cfg.data.frameskip)
    max_steps = cfg.collect.max_steps
    bytes_per_step = step_bytes(step)
    fields: dict[str, Any] = {
        "env": cfg.env.id,
        "resolution": cfg.env.resolution,
        "model": f"{cfg.model.encoder} encoder + predictor"
        if cfg.model.factory is None
        else f"{type(model).__name__} from {cfg.model.factory}",
        "model_parameters": sum(p.numel() for p in model.parameters()),
        "batch_size": cfg.train.batch_size,
        "ranks": cfg.runtime.nproc,
        "batch_per_rank": cfg.train.batch_size // cfg.runtime.nproc,
        "grad_accum": cfg.train.grad_accum,
        "history_len": cfg.data.history_len,
        "frameskip": cfg.data.frameskip,
        "precision": "bf16 autocast" if cfg.runtime.bf16 else "fp32",
        "predicted_for": predictor.device,
        "predicted_train_peak_bytes": peak,
        "ddp_bucket_bytes": ddp_bucket_bytes(model) if cfg.runtime.nproc > 1 else 0,
        "predicted_eval_peak_bytes": predictor.predict(_configured(cfg, "eval")).peak_bytes,
        "cuda_allowance_bytes": cuda_allowance_bytes(peak),
        "predicted_train_needs_bytes": peak + cuda_allowance_bytes(peak),
        "predict_seconds": round(predictor.seconds, 2),
        "max_steps": max_steps,
        "buffer_bytes_per_step": bytes_per_step,
        "buffer_ram_bytes": ReplayBuffer.nbytes_for(max_steps, step),
        "host_available_bytes": available_host_bytes(),
        "disk_sample_steps": sample_steps,
    }
    for fmt, per_step in disk.items():
        known = isinstance(per_step, float)
        fields[f"disk_{fmt}_bytes"] = round(per_step * max_steps) if known else per_step
    if budget_fit is not None:
        best, needed = budget_fit
        fields["budget_bytes"] = cfg.memprofile.budget
        fields["budget_batch_size"] = best
        fields["budget_batch_needs_bytes"] = needed
    if cfg.memprofile.ram_budget is not None:
        fields["ram_budget_bytes"] = cfg.memprofile.ram_budget
        fields["ram_budget_max_steps"] = cfg.memprofile.ram_budget // bytes_per_step
    return fields


def _technique_table(rows: list[Row], on_cuda: bool, device: str) -> Table:
    # Byte columns hold integers: the panel shows them with units, --json keeps the bytes.
    columns = ["technique", "settings", "predicted_peak_bytes", "vs fp32 train"]
    if on_cuda:
        columns += ["measured_allocated_bytes", "measured_reserved_bytes", "measured / predicted"]
    cells = [
        [row.technique, row.variant.describe(), *_row_cells(row, rows[0], on_cuda)] for row in rows
    ]
    return Table(
        f"peak memory per technique, predicted for {DEVICE_WORDS[device]} (one step; B batch, "
        "H history, F frameskip)",
        columns,
        cells,
    )


def _row_cells(row: Row, baseline: Row, on_cuda: bool) -> list:
    """Predicted peak and saving; on CUDA the measured peaks and their ratio to the prediction.

    A row that cannot be predicted (compile) shows its measured saving against the measured
    baseline instead.
    """
    predicted = row.predicted.peak_bytes if row.predicted else None
    base = baseline.predicted.peak_bytes
    saving = f"{100 * (predicted - base) / base:+.0f}%" if predicted else "-"
    allocated, base_allocated = row.measured_allocated_bytes, baseline.measured_allocated_bytes
    if predicted is None and allocated and base_allocated:
        saving = f"{100 * (allocated - base_allocated) / base_allocated:+.0f}% measured"
    cells = [predicted if predicted else "measured on GPU", saving]
    if not on_cuda:
        return cells
    if row.out_of_memory:
        return [*cells, "out of memory", "-", "-"]
    ratio = f"{allocated / predicted:.3f}" if predicted else "-"
    return [*cells, allocated, row.measured_reserved_bytes, ratio]


def _semantics_notes(device: str) -> list[str]:
    """What the prediction follows, for ``device``'s table."""
    if device == "cpu":
        return [
            "Predicted for the CPU on fake tensors (FakeTensorMode; bf16 rows: CPU autocast, which "
            "keeps norms and losses in bf16), exact bytes: what `swm train` on a CPU holds. "
            "--predict-for cuda (the default) predicts a GPU's step."
        ]
    return [
        "Predicted for CUDA on fake CPU tensors (FakeTensorMode; bf16 rows: CPU autocast plus the "
        "float32 casts CUDA autocast makes), sizes rounded up to 512 bytes as the CUDA allocator "
        "rounds them; --predict-for cpu predicts a CPU's step. Not included: the CUDA context, "
        "cuBLAS/cuDNN workspaces and allocator fragmentation; budgets add an allowance for them "
        f"of {format_bytes(CUDA_CONTEXT_BYTES + CUDA_WORKSPACE_BYTES)} + "
        f"{ALLOCATOR_OVERHEAD:.0%} of the peak."
    ]


def _category_table(rows: list[Row]) -> Table:
    columns = ["technique", *(CATEGORY_LABELS[c] for c in CATEGORIES)]
    cells = [
        [row.technique, *(f"{row.predicted.by_category[c] / 2**20:.1f}" for c in CATEGORIES)]
        for row in rows
        if row.predicted
    ]
    return Table("predicted MiB alive at the peak, by category", columns, cells)


def _notes(on_cuda: bool, fields: dict[str, Any], snapshot: Path | None) -> list[str]:
    sample_steps, max_steps = fields["disk_sample_steps"], fields["max_steps"]
    buffer_bytes = fields["buffer_ram_bytes"]
    notes = [
        *_semantics_notes(fields["predicted_for"]),
        "Training rows: an AdamW step with its optimizer state alive (as a second step); eval "
        "rows: one forward of encode + predict on the same batch.",
        f"On-disk sizes scale a real sample of {sample_steps} steps written in each format.",
        f"ReplayBuffer RAM: {format_gb(buffer_bytes)} for --max-steps {max_steps} (GB = 10^9 B).",
    ]
    if buffer_bytes > fields["host_available_bytes"]:
        fitting = fields["host_available_bytes"] // fields["buffer_bytes_per_step"]
        notes.append(
            f"This host cannot hold that buffer ({format_gb(fields['host_available_bytes'])} "
            f"available): `swm collect` would refuse it; --max-steps {fitting} fits."
        )
    if fields.get("budget_batch_size") == 0:
        notes.append("No batch size fits the budget: even batch 1 needs more (see the allowance).")
    if fields["ranks"] > 1:
        notes.append(
            f"Data-parallel over {fields['ranks']} ranks: training rows are one rank's peak "
            f"(its {fields['batch_per_rank']} clips of each batch, SIGReg and BatchNorm over all "
            f"{fields['batch_size']}, plus {format_bytes(fields['ddp_bucket_bytes'])} of DDP "
            "gradient buckets); on a GPU, `swm train --nproc N` measures them per rank."
        )
    if fields["ranks"] > 1 and fields["grad_accum"] > 1:
        accumulation = fields["grad_accum"]
        notes.append(
            f"Gradient accumulation ({accumulation} micro-batches per step) costs a rank no memory "
            "past the gradients already in its rows (the second micro-batch is traced with them "
            f"alive); they are all-reduced once per step, on the last micro-batch (no_sync), so "
            f"{accumulation - 1} of every {accumulation} all-reduces are saved."
        )
    if on_cuda and fields["ranks"] == 1:
        notes.append("Measured: one step after a warm-up step, allocator peaks reset per row.")
    else:
        notes.append("torch.compile cannot be traced on fake CPU tensors: run on a GPU to measure.")
    if snapshot is not None:
        notes.append(f"CUDA memory snapshot written to {snapshot} (open in pytorch.org/memory_viz)")
    return notes
