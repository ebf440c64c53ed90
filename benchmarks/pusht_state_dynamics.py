"""swm's predictor on gym-pusht's recorded states, planned from the exact state: what is left of
Push-T for a world model whose encoder reads the state perfectly (docs/bring-your-env.md, "The
recorded state as a training target").

    PYTHONPATH=. python benchmarks/pusht_state_dynamics.py RUN [--data DATA] [--steps 6000]
        [--set KEY=VALUE ...]

Trains swm's predictor (RUN's size) on DATA's training episodes (default: RUN's data), its
"latents" the recorded ``state`` in ``model.state_units`` with ``model.state_angles`` on the
circle (``models.state.StateFeatures``, as ``model.state_weight`` reads them from frames), then the
agent's velocity from ``proprio``; clips of 6 observations ``data.frameskip`` env steps apart,
with the one-step and the five-block loss. Then plays RUN's dataset protocol (its start rows and
goals, budget and planner, as ``swm eval RUN --set`` resolves them) planning from the exact state
after every plan; the cost counts the state's features only (the success criterion's units), not
the velocity. No pixels: the gap between this and the physics ceiling (``pusht_oracle.py``) is the
learned dynamics' alone. Needs gym-pusht.
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

import numpy as np
import pusht_oracle
import torch
from rich.console import Console

from swmcli.config import load_run_config
from swmcli.data.clips import heldout_split
from swmcli.data.formats import open_reader
from swmcli.envs import pusht
from swmcli.models.predictor import Predictor
from swmcli.models.state import StateFeatures
from swmcli.planning import planners
from swmcli.planning.goals import goal_episodes, wilson_interval

CLIP = 6  # observations: five blocks, the planning horizon
VELOCITY_UNIT = 400.0  # px/s: the agent's velocity, an input only
ACTION_DIM = 2
BATCH = 256


class StateDynamics(torch.nn.Module):
    """The predictor on ``[state features, agent velocity / VELOCITY_UNIT]``, standardized
    inside; ``proprio_dims`` 2: the planner's ``proprio_weight`` 0 leaves the velocity out."""

    proprio_dims = 2

    def __init__(self, cfg, size: int, block: int, mean, std):
        super().__init__()
        m = cfg.model
        self.predictor = Predictor(
            size, block, m.predictor_dim, m.predictor_depth, m.predictor_heads, CLIP - 1
        )
        self.context_len = CLIP - 1
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)

    def predict(self, latents: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.standardized(((latents - self.mean) / self.std), actions) * self.std + self.mean

    def standardized(self, latents: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.predictor(latents, actions)


def latents_of(features: StateFeatures, state, proprio) -> torch.Tensor:
    state, proprio = torch.as_tensor(state), torch.as_tensor(proprio)
    return torch.cat([features(state), proprio[..., 2:].float() / VELOCITY_UNIT], dim=-1)


def clips(path: Path, cfg, features: StateFeatures) -> tuple[torch.Tensor, torch.Tensor]:
    """Every clip of ``CLIP`` observations ``frameskip`` apart in the training episodes, with the
    dense action block taken at each (zeros past the episode's end)."""
    reader = open_reader(path)
    training, _ = heldout_split(reader.num_episodes, cfg.eval.heldout_episodes)
    skip, latents, blocks = cfg.data.frameskip, [], []
    for index in training:
        rows = reader.read_episode(index, keys=["state", "proprio", "action"])
        latent = latents_of(features, rows["state"], rows["proprio"])
        actions = torch.as_tensor(np.nan_to_num(rows["action"]), dtype=torch.float32)
        actions = torch.cat([actions, actions.new_zeros(skip * CLIP, ACTION_DIM)])
        for start in range(len(latent) - skip * (CLIP - 1)):
            steps = start + skip * torch.arange(CLIP)
            latents.append(latent[steps])
            taken = [actions[step : step + skip].reshape(-1) for step in steps]
            blocks.append(torch.stack(taken))
    return torch.stack(latents), torch.stack(blocks)


def train(model: StateDynamics, latents, blocks, steps: int, console: Console) -> None:
    """AdamW, one cycle; the one-step loss plus the rollout's from each clip's first state."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, 1e-3, steps, pct_start=0.05)
    standardized = (latents - model.mean) / model.std
    for step in range(steps):
        chosen = torch.randint(len(latents), (BATCH,))
        clip, actions = standardized[chosen], blocks[chosen]
        one_step = (model.standardized(clip[:, :-1], actions[:, :-1]) - clip[:, 1:]).pow(2).mean()
        imagined = clip[:, :1]
        for block in range(CLIP - 1):
            following = model.standardized(imagined, actions[:, : block + 1])[:, -1:]
            imagined = torch.cat([imagined, following], dim=1)
        rollout = (imagined[:, 1:] - clip[:, 1:]).pow(2).mean()
        optimizer.zero_grad()
        (one_step + rollout).backward()
        optimizer.step()
        schedule.step()
        if step % 500 == 0 or step == steps - 1:
            console.print(f"step {step}: one-step {one_step:.5f}, rollout {rollout:.5f}")


def plan_from_state(physics, mean, generator, model, features, goal, settings) -> torch.Tensor:
    """CEM's plan from the env's exact current state, with the learned predictor."""
    state = [*physics.agent.position, *physics.block.position, physics.block.angle]
    latent = latents_of(features, np.float32(state), pusht.proprio(physics))[None]
    with torch.inference_mode():
        return planners.cem(model, latent, goal, mean, settings, generator)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--data", type=Path, help="episodes to train on (default: RUN's data)")
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument(
        "--eval-seeds", type=int, nargs="+", help="eval.seed of each set of start rows"
    )
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    args = parser.parse_args()
    sets = [*args.overrides, "eval.proprio_weight=0"]  # the velocity: an input, not a cost
    cfg = load_run_config(args.run, sets=sets)
    if not cfg.env.id.startswith("gym_pusht:"):
        raise SystemExit(
            f"error: {args.run} plays {cfg.env.id}; these features are gym-pusht's state\n"
            "hint: pass a run trained with --preset pusht-64 (pip install 'swmcli[pusht]')"
        )
    torch.set_num_threads(cfg.runtime.cpu_threads or torch.get_num_threads())
    torch.manual_seed(0)
    console = Console(width=120)
    units = cfg.model.state_units or [20.0, 20.0, 20.0, 20.0, float(pusht.SUCCESS_ANGLE)]
    features = StateFeatures(5, units, cfg.model.state_angles or [4])
    latents, blocks = clips(args.data or cfg.data.path, cfg, features)
    flat = latents.reshape(-1, latents.shape[-1])
    model = StateDynamics(cfg, flat.shape[1], blocks.shape[-1], flat.mean(0), flat.std(0))
    console.print(f"{len(latents):,} clips of {CLIP} states; {args.steps:,} steps of {BATCH}")
    train(model, latents, blocks, args.steps, console)
    model.eval()
    settings = planners.planner_settings(cfg.eval, ACTION_DIM)
    for seed in args.eval_seeds or [cfg.eval.seed]:
        cfg = load_run_config(args.run, sets=[*sets, f"eval.seed={seed}"])
        episodes = goal_episodes(cfg)
        wins = 0
        for index, episode in enumerate(episodes, 1):
            goal = latents_of(features, episode.goal_state, np.zeros(4, np.float32))[None]
            plan_from = partial(
                plan_from_state, model=model, features=features, goal=goal, settings=settings
            )
            wins += pusht_oracle.play(cfg, episode, settings, plan_from)
            console.print(f"{index}/{len(episodes)}: {wins} reached", highlight=False)
        low, high = wilson_interval(wins, len(episodes))
        console.print(
            f"the predictor on the recorded states, {settings.cost} cost, eval.seed {seed}: "
            f"{wins}/{len(episodes)} = {wins / len(episodes):.0%} [{low:.0%}-{high:.0%}]"
        )


if __name__ == "__main__":
    main()
