"""Pictures of `swm eval` episodes that a person reads without the README.

- The strip (matplotlib, PNG): one row per recorded episode: the goal, then frames from start to
  end, each titled with its env step; the row says whether the goal was reached and in how many
  steps.
- The GIF (PIL): every frame of the recorded episodes, the current frame and the goal side by
  side, enlarged to at least ``GIF_PANEL`` pixels, under a label line (episode, env step, and at
  the end success or failure).

``recorded`` is a list of ``(frames, goal image, success)`` with uint8 ``(H, W, 3)`` images.
"""

from pathlib import Path

import numpy as np

STRIP_FRAMES = 8
GIF_PANEL = 256  # minimum side of each GIF panel in pixels
GIF_LABEL = 22  # label band height in pixels
GIF_FRAME_MS = 100
GIF_HOLD_MS = 1200  # the last frame of an episode stays this long


def outcome(frames: list, success: bool) -> str:
    """``reached the goal in N env steps`` or ``did not reach the goal in N env steps``."""
    steps = len(frames) - 1
    return f"reached the goal in {steps} env steps" if success else f"failed after {steps} steps"


def save_strip(recorded, path: Path, planner: str) -> Path:
    """Goal then frames (with their env step), one labelled row per episode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = STRIP_FRAMES + 1
    figure, axes = plt.subplots(
        len(recorded),
        columns,
        figsize=(1.3 * columns, 1.6 * len(recorded) + 0.4),
        squeeze=False,
        gridspec_kw={"wspace": 0.08, "hspace": 0.45},
    )
    for row, (frames, goal, success) in enumerate(recorded):
        picks = np.unique(np.linspace(0, len(frames) - 1, STRIP_FRAMES).round().astype(int))
        panels = [(goal, "goal")] + [(frames[i], _step_title(i, len(frames))) for i in picks]
        for column, axis in enumerate(axes[row]):
            axis.set_xticks([])
            axis.set_yticks([])
            if column >= len(panels):
                axis.axis("off")
                continue
            image, title = panels[column]
            axis.imshow(image, interpolation="nearest")
            axis.set_title(title, fontsize=8)
        colour = "tab:green" if success else "tab:red"
        axes[row][0].set_ylabel(f"episode {row + 1}", fontsize=8)
        axes[row][1].text(
            0.0, -0.18, outcome(frames, success), transform=axes[row][1].transAxes,
            fontsize=8, color=colour, va="top",
        )  # fmt: skip
    figure.suptitle(f"{planner} episodes: the goal, then the agent's frames", fontsize=9)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(figure)
    return path


def _step_title(index: int, count: int) -> str:
    if index == 0:
        return "start (step 0)"
    return f"end (step {index})" if index == count - 1 else f"step {index}"


def save_gif(recorded, path: Path) -> Path:
    """Current frame | goal, enlarged and labelled, for every frame of every recorded episode."""
    from PIL import Image

    images, durations = [], []
    for number, (frames, goal, success) in enumerate(recorded, start=1):
        for step, frame in enumerate(frames):
            last = step == len(frames) - 1
            label = f"episode {number}  step {step}"
            if last:
                label += "  " + ("SUCCESS" if success else "FAILURE")
            images.append(Image.fromarray(_labelled_pair(frame, goal, label)))
            durations.append(GIF_HOLD_MS if last else GIF_FRAME_MS)
    images[0].save(path, save_all=True, append_images=images[1:], duration=durations, loop=0)
    return path


def _labelled_pair(frame: np.ndarray, goal: np.ndarray, label: str) -> np.ndarray:
    from PIL import Image, ImageDraw

    scale = max(1, -(-GIF_PANEL // frame.shape[0]))
    big = [image.repeat(scale, axis=0).repeat(scale, axis=1) for image in (frame, goal)]
    gap = np.full((big[0].shape[0], 6, 3), 255, np.uint8)
    pair = np.concatenate([big[0], gap, big[1]], axis=1)
    canvas = Image.new("RGB", (pair.shape[1], pair.shape[0] + GIF_LABEL), "white")
    canvas.paste(Image.fromarray(pair), (0, GIF_LABEL))
    draw = ImageDraw.Draw(canvas)
    draw.text((4, 5), f"now: {label}", fill="black")
    draw.text((big[0].shape[1] + 10, 5), "goal", fill="black")
    return np.asarray(canvas)
