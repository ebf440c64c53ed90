"""Reproduces docs/reports/pusht.md, table 'The noisier pushes', its held-out errors.

The held-out errors of a ``pusht-state-64`` run.

    PYTHONPATH=. python experiments/pusht_state_errors.py RUN

Prints, on the run's held-out episodes (the last ``eval.heldout_episodes`` of its data): the mean
error of the T's position (px) and angle (degrees) its reader reads from every frame, then the
agent's and the T's errors its predictor makes one and five blocks on from each clip's recorded
first state (as ``pusht_state_dynamics.py`` prints them for its predictors).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from pusht_reader import frames_and_states, pose_errors
from pusht_state_dynamics import UNITS, episode_clips, held_out_errors
from rich.console import Console

from swmcli.commands.evaluate import load_model
from swmcli.config import resolve_config
from swmcli.data.formats import open_reader
from swmcli.models.runner import make_runner
from swmcli.zoo.pusht_state import state_latent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    args = parser.parse_args()
    cfg = resolve_config(config_file=args.run / "config.json")
    model, _ = load_model(args.run, cfg, make_runner())
    console = Console(width=120)
    reader = open_reader(cfg.data.path)
    total = reader.num_episodes
    held = range(total - cfg.eval.heldout_episodes, total)
    pixels, states = frames_and_states(cfg.data.path, held)
    position, angle = pose_errors(model.reader, pixels, states)
    console.print(f"the reader, held-out frames: T {position:.1f} px, angle {angle:.1f} degrees")
    found = []
    for index in held:
        rows = reader.read_episode(index, keys=["state", "proprio", "action"])
        latent = state_latent(torch.as_tensor(rows["state"]), torch.as_tensor(rows["proprio"]))
        found.append(episode_clips(latent, rows["action"], cfg.data.frameskip))
    reader.close()
    latents, blocks = torch.cat([one[0] for one in found]), torch.cat([one[1] for one in found])
    held_out_errors(model, latents, blocks, UNITS, console)


if __name__ == "__main__":
    main()
