"""Deterministic synthetic episodes, the same bytes for every loader a benchmark compares.

Pure numpy, no project imports: ``benchmarks/upstream_loader_bench.py`` writes these episodes
with stable-worldmodel's writer in its own venv, and ``benchmarks/loader.py``,
``benchmarks/import_speed.py`` and ``benchmarks/object_store.py`` write them with swm's, so both
sides read the very same episodes.

Each frame is a smooth image that compresses like a simple rendered scene (not like TwoRoom's flat
colours): a per-episode two-colour gradient background, a darker static wall with a door, and a
coloured square that moves with the episode's actions, bouncing off the borders. Everything is a
function of ``seed`` alone.

Episode layout (rows are observations, as stable-worldmodel's ``World.collect`` and swm store
them):

- ``pixels``     (L, res, res, 3) uint8
- ``action``     (L, 2) float32 in [-1, 1], ``action[t]`` is the move taken at observation ``t``;
                 the last row is NaN (no action after the final observation)
- ``reward``     (L,) float32, minus the normalised distance to a goal point
- ``terminated`` (L,) bool, all False
- ``truncated``  (L,) bool, True on the last row only (time limit)

    from synth import make_episode
    episode = make_episode(3)                  # 100 steps at 224x224
    episode = make_episode(3, length=50, res=64)
"""

from __future__ import annotations

import numpy as np

__all__ = ["episode_nbytes", "make_episode"]


def _background(rng: np.random.Generator, res: int) -> np.ndarray:
    """Diagonal two-colour gradient plus a wall band with a door: (res, res, 3) uint8."""
    c0 = rng.uniform(20, 120, size=3)
    c1 = rng.uniform(120, 235, size=3)
    theta = rng.uniform(0, 2 * np.pi)
    yy, xx = np.mgrid[0:res, 0:res].astype(np.float32) / max(res - 1, 1)
    t = 0.5 + 0.5 * (np.cos(theta) * (xx - 0.5) + np.sin(theta) * (yy - 0.5)) * 1.4
    t = np.clip(t, 0.0, 1.0)[..., None]
    bg = (1.0 - t) * c0 + t * c1
    # vertical wall in the middle with a door (TwoRoom-like), darker shade
    w0, w1 = int(res * 0.48), int(res * 0.52) + 1
    d0 = int(res * rng.uniform(0.25, 0.6))
    d1 = d0 + max(2, int(res * 0.18))
    wall = np.ones(res, bool)
    wall[d0:d1] = False
    bg[wall, w0:w1] *= 0.35
    return np.clip(bg, 0, 255).astype(np.uint8)


def make_episode(seed: int, length: int = 100, res: int = 224) -> dict:
    """Return one deterministic synthetic episode as a dict of numpy arrays.

    Args:
        seed: any non-negative int; the same seed always gives the same bytes.
        length: number of observations (rows), >= 1.
        res: square frame side in pixels, >= 8.

    Returns:
        dict with keys ``pixels`` (L, res, res, 3) uint8, ``action`` (L, 2)
        float32 with a NaN last row, ``reward`` (L,) float32, ``terminated``
        and ``truncated`` (L,) bool.
    """
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    if res < 8:
        raise ValueError(f"res must be >= 8, got {res}")
    rng = np.random.default_rng(int(seed))
    bg = _background(rng, res)
    color = rng.integers(0, 256, size=3).astype(np.uint8)
    side = max(2, res // 10)
    speed = 0.035 * res  # pixels per step at |action| == 1
    lo, hi = 0.0, float(res - side)

    # smooth random actions: low-pass filtered noise in [-1, 1]
    noise = rng.standard_normal((length, 2)).astype(np.float32)
    act = np.empty((length, 2), np.float32)
    a = rng.uniform(-1, 1, size=2).astype(np.float32)
    for t in range(length):
        a = 0.85 * a + 0.35 * noise[t]
        act[t] = np.clip(a, -1.0, 1.0)

    # positions: pos[t+1] = pos[t] + speed * act[t], reflected at the borders
    pos = np.empty((length, 2), np.float64)
    p = rng.uniform(lo, hi, size=2)
    for t in range(length):
        pos[t] = p
        p = p + speed * act[t]
        for d in range(2):
            if p[d] < lo:
                p[d] = 2 * lo - p[d]
            elif p[d] > hi:
                p[d] = 2 * hi - p[d]
            p[d] = min(max(p[d], lo), hi)
    act[-1] = np.nan

    pixels = np.broadcast_to(bg, (length, res, res, 3)).copy()
    ipos = np.rint(pos).astype(np.int64)
    for t in range(length):
        y, x = ipos[t]
        pixels[t, y : y + side, x : x + side] = color
        # 1-px darker outline so edges are not trivially flat
        pixels[t, y, x : x + side] //= 2
        pixels[t, y + side - 1, x : x + side] //= 2

    goal = rng.uniform(lo, hi, size=2)
    dist = np.linalg.norm(pos - goal, axis=1) / (np.sqrt(2.0) * max(hi, 1.0))
    reward = (-dist).astype(np.float32)
    terminated = np.zeros(length, bool)
    truncated = np.zeros(length, bool)
    truncated[-1] = True
    return {
        "pixels": pixels,
        "action": act,
        "reward": reward,
        "terminated": terminated,
        "truncated": truncated,
    }


def episode_nbytes(length: int = 100, res: int = 224) -> int:
    """Raw bytes of one episode from :func:`make_episode` (uint8 pixels, f32, bools)."""
    return length * (res * res * 3 + 2 * 4 + 4 + 1 + 1)
