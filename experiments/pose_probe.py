"""Reproduces docs/reports/pusht.md, table 'What limits it', row 'what the latent holds'.

How plainly does a Push-T run's latent hold the block? Probes of the recorded state.

    PYTHONPATH=. python experiments/pose_probe.py RUN [RUN ...] [--every 4]

Encodes every ``--every``-th frame of the run's dataset with the run's encoder (the image part
of the latent only: the agent's state, where the model takes it, left out) and reads the
recorded state back from it two ways, fitted on the training episodes and scored on the held-out
ones (the last ``eval.heldout_episodes``, the ones the planner is evaluated on):

- ``linear``: a ridge regression from the latent;
- ``nearest``: the mean state of the 5 training frames nearest in the latent (Euclidean), what
  the planner's cost, a squared distance in this latent, can tell apart.

Prints, per run, the held-out error of the agent's and the block's position (RMS, arena pixels,
512 across) and of the block's angle (median, degrees), beside the error of always guessing the
mean. Needs a run trained on gym-pusht (its data records ``state``: agent x, y, block x, y,
angle).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from swmcli.commands.evaluate import load_model
from swmcli.config import load_run_config
from swmcli.data.clips import heldout_split
from swmcli.data.formats import open_reader
from swmcli.models.rollout import encode_observation
from swmcli.models.runner import make_runner

NEIGHBOURS = 5
RIDGE = 1e-3  # relative to the mean eigenvalue of the latents' Gram matrix
CHUNK = 512  # frames encoded at once


def probe(run: Path, every: int, sets: list[str], frames: bool = False) -> dict[str, tuple]:
    """Held-out (linear, nearest, mean-guess) errors per target: RMS in arena pixels for the
    agent's and the block's position, median absolute error in degrees for the block's angle.
    With ``frames``, read from the run's frames themselves (pooled to half size), not its
    latents: what there is to hold."""
    cfg = load_run_config(run, sets=sets)
    runner = make_runner()
    model, _ = load_model(run, cfg, runner)
    keys = ["pixels", "proprio"] if cfg.model.proprio else ["pixels"]
    reader = open_reader(cfg.data.path)
    training, heldout = heldout_split(reader.num_episodes, cfg.eval.heldout_episodes)
    read = _pooled if frames else _image_latent
    parts = {}
    with runner.inference(model):
        for name, episodes in (("fit", training), ("test", heldout)):
            features, states = [], []
            for index in episodes:
                rows = reader.read_episode(index, keys=[*keys, "state"])
                picked = {key: rows[key][::every] for key in [*keys, "state"]}
                for start in range(0, len(picked["state"]), CHUNK):
                    chunk = {key: picked[key][start : start + CHUNK] for key in keys}
                    features.append(read(model, runner.to_device(chunk)).float().cpu().numpy())
                states.append(picked["state"])
            parts[name] = (np.concatenate(features), _targets(np.concatenate(states)))
    features, truth = parts["test"]
    guesses = (
        _with_bias(features) @ _ridge(*parts["fit"]),
        _nearest(*parts["fit"], features),
        np.broadcast_to(parts["fit"][1].mean(0), truth.shape),
    )
    return {
        "agent position": tuple(_position_error(guess, truth, 0) for guess in guesses),
        "T position": tuple(_position_error(guess, truth, 2) for guess in guesses),
        "T angle": tuple(_angle_error(guess, truth) for guess in guesses),
    }


def _image_latent(model, chunk: dict[str, torch.Tensor]) -> torch.Tensor:
    """The image part of the latents (the agent's state, where the model takes it, left out)."""
    latent = encode_observation(model, chunk)
    return latent[..., : latent.shape[-1] - getattr(model, "proprio_dims", 0)]


def _pooled(model, chunk: dict[str, torch.Tensor]) -> torch.Tensor:
    """The frames in [0, 1], average-pooled to half their side and flattened."""
    frames = chunk["pixels"].permute(0, 3, 1, 2).float() / 255.0
    return torch.nn.functional.avg_pool2d(frames, 2).flatten(1)


def _nearest(latents: np.ndarray, targets: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """The mean target of each query's ``NEIGHBOURS`` nearest latents."""
    distances = torch.cdist(torch.as_tensor(queries), torch.as_tensor(latents))
    nearest = distances.topk(NEIGHBOURS, largest=False).indices.numpy()
    return targets[nearest].mean(1)


def _targets(state: np.ndarray) -> np.ndarray:
    """agent x, y, block x, y, and the angle as (cos, sin) scaled to the arena (so one ridge
    weighs it like the positions)."""
    angle = state[:, 4:5].astype(np.float64)
    return np.hstack([state[:, :4], 100.0 * np.cos(angle), 100.0 * np.sin(angle)])


def _with_bias(latents: np.ndarray) -> np.ndarray:
    return np.hstack([latents.astype(np.float64), np.ones((len(latents), 1))])


def _ridge(latents: np.ndarray, targets: np.ndarray) -> np.ndarray:
    inputs = _with_bias(latents)
    gram = inputs.T @ inputs
    penalty = RIDGE * np.trace(gram) / len(gram)
    return np.linalg.solve(gram + penalty * np.eye(len(gram)), inputs.T @ targets)


def _position_error(guessed: np.ndarray, truth: np.ndarray, first: int) -> float:
    miss = guessed[:, first : first + 2] - truth[:, first : first + 2]
    return float(np.sqrt((miss**2).sum(1).mean()))


def _angle_error(guessed: np.ndarray, truth: np.ndarray) -> float:
    turned = np.arctan2(guessed[:, 5], guessed[:, 4]) - np.arctan2(truth[:, 5], truth[:, 4])
    return float(np.degrees(np.median(np.abs(np.angle(np.exp(1j * turned))))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--every", type=int, default=4, help="probe every N-th frame")
    parser.add_argument(
        "--frames", action="store_true", help="add a row read from the first run's frames"
    )
    parser.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE")
    args = parser.parse_args()
    torch.set_num_threads(1)
    table = Table(title="held-out probes: linear / nearest / always the mean")
    table.add_column("run")
    for target in ("agent position (px)", "T position (px)", "T angle (deg)"):
        table.add_column(target, justify="right")
    rows = [(str(run), probe(run, args.every, args.sets)) for run in args.runs]
    if args.frames:
        rows.append(("the frames (half size)", probe(args.runs[0], args.every, args.sets, True)))
    for name, errors in rows:
        table.add_row(name, *(" / ".join(f"{e:.0f}" for e in three) for three in errors.values()))
    Console().print(table)


if __name__ == "__main__":
    main()
