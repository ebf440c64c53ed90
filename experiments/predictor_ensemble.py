"""Reproduces docs/reports/pusht.md, table 'What limits it', row 'an ensemble of predictors'.

Several predictors on one frozen encoder, planned as one model.

    PYTHONPATH=. python experiments/predictor_ensemble.py OUT RUN RUN [RUN ...]
    swm eval OUT

The RUNs share one encoder (trained with ``swm train --init-from RUN0 --freeze encoder`` from
the same run, so their latents are the same numbers); OUT is a run directory whose model
(``--model`` protocol, this file's ``build``) encodes a frame once per member and lays the
members' latents side by side, the agent-state parts last, so ``swm eval``'s planner, unchanged,
sums each member's squared distance to the goal: K times the distance of the members' mean
prediction plus their variance. A plan the members disagree on costs more: the search is
steered away from where the predictors are unsure (PETS's reason for an ensemble). OUT takes
the first RUN's config (data, env, eval settings) and step.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
from torch import nn

from swmcli.config import config_text, load_run_config, with_settings
from swmcli.models.interface import build_model as build_member
from swmcli.training.checkpoints import load_checkpoint, save_checkpoint


class PredictorEnsemble(nn.Module):
    """Members' latents side by side: ``[pixels_1 .. pixels_K, state_1 .. state_K]``."""

    def __init__(self, members: list[nn.Module]):
        super().__init__()
        self.members = nn.ModuleList(members)
        self.state_dims = getattr(members[0], "proprio_dims", 0)
        self.proprio_dims = self.state_dims * len(members)  # the planner weights this tail
        self.context_len = min(member.context_len for member in members)

    def encode(self, pixels: torch.Tensor, proprio: torch.Tensor | None = None) -> torch.Tensor:
        if self.state_dims:
            return self._join([member.encode(pixels, proprio) for member in self.members])
        return self._join([member.encode(pixels) for member in self.members])

    def predict(self, latents: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        parts = zip(self.members, self._split(latents), strict=True)
        return self._join([member.predict(latent, actions) for member, latent in parts])

    def _join(self, latents: list[torch.Tensor]) -> torch.Tensor:
        cut = latents[0].shape[-1] - self.state_dims
        return torch.cat([z[..., :cut] for z in latents] + [z[..., cut:] for z in latents], -1)

    def _split(self, joined: torch.Tensor) -> list[torch.Tensor]:
        count, state = len(self.members), self.state_dims
        cut = joined.shape[-1] - state * count
        pixels, states = joined[..., :cut], joined[..., cut:]
        width = pixels.shape[-1] // count
        own_pixels = pixels.split(width, dim=-1)
        own_states = states.split(state, dim=-1) if state else [states[..., :0]] * count
        return [torch.cat(parts, -1) for parts in zip(own_pixels, own_states, strict=True)]


def build(resolution, action_dim, frameskip, history_len, proprio_dim=0, runs=()):
    """The ``--model`` factory: the members, each with its run's trained weights."""
    members = []
    for run in runs:
        state = load_checkpoint(Path(run))
        member = build_member(load_run_config(run).model, state["model_args"])
        member.load_state_dict(state["model"])
        members.append(member)
    return PredictorEnsemble(members)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the ensemble's run directory (new)")
    parser.add_argument("runs", type=Path, nargs="+", help="runs sharing one frozen encoder")
    args = parser.parse_args()
    runs = [str(run.resolve()) for run in args.runs]
    first = load_checkpoint(Path(runs[0]))
    factory = {"model.factory": f"{Path(__file__).resolve()}:build", "model.kwargs": {"runs": runs}}
    cfg = with_settings(load_run_config(runs[0]), {**factory, "train.out": args.out})
    model = build(**first["model_args"], runs=runs)
    args.out.mkdir(parents=True)
    if (fingerprint := Path(runs[0]) / "data.json").is_file():  # the data it was trained on
        shutil.copy(fingerprint, args.out / fingerprint.name)
    text = config_text(cfg, own_loss=False)
    save_checkpoint(args.out, model=model.state_dict(), optimizer=None, step=first["step"],
                    model_args=first["model_args"], config_text=text)  # fmt: skip
    print(f"{args.out}: {len(runs)} predictors on one encoder; swm eval {args.out}")


if __name__ == "__main__":
    main()
