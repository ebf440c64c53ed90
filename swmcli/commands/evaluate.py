"""`swm eval RUN_DIR`: how well a trained world model predicts, and how well it plans.

Everything runs gradient-free (``requires_grad_(False)`` + ``inference_mode``, via the runner):

(a) open-loop latent prediction error per horizon step on the held-out episodes (the last
    ``eval.heldout_episodes`` of the dataset, never trained on): from one observed frame, the
    predictor rolls forward with the recorded action blocks, feeding its own predictions back; the
    error is the MSE to the encoded true frames, next to the error of "the latent does not move";
(b) goal reaching, in the env the run was trained on, when that env gives a goal image: a planner
    (CEM or MPPI) in latent space toward the goal image, receding horizon, on the episodes of
    ``eval.protocol`` (see ``protocols``), next to a random-action policy on the same episodes.
    Success rates come with 95% Wilson intervals, split by the env's kind of goal (TwoRoom: same
    room / other room), with the planner's seconds per env step. Labelled pictures of the first
    episodes go to ``RUN_DIR/eval/``.

A model no better than "no change" at predicting, or a planner no better than random actions,
is reported as a warning naming the likely cause.
"""

from pathlib import Path

import numpy as np

from swmcli.config import SwmConfig, check_eval_changes, eval_budget, load_run_config
from swmcli.data.clips import heldout_split
from swmcli.data.formats import open_reader
from swmcli.data.storage.lock import run_lock
from swmcli.data.streaming import load_dataset
from swmcli.data.videos import require_av
from swmcli.envs.make import has_goal_image, make_env
from swmcli.envs.plugins import check_restorable
from swmcli.errors import UsageError
from swmcli.models.interface import build_model
from swmcli.models.outputs import predict_checked
from swmcli.models.rollout import encode_observation, is_recurrent, observe_clip, rollout
from swmcli.models.runner import make_runner, untrack_tensors_if_compiling
from swmcli.planning.episodes import run_episodes
from swmcli.planning.goals import goal_episodes, wilson_interval
from swmcli.planning.pictures import save_gif, save_strip
from swmcli.planning.plan_videos import EpisodeVideos
from swmcli.report import CommandResult, Table, info, warn
from swmcli.training.checkpoints import (
    checkpoint_path,
    data_fingerprint,
    fingerprint_change,
    load_checkpoint,
    restore_model,
)
from swmcli.training.lewm_checkpoints import is_lewm_folder, lewm_eval_config, load_lewm_model
from swmcli.training.loggers import check_installed, log_once
from swmcli.training.step import train_keys

EVAL_DIR = "eval"
OPEN_LOOP_BATCH = 256
PLANNER_KEYS = ("horizon", "samples", "iterations", "elites", "keep_elites", "noise_beta")
PLANNER_KEYS += ("cost", "replan_every", "shrink_horizon")


def eval_config(run_dir: Path, flags=None, sets: list[str] | None = None) -> SwmConfig:
    """What ``swm eval RUN_DIR`` runs with: the run's saved config with eval and runtime
    settings changed by ``flags`` and ``sets``; for a stable-worldmodel LeWM checkpoint folder,
    its model on the data ``sets`` names (``lewm_checkpoints.lewm_eval_config``)."""
    if is_lewm_folder(run_dir):
        return lewm_eval_config(Path(run_dir), flags, sets)
    check_eval_changes(flags, sets)
    return load_run_config(run_dir, flags, sets)


def run_eval(run_dir: Path, monitor, cfg: SwmConfig | None = None, flags=None,
             sets: list[str] | None = None, video: bool = False) -> CommandResult:  # fmt: skip
    """Evaluate the run in ``run_dir`` (its config.json and checkpoint.pt, or a
    stable-worldmodel LeWM checkpoint folder) with ``cfg``; without one, with
    ``eval_config(run_dir, flags, sets)`` (the run's saved config when neither is given); with
    ``video``, each planned episode as an MP4 in ``RUN_DIR/eval/videos`` (``plan_videos``).

    Phases for the memory report: load, warm-up (compilation), open-loop error, then plan and
    random baseline when the env has goals.
    """
    run_dir = Path(run_dir)
    cfg = cfg if cfg is not None else eval_config(run_dir, flags, sets)
    check_installed(cfg.train.loggers)
    if video:
        require_av("swm eval --video")
    with run_lock(run_dir):  # eval writes its pictures into the run: not while it trains
        return _evaluate(run_dir, cfg, monitor, video)


def _evaluate(run_dir: Path, cfg: SwmConfig, monitor, video: bool = False) -> CommandResult:
    """``run_eval``'s work, with the run directory's writer lock held."""
    runner = make_runner(
        bf16=cfg.runtime.bf16, compile=cfg.runtime.compile, cpu_threads=cfg.runtime.cpu_threads
    )
    if note := untrack_tensors_if_compiling(runner, monitor):
        info(note)
    compiled = "on" if runner.compile else "off"
    info(f"device {runner.device}; {runner.dtype_reason}; compile {compiled}")
    with monitor.phase("load"):
        model, state = load_model(run_dir, cfg, runner)
    shape = state["model_args"]
    _check_data_fits_model(cfg, state, run_dir)
    no_goal = _why_no_planning(cfg, shape)
    if video and no_goal is not None:  # asked for films of planned episodes: there are none
        raise UsageError(f"--video: {no_goal}", hint="without --video: the open-loop error alone")
    with runner.inference(model), monitor.phase("warm-up"):
        warm_up(model, shape, runner)
    with runner.inference(model), monitor.phase("open-loop error"):
        errors = open_loop_errors(model, cfg, runner)
    reaching = None
    if no_goal is None:
        episodes = _goal_episodes(cfg)
        videos = EpisodeVideos(run_dir / EVAL_DIR / "videos", model, shape["frameskip"])
        videos = videos if video else None
        with runner.inference(model), monitor.phase("plan"):
            planned = run_episodes(
                model, cfg, runner, shape, episodes, monitor.stop_tracking, videos
            )
        with monitor.phase("random baseline"):
            random = run_episodes(None, cfg, runner, shape, episodes)
        pictures = save_pictures(planned["recorded"], run_dir / EVAL_DIR, cfg.eval.planner)
        if videos is not None:
            pictures["videos"] = videos.written
        reaching = (planned, random, pictures)
    result = _result(run_dir, cfg, runner, state["step"], errors, reaching, no_goal)
    pictures = {"eval/strip": result.fields.get("strip")}
    log_once(cfg.train.loggers, run_dir, state["step"], values=result.fields, pictures=pictures)
    return result


def _why_no_planning(cfg: SwmConfig, shape: dict[str, int]) -> str | None:
    """None when the run's env can be planned in; otherwise why there is no planning result.

    The dataset protocol needs an env that can be set to a recorded state (refused in one line
    otherwise: it was asked for); random goals need an env that gives a goal image. An env that
    cannot be made here (a package missing) leaves the open-loop error only.
    """
    try:
        env = make_env(
            cfg.env.id,
            shape["resolution"],
            cfg.env.max_episode_steps,
            cfg.eval.seed,
            cfg.env.kwargs,
        )
    except UsageError as error:
        return f"no planning result: cannot make {cfg.env.id} here: {error.message} ({error.hint})"
    try:
        if cfg.eval.protocol == "dataset":
            check_restorable(env)
            return None
        if has_goal_image(env):
            return None
    finally:
        env.close()
    return (
        f"no planning result: {cfg.env.id} gives no goal image to plan toward on random goals "
        "(use --protocol dataset where the env can be set to a recorded state, or a "
        "goal-conditioned env such as swm/TwoRoom-v0)"
    )


def _goal_episodes(cfg: SwmConfig):

    return goal_episodes(cfg)


def load_model(run_dir: Path, cfg: SwmConfig, runner):
    """The run's world model with its checkpoint's weights (prepared by ``runner``) and state."""
    if is_lewm_folder(run_dir):
        model, state = load_lewm_model(run_dir, cfg)
        return runner.prepare(model), state
    state = load_checkpoint(run_dir)
    model = build_model(cfg.model, state["model_args"])
    restore_model(model, state, checkpoint_path(run_dir))
    return runner.prepare(model), state


def _check_data_fits_model(cfg: SwmConfig, state: dict, run_dir: Path) -> None:
    """Refuse data whose frames or actions are not what the run was trained on, or whose
    episodes are not (the dataset may have been replaced since), before any step: the held-out
    episodes of other data would be episodes the run trained on, and its error a wrong figure."""
    reader = open_reader(cfg.data.path)  # metadata only: no rows are read
    try:
        pixels = reader.keys["pixels"][1] if "pixels" in reader.keys else None
        action = reader.keys["action"][1] if "action" in reader.keys else None
        fingerprint = data_fingerprint(reader.episode_lengths)
    finally:
        reader.close()
    shape = state["model_args"]
    side, action_dim = shape["resolution"], shape["action_dim"]
    if pixels is None or pixels[:2] != (side, side) or int(np.prod(action or (0,))) != action_dim:
        raise UsageError(
            f"{cfg.data.path} holds frames {pixels} and actions {action}; {run_dir} was trained "
            f"on {side}x{side} frames and {action_dim} action values",
            hint=f"restore the data the run was trained on (data.path in {run_dir}/config.json)",
        )
    trained = state.get("data")  # None for a run trained online
    if trained is not None and trained != fingerprint:
        raise UsageError(
            f"{cfg.data.path} changed since {run_dir} was trained: "
            f"{fingerprint_change(trained, fingerprint)}; its held-out episodes would not be the "
            "ones it never trained on",
            hint=f"restore the data the run was trained on (data.path in {run_dir}/config.json), "
            "or train a new run on this data",
        )


def warm_up(model, shape: dict[str, int], runner) -> None:
    """Encodes and predictions of batch 1 (one frame) then 2 (two frames), so that compilation
    is not timed and happens here: batch 1 and length 1 are compiled as constants (torch
    specializes them), the second call's sizes as symbols that serve every batch and rollout
    length after. Eager if compiling fails."""
    import torch

    side, block = shape["resolution"], shape["frameskip"] * shape["action_dim"]
    device, longest = runner.device, getattr(model, "context_len", None) or 2
    try:
        for count in (1, 2):
            lead = (count, min(count, longest))
            clip = {
                "pixels": torch.zeros(*lead, side, side, 3, dtype=torch.uint8, device=device),
                "action": torch.zeros(*lead, block, device=device),
            }
            if shape.get("proprio_dim"):
                clip["proprio"] = torch.zeros(*lead, shape["proprio_dim"], device=device)
            if is_recurrent(model):  # every call carries the state: one position at a time
                latents, state = observe_clip(model, clip)
                predict_checked(model, latents[:, :1], clip["action"][:, :1], state)
            else:
                latents = encode_observation(model, clip)
                predict_checked(model, latents, clip["action"])
    except Exception as err:  # torch.compile raises backend-specific errors
        if not runner.compile:
            raise
        info(f"torch.compile failed ({type(err).__name__}); evaluating the eager modules")
        runner.eager(model)


def open_loop_errors(model, cfg: SwmConfig, runner) -> dict[str, list[float]]:
    """Per horizon step: the model's latent MSE and the "no change" baseline's, held-out data.

    The windows are the clips training reads (``load_dataset``), ``horizon + 1`` observations
    long, from the held-out episodes only; the action block of a clip's last frame is not used.
    The horizon is ``eval.horizon``, shortened to what the longest held-out episode holds (short
    expert episodes and a large frameskip); empty when not even one step fits.
    """
    frameskip = cfg.data.frameskip
    path, cache = cfg.data.path, cfg.data.cache_dir
    lengths = load_dataset(path, keys_to_load=["pixels"], cache_dir=cache).episode_lengths
    _, heldout = heldout_split(len(lengths), cfg.eval.heldout_episodes)
    longest = max((int(lengths[i]) for i in heldout), default=0)
    horizon = min(cfg.eval.horizon, longest // frameskip - 1)
    if horizon < 1:
        return {"model": [], "no_change": []}
    windows = load_dataset(
        path,
        keys_to_load=train_keys(cfg),
        history_len=horizon + 1,
        frameskip=frameskip,
        cache_dir=cache,
        episodes=heldout,
    )
    model_sum, still_sum = np.zeros(horizon), np.zeros(horizon)
    for start in range(0, len(windows), OPEN_LOOP_BATCH):
        indices = range(start, min(start + OPEN_LOOP_BATCH, len(windows)))
        batch = runner.to_device(windows.read_batch(indices))
        actions = batch["action"][:, :horizon]
        if is_recurrent(model):  # the truth: each frame seen after the recorded blocks
            latents, state = observe_clip(model, batch)
        else:
            latents, state = encode_observation(model, batch), None
        latents = latents.float()
        predicted = rollout(model, latents[:, :1], actions[:, :0], actions, state).float()
        truth = latents[:, 1:]
        model_sum += (predicted - truth).pow(2).mean(-1).sum(0).cpu().numpy()
        still_sum += (latents[:, :1] - truth).pow(2).mean(-1).sum(0).cpu().numpy()
    windows.close()
    return {"model": list(model_sum / len(windows)), "no_change": list(still_sum / len(windows))}


def save_pictures(recorded, directory: Path, planner: str) -> dict[str, str]:
    """A labelled strip and GIF of the recorded episodes (see ``eval_pictures``)."""
    if not recorded:
        return {}
    directory.mkdir(parents=True, exist_ok=True)
    return {
        "gif": str(save_gif(recorded, directory / f"{planner}_episodes.gif")),
        "strip": str(save_strip(recorded, directory / f"{planner}_strip.png", planner)),
    }


def _result(run_dir, cfg, runner, step, errors, reaching, no_goal) -> CommandResult:
    horizon_rows = [
        [k + 1, f"{model:.4f}", f"{still:.4f}"]
        for k, (model, still) in enumerate(zip(errors["model"], errors["no_change"], strict=True))
    ]
    fields = {
        "run_dir": str(run_dir),
        "checkpoint_step": step,
        "env": cfg.env.id,
        "open_loop_mse_first": errors["model"][0] if errors["model"] else None,
        "open_loop_mse_last": errors["model"][-1] if errors["model"] else None,
        "no_change_mse_first": errors["no_change"][0] if errors["no_change"] else None,
        "device": str(runner.device),
        "dtype": str(runner.dtype).removeprefix("torch."),
        "compile": runner.compile,
    }
    tables = [
        Table(
            "open-loop latent prediction error (held-out episodes)",
            ["horizon step", "model MSE", "no-change MSE"],
            horizon_rows,
        )
    ]
    warnings = [warn(message) for message in _open_loop_warning(errors)]
    notes = [runner.dtype_reason]
    if not errors["model"]:
        notes.append(
            f"no open-loop error: no held-out episode is {2 * cfg.data.frameskip} rows long "
            "(raise eval.heldout_episodes, or collect longer episodes)"
        )
    if reaching is None:
        notes.append(no_goal)
        fields["planning"] = None
        fields["no_planning_reason"] = no_goal
    else:
        planned, random, pictures = reaching
        fields.update(_reaching_fields(cfg, planned, random), **pictures)
        tables.append(_reaching_table(cfg, planned, random))
        warnings += [warn(message) for message in _planner_warning(planned, random)]
    return CommandResult("swm eval", fields, tables, notes, warnings)


def _reaching_fields(cfg, planned: dict, random: dict) -> dict:

    e = cfg.eval
    env_steps = sum(planned["steps"])
    fields = {
        "protocol": e.protocol,
        "planner": e.planner,
        "episodes": len(planned["success"]),
        "budget": eval_budget(cfg),
        "success_rate": float(np.mean(planned["success"])),
        "success_interval": list(wilson_interval(sum(planned["success"]), len(planned["success"]))),
        "random_success_rate": float(np.mean(random["success"])),
        "random_success_interval": list(
            wilson_interval(sum(random["success"]), len(random["success"]))
        ),
        "success_by_kind": {
            kind: {"planner": list(_count(planned, kind)), "random": list(_count(random, kind))}
            for kind in sorted(set(planned["kind"]))
        },
        "planning_seconds_per_env_step": planned["seconds"] / max(env_steps, 1),
        "planner_settings": {key: getattr(e, key) for key in PLANNER_KEYS},
    }
    if e.protocol == "dataset":
        fields["goal_offset"] = e.goal_offset
    return fields


def _count(run: dict, kind: str | None) -> tuple[int, int]:
    """(successes, episodes) of a run, for one kind of goal or all (None)."""
    picked = [ok for ok, k in zip(run["success"], run["kind"], strict=True) if kind in (None, k)]
    return sum(picked), len(picked)


def _reaching_table(cfg, planned: dict, random: dict) -> Table:

    kinds = sorted(set(planned["kind"]))
    rows = []
    for name, run in ((cfg.eval.planner, planned), ("random actions", random)):
        for kind in [None, *kinds] if len(kinds) > 1 else [None]:
            wins, total = _count(run, kind)
            low, high = wilson_interval(wins, total)
            steps = [
                s
                for s, ok, k in zip(run["steps"], run["success"], run["kind"], strict=True)
                if ok and kind in (None, k)
            ]
            rows.append(
                [
                    name,
                    kind or "all",
                    f"{wins}/{total}",
                    f"{wins / max(total, 1):.0%}",
                    f"{low:.0%}-{high:.0%}",
                    f"{np.mean(steps):.1f}" if steps else "-",
                ]
            )
    e = cfg.eval
    where = (
        f"dataset protocol: held-out starts, goal {e.goal_offset} steps ahead"
        if e.protocol == "dataset"
        else "random-goal protocol"
    )
    per_step = planned["seconds"] / max(sum(planned["steps"]), 1)
    return Table(
        f"goal reaching, {where}, budget {eval_budget(cfg)} env steps "
        f"({per_step:.3f} s planning per env step)",
        ["policy", "goal", "successes", "success rate", "95% interval", "mean env steps (wins)"],
        rows,
    )


def _open_loop_warning(errors: dict) -> list[str]:
    if not errors["model"] or errors["model"][0] < errors["no_change"][0]:
        return []
    return [
        f"open-loop prediction is no better than the no-change baseline "
        f"({errors['model'][0]:.4f} vs {errors['no_change'][0]:.4f} at one step): the model has "
        "not learned the dynamics; likely too few training steps or too little data: train "
        "longer (--steps) or collect more episodes"
    ]


def _planner_warning(planned: dict, random: dict) -> list[str]:
    wins, random_wins = sum(planned["success"]), sum(random["success"])
    if wins > random_wins:
        return []
    total = len(planned["success"])
    return [
        f"the planner is no better than random actions ({wins}/{total} vs {random_wins}/{total}): "
        "likely an undertrained model (see the open-loop error) or a horizon too short to "
        "reach the goal: train longer, or raise --horizon / --samples"
    ]
