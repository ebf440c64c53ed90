"""Push-T data with noisier pushes, the same held-out episodes last (docs/bring-your-env.md,
"A new predictor on the decoder's frozen latent").

    PYTHONPATH=. python benchmarks/pusht_noisy_data.py SOURCE OUT [--episodes 300]

Collects ``--episodes`` episodes of swm's Push-T pusher at 3x and at 6x its target noise (33 and
67 px; DINO-WM's Push-T data replays expert paths at several noise levels) with `swm collect
--preset pusht-64`, then writes OUT: SOURCE's training episodes, the noisy ones, then SOURCE's
held-out episodes (``eval.heldout_episodes`` of the preset), so `swm eval` on a run trained on
OUT plays the very start rows and goals of runs trained on SOURCE. Needs gym-pusht.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from swmcli.config import resolve_config
from swmcli.data.formats import open_reader, open_writer
from swmcli.envs.pusht import pusher

LEVELS = {"noise_3x": (1.0, 1000), "noise_6x": (2.0, 2000)}  # pusher noise (0.3 = 1x), seed


def noise_3x(env, seed: int):
    return pusher(env, seed, noise=LEVELS["noise_3x"][0])


def noise_6x(env, seed: int):
    return pusher(env, seed, noise=LEVELS["noise_6x"][0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="the pusht-64 preset's dataset")
    parser.add_argument("out", type=Path, help="the mixed dataset to write (must not exist)")
    parser.add_argument("--episodes", type=int, default=300, help="episodes per noise level")
    parser.add_argument("--heldout", type=int, default=None, help="default: the preset's")
    args = parser.parse_args()
    held = args.heldout or resolve_config("pusht-64").eval.heldout_episodes
    source = open_reader(args.source)
    meta = source.metadata  # the noisy episodes are drawn as SOURCE's were
    size, steps = meta["resolution"], meta["max_episode_steps"]
    like_source = ["--resolution", str(size), "--set", f"env.max_episode_steps={steps}",
                   "--set", f"env.kwargs.observation_width={size}",
                   "--set", f"env.kwargs.observation_height={size}"]  # fmt: skip
    here = os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
    with tempfile.TemporaryDirectory(dir=args.out.parent) as scratch:
        noisy_path = Path(scratch) / "noisy.lance"
        for factory, (_, seed) in LEVELS.items():
            command = [sys.executable, "-m", "swmcli", "collect", "--preset", "pusht-64",
                       "--policy", f"pusht_noisy_data:{factory}", "--episodes", str(args.episodes),
                       "--set", "collect.random_episodes=0", "--seed", str(seed),
                       "--workers", "2", "--out", str(noisy_path), *like_source]  # fmt: skip
            subprocess.run(command, check=True, env={**os.environ, "PYTHONPATH": here})
        noisy = open_reader(noisy_path)
        total = source.num_episodes
        order = [(source, index) for index in range(total - held)]
        order += [(noisy, index) for index in range(noisy.num_episodes)]
        order += [(source, index) for index in range(total - held, total)]
        with open_writer(args.out, mode="error", metadata=source.metadata) as writer:
            for reader, index in order:
                writer.write_episode(reader.read_episode(index))
    print(f"{args.out}: {total - held} + {noisy.num_episodes} noisy + {held} held out episodes")


if __name__ == "__main__":
    main()
