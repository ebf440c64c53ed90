"""LeRobot's statistics of a dataset, computed while an export streams: one set per episode as it
is written (``stats/<feature>/<stat>`` columns of ``meta/episodes``), and ``meta/stats.json``
over the whole dataset at the end, as LeRobot v3 (0.4.4's ``compute_stats.py``) lays them out.

Each feature gets ``min``, ``max``, ``mean``, ``std``, ``count`` and the quantiles ``q01``,
``q10``, ``q50``, ``q90``, ``q99``, shaped like the feature (``[1]`` for a scalar). Frames get
one value per channel, shaped ``(3, 1, 1)``, of pixels scaled to [0, 1], over frames sampled as
LeRobot samples them (all of a short episode, about ``T**0.75`` of a long one, every few pixels
of a side of 300 or more). Quantiles are exact (``inverted_cdf``; LeRobot estimates them from
histograms); frames' come from their 256-value histogram. The dataset's stats combine the
episodes' as LeRobot's ``aggregate_stats`` does: min of minima, max of maxima, means weighted by
count, variances by the parallel algorithm, quantiles averaged weighted by count.
"""

import numpy as np

QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
_MIN_SAMPLES, _MAX_SAMPLES, _POWER = 100, 10_000, 0.75  # frames sampled per episode
_LARGE_SIDE, _TARGET_SIDE = 300, 150  # frames with a side this large are read every few pixels


def number_stats(values: np.ndarray, shape: tuple) -> dict[str, np.ndarray]:
    """The stats of one numeric feature over an episode's ``values`` (frames first)."""
    flat = values.reshape(len(values), -1)
    exact = flat.astype(np.float64)
    stats = {
        "min": flat.min(axis=0),
        "max": flat.max(axis=0),
        "mean": exact.mean(axis=0),
        "std": exact.std(axis=0),
    }
    for name, q in QUANTILES.items():
        stats[name] = np.quantile(exact, q, axis=0, method="inverted_cdf")
    shaped = {name: value.reshape(shape or (1,)) for name, value in stats.items()}
    return {**shaped, "count": np.array([len(values)])}


def sampled_frames(frames: np.ndarray) -> np.ndarray:
    """The frames LeRobot's stats look at: evenly spaced over the episode, every few pixels of
    a large frame."""
    length = len(frames)
    wanted = min(length, max(_MIN_SAMPLES, min(int(length**_POWER), _MAX_SAMPLES)))
    picked = frames[np.round(np.linspace(0, length - 1, wanted)).astype(int)]
    height, width = picked.shape[1:3]
    if max(height, width) >= _LARGE_SIDE:
        step = int(max(height, width) / _TARGET_SIDE)
        picked = picked[:, ::step, ::step]
    return picked


def frame_stats(frames: np.ndarray) -> dict[str, np.ndarray]:
    """The stats of one image feature over an episode's uint8 ``frames`` ``(T, H, W, C)``:
    per channel, in [0, 1], shaped ``(C, 1, 1)``."""
    picked = sampled_frames(frames)
    channels = picked.shape[-1]
    histograms = [
        np.bincount(picked[..., c].reshape(-1), minlength=256).astype(np.int64)
        for c in range(channels)
    ]
    levels = np.arange(256, dtype=np.float64)
    stats = {name: np.empty(channels) for name in ("min", "max", "mean", "std", *QUANTILES)}
    for c, counts in enumerate(histograms):
        present = np.flatnonzero(counts)
        total = counts.sum()
        mean = (counts * levels).sum() / total
        stats["min"][c], stats["max"][c] = present[0], present[-1]
        stats["mean"][c] = mean
        stats["std"][c] = np.sqrt((counts * (levels - mean) ** 2).sum() / total)
        cumulative = np.cumsum(counts)
        for name, q in QUANTILES.items():  # inverted_cdf: the first level reaching q of them
            stats[name][c] = np.searchsorted(cumulative, q * total, side="left")
    shaped = {name: (value / 255).reshape(channels, 1, 1) for name, value in stats.items()}
    return {**shaped, "count": np.array([len(picked)])}


def aggregate(episodes: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One feature's stats over the dataset, from its stats per episode."""
    counts = np.array([float(e["count"][0]) for e in episodes])
    total = counts.sum()
    weights = counts.reshape(-1, *[1] * np.ndim(episodes[0]["mean"])) / total
    means = np.stack([e["mean"] for e in episodes])
    mean = (means * weights).sum(axis=0)
    variance = (np.stack([e["std"] for e in episodes]) ** 2 + (means - mean) ** 2) * weights
    stats = {
        "min": np.min(np.stack([e["min"] for e in episodes]), axis=0),
        "max": np.max(np.stack([e["max"] for e in episodes]), axis=0),
        "mean": mean,
        "std": np.sqrt(variance.sum(axis=0)),
        "count": np.array([int(total)]),
    }
    for name in QUANTILES:
        stats[name] = (np.stack([e[name] for e in episodes]) * weights).sum(axis=0)
    return stats


def as_lists(stats: dict[str, dict[str, np.ndarray]]) -> dict:
    """``{feature: {stat: array}}`` as JSON's lists (what ``stats.json`` and the episodes'
    parquet columns hold)."""
    return {
        feature: {name: np.asarray(value).tolist() for name, value in values.items()}
        for feature, values in stats.items()
    }
