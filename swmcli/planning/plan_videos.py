"""``swm eval --video``: each planned episode as a video, written as soon as it has been played.

Each frame shows the env's frame at that step beside the goal and, for a model that can draw
its latents back into frames (swm's model trained with ``model.reconstruction_weight``), the
frame the planner predicted for that step, decoded. Under them, the latent distance to the goal:
the observed frame's at each replanning (black) and what the current plan predicts for the
blocks ahead (blue). The last frame is held a second, framed green on success and red on
failure.

A ``PlanRecorder`` is the planner's hook (``episodes.planner_actor``'s ``on_plan``): after each
replanning it rolls the chosen plan out once more from the latent it was planned from, to keep
the predicted distances (and frames) for the video.
"""

from pathlib import Path

import numpy as np

from swmcli.data.videos import (
    BLACK,
    BLUE,
    GREEN,
    RED,
    WHITE,
    VideoWriter,
    plot_strip,
    side_by_side,
    stacked,
    text_strip,
)
from swmcli.models.rollout import rollout
from swmcli.models.world_model import PIXEL_MEAN, PIXEL_STD, WorldModel

FPS = 10
HOLD_SECONDS = 1  # the last frame stays this long


class PlanRecorder:
    """What the planner saw and predicted during one episode: at each replanning, the env step,
    the observed latent distance to the goal, the predicted distances after each planned block
    and, where the model decodes, the predicted frames."""

    def __init__(self, model, frameskip: int):
        self.model, self.frameskip = model, frameskip
        self.step = 0  # the env step of the next replanning
        self.plans: list[tuple[int, float, np.ndarray, np.ndarray | None]] = []

    def __call__(self, planner, env_steps: int) -> None:
        """After ``planner`` chose its plan (``planner.planned_from``, ``planner.plan``) at this
        step; ``env_steps`` of it run before the next replanning."""
        latent, plan, goal = planner.planned_from, planner.plan, planner.goal
        history, no_past = latent.reshape(1, 1, -1), plan.new_zeros(1, 0, plan.shape[-1])
        predicted = rollout(self.model, history, no_past, plan[None], planner.state)
        distances = (predicted[0].float() - goal.float().reshape(1, -1)).pow(2).sum(-1)
        observed = float((latent.float() - goal.float()).pow(2).sum())
        frames = _decoded(self.model, predicted[0])
        self.plans.append((self.step, observed, distances.cpu().numpy(), frames))
        self.step += env_steps

    def predicted_frame(self, step: int) -> np.ndarray | None:
        """The frame the latest plan made at or before ``step`` predicted for it (the end of the
        block running at ``step``); None when the model does not decode."""
        made = [entry for entry in self.plans if entry[0] <= step]
        if not made or made[-1][3] is None:
            return None
        start, _, _, frames = made[-1]
        block = max(1, -(-(step - start) // self.frameskip))
        return frames[min(block, len(frames)) - 1]

    def series(self, step: int) -> list[tuple[np.ndarray, np.ndarray, tuple]]:
        """The distance plot at ``step``: observed distances so far, the current plan's."""
        made = [entry for entry in self.plans if entry[0] <= step]
        if not made:
            return []
        observed_x = np.array([entry[0] for entry in made], dtype=float)
        observed_y = np.array([entry[1] for entry in made])
        start, now, distances, _ = made[-1]
        ahead_x = start + self.frameskip * np.arange(len(distances) + 1, dtype=float)
        ahead_y = np.concatenate([[now], distances])
        return [(ahead_x, ahead_y, BLUE), (observed_x, observed_y, BLACK)]

    @property
    def last_predicted_step(self) -> int:
        """The furthest env step any plan predicted."""
        return max((s + self.frameskip * len(d) for s, _, d, _ in self.plans), default=0)


def _decoded(model, latents) -> np.ndarray | None:
    """Latents ``(H, D)`` drawn back as uint8 frames ``(H, h, w, 3)`` by swm's decoder; None
    for a model without one."""
    decoder = getattr(model, "decoder", None) if isinstance(model, WorldModel) else None
    if decoder is None:  # a model of the user's own: its decoder's interface is its own
        return None
    drawn = decoder(latents).float() * PIXEL_STD + PIXEL_MEAN
    return (drawn.clamp(0, 1) * 255).round().byte().permute(0, 2, 3, 1).cpu().numpy()


class EpisodeVideos:
    """Planned episodes written as MP4s into ``directory``, ``episode_N.mp4``."""

    def __init__(self, directory: Path, model, frameskip: int):
        self.directory, self.model, self.frameskip = Path(directory), model, frameskip
        self.written: list[str] = []

    def recorder(self) -> PlanRecorder:
        """A new episode's planner hook."""
        return PlanRecorder(self.model, self.frameskip)

    def write(self, number: int, frames: list, goal: np.ndarray, success: bool,
              recorder: PlanRecorder) -> Path:  # fmt: skip
        """The video of episode ``number`` (from 1): its ``frames``, the ``goal`` image, what
        ``recorder`` kept, ``success`` marked at the end."""
        last = len(frames) - 1
        span = max(last, recorder.last_predicted_step)
        path = self.directory / f"episode_{number}.mp4"
        with VideoWriter(path, FPS) as video:
            for step, frame in enumerate(frames):
                picture = self._picture(number, step, frame, goal, success, recorder, span, last)
                for _ in range(FPS * HOLD_SECONDS if step == last else 1):
                    video.write(picture)
        self.written.append(str(path))
        return path

    def _picture(self, number, step, frame, goal, success, recorder, span, last) -> np.ndarray:
        panels = [(f"env, step {step}", frame), ("goal", goal)]
        predicted = recorder.predicted_frame(step)
        if predicted is not None:
            panels.append(("predicted (decoded)", predicted))
        ended = step == last
        # every frame framed (white until the end), so that the last one keeps their size
        row = side_by_side(panels, border=(GREEN if success else RED) if ended else WHITE)
        width = row.shape[1]
        plot = plot_strip(width, recorder.series(step), step, span, "latent distance to goal")
        verdict = f"SUCCESS: goal reached in {last} steps" if success else "FAILURE"
        lines = [
            ("black: seen   blue: planned", BLACK),  # the plot's legend, short: two panels wide
            (f"episode {number}   env step {step} / {last}", BLACK),
            (verdict if ended else "", GREEN if success else RED),  # the frame keeps its size
        ]
        return stacked(row, plot, text_strip(width, lines))
