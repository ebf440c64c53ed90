"""`swm eval RUN_DIR`: how well a trained world model predicts, and how well it plans.

Everything runs gradient-free (``requires_grad_(False)`` + ``inference_mode``, via the runner):

(a) open-loop latent prediction error per horizon step on the held-out episodes (the last
    ``eval.heldout_episodes`` of the dataset, never trained on): from one observed frame, the
    predictor rolls forward with the recorded action blocks, feeding its own predictions back; the
    error is the MSE to the encoded true frames, next to the error of "the latent does not move";
(b) goal reaching: a planner (CEM or MPPI) in latent space toward the goal image, receding
    horizon, over ``eval.episodes`` seeded episodes, next to a random-action policy on the same
    seeds. A GIF and a picture strip of the first episodes go to ``RUN_DIR/eval/``.
"""

from pathlib import Path

import numpy as np

from swmcli.config import SwmConfig, load_run_config
from swmcli.errors import UsageError
from swmcli.report import CommandResult, Table, info, progress

EVAL_DIR = "eval"
RECORDED_EPISODES = 3  # episodes drawn into the GIF and the strip
STRIP_FRAMES = 8
OPEN_LOOP_BATCH = 256


def run_eval(
    run_dir: Path,
    monitor,
    episodes: int | None = None,
    planner: str | None = None,
    bf16: bool | None = None,
    compile: bool | None = None,
) -> CommandResult:
    """Evaluate the run in ``run_dir`` (its config.json and checkpoint.pt).

    Each argument left None keeps the run's setting (``bf16`` and ``compile`` are its ``runtime``
    section, the one it trained with). Phases for the memory report: load, warm-up
    (compilation), open-loop error, plan, random baseline.
    """
    from swmcli.core.runner import make_runner, untrack_tensors_if_compiling

    run_dir = Path(run_dir)
    overrides = {
        "eval.episodes": episodes,
        "eval.planner": planner,
        "runtime.bf16": bf16,
        "runtime.compile": compile,
    }
    cfg = load_run_config(run_dir, overrides)
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
    _check_data_fits_model(cfg, shape, run_dir)
    with runner.inference(model), monitor.phase("warm-up"):
        _warm_up(model, shape, runner)
    with runner.inference(model), monitor.phase("open-loop error"):
        errors = open_loop_errors(model, cfg, runner)
    with runner.inference(model), monitor.phase("plan"):
        planned = run_episodes(model, cfg, runner, shape)
    with monitor.phase("random baseline"):
        random = run_episodes(None, cfg, runner, shape)
    pictures = save_pictures(planned["recorded"], run_dir / EVAL_DIR, cfg.eval.planner)
    return _result(run_dir, cfg, runner, state["step"], errors, planned, random, pictures)


def load_model(run_dir: Path, cfg: SwmConfig, runner):
    """The run's world model with its checkpoint's weights (prepared by ``runner``) and state."""
    from swmcli.models import build_world_model
    from swmcli.models.checkpoint import checkpoint_path, load_checkpoint, restore_model

    state = load_checkpoint(run_dir)
    model = build_world_model(cfg.model, **state["model_args"])
    restore_model(model, state, checkpoint_path(run_dir))
    return runner.prepare(model), state


def _check_data_fits_model(cfg: SwmConfig, shape: dict[str, int], run_dir: Path) -> None:
    """Refuse data whose frames or actions are not what the run was trained on (the dataset may
    have been replaced since), before any step that would fail on the shapes."""
    from swmcli.core.storage import open_reader

    reader = open_reader(cfg.data.path)  # metadata only: no rows are read
    try:
        pixels = reader.keys["pixels"][1] if "pixels" in reader.keys else None
        action = reader.keys["action"][1] if "action" in reader.keys else None
    finally:
        reader.close()
    side, action_dim = shape["resolution"], shape["action_dim"]
    if pixels is None or pixels[:2] != (side, side) or int(np.prod(action or (0,))) != action_dim:
        raise UsageError(
            f"{cfg.data.path} holds frames {pixels} and actions {action}; {run_dir} was trained "
            f"on {side}x{side} frames and {action_dim} action values",
            hint=f"restore the data the run was trained on (data.path in {run_dir}/config.json)",
        )


def _warm_up(model, shape: dict[str, int], runner) -> None:
    """One encode and one prediction, so compilation is not timed; eager if compiling fails."""
    import torch

    side, block = shape["resolution"], shape["frameskip"] * shape["action_dim"]
    pixels = torch.zeros(1, 1, side, side, 3, dtype=torch.uint8, device=runner.device)
    try:
        latents = model.encode(pixels)
        model.predict(latents, torch.zeros(1, 1, block, device=runner.device))
    except Exception as err:  # torch.compile raises backend-specific errors
        if not runner.compile:
            raise
        info(f"torch.compile failed ({type(err).__name__}); evaluating the eager modules")
        runner.eager(model)


def open_loop_errors(model, cfg: SwmConfig, runner) -> dict[str, list[float]]:
    """Per horizon step: the model's latent MSE and the "no change" baseline's, held-out data.

    The windows are the clips training reads (``load_dataset``), ``horizon + 1`` observations
    long, from the held-out episodes only; the action block of a clip's last frame is not used.
    """
    from swmcli.core.clips import clip_span, heldout_split
    from swmcli.core.data import load_dataset

    horizon, frameskip = cfg.eval.horizon, cfg.data.frameskip
    path, cache = cfg.data.path, cfg.data.cache_dir
    lengths = load_dataset(path, keys_to_load=["pixels"], cache_dir=cache).episode_lengths
    _, heldout = heldout_split(len(lengths), cfg.eval.heldout_episodes)
    if not any(lengths[i] >= clip_span(horizon + 1, frameskip) for i in heldout):
        return {"model": [], "no_change": []}
    windows = load_dataset(
        path,
        keys_to_load=["pixels", "action"],
        history_len=horizon + 1,
        frameskip=frameskip,
        cache_dir=cache,
        episodes=heldout,
    )
    model_sum, still_sum = np.zeros(horizon), np.zeros(horizon)
    for start in range(0, len(windows), OPEN_LOOP_BATCH):
        indices = range(start, min(start + OPEN_LOOP_BATCH, len(windows)))
        batch = runner.to_device(windows.read_batch(indices))
        latents = model.encode(batch["pixels"]).float()
        actions = batch["action"][:, :horizon]
        predicted = model.rollout(latents[:, :1], actions[:, :0], actions).float()
        truth = latents[:, 1:]
        model_sum += (predicted - truth).pow(2).mean(-1).sum(0).cpu().numpy()
        still_sum += (latents[:, :1] - truth).pow(2).mean(-1).sum(0).cpu().numpy()
    windows.close()
    return {"model": list(model_sum / len(windows)), "no_change": list(still_sum / len(windows))}


def run_episodes(model, cfg: SwmConfig, runner, shape: dict[str, int]) -> dict:
    """Seeded goal-reaching episodes: planning with ``model``, or random actions when None.

    Returns per-episode ``success`` and ``steps`` (env steps), and the frames of the first
    episodes (``recorded``: list of (frames, goal image)) for the pictures.
    """
    from swmcli.envs import goal_pixels, make_env

    settings = cfg.eval
    label = settings.planner if model is not None else "random"
    outcome: dict[str, list] = {"success": [], "steps": [], "recorded": []}
    with progress(f"eval {label}", total=settings.episodes) as advance:
        for episode in range(settings.episodes):
            seed = settings.seed + episode
            env = make_env(cfg.env.id, shape["resolution"], cfg.env.max_episode_steps, seed=seed)
            observation, _ = env.reset(seed=seed)
            goal = goal_pixels(env)
            act = _actor(model, cfg, runner, shape, env, goal, seed)
            success, frames = _episode(env, observation, act, settings.max_steps)
            env.close()
            outcome["success"].append(success)
            outcome["steps"].append(len(frames) - 1)
            if episode < RECORDED_EPISODES:
                outcome["recorded"].append((frames, goal))
            advance(1, success_rate=float(np.mean(outcome["success"])))
    return outcome


def _actor(model, cfg: SwmConfig, runner, shape, env, goal, seed: int):
    """observation -> list of env actions: one planned block, or one random action."""
    if model is None:
        from swmcli.envs.policies import make_policy

        policy = make_policy("random", env, seed)
        return lambda observation: [policy(observation)]
    from swmcli.planning import PlannerSettings, RecedingHorizon

    settings = PlannerSettings(
        cfg.eval.horizon, cfg.eval.samples, cfg.eval.iterations, cfg.eval.elites
    )
    block = shape["frameskip"] * shape["action_dim"]
    planner = RecedingHorizon(model, cfg.eval.planner, settings, block, seed)
    planner.reset(runner.to_device({"goal": goal})["goal"])

    def act(observation: dict) -> list[np.ndarray]:
        pixels = runner.to_device({"pixels": observation["pixels"]})["pixels"]
        actions = planner.act(pixels).float().cpu().numpy()
        return list(actions.reshape(shape["frameskip"], shape["action_dim"]))

    return act


def _episode(env, observation, act, max_steps: int) -> tuple[bool, list[np.ndarray]]:
    """Run ``act`` until success, the env ends the episode, or ``max_steps`` env steps."""
    frames = [observation["pixels"]]
    while len(frames) <= max_steps:
        for action in act(observation):
            observation, _, terminated, truncated, step_info = env.step(action)
            frames.append(observation["pixels"])
            if step_info.get("success"):
                return True, frames
            if terminated or truncated or len(frames) > max_steps:
                return False, frames
    return False, frames


def save_pictures(recorded, directory: Path, planner: str) -> dict[str, str]:
    """A GIF (frame | goal, side by side) and a strip (goal, then frames) of recorded episodes."""
    from PIL import Image

    if not recorded:
        return {}
    directory.mkdir(parents=True, exist_ok=True)
    scale = max(1, 128 // recorded[0][1].shape[0])  # small frames are enlarged to be seen
    movie = []
    for frames, goal in recorded:
        for frame in frames:
            movie.append(_enlarge(np.concatenate([frame, _gap(frame), goal], axis=1), scale))
    gif = directory / f"{planner}_episodes.gif"
    images = [Image.fromarray(frame) for frame in movie]
    images[0].save(gif, save_all=True, append_images=images[1:], duration=80, loop=0)
    rows = []
    for frames, goal in recorded:
        picks = np.linspace(0, len(frames) - 1, STRIP_FRAMES).round().astype(int)
        row = [goal, _gap(goal)] + [frames[i] for i in picks]
        rows.append(np.concatenate(row, axis=1))
    strip = directory / f"{planner}_strip.png"
    Image.fromarray(_enlarge(np.concatenate(rows, axis=0), scale)).save(strip)
    return {"gif": str(gif), "strip": str(strip)}


def _gap(frame: np.ndarray) -> np.ndarray:
    return np.full((frame.shape[0], 2, 3), 255, dtype=np.uint8)


def _enlarge(image: np.ndarray, scale: int) -> np.ndarray:
    return image.repeat(scale, axis=0).repeat(scale, axis=1)


def _result(run_dir, cfg, runner, step, errors, planned, random, pictures) -> CommandResult:
    horizon_rows = [
        [k + 1, f"{model:.4f}", f"{still:.4f}"]
        for k, (model, still) in enumerate(zip(errors["model"], errors["no_change"], strict=True))
    ]
    rates = {
        name: float(np.mean(run["success"]))
        for name, run in (("plan", planned), ("random", random))
    }
    reach_rows = [
        _reach_row(cfg.eval.planner, planned),
        _reach_row("random actions", random),
    ]
    return CommandResult(
        title="swm eval",
        fields={
            "run_dir": str(run_dir),
            "checkpoint_step": step,
            "planner": cfg.eval.planner,
            "episodes": cfg.eval.episodes,
            "success_rate": rates["plan"],
            "random_success_rate": rates["random"],
            "open_loop_mse_first": errors["model"][0] if errors["model"] else None,
            "open_loop_mse_last": errors["model"][-1] if errors["model"] else None,
            "device": str(runner.device),
            "dtype": str(runner.dtype).removeprefix("torch."),
            "compile": runner.compile,
            **pictures,
        },
        tables=[
            Table(
                "open-loop latent prediction error (held-out episodes)",
                ["horizon step", "model MSE", "no-change MSE"],
                horizon_rows,
            ),
            Table(
                f"goal reaching over {cfg.eval.episodes} seeded episodes",
                ["policy", "successes", "success rate", "mean env steps (successes)"],
                reach_rows,
            ),
        ],
        notes=[runner.dtype_reason],
    )


def _reach_row(name: str, run: dict) -> list:
    wins = [steps for steps, ok in zip(run["steps"], run["success"], strict=True) if ok]
    mean_steps = f"{np.mean(wins):.1f}" if wins else "-"
    return [
        name,
        f"{len(wins)}/{len(run['success'])}",
        f"{np.mean(run['success']):.0%}",
        mean_steps,
    ]
