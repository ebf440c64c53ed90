"""`swm train` against a bare PyTorch loop and the compute-only ceiling, on every training path.

    python benchmarks/overhead.py                          # all paths, 3 rounds of 200 steps
    python benchmarks/overhead.py --paths memory --rounds 5
    python benchmarks/overhead.py --episodes 8 --steps 4 --rounds 1 --paths memory   # a smoke run

On the same collected TwoRoom episodes and the ``tworoom-64`` recipe (fp32, batch 64, history 3,
frameskip 5, one torch thread per process), each path runs three programs in fresh processes,
alternating round after round so that a change of load hits all three alike:

- ``swm``: ``swm train`` itself, as a user runs it (``python -m swmcli train --config ...``);
- ``bare``: a nanoGPT-style loop written here from swm's own parts (the model builder, the loss,
  AdamW, the schedule, clipping) over the same loader, with the allocator setting swm makes at
  its start (``host.keep_freed_memory``): what swm's own work (checks, logging, checkpoints,
  progress, tracking) costs is the gap between the two;
- ``ceiling``: the bare loop over batches already in RAM (read before the clock starts): what
  the step alone costs; the gap to it is the loader's share.

Paths: ``stream`` (Lance, ``--no-in-memory``), ``memory`` (a ReplayBuffer loaded with the same
episodes, ``--in-memory``), ``online`` (a policy collecting while the model trains: the bare loop
reads the same ``OnlineFeed``; there is no ceiling for it) and ``nproc`` (``--nproc 2``: two
gloo ranks under torchrun, each with its half of every batch, streamed from Lance
as the bare loop's two DDP ranks read it).
Steps/s are the steady state: from the end of the first step (which builds the loader and, for
swm, includes its preflight) to the end of the last, checkpoints and logging included. Each
row gives min/median/max over the rounds of swm's steps/s over the other's, with the page
faults and system time of each program (what a process loses to the kernel), the load average,
and whether the bare loop's losses equal swm's at every logged step.
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PATHS = ("stream", "memory", "online", "nproc")
PROGRAMS = ("swm", "bare", "ceiling")


def settings(data: Path, steps: int, path: str) -> dict:
    """The run's settings on ``path`` (what `swm train` gets as flags, and the bare loop too)."""
    flags = {
        "data.path": str(data),
        "train.steps": steps,
        "runtime.cpu_threads": 1,
        "eval.heldout_episodes": 4,  # every other episode is trained on
        "data.in_memory": {"stream": False, "memory": True, "nproc": False}.get(path),
    }
    if path == "online":
        flags.update({"online.enabled": True, "online.warmup_steps": 64, "data.in_memory": None})
    if path == "nproc":
        flags["runtime.nproc"] = 2
    return flags


# ---- the bare loop (runs in its own process: `overhead.py --worker bare|ceiling ...`) --------


def bare_loop(config_file: Path, path: str, in_ram: bool) -> dict:
    """The training steps of ``swm train`` without swm's loop around them."""
    import torch

    from swmcli.config import resolve_config
    from swmcli.host import keep_freed_memory
    from swmcli.models.interface import Objective
    from swmcli.models.runner import make_runner
    from swmcli.training import distributed
    from swmcli.training.online import OnlineFeed
    from swmcli.training.recipe import make_optimizer, model_to_train
    from swmcli.training.sources import _loader, load_clips, open_training_data, ram_budget
    from swmcli.training.step import learning_rate

    keep_freed_memory()  # as `swm` does from its start: the gap left is swm's own work
    cfg = resolve_config(config_file=config_file)
    world = distributed.world_from_env()
    distributed.start(world)
    runner = make_runner(cpu_threads=1)
    budget = ram_budget(cfg.data.ram_budget, cfg.data.ram_share)
    if path == "online":
        feed = OnlineFeed(cfg, budget)
        metadata = feed.metadata
    else:
        dataset, _, metadata = open_training_data(cfg)
        clips = load_clips(dataset, budget, cfg.train.seed) if path == "memory" else dataset
    model = runner.prepare(model_to_train(cfg, metadata))
    objective = distributed.wrap(Objective(model, cfg.model), world, runner.device)
    optimizer = make_optimizer(model, cfg.train)
    batches = feed.batches(0) if path == "online" else iter(_loader(cfg, clips, 0, world))
    if in_ram:  # the ceiling: every batch read before the clock starts
        batches = iter([next(batches) for _ in range(cfg.train.steps)])
    model.train()
    losses, started = {}, time.perf_counter()
    for step in range(cfg.train.steps):
        if step == 1:
            started = time.perf_counter()  # steady state: from the end of the first step
        batch = runner.to_device(next(batches))
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, cfg.train.steps, cfg.train.lr)
        optimizer.zero_grad(set_to_none=True)
        loss = objective(batch)["loss"]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(objective.parameters(), cfg.train.grad_clip)
        optimizer.step()
        done = step + 1
        if done % cfg.train.log_every == 0 or done == cfg.train.steps or step == 0:
            losses[done] = distributed.mean_over_ranks({"loss": float(loss)}, world)["loss"]
    seconds = time.perf_counter() - started
    distributed.stop(world)
    return {"steady_seconds": seconds, "losses": losses}


# ---- the driver --------------------------------------------------------------------------------


def run_program(program: str, path: str, config_file: Path, run_dir: Path, steps: int) -> dict:
    """One fresh process of ``program``: its steady steps/s, faults, system time and losses."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    if program == "swm":
        command = [sys.executable, "-m", "swmcli", "train", "--config", str(config_file)]
        command += ["--out", str(run_dir), "--json"]
    else:
        here = [str(Path(__file__).resolve()), "--worker", program, "--path", path]
        here += ["--config-file", str(config_file)]
        launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
        command = [*launcher, *here] if path == "nproc" else [sys.executable, *here]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{program} on {path} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if program == "swm":
        phases = {phase["name"]: phase for phase in result["memory"]["phases"]}
        steady = phases.get("steady state") or phases["rank 0: steady state"]
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
        losses = {row["step"]: row["loss"] for row in rows}
        result = {"steady_seconds": steady["seconds"], "losses": losses}
    return {
        "steps_per_s": (steps - 1) / result["steady_seconds"],
        "minor_faults": after.ru_minflt - before.ru_minflt,
        "system_s": after.ru_stime - before.ru_stime,
        "losses": {int(k): v for k, v in result["losses"].items()},
    }


def collect(data: Path, episodes: int) -> None:
    """The episodes every program reads, collected as `swm collect` does."""
    command = [sys.executable, "-m", "swmcli", "collect", "--preset", "tworoom-64"]
    command += ["--episodes", str(episodes), "--out", str(data)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(command, env=env, check=True, capture_output=True)


def measure(args, scratch: Path) -> dict:
    """Every program on every path, ``args.rounds`` times, alternating; the per-run figures."""
    from swmcli.config import resolve_config

    data = scratch / "tworoom-64.lance"
    collect(data, args.episodes)
    runs: dict = {(path, program): [] for path in args.paths for program in PROGRAMS}
    for round_ in range(args.rounds):
        for path in args.paths:
            cfg = resolve_config("tworoom-64", flags=settings(data, args.steps, path))
            config_file = scratch / f"{path}.json"
            config_file.write_text(cfg.model_dump_json())
            for program in PROGRAMS:
                if program == "ceiling" and path == "online":
                    continue  # collecting is the online path's loader: no batches to hold
                run_dir = scratch / f"run-{path}-{program}-{round_}"
                runs[path, program].append(
                    run_program(program, path, config_file, run_dir, args.steps)
                )
    return runs


def report(runs: dict, args) -> None:
    load = os.getloadavg()
    print(
        f"{args.episodes} TwoRoom episodes, tworoom-64 (fp32, batch 64, 1 thread per process), "
        f"{args.steps} steps per run, {args.rounds} rounds; {os.cpu_count()} CPUs, load average "
        f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1 / 5 / 15 min) at the end"
    )
    print(f"{'path':<7} {'program':<8} {'steps/s median':>15} {'faults/run':>11} {'sys s/run':>9}")
    for (path, program), rows in runs.items():
        if rows:
            rate = statistics.median(row["steps_per_s"] for row in rows)
            faults = statistics.median(row["minor_faults"] for row in rows)
            system = statistics.median(row["system_s"] for row in rows)
            print(f"{path:<7} {program:<8} {rate:>15.2f} {faults:>11,.0f} {system:>9.1f}")
    print(f"{'path':<7} {'swm / other':<16} {'min':>6} {'median':>7} {'max':>6}  same losses")
    for path in args.paths:
        swm = runs[path, "swm"]
        for other in ("bare", "ceiling"):
            theirs = runs[path, other]
            if not theirs:
                continue
            ratios = [a["steps_per_s"] / b["steps_per_s"] for a, b in zip(swm, theirs, strict=True)]
            same = all(a["losses"] == b["losses"] for a, b in zip(swm, theirs, strict=True))
            same_text = str(same) if other == "bare" else "-"
            print(
                f"{path:<7} {'swm / ' + other:<16} {min(ratios):>6.3f} "
                f"{statistics.median(ratios):>7.3f} {max(ratios):>6.3f}  {same_text}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=400, help="TwoRoom episodes collected")
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps per run")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each program per path")
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory")
    parser.add_argument("--worker", choices=("bare", "ceiling"), help=argparse.SUPPRESS)
    parser.add_argument("--path", choices=PATHS, help=argparse.SUPPRESS)
    parser.add_argument("--config-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        result = bare_loop(args.config_file, args.path, in_ram=args.worker == "ceiling")
        if os.environ.get("RANK", "0") == "0":
            print(json.dumps(result))
        return
    scratch = Path(tempfile.mkdtemp(prefix="swm-overhead-", dir=args.dir))
    try:
        report(measure(args, scratch), args)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
