"""Every setting of swm, as pydantic models validated once at the edge.

Precedence, lowest first: the defaults below < a preset (``--preset NAME``, ``presets/NAME.toml``)
or ``--config FILE`` < ``--set section.key=value`` < explicit command-line flags. Defaults live here
and nowhere else. Each run directory keeps its resolved config as ``config.json``.
"""

import copy
import json
import os
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from swmcli.errors import CheckpointError, UsageError
from swmcli.files import check_regular
from swmcli.names import check_name
from swmcli.units import parse_size

SEED_MAX = 2**32 - 1  # what numpy's legacy seeding and gymnasium accept everywhere

CONFIG_FILE = "config.json"


def flag(
    name: str | None = None, *, metavar: str | None = None, help_in: dict[str, str] | None = None
) -> dict:
    """How a setting reads on the command line when not ``--key TYPE``: its flag (``"--env"``,
    ``"--bf16/--fp32"`` for a switch), the word for its value (``"SIZE"``), and ``help_in``:
    its help in a command where the setting does something else than its description says
    (``{"memprofile": "..."}``)."""
    pairs = (("flag", name), ("metavar", metavar), ("help_in", help_in))
    return {k: v for k, v in pairs if v is not None}


def format_name(value: Any) -> Any:
    """A dataset format as written: ``h5`` is HDF5, as the ``.h5`` suffix is everywhere."""
    return "hdf5" if value == "h5" else value


def _dataset_location(value: Any) -> Any:
    return Path(value) if isinstance(value, str) and "://" not in value else value


Format = Literal["lance", "hdf5", "folder"]


def _policy_name(*names: str):
    """A validator: one of ``names``, or ``module:factory`` (a callable of the user's own)."""

    def check(value: Any) -> Any:
        if isinstance(value, str) and (value in names or _is_module_attribute(value)):
            return value
        raise ValueError(f"use one of: {', '.join(names)}, or module:factory")

    return BeforeValidator(check)


def _is_module_attribute(value: str) -> bool:
    module, sep, attribute = value.partition(":")
    return bool(sep) and all(part.isidentifier() for part in [*module.split("."), attribute])


# A dataset's place: a local Path, or an object-store URI kept as the string it is (pathlib
# would fold ``s3://`` into ``s3:/``); storage checks the URI when it opens it.
DatasetPath = Annotated[Path | str, BeforeValidator(_dataset_location)]


INT_MAX = 2**63 - 1  # the largest integer numpy, torch and every file format hold

# runtime.cpu_threads at most: beyond any CPU's hardware threads, and far below the counts that
# crash torch (100000). Not this machine's count: a run's config.json loads on any machine.
MAX_CPU_THREADS = 1024


class Section(BaseModel):
    # Frozen: a resolved config is never edited; a derived one is made by ``with_settings``.
    # No NaN or infinity in any number: an infinite learning rate would only fail deep inside.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, value: Any, info: ValidationInfo) -> Any:
        """``steps = true`` is no step count: a boolean only where a setting is a switch."""
        annotation = cls.model_fields[info.field_name].annotation
        if isinstance(value, bool) and not _takes_bool(annotation):
            raise ValueError(f"{str(value).lower()} is a boolean: this setting takes a value")
        return value

    @field_validator("*", mode="after")
    @classmethod
    def _bounded(cls, value: Any) -> Any:
        """No integer setting beyond int64: a step count of 10**30 would only fail deep inside."""
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT_MAX:
            raise ValueError(f"{value} is beyond the largest integer swm takes (2**63 - 1)")
        return value


def _takes_bool(annotation: Any) -> bool:
    """Whether a field of this type annotation holds a boolean (``bool``, ``bool | None``,
    ``Any``, a dict of anything)."""
    if annotation is bool or annotation is Any:
        return True
    return any(_takes_bool(arg) for arg in get_args(annotation))


class EnvConfig(Section):
    """The gymnasium environment experience comes from."""

    id: str = Field(
        "swm/TwoRoom-v0",
        description="gymnasium env id; module:Id imports module first (it registers the env)",
        json_schema_extra=flag("--env"),
    )
    kwargs: dict[str, Any] = Field(
        {}, description="keyword arguments of gymnasium.make for this env (preset or --set)"
    )
    resolution: PositiveInt = Field(64, description="square frame side in pixels")
    max_episode_steps: PositiveInt = Field(100, description="an episode is truncated after this")


class CollectConfig(Section):
    """`swm collect`: roll out a policy through the capped ReplayBuffer into a dataset."""

    episodes: PositiveInt | None = Field(
        None, description="finished episodes to collect; default: fill --max-steps"
    )
    steps: PositiveInt | None = Field(
        None, description="collect exactly this many steps; default: --max-steps"
    )
    max_steps: PositiveInt = Field(
        200_000,
        description="the ReplayBuffer's capacity in steps (host RAM), as "
        "ReplayBuffer(max_steps=...); without --episodes or --steps, collect stops once this "
        "many steps are written",
        json_schema_extra=flag(
            help_in={
                "memprofile": "the ReplayBuffer's capacity in steps, as "
                "ReplayBuffer(max_steps=...): its host RAM and this many steps' size on disk "
                "are predicted"
            }
        ),
    )
    policy: Annotated[str, _policy_name("expert", "random")] = Field(
        "expert",
        description="who picks the actions: expert, random, or module:factory (factory(env, "
        "seed) returns observation -> action)",
    )
    noise: float = Field(
        0.3,
        ge=0,
        description="noise of the expert policy's actions, in swm collect and in swm train "
        "--online --policy expert (action units; Push-T's pusher: 1.0 is 3x its target noise, "
        "2.0 is 6x); not online.noise, the noise on planned actions",
    )
    random_episodes: int = Field(
        0,
        ge=0,
        description="the dataset's first episodes played with random actions, then the "
        "policy's: shows the model what expert data never does; the held-out tail stays the "
        "policy's",
    )
    out: DatasetPath = Field(
        Path("data/tworoom.lance"), description="dataset (path or s3:// URI) to write or append to"
    )
    format: Annotated[Format | None, BeforeValidator(format_name)] = Field(
        None,
        description="lance, hdf5 (or h5) or folder; default: from the --out suffix, else lance",
    )
    seed: int = Field(0, ge=0, le=SEED_MAX, description="seed of the env resets and the policy")
    workers: PositiveInt = Field(
        1,
        description="env processes rolling out episodes (one torch thread each): more where "
        "the env's step is slow (Push-T); the dataset is the same for any number",
    )

    @model_validator(mode="after")
    def _one_amount(self) -> "CollectConfig":
        _refuse_impossible(
            [
                (
                    self.episodes is not None and self.steps is not None,
                    f"episodes ({self.episodes}) and steps ({self.steps}) both say how much to "
                    "collect: give one (--episodes N or --steps N)",
                )
            ]
        )
        return self


class DataConfig(Section):
    """Streaming clips from a dataset on disk."""

    path: DatasetPath = Field(
        Path("data/tworoom.lance"),
        description="dataset (path or s3:// URI) to stream clips from",
        json_schema_extra=flag("--data"),
    )
    history_len: int = Field(3, ge=2, description="observations per clip")
    frameskip: PositiveInt = Field(5, description="observation stride; actions stay dense")
    num_workers: int = Field(
        2, ge=0, description="readers of the streamed data (0: read between training steps)"
    )
    worker_kind: Literal["threads", "processes"] = Field(
        "threads",
        description="readers as threads of the trainer (fastest: no copy through shared "
        "memory) or DataLoader worker processes (a decoder crash on damaged data then kills "
        "only the worker)",
    )
    prefetch_factor: PositiveInt = Field(2, description="batches each reader reads ahead")
    cache_dir: Path | None = Field(
        None, description="keep the episode index here so reopening does not rescan"
    )
    skip_damaged: bool = Field(
        False,
        description="skip episodes whose rows fail their checksum (named in a warning, "
        "counted in the report) instead of stopping at the first",
        json_schema_extra=flag("--skip-damaged"),
    )
    in_memory: bool | None = Field(
        None,
        description="train from a ReplayBuffer loaded with the training episodes "
        "(--in-memory) or stream them from disk (--no-in-memory); default: in memory when "
        "they fit --ram-budget",
        json_schema_extra=flag("--in-memory/--no-in-memory"),
    )
    ram_budget: int | None = Field(
        None,
        description="host RAM the training ReplayBuffer may take, e.g. 8GiB; "
        "default: data.ram_share of the RAM available when training starts",
        json_schema_extra=flag(metavar="SIZE"),
    )
    ram_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="without --ram-budget, the share of available RAM the buffer may take",
    )
    newest_steps: PositiveInt | None = Field(
        None,
        description="train on the newest training episodes whose steps add up to at most this "
        "(streamed or in memory; default: all of them)",
    )

    @field_validator("ram_budget", mode="before")
    @classmethod
    def _size(cls, value: Any) -> int | None:
        return None if value is None else parse_size(value)


class ModelConfig(Section):
    """The world model: swm's JEPA (encoder + causal action-conditioned predictor, the fields
    below) or your own (``factory``, docs/bring-your-model.md)."""

    factory: str | None = Field(
        None,
        description="your world model: module:function or path/to/file.py:function returning "
        "a module with encode and predict (optional loss); default: swm's JEPA model",
        json_schema_extra=flag("--model", metavar="MODULE:FUNCTION"),
    )
    kwargs: dict[str, Any] = Field(
        {}, description="keyword arguments for --model's factory, e.g. --set model.kwargs.width=64"
    )

    @model_validator(mode="after")
    def _kwargs_for_a_factory(self) -> "ModelConfig":
        _refuse_impossible(
            [
                (
                    bool(self.kwargs) and self.factory is None,
                    f"kwargs {self.kwargs} are for --model's factory: swm's own model takes "
                    "its settings by name (model.latent_dim, model.cnn_width, ...)",
                )
            ]
        )
        return self

    encoder: Literal["cnn", "vit"] = Field("cnn", description="pixel encoder architecture")
    latent_dim: PositiveInt = Field(32, description="size of one frame's latent")
    cnn_width: PositiveInt = Field(16, description="channels of the first CNN stage (doubles)")
    vit_patch: PositiveInt = Field(16, description="ViT patch side in pixels")
    vit_dim: PositiveInt = Field(192, description="ViT token width")
    vit_depth: PositiveInt = Field(12, description="ViT layers")
    vit_heads: PositiveInt = Field(3, description="ViT attention heads")
    predictor_dim: PositiveInt = Field(128, description="predictor token width")
    predictor_depth: PositiveInt = Field(3, description="predictor layers")
    predictor_heads: PositiveInt = Field(4, description="predictor attention heads")
    regularizer: Literal["sigreg", "vicreg"] = Field(
        "sigreg", description="what keeps the latents from collapsing"
    )
    regularizer_weight: float = Field(0.005, ge=0, description="weight of the regularizer loss")
    rollout_weight: float = Field(
        0.0,
        ge=0,
        description="weight of the multi-step loss: the predictor rolled out over the clip from "
        "its first latent, its own predictions fed back (what planning does)",
    )
    reconstruction_weight: float = Field(
        0.0,
        ge=0,
        description="weight of a decoder's error drawing each frame back from its latent (swm's "
        "CNN model): the latent must then hold all the frame shows, not only what moves most",
    )
    proprio: bool = Field(
        False,
        description="feed the agent's own state (the data's proprio key: Push-T's position and "
        "velocity) to the model beside the pixels; the planner then counts it in its cost",
    )
    state_weight: float = Field(
        0.0,
        ge=0,
        description="weight of a supervised readout: the first values of each frame's latent "
        "trained to equal the env's recorded state (the data's state key) in state_units, so "
        "the planner's distance over them is the success criterion's; 0: off",
    )
    state_units: list[PositiveFloat] = Field(
        [],
        description="the unit of each value of the data's state in the latent (Push-T: the "
        "success region, 20 px and pi/9 radians); empty: 1 for every value",
    )
    state_angles: list[NonNegativeInt] = Field(
        [],
        description="indices of the state's values that are angles in radians: each enters "
        "the latent as its cosine and sine (a turn of 2 pi is no distance), over its unit",
    )

    @model_validator(mode="after")
    def _heads_divide_widths(self) -> "ModelConfig":
        pred, vit = (self.predictor_dim, self.predictor_heads), (self.vit_dim, self.vit_heads)
        _refuse_impossible(
            [
                (
                    pred[0] % pred[1] != 0,
                    f"predictor_dim ({pred[0]}) must be a multiple of "
                    f"predictor_heads ({pred[1]}): each head takes an equal share",
                ),
                (
                    vit[0] % vit[1] != 0,
                    f"vit_dim ({vit[0]}) must be a multiple of vit_heads "
                    f"({vit[1]}): each head takes an equal share",
                ),
                (
                    len(set(self.state_angles)) != len(self.state_angles),
                    f"state_angles {self.state_angles} names an index twice",
                ),
            ]
        )
        return self


class RuntimeConfig(Section):
    """How train, eval and memprofile run the model: precision, compilation, CPU threads, and
    the memory techniques (docs/bring-your-model.md)."""

    bf16: bool = Field(
        False,
        description="bf16 autocast: True reduces activation memory",
        json_schema_extra=flag("--bf16/--fp32"),
    )
    compile: bool = Field(
        False,
        description="torch.compile the model's encode and predict separately, and its own loss "
        "when it has one",
        json_schema_extra=flag(
            "--compile/--eager",
            help_in={"eval": "torch.compile the model's encode and predict separately"},
        ),
    )
    cpu_threads: PositiveInt | None = Field(
        None, description="torch CPU threads (None: torch's default); 1 on a busy shared CPU"
    )

    @field_validator("cpu_threads")
    @classmethod
    def _threads_a_cpu_runs(cls, value: int | None) -> int | None:
        """torch crashes on a thread count far beyond any CPU's (100000): refused here."""
        if value is not None and value > MAX_CPU_THREADS:
            raise ValueError(
                f"{value} threads is more than any CPU runs: at most {MAX_CPU_THREADS} "
                f"(this machine has {os.cpu_count()} CPUs)"
            )
        return value
    nproc: PositiveInt = Field(
        1,
        description="data-parallel processes, one per GPU (or CPU processes): swm train "
        "launches them with torchrun",
        json_schema_extra=flag(
            help_in={
                "memprofile": "data-parallel ranks to predict for: a training row is one rank's "
                "peak (its share of the batch, DDP's gradient buckets or its shard)"
            }
        ),
    )
    activation_checkpointing: str | None = Field(
        None,
        description="recompute these modules' activations in backward instead of keeping "
        "them: 'layers' (every child of the model's nn.ModuleLists: swm's model's transformer "
        "layers) or module class names, comma-separated; saves most activation memory, costs "
        "about a third more compute",
        json_schema_extra=flag(metavar="MODULES"),
    )
    optimizer_in_backward: bool = Field(
        False,
        description="step AdamW per parameter inside backward and free each gradient at once: "
        "saves the gradients' memory; cannot clip (needs --grad-clip 0) nor accumulate, one "
        "process",
        json_schema_extra=flag("--optimizer-in-backward"),
    )
    shard: bool = Field(
        False,
        description="fully shard parameters, gradients and AdamW state over the data-parallel "
        "ranks (FSDP2, torchrun): divides their memory by the ranks; costs an all-gather of "
        "each layer's weights in forward and backward",
        json_schema_extra=flag("--shard"),
    )


class TrainConfig(Section):
    """`swm train`: the optimization loop."""

    steps: PositiveInt = Field(2000, description="optimizer steps to train to")
    batch_size: PositiveInt = Field(
        64, description="clips per micro-batch, all ranks together (each reads its share)"
    )
    grad_accum: PositiveInt = Field(1, description="micro-batches per optimizer step")
    lr: float = Field(5e-4, gt=0, description="peak learning rate (warm-up, then cosine)")
    weight_decay: float = Field(0.05, ge=0, description="AdamW weight decay")
    optimizer_impl: Literal["foreach", "for-loop", "fused"] = Field(
        "foreach",
        description="AdamW's implementation in torch: foreach updates every parameter at once "
        "(torch's default on CUDA), for-loop one parameter at a time (its default on the CPU), "
        "fused in one kernel per step (CUDA and the CPU have it); each holds different "
        "temporaries at the step, and the memory prediction follows the one set",
        json_schema_extra=flag(metavar="IMPL"),
    )
    grad_clip: float = Field(
        1.0,
        ge=0,
        description="scale the gradients down to this global norm when above it; 0: no clipping "
        "(--optimizer-in-backward needs 0)",
    )
    seed: int = Field(0, ge=0, le=SEED_MAX, description="seed of init, sampling and shuffling")
    init_from: Path | None = Field(
        None,
        description="start from another run's trained weights: every weight of its checkpoint "
        "whose name and shape match this model's (the rest starts fresh); a resume ignores it",
        json_schema_extra=flag(metavar="RUN_DIR"),
    )
    freeze: str | None = Field(
        None,
        description="parts of the model that training leaves as they are: module names, "
        "comma-separated (swm's model: encoder, proprio_norm, predictor, decoder); they get no "
        "gradient and run in eval mode",
        json_schema_extra=flag(metavar="MODULES"),
    )
    out: Path = Field(Path("runs/tworoom"), description="run directory")
    checkpoint_every: PositiveInt = Field(100, description="steps between atomic checkpoints")
    log_every: PositiveInt = Field(10, description="steps between metrics lines")
    loggers: list[Literal["tensorboard", "wandb"]] = Field(
        [],
        description="also log to tensorboard and/or wandb (repeat the flag, or a comma list); "
        "metrics.jsonl is always written",
        json_schema_extra=flag("--logger"),
    )

    @field_validator("loggers", mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            return value
        names = [name.strip() for item in items for name in str(item).split(",")]
        return list(dict.fromkeys(name for name in names if name))


class OnlineConfig(Section):
    """`swm train --online`: a policy fills the capped ReplayBuffer while the model trains."""

    enabled: bool = Field(
        False,
        description="collect in the env while training (--env ID)",
        json_schema_extra=flag("--online"),
    )
    policy: Annotated[str, _policy_name("expert", "random", "planner")] = Field(
        "expert",
        description="who picks the actions online: expert, random, planner (the model being "
        "trained plans toward the env's goal with the eval planner settings, plus noise), or "
        "module:factory",
    )
    noise: float = Field(
        0.3,
        ge=0,
        description="Gaussian noise (std, action units) added to planned actions online (--policy "
        "planner); not collect.noise, the expert policy's noise",
    )
    updates_per_step: float = Field(
        0.1, gt=0, description="optimizer steps per env step collected (0.1: one every 10)"
    )
    warmup_steps: int = Field(
        1000, ge=0, description="env steps collected before the first optimizer step"
    )
    max_steps: PositiveInt = Field(
        200_000,
        description="the online ReplayBuffer's capacity in steps, as collect's --max-steps: a "
        "ring of the newest episodes",
    )
    record: DatasetPath | None = Field(
        None,
        description="append every finished episode to this dataset; --resume refills the "
        "buffer from it",
    )


class EvalConfig(Section):
    """`swm eval`: open-loop prediction error and goal reaching with a planner."""

    protocol: Literal["random-goal", "dataset"] = Field(
        "random-goal",
        description="random-goal (a fresh random start and goal) or dataset (start state and "
        "goal image from held-out episodes, goal_offset env steps apart)",
    )
    episodes: PositiveInt = Field(10, description="planning episodes (seeded)")
    goal_offset: PositiveInt = Field(
        25, description="dataset protocol: env steps from the start state to the goal"
    )
    planner: Literal["cem", "mppi"] = Field("cem", description="latent-space planner: cem or mppi")
    horizon: PositiveInt = Field(5, description="planned action blocks")
    samples: PositiveInt = Field(300, description="action sequences per planner iteration")
    iterations: PositiveInt = Field(10, description="planner iterations per replanning")
    elites: PositiveInt = Field(30, description="best sequences CEM refits to")
    keep_elites: int = Field(3, ge=0, description="elites carried to the next iteration (iCEM)")
    noise_beta: float = Field(
        2.0, ge=0, description="colored sampling noise, 1/f^beta along time (0 white, iCEM 2)"
    )
    cost: Literal["terminal", "trajectory", "reach"] = Field(
        "trajectory",
        description="latent distance to the goal at the last planned block, averaged over every "
        "block, or the closest any block comes (reach: success counts at any step)",
    )
    replan_every: PositiveInt = Field(1, description="planned blocks executed before replanning")
    shrink_horizon: bool = Field(
        False,
        description="each new plan keeps the previous plan's deadline (its horizon: the blocks "
        "left of it, a full one once spent) instead of reaching horizon blocks further",
    )
    proprio_weight: float = Field(
        1.0,
        ge=0,
        description="weight of the agent's state in the planning cost, beside the latent's "
        "(models trained with model.proprio)",
    )
    step_budget: PositiveInt | None = Field(
        None,
        description="env steps per planning episode; default: twice goal_offset "
        "for the dataset protocol, env.max_episode_steps for random goals",
    )
    heldout_episodes: PositiveInt = Field(4, description="episodes kept out for prediction error")
    seed: int = Field(1000, ge=0, le=SEED_MAX, description="seed of the planning episodes")

    @model_validator(mode="after")
    def _possible_planner(self) -> "EvalConfig":
        _refuse_impossible(
            [
                (
                    self.elites > self.samples,
                    f"elites ({self.elites}) cannot be more than "
                    f"samples ({self.samples}): the elites are the best of the samples (lower "
                    "--elites or raise --samples)",
                ),
                (
                    self.keep_elites > self.elites,
                    f"keep_elites ({self.keep_elites}) cannot be more than elites ({self.elites})",
                ),
                (
                    self.replan_every > self.horizon,
                    f"replan_every ({self.replan_every}) cannot "
                    f"be more than horizon ({self.horizon}): only the planned blocks can be run",
                ),
            ]
        )
        return self


def _refuse_impossible(checks: list[tuple[bool, str]]) -> None:
    """One ValueError naming every impossible combination of a section's settings (pydantic
    reports it with the config's other errors, all at once)."""
    problems = [words for impossible, words in checks if impossible]
    if problems:
        raise ValueError("; ".join(problems))


def eval_budget(cfg: "SwmConfig") -> int:
    """The env steps a planning episode may take (``eval.step_budget`` or its protocol default)."""
    if cfg.eval.step_budget is not None:
        return cfg.eval.step_budget
    if cfg.eval.protocol == "dataset":
        return 2 * cfg.eval.goal_offset
    return cfg.env.max_episode_steps


class MemprofileConfig(Section):
    """`swm memprofile`: budgets to fit, and the picture."""

    budget: int | None = Field(
        None, description="GPU memory budget, e.g. 24GiB", json_schema_extra=flag(metavar="SIZE")
    )
    ram_budget: int | None = Field(
        None, description="host RAM budget, e.g. 64GB", json_schema_extra=flag(metavar="SIZE")
    )
    sample_episodes: PositiveInt = Field(
        4, description="episodes written in each format to estimate the on-disk size"
    )
    picture: Path | None = Field(
        None,
        description="draw the predicted peaks as stacked bars by category (per combination of "
        "techniques with --budget, else per row) with the budget line, into this PNG",
    )
    predict_for: Literal["cuda", "cpu"] = Field(
        "cuda",
        description="the device whose semantics the prediction follows: cuda (what CUDA bf16 "
        "autocast keeps in float32, sizes rounded up to 512 bytes as its allocator does) or cpu "
        "(CPU autocast, exact bytes: what `swm train` on a CPU uses)",
        json_schema_extra=flag(metavar="DEVICE"),
    )

    @field_validator("budget", "ram_budget", mode="before")
    @classmethod
    def _size(cls, value: Any) -> int | None:
        return None if value is None else parse_size(value)


class SwmConfig(Section):
    """All of swm's settings; every command reads the sections it needs."""

    env: EnvConfig = EnvConfig()
    collect: CollectConfig = CollectConfig()
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    train: TrainConfig = TrainConfig()
    online: OnlineConfig = OnlineConfig()
    eval: EvalConfig = EvalConfig()
    memprofile: MemprofileConfig = MemprofileConfig()

    @model_validator(mode="after")
    def _ranks_share_the_batch(self) -> "SwmConfig":
        _refuse_impossible(
            [
                (
                    self.runtime.nproc > self.train.batch_size,
                    f"runtime.nproc ({self.runtime.nproc}) cannot be more than train.batch_size "
                    f"({self.train.batch_size}): each process takes a share of the batch",
                )
            ]
        )
        return self


def _get(tree: dict[str, Any], dotted: str) -> Any:
    section, key = dotted.split(".")
    node = tree.get(section)
    return node.get(key) if isinstance(node, dict) else None


def presets_dir() -> Path:
    """Where presets live: inside the installed wheel, else the repository's ``presets/``."""
    packaged = Path(__file__).parent / "presets"
    return packaged if packaged.is_dir() else Path(__file__).parents[1] / "presets"


def preset_names() -> list[str]:
    return sorted(p.stem for p in presets_dir().glob("*.toml"))


def _read_config_file(path: Path) -> dict[str, Any]:
    """The settings in a TOML file (or a run's config.json), as nested dicts."""
    check_regular(path, "settings")
    try:
        text = path.read_text()
        tree = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except FileNotFoundError as err:
        raise UsageError(f"config file {path} does not exist", hint="check the path") from err
    except UnicodeDecodeError as err:
        raise UsageError(
            f"{path} is not text (byte {err.object[err.start]:#04x} at {err.start})",
            hint="pass a TOML file of settings",
        ) from err
    except OSError as err:
        raise UsageError(f"cannot read config {path}: {err}", hint="check the path") from err
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as err:
        kind = "JSON" if path.suffix == ".json" else "TOML"
        raise UsageError(f"{path} is not valid {kind}: {err}", hint="fix the file") from err
    except RecursionError:
        raise UsageError(
            f"{path} is nested too deeply to be a config", hint="see presets/*.toml"
        ) from None
    if not isinstance(tree, dict):
        raise UsageError(f"{path} does not hold a table of settings", hint="see presets/*.toml")
    return tree


def _parse_value(text: str) -> Any:
    """A --set value as TOML (numbers, booleans, lists, quoted strings), else the raw string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError):
        return text


def _put(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        node = tree.setdefault(key, {})
        if not isinstance(node, dict):
            raise UsageError(f"cannot set {dotted}: {key} is not a section", hint="see --help")
        tree = node
    tree[leaf] = value


def _settings_tree(sets: list[str] | None, flags: dict[str, Any] | None) -> dict[str, Any]:
    """The ``--set section.key=value`` items, then the flags given (``None``: not given), as
    nested settings."""
    tree: dict[str, Any] = {}
    for item in sets or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--set {item!r} is not key=value", hint="e.g. --set train.lr=1e-3")
        _put(tree, key.strip(), _parse_value(value.strip()))
    for key, value in (flags or {}).items():
        if value is not None:
            _put(tree, key, value)
    return tree


#: Settings that say one thing two ways: a source that sets either replaces what a source below
#: it set (``--steps 100`` over a preset's ``episodes``); one source setting both is refused.
ALTERNATIVES = (("collect.episodes", "collect.steps"),)


def _layered(base: dict[str, Any], top: dict[str, Any], where: str) -> dict[str, Any]:
    """``top``'s settings (from ``where``) over ``base``'s, as the precedence says. An env's
    kwargs are that env's: a layer that names another env (``--preset pusht-64 --env
    stable_worldmodel:swm/PushT-v1``) drops the kwargs below it."""
    _check_sections(top, where)
    base = copy.deepcopy(base)
    env_base, env_top = base.get("env") or {}, top.get("env") or {}
    if "id" in env_top and env_top["id"] != env_base.get("id", EnvConfig().id):
        base["env"] = {key: value for key, value in env_base.items() if key != "kwargs"}
    for group in ALTERNATIVES:
        if any(_get(top, key) is not None for key in group):
            for key in group:
                section, name = key.split(".")
                if isinstance(base.get(section), dict):
                    base[section].pop(name, None)
    return _merge(base, top)


def _check_sections(tree: dict[str, Any], where: str) -> None:
    """A section given as anything but a table is refused, never merged away: ``train = 5`` in
    a file would otherwise drop a preset's whole ``[train]``."""
    for name, value in tree.items():
        if name in SwmConfig.model_fields and not isinstance(value, dict):
            raise UsageError(
                f"{where}: {name} is a section of settings, not {value!r}",
                hint=f"write it as a table: [{name}] then key = value lines (see presets/*.toml)",
            )


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _describe(err: ValidationError) -> str:
    return "; ".join(_describe_one(e) for e in err.errors(include_url=False))


def _describe_one(error: dict) -> str:
    dotted = ".".join(str(p) for p in error["loc"])
    message = error["msg"].removeprefix("Value error, ")
    return f"{dotted}: {message}" if dotted else message


def _validated(tree: dict[str, Any]) -> SwmConfig:
    try:
        return SwmConfig.model_validate(tree)
    except ValidationError as err:
        raise UsageError(
            f"invalid config: {_describe(err)}", hint="see the command's --help for its options"
        ) from err


def with_settings(cfg: SwmConfig, settings: dict[str, Any]) -> SwmConfig:
    """A new validated config: ``cfg`` with ``settings`` (dotted keys, e.g. ``"train.steps"``)
    changed. ``cfg`` itself is frozen and stays as it was."""
    tree = cfg.model_dump()
    for key, value in settings.items():
        _put(tree, key, value)
    return _validated(tree)


def resolve_config(
    preset: str | None = None,
    config_file: Path | None = None,
    sets: list[str] | None = None,
    flags: dict[str, Any] | None = None,
) -> SwmConfig:
    """Build the one validated config of a command, reporting every bad field at once.

    ``flags`` maps dotted keys (``"train.batch_size"``) to explicit flag values; ``None`` means the
    flag was not given and does not override anything.
    """
    tree: dict[str, Any] = {}
    if preset is not None:
        path = preset_path(preset)
        tree = _layered(tree, _read_config_file(path), f"preset {preset}")
    if config_file is not None:
        tree = _layered(tree, _read_config_file(config_file), str(config_file))
    return _validated(_layered(tree, _settings_tree(sets, flags), "--set and flags"))


def preset_path(preset: str) -> Path:
    """The file of the preset named ``preset``: only ever one of ``presets/``, never a path
    (a file of settings elsewhere is ``--config FILE``)."""
    hint = f"choose one of: {', '.join(preset_names())}; a file of settings is --config FILE"
    check_name(preset, "preset", hint=hint)
    path = presets_dir() / f"{preset}.toml"
    if not path.is_file():
        raise UsageError(f"no preset named {preset!r}", hint=hint)
    return path


#: The settings of swm's own model (its architecture) and of swm's JEPA loss: a run of a
#: ``model.factory`` model does not record the first, nor the second when it has its own loss.
#: ``state_weight`` is kept: it also has the batch carry the data's ``state``, which a model's
#: own loss may read (a resumed run reads it again).
SWM_MODEL_SETTINGS = (
    "encoder", "latent_dim", "cnn_width", "vit_patch", "vit_dim", "vit_depth", "vit_heads",
    "predictor_dim", "predictor_depth", "predictor_heads", "state_units", "state_angles",
)  # fmt: skip
JEPA_LOSS_SETTINGS = (
    "regularizer", "regularizer_weight", "rollout_weight", "reconstruction_weight",
)  # fmt: skip


def save_config(config: SwmConfig, directory: Path) -> Path:
    """Write the resolved config next to a command's output, so the run needs nothing else."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / CONFIG_FILE
    path.write_text(config_text(config))
    return path


def config_text(config: SwmConfig, own_loss: bool = False) -> str:
    """A config as ``config.json`` holds it (and the checkpoint beside it, byte for byte): the
    settings that apply to its model. A ``model.factory`` model leaves out swm's model's
    settings, and swm's loss settings when it has a loss of its own (``own_loss``); loading the
    file back gives them their defaults, which nothing reads."""
    left_out: set[str] = set()
    if config.model.factory is not None:
        left_out.update(SWM_MODEL_SETTINGS, JEPA_LOSS_SETTINGS if own_loss else ())
    return config.model_dump_json(indent=2, exclude={"model": left_out}) + "\n"


def load_run_config(
    run_dir: Path, flags: dict[str, Any] | None = None, sets: list[str] | None = None
) -> SwmConfig:
    """The resolved config a run directory was made with, ``--set`` items and ``flags`` on top."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(
            f"{run_dir} has no {CONFIG_FILE}",
            hint="pass a directory written by `swm train`",
            exit_code=2,
        )
    damaged = "restore it from a copy (the run's checkpoint.pt holds its text)"
    try:
        tree = _read_config_file(path)
    except UsageError as err:
        raise CheckpointError(f"{path} is damaged: {err.message}", hint=damaged) from err
    try:
        SwmConfig.model_validate(tree)
    except ValidationError as err:  # before any flag: the file itself is bad
        raise CheckpointError(
            f"{path} is damaged or from another swm version: {_describe(err)}", hint=damaged
        ) from err
    return _validated(_layered(tree, _settings_tree(sets, flags), "--set and flags"))


def check_eval_changes(flags: dict[str, Any] | None, sets: list[str] | None) -> None:
    """swm eval changes only ``eval.*`` and ``runtime.*``: the model and its data are the run's
    (``model.factory`` may move: a renamed module, another checkout; its weights are the run's)."""
    keys = [key for key, value in (flags or {}).items() if value is not None]
    keys += [item.partition("=")[0].strip() for item in sets or []]
    for key in keys:
        if not key.startswith(("eval.", "runtime.")) and key != "model.factory":
            raise UsageError(
                f"swm eval cannot change {key}: the model and its data are the run's",
                hint="override eval settings only, e.g. --set eval.samples=300",
            )


def flat_settings(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"section.key": value}`` of a nested settings tree."""
    if not isinstance(tree, dict):
        return {prefix.rstrip("."): tree}
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        flat.update(flat_settings(value, f"{prefix}{key}."))
    return flat
