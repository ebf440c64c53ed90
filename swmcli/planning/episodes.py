"""Goal-reaching episodes played in the env: a planner in latent space (``planners``), or
random actions on the same episodes (``goals``), each until success, the env's end of episode
or the step budget; with the first episodes' frames kept for the pictures.
"""

import time

import numpy as np

from swmcli.config import SwmConfig, eval_budget
from swmcli.envs.make import goal_kind, goal_pixels, make_env
from swmcli.envs.plugins import restore_recorded
from swmcli.envs.policies import make_policy
from swmcli.planning.planners import RecedingHorizon, planner_settings
from swmcli.report import progress

RECORDED_EPISODES = 3  # episodes drawn into the GIF and the strip


def run_episodes(
    model,
    cfg: SwmConfig,
    runner,
    shape: dict[str, int],
    episodes,
    first_done=lambda: None,
    videos=None,
) -> dict:
    """Play ``episodes`` (``GoalEpisode``s): planning with ``model``, or random actions when None;
    ``first_done`` is called once the first has been played (memory tracking stops there);
    ``videos`` (``plan_videos.EpisodeVideos``) writes each planned episode as a video.

    Returns per-episode ``success``, ``steps`` (env steps) and ``kind`` (of goal), the seconds
    spent planning, and the first episodes' frames (``recorded``: (frames, goal image, success)).
    """
    settings = cfg.eval
    label = settings.planner if model is not None else "random"
    outcome: dict = {"success": [], "steps": [], "kind": [], "recorded": [], "seconds": 0.0}
    with progress(f"eval {label}", total=len(episodes)) as advance:
        for index, episode in enumerate(episodes):
            recorder = videos.recorder() if videos is not None else None
            success, frames, kind, seconds = _play(model, cfg, runner, shape, episode, recorder)
            if videos is not None:
                videos.write(index + 1, frames, _goal_image(episode, frames), success, recorder)
            outcome["success"].append(success)
            outcome["steps"].append(len(frames) - 1)
            outcome["kind"].append(kind)
            outcome["seconds"] += seconds
            if index < RECORDED_EPISODES:
                outcome["recorded"].append((frames, _goal_image(episode, frames), success))
            advance(1, success_rate=float(np.mean(outcome["success"])))
            if index == 0:
                first_done()
    return outcome


def _play(model, cfg: SwmConfig, runner, shape, episode, on_plan=None):
    """One episode: (success, frames, kind of goal, seconds spent choosing actions);
    ``on_plan`` is the planner's hook (``planner_actor``)."""
    budget = eval_budget(cfg)
    limit = max(cfg.env.max_episode_steps, budget)
    env = make_env(cfg.env.id, shape["resolution"], limit, episode.seed, cfg.env.kwargs)
    if episode.state is None:
        observation, _ = env.reset(seed=episode.seed)
        episode.goal_pixels = goal_pixels(env)
    else:
        env, observation = restore_recorded(env, episode.state, episode.goal_state, episode.seed)
    kind = goal_kind(env)
    act = planner_actor(model, cfg, runner, shape, env, episode, on_plan)
    success, frames, seconds = _episode(env, observation, act, budget)
    env.close()
    return success, frames, kind, seconds


def _goal_image(episode, frames) -> np.ndarray:
    return episode.goal_pixels if episode.goal_pixels is not None else frames[0]


def planner_actor(model, cfg: SwmConfig, runner, shape, env, episode, on_plan=None):
    """observation -> list of env actions: the planned blocks toward ``episode``'s goal, or one
    random action when ``model`` is None. ``on_plan(planner, env_steps)`` is called after each
    planning, with the env steps of the plan that run before the next."""
    if model is None:
        policy = make_policy("random", env, episode.seed)
        return lambda observation: [policy(observation)]
    settings = planner_settings(cfg.eval, shape["action_dim"])
    block = shape["frameskip"] * shape["action_dim"]
    budget_blocks = -(-eval_budget(cfg) // shape["frameskip"])
    planner = RecedingHorizon(model, cfg.eval.planner, settings, block, episode.seed, budget_blocks)
    # The agent's state goes to the planner only for a model trained with it.
    keys = ["pixels", "proprio"] if cfg.model.proprio else ["pixels"]
    goal = {"pixels": episode.goal_pixels, "proprio": episode.goal_proprio}
    planner.reset(*runner.to_device({key: goal[key] for key in keys}).values())

    def act(observation: dict) -> list[np.ndarray]:
        now = runner.to_device({key: observation[key] for key in keys})
        actions = planner.act(*now.values()).float().cpu().numpy()
        env_actions = list(actions.reshape(-1, shape["action_dim"]))
        if on_plan is not None:
            on_plan(planner, len(env_actions))
        return env_actions

    return act


def _episode(env, observation, act, step_budget: int) -> tuple[bool, list[np.ndarray], float]:
    """Run ``act`` until success, the env ends the episode, or ``step_budget`` env steps.

    Returns success, the frames seen and the seconds ``act`` took (planning time).
    """
    frames = [observation["pixels"]]
    seconds = 0.0
    while len(frames) <= step_budget:
        started = time.perf_counter()
        actions = act(observation)
        seconds += time.perf_counter() - started
        for action in actions:
            observation, _, terminated, truncated, step_info = env.step(action)
            frames.append(observation["pixels"])
            if step_info.get("success"):
                return True, frames, seconds
            if terminated or truncated or len(frames) > step_budget:
                return False, frames, seconds
    return False, frames, seconds
