"""LeRobot trains on swm's export: a dataset collected by swm, ``swm convert --layout lerobot``,
then LeRobot's own ``LeRobotDataset`` + DataLoader and ``lerobot-train`` (ACT and diffusion, a
few steps) on it, in a venv of LeRobot's own (it pulls its own torch, so it never goes in swm's).

    python tests/lerobot_train.py --venv /tmp/swm-lerobot-venv --work /tmp/swm-lerobot

Makes the venv when it has no ``lerobot-train`` (``pip install torch==2.9.1 torchvision==0.24.1
lerobot==0.4.4``: lerobot 0.4.4 takes torch < 2.11; then swm from this checkout, ``-e .[video]``),
and runs every step with that venv's interpreters: ``swm collect`` (swm/TwoRoom-v0, expert),
``swm convert --layout lerobot``, a reader check (every batch of a DataLoader over every frame:
NaN counted in every float tensor; ``action_is_pad`` past an episode's end; ``stats.json``
loaded), and ``lerobot-train --policy.type=act|diffusion --steps N`` on the CPU: ACT with frames
normalized by ImageNet's stats (LeRobot's default) and by the export's own ``stats.json``, and
diffusion (ACT without its ImageNet backbone weights: nothing is downloaded here). Prints each
step's loss and one JSON summary line; exits non-zero when a step fails or a loss is not finite.
"""

import argparse
import json
import math
import os
import re
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("torch==2.9.1", "torchvision==0.24.1", "lerobot==0.4.4")
READER_CHECK = """
import json, sys
import torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset

root, fps = sys.argv[1], 10
dataset = LeRobotDataset("swm/tworoom", root=root, video_backend="pyav",
                         delta_timestamps={"action": [i / fps for i in range(4)]})
batches = with_nan = 0
for batch in torch.utils.data.DataLoader(dataset, batch_size=8):
    batches += 1
    with_nan += any(torch.isnan(v).any().item() for v in batch.values()
                    if torch.is_tensor(v) and v.is_floating_point())
last = dataset[dataset.meta.episodes[0]["dataset_to_index"] - 1]  # episode 0's last frame
print(json.dumps({
    "frames": len(dataset), "episodes": dataset.meta.total_episodes, "batches": batches,
    "batches_with_nan": with_nan, "last_frame_action_is_pad": last["action_is_pad"].tolist(),
    "stats_features": sorted(dataset.meta.stats), "task": last["task"],
}))
"""


def run(command: list[str], **kwargs) -> tuple[str, str]:
    """``command``'s stdout and stderr; a failure stops here, showing their end."""
    print("$", " ".join(map(str, command)), flush=True)
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}")
    return done.stdout, done.stderr


def last_json(command: list[str], **kwargs) -> dict:
    """The JSON object ``command`` prints last on stdout."""
    return json.loads(run(command, **kwargs)[0].strip().splitlines()[-1])


def make_venv(path: Path) -> None:
    if (path / "bin" / "lerobot-train").exists():
        return
    venv.create(path, with_pip=True)
    pip = [str(path / "bin" / "pip"), "install", "-q"]
    run([*pip, *PACKAGES])
    run([*pip, "-e", f"{ROOT}[video]"])


RUNS = {  # name: lerobot-train's flags beyond the common ones
    "act": ["--policy.type=act", "--policy.pretrained_backbone_weights=null"],  # no download
    "act, swm's image stats": [  # frames normalized by the export's stats.json, not ImageNet's
        "--policy.type=act", "--policy.pretrained_backbone_weights=null",
        "--dataset.use_imagenet_stats=false",
    ],
    "diffusion": ["--policy.type=diffusion"],
}  # fmt: skip


def train(venv_bin: Path, data: Path, out: Path, run_name: str, args) -> list[float]:
    """``lerobot-train`` for ``args.steps`` steps; the loss it logs at each."""
    command = [
        str(venv_bin / "lerobot-train"), *RUNS[run_name], "--policy.device=cpu",
        "--policy.push_to_hub=false", "--dataset.repo_id=swm/tworoom", f"--dataset.root={data}",
        "--dataset.video_backend=pyav", f"--output_dir={out}", f"--steps={args.steps}",
        f"--batch_size={args.batch_size}", "--log_freq=1", "--save_checkpoint=false",
        "--eval_freq=0", "--num_workers=0", "--wandb.enable=false",
    ]  # fmt: skip
    output = "".join(run(command, env={**os.environ, "HF_HUB_OFFLINE": "1"}))
    losses = [float(x) for x in re.findall(r"\bloss:([-+0-9.eE]+|nan|inf)", output)]
    print(f"{run_name}: losses {losses}")
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=Path("/tmp/swm-lerobot-venv"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/swm-lerobot"))
    parser.add_argument("--episodes", type=int, default=6)
    parser.add_argument("--resolution", type=int, default=96)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    make_venv(args.venv)
    bin_ = args.venv / "bin"
    args.work.mkdir(parents=True, exist_ok=True)
    collected, exported = args.work / "tworoom.lance", args.work / "tworoom-lerobot"
    runs = {name: args.work / f"run-{index}" for index, name in enumerate(RUNS)}
    for old in (collected, exported, *runs.values()):
        if old.exists():
            run(["rm", "-r", str(old)])
    swm = str(bin_ / "swm")
    run([swm, "collect", "--env", "swm/TwoRoom-v0", "--episodes", str(args.episodes),
         "--resolution", str(args.resolution), "--out", str(collected)])  # fmt: skip
    exported_by = last_json([swm, "convert", collected, exported, "--layout", "lerobot", "--json"])
    print("swm convert:", exported_by["convention"])
    offline = {**os.environ, "HF_HUB_OFFLINE": "1"}
    reader = last_json([str(bin_ / "python"), "-c", READER_CHECK, str(exported)], env=offline)
    print("LeRobotDataset:", reader)
    losses = {name: train(bin_, exported, out, name, args) for name, out in runs.items()}
    versions = run([str(bin_ / "python"), "-c", "import lerobot, torch; "
                    "print(lerobot.__version__, torch.__version__)"])[0].split()  # fmt: skip
    summary = {
        "lerobot": versions[0], "torch": versions[1], "steps": args.steps,
        "collected_steps": exported_by["steps"], "reader": reader, "losses": losses,
    }  # fmt: skip
    print(json.dumps(summary))
    finite = all(losses[p] and all(math.isfinite(x) for x in losses[p]) for p in losses)
    if reader["batches_with_nan"] or not finite:
        sys.exit("a NaN reached LeRobot's batches, or a loss is not finite")


if __name__ == "__main__":
    main()
