"""Reproduces docs/reports/pusht.md, table 'Planning from the recorded state'.

swm's predictor on gym-pusht's recorded states, planned from the exact state: what is left of
Push-T for a world model whose encoder reads the state perfectly.

    PYTHONPATH=. python experiments/pusht_state_dynamics.py RUN [--data DATA] [--steps 6000]
        [--predictor transformer|t-frame] [--planner-rounds 0] [--planner-episodes 600]
        [--reader-steps 0] [--set KEY=VALUE ...]

Trains a predictor on DATA's training episodes (default: RUN's data), its "latents" the recorded
``state`` in the success criterion's units (20 px, the angle's cosine and sine over pi/9;
``models.state.StateFeatures``), then the agent's velocity from ``proprio``; clips of 6
observations ``data.frameskip`` env steps apart, with the one-step and the five-block loss. The
predictor is swm's (``transformer``, RUN's size) or ``t-frame`` (the Push-T state model's,
``swmcli.zoo.pusht_state``): a Markov MLP that sees the agent, its velocity and the action's
targets in the T's frame and moves the T there (pushing is the same anywhere in the arena and at
any angle; the transformer must learn that from data). Prints its held-out errors in pixels and
degrees, one block and five blocks on. With ``--planner-rounds K``, K times: the predictor's
planner plays ``--planner-episodes`` start rows drawn from the training episodes (never the
held-out ones) for the whole budget, every state and action recorded, and a fresh predictor
trains on the data and every round's plays (the planner's own plans as data, in state space).
Then plays RUN's dataset protocol (its start rows and goals, budget and planner, as ``swm eval
RUN --set`` resolves them) planning from the exact state after every plan; the cost counts the
state's features only (the success criterion's units), not the velocity. No pixels: the gap
between this and the physics ceiling (``pusht_oracle.py``) is the learned dynamics' alone. With
``--reader-steps N``, pixels after all: a CNN (``pusht_reader.py``) trained N steps to read the
T's pose from the training episodes' frames, and the planner starts from the T it reads from the
frame the env draws and aims at the T it reads from the goal image, the agent's position and
velocity its observation's. Needs gym-pusht.
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

import numpy as np
import pusht_oracle
import torch
from pusht_reader import read_state, train_reader
from rich.console import Console
from torch import nn

from swmcli.config import load_run_config
from swmcli.data.clips import heldout_split
from swmcli.data.formats import open_reader
from swmcli.envs import pusht
from swmcli.models.predictor import Predictor
from swmcli.models.rollout import rollout
from swmcli.models.state import StateFeatures
from swmcli.planning import planners
from swmcli.planning.goals import dataset_episodes, goal_episodes, wilson_interval
from swmcli.zoo.pusht_state import (
    ACTION_DIM,
    ANGLE_UNIT,
    POSITION_UNIT,
    VELOCITY_UNIT,
    TFrameDynamics,
)

CLIP = 6  # observations: five blocks, the planning horizon
UNITS = [POSITION_UNIT] * 4 + [ANGLE_UNIT]  # gym-pusht's state: the success region


class StateDynamics(nn.Module):
    """The predictor on ``[state features, agent velocity / VELOCITY_UNIT]``, standardized
    inside; ``proprio_dims`` 2: the planner's ``proprio_weight`` 0 leaves the velocity out."""

    proprio_dims = 2
    batch = 256

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


class StandardizedTFrame(nn.Module):
    """The Push-T state model's t-frame predictor (``pusht_state.TFrameDynamics``: a
    Markov MLP that sees the agent, its velocity and the block's targets in the T's own frame),
    with ``StateDynamics``' ``standardized``."""

    proprio_dims = 2
    context_len = 1
    batch = 512

    def __init__(self, frameskip: int, mean, std):
        super().__init__()
        self.dynamics = TFrameDynamics(frameskip)
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)

    def predict(self, latents: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Each observation's next features ``(..., 8)`` from its own and its block's."""
        return self.dynamics(latents, actions)

    def standardized(self, latents: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return (self.predict(latents * self.std + self.mean, actions) - self.mean) / self.std


def latents_of(features: StateFeatures, state, proprio) -> torch.Tensor:
    state, proprio = torch.as_tensor(state), torch.as_tensor(proprio)
    return torch.cat([features(state), proprio[..., 2:].float() / VELOCITY_UNIT], dim=-1)


def episode_clips(latent, actions, skip: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every clip of ``CLIP`` observations ``skip`` steps apart in one episode (none in one too
    short), with the dense action block taken at each (zeros past the episode's end)."""
    actions = torch.as_tensor(np.nan_to_num(actions), dtype=torch.float32)
    actions = torch.cat([actions, actions.new_zeros(skip * CLIP, ACTION_DIM)])
    latents, blocks = (
        [latent.new_zeros(0, CLIP, latent.shape[-1])],
        [actions.new_zeros(0, CLIP, skip * ACTION_DIM)],
    )
    for start in range(len(latent) - skip * (CLIP - 1)):
        steps = start + skip * torch.arange(CLIP)
        latents.append(latent[steps][None])
        taken = [actions[step : step + skip].reshape(-1) for step in steps]
        blocks.append(torch.stack(taken)[None])
    return torch.cat(latents), torch.cat(blocks)


def clips(path: Path, episodes, cfg, features: StateFeatures) -> tuple[torch.Tensor, torch.Tensor]:
    """``episode_clips`` of each of ``episodes`` in the dataset at ``path``."""
    reader = open_reader(path)
    found = []
    for index in episodes:
        rows = reader.read_episode(index, keys=["state", "proprio", "action"])
        latent = latents_of(features, rows["state"], rows["proprio"])
        found.append(episode_clips(latent, rows["action"], cfg.data.frameskip))
    return torch.cat([latent for latent, _ in found]), torch.cat([block for _, block in found])


def train(model, latents, blocks, steps: int, console: Console) -> None:
    """AdamW, one cycle; the one-step loss plus the rollout's from each clip's first state."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, 1e-3, steps, pct_start=0.05)
    standardized = (latents - model.mean) / model.std
    for step in range(steps):
        chosen = torch.randint(len(latents), (model.batch,))
        clip, actions = standardized[chosen], blocks[chosen]
        one_step = (model.standardized(clip[:, :-1], actions[:, :-1]) - clip[:, 1:]).pow(2).mean()
        imagined = clip[:, :1]
        for block in range(CLIP - 1):
            start = max(block + 1 - model.context_len, 0)
            context = imagined[:, start:], actions[:, start : block + 1]
            following = model.standardized(*context)[:, -1:]
            imagined = torch.cat([imagined, following], dim=1)
        rollout_loss = (imagined[:, 1:] - clip[:, 1:]).pow(2).mean()
        optimizer.zero_grad()
        (one_step + rollout_loss).backward()
        optimizer.step()
        schedule.step()
        if step % 500 == 0 or step == steps - 1:
            console.print(f"step {step}: one-step {one_step:.5f}, rollout {rollout_loss:.5f}")


def held_out_errors(model, latents, blocks, units: list[float], console: Console) -> None:
    """The mean error of the predicted agent and T (pixels) and the T's angle (degrees), one and
    five blocks on from the held-out clips' first states."""
    with torch.inference_mode():
        imagined = rollout(model, latents[:, :1], blocks[:, :0], blocks[:, : CLIP - 1])
    truth = latents[:, 1:]

    def distance(part: slice) -> torch.Tensor:
        unit = torch.tensor(units[part])
        return ((imagined[..., part] - truth[..., part]) * unit).norm(dim=-1)

    def angle(values: torch.Tensor) -> torch.Tensor:
        return torch.atan2(values[..., 5], values[..., 4])

    turned = (angle(imagined) - angle(truth) + torch.pi) % (2 * torch.pi) - torch.pi
    agent, block = distance(slice(0, 2)), distance(slice(2, 4))
    for ahead in (1, CLIP - 1):
        console.print(
            f"held out, {ahead} block{'s' if ahead > 1 else ''} on: agent "
            f"{agent[:, ahead - 1].mean():.1f} px, T {block[:, ahead - 1].mean():.1f} px, "
            f"angle {turned[:, ahead - 1].abs().mean().rad2deg():.1f} degrees"
        )


def plan_from_state(
    physics, mean, generator, model, features, goal, settings, reader=None
) -> torch.Tensor:
    """CEM's plan from the env's exact current state, with the learned predictor; with a
    ``reader`` (``pusht_reader.PoseReader``), from the T's pose it reads from the frame the env
    draws, the agent's from its proprio."""
    proprio = pusht.proprio(physics)
    if reader is None:
        state = pusht_oracle.state_of(physics).astype(np.float32)
    else:
        state = read_state(reader, pusht.frame(physics), proprio[:2])
    latent = latents_of(features, state, proprio)[None]
    with torch.inference_mode():
        return planners.cem(model, latent, goal, mean, settings, generator)


def planner(model, features, settings, episode, reader=None):
    """``pusht_oracle.play``'s planner toward ``episode``'s goal state (with a ``reader``: the
    T's pose read from the goal image, the agent's the goal's proprio)."""
    if reader is None:
        goal_state = episode.goal_state
    else:
        goal_state = read_state(reader, episode.goal_pixels, episode.goal_proprio[:2])
    goal = latents_of(features, goal_state, np.zeros(4, np.float32))[None]
    return partial(
        plan_from_state, model=model, features=features, goal=goal, settings=settings,
        reader=reader,
    )  # fmt: skip


def planner_clips(model, cfg, features, starts) -> tuple[torch.Tensor, torch.Tensor]:
    """The clips of the model's planner played from each of ``starts`` for the whole budget."""
    settings = planners.planner_settings(cfg.eval, ACTION_DIM)
    found = []
    for episode in starts:
        states, proprios, actions = [], [], []

        def record(physics, action, states=states, proprios=proprios, actions=actions):
            states.append(pusht_oracle.state_of(physics).astype(np.float32))
            proprios.append(pusht.proprio(physics))
            actions.append(action)

        pusht_oracle.play(
            cfg, episode, settings, planner(model, features, settings, episode), record
        )
        latent = latents_of(features, np.stack(states), np.stack(proprios))
        found.append(episode_clips(latent, np.stack(actions), cfg.data.frameskip))
    return torch.cat([latent for latent, _ in found]), torch.cat([block for _, block in found])


def fit(kind: str, cfg, units, data, held, steps: int, console: Console):
    """A fresh predictor of ``kind`` trained on ``data`` (clips and their blocks), standardized
    by their statistics; its errors on the ``held`` out clips printed."""
    latents, blocks = data
    flat = latents.reshape(-1, latents.shape[-1])
    mean, std = flat.mean(0), flat.std(0)
    if kind == "t-frame":
        model = StandardizedTFrame(cfg.data.frameskip, mean, std)
    else:
        model = StateDynamics(cfg, flat.shape[1], blocks.shape[-1], mean, std)
    console.print(f"{len(latents):,} clips of {CLIP} states; {steps:,} steps of {model.batch}")
    train(model, latents, blocks, steps, console)
    model.eval()
    held_out_errors(model, *held, units, console)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--data", type=Path, help="episodes to train on (default: RUN's data)")
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument(
        "--predictor", choices=["transformer", "t-frame"], default="transformer"
    )
    parser.add_argument(
        "--planner-rounds", type=int, default=0, help="rounds of the planner's plays as data"
    )
    parser.add_argument("--planner-episodes", type=int, default=600, help="start rows each round")
    parser.add_argument(
        "--eval-seeds", type=int, nargs="+", help="eval.seed of each set of start rows"
    )
    parser.add_argument(
        "--reader-steps", type=int, default=0,
        help="plan from the T read from the frames by a CNN trained this many steps (0: exact)",
    )  # fmt: skip
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
    features = StateFeatures(5, UNITS, [4])
    data = args.data or cfg.data.path
    training, heldout = heldout_split(open_reader(data).num_episodes, cfg.eval.heldout_episodes)
    latents, blocks = clips(data, training, cfg, features)
    held = clips(data, heldout, cfg, features)
    model = fit(args.predictor, cfg, UNITS, (latents, blocks), held, args.steps, console)
    for round_ in range(1, args.planner_rounds + 1):
        draw = {"episodes": args.planner_episodes, "seed": 5000 + 1000 * round_}
        starts = dataset_episodes(data, cfg.eval.model_copy(update=draw), among=training)
        played = planner_clips(model, cfg, features, starts)
        latents, blocks = torch.cat([latents, played[0]]), torch.cat([blocks, played[1]])
        console.print(f"round {round_}: {len(starts)} plays of the planner")
        model = fit(args.predictor, cfg, UNITS, (latents, blocks), held, args.steps, console)
    reader, source = None, "the recorded states"
    if args.reader_steps:
        reader = train_reader(data, training, heldout, args.reader_steps, console)
        source = "the T read from the frames"
    settings = planners.planner_settings(cfg.eval, ACTION_DIM)
    for seed in args.eval_seeds or [cfg.eval.seed]:
        cfg = load_run_config(args.run, sets=[*sets, f"eval.seed={seed}"])
        episodes = goal_episodes(cfg)
        wins = 0
        for index, episode in enumerate(episodes, 1):
            wins += pusht_oracle.play(
                cfg, episode, settings, planner(model, features, settings, episode, reader)
            )
            console.print(f"{index}/{len(episodes)}: {wins} reached", highlight=False)
        low, high = wilson_interval(wins, len(episodes))
        console.print(
            f"the {args.predictor} predictor on {source}, {settings.cost} cost, "
            f"eval.seed {seed}: {wins}/{len(episodes)} = {wins / len(episodes):.0%} "
            f"[{low:.0%}-{high:.0%}]"
        )


if __name__ == "__main__":
    main()
