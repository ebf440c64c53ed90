"""Which memory techniques to switch on: every combination predicted, the cheapest one that fits.

Each technique has a price (``Technique.cost``, lowest first): bf16 autocast costs precision (and
is usually faster on a GPU); the optimizer step in backward costs gradient clipping (its words say
so when clipping is on) and accumulation; fully sharding costs communication and needs the ranks;
activation checkpointing costs about a third more compute. ``combinations`` predicts the training
step with every subset of the techniques that apply to a config and model; ``cheapest_fitting``
picks the subset of lowest total price (then lowest need) whose need (predicted peak plus the CUDA
allowance) is within the budget; ``plan_sentence`` says it in one line; ``draw_combinations``
draws the same as stacked bars by category with the budget line.
"""

import itertools
from dataclasses import dataclass, replace
from pathlib import Path

from swmcli.config import SwmConfig
from swmcli.errors import UsageError
from swmcli.memory.predict import PeakPredictor, Variant
from swmcli.memory.trace import CATEGORIES, StepPeak
from swmcli.training.techniques import LAYERS, layers
from swmcli.units import format_bytes


@dataclass(frozen=True)
class Technique:
    """One memory technique: its words, its price (lower is cheaper) and the settings it changes."""

    name: str
    cost: int
    settings: tuple[tuple[str, object], ...]


@dataclass
class Combination:
    """A set of techniques, the training step it gives and what that step is predicted to need."""

    techniques: tuple[Technique, ...]
    variant: Variant
    peak: StepPeak
    needed_bytes: int  # the peak plus the CUDA allowance: what a GPU must have free

    @property
    def cost(self) -> int:
        return sum(technique.cost for technique in self.techniques)

    @property
    def name(self) -> str:
        return " + ".join(technique.name for technique in self.techniques) or "no technique"


def applicable_techniques(cfg: SwmConfig, predictor: PeakPredictor) -> list[Technique]:
    """The techniques this config and model can use: bf16 always; the optimizer in backward without
    accumulation in one process; sharding across ranks; checkpointing the configured modules,
    else the model's layers when it has some."""
    techniques = [Technique("bf16", 1, (("bf16", True),))]
    if cfg.train.grad_accum == 1 and cfg.runtime.nproc == 1:
        # It cannot clip: with clipping on, taking it means --grad-clip 0 too.
        words = "optimizer in backward" + (" (no clipping)" if cfg.train.grad_clip else "")
        techniques.append(Technique(words, 2, (("in_backward", True),)))
    if cfg.runtime.nproc > 1:
        techniques.append(Technique(f"shard over {cfg.runtime.nproc} ranks", 3, (("shard", True),)))
    choice = cfg.runtime.activation_checkpointing
    if choice is None and layers(predictor.model(cfg.data.history_len, cfg.data.frameskip)):
        choice = LAYERS
    if choice is not None:
        words = "activation checkpointing" + ("" if choice == LAYERS else f" ({choice})")
        techniques.append(Technique(words, 4, (("checkpointing", choice),)))
    return techniques


def without_techniques(variant: Variant) -> Variant:
    """``variant`` with every technique off: what the techniques are weighed against."""
    return replace(variant, bf16=False, checkpointing=None, in_backward=False, shard=False)


def combinations(predictor: PeakPredictor, base: Variant, techniques: list[Technique]):
    """Every subset of ``techniques`` applied to ``base`` (techniques off), predicted."""
    result = []
    for count in range(len(techniques) + 1):
        for chosen in itertools.combinations(techniques, count):
            settings = {key: value for one in chosen for key, value in one.settings}
            variant = replace(without_techniques(base), **settings)
            peak = predictor.predict(variant)
            result.append(Combination(chosen, variant, peak, predictor.needed_bytes(variant)))
    return result


def cheapest_fitting(options: list[Combination], budget: int) -> Combination | None:
    """The combination of lowest price (then lowest need) that fits ``budget``; None if none."""
    fitting = [option for option in options if option.needed_bytes <= budget]
    return min(fitting, key=lambda option: (option.cost, option.needed_bytes), default=None)


def plan_sentence(options: list[Combination], budget: int, resolution: int) -> str:
    """One line: the cheapest set of techniques that fits, or the least any set needs."""
    base = options[0].variant
    task = f"to train B={base.batch_size} at {resolution} in {format_bytes(budget)}"
    chosen = cheapest_fitting(options, budget)
    if chosen is None:
        least = min(options, key=lambda option: option.needed_bytes)
        return (
            f"{task}: no set of techniques fits; the least, {least.name}, needs "
            f"{format_bytes(least.needed_bytes)}: lower --batch-size or --resolution"
        )
    return f"{task}: {chosen.name}; {format_bytes(chosen.needed_bytes)} predicted"


def draw_combinations(
    options: list[Combination], budget: int | None, title: str, path: Path
) -> Path:
    """A PNG: one stacked bar per combination (GiB alive at the peak, by category, plus the
    CUDA allowance) and the budget as a horizontal line. Returns the file written (``path``,
    with ``.png`` added when it has no suffix, as matplotlib adds it)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    gib = 2**30
    figure, axes = plt.subplots(figsize=(max(8, 0.9 * len(options) + 3), 5.5), dpi=80)
    positions = range(len(options))
    bottoms = [0.0] * len(options)
    stacks = [
        (category, [o.peak.by_category[category] / gib for o in options]) for category in CATEGORIES
    ]
    stacks.append(("CUDA allowance", [(o.needed_bytes - o.peak.peak_bytes) / gib for o in options]))
    for label, heights in stacks:
        if any(heights):
            axes.bar(positions, heights, bottom=bottoms, label=label.replace("_", " "))
            bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    if budget is not None:
        axes.axhline(
            budget / gib, color="black", linestyle="--", label=f"budget {format_bytes(budget)}"
        )
    labels = [o.name.replace(" + ", "\n+ ") for o in options]
    axes.set_xticks(list(positions), labels, fontsize=7, rotation=30, ha="right")
    axes.set_ylabel("predicted GiB at the step's peak")
    axes.set_title(title)
    axes.legend(fontsize=7)
    axes.grid(True, axis="y", alpha=0.3)
    figure.tight_layout()
    path = path if path.suffix else path.with_name(path.name + ".png")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return path


def check_picture(path: Path) -> None:
    """Refuse, before any work, a picture path whose suffix names no format matplotlib writes
    (none: ``.png`` is added)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    suffix = path.suffix.lower().lstrip(".")
    if suffix and suffix not in formats:
        raise UsageError(
            f"--picture {path}: matplotlib writes no .{suffix} picture",
            hint=f"name a .png (or one of .{', .'.join(sorted(formats))})",
        )
