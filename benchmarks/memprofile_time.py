"""How long `swm memprofile` takes, next to its start-up and (optionally) another checkout of swm,
all in the same run.

    python benchmarks/memprofile_time.py [--repeats 3] [--baseline DIR] [--commands tiny,vitb]

Each command runs in a fresh process, ``--repeats`` times, alternating with the baseline's runs so
that both see the same load. Prints the median CPU seconds (user + system: what a loaded machine
changes least), the median wall seconds and the peak RSS of each, and, with ``--baseline`` (a
source tree of another commit, e.g. ``git archive 2b55751 | tar -x -C /tmp/base``, imported
through ``PYTHONPATH``), the ratio of this tree's CPU time to the baseline's. Start-up is what
every command pays before its own work: the interpreter, torch, swm's command modules, and
``torch._dynamo``, which ``FakeTensorMode`` imports when the first trace starts.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

MEMPROFILE = [sys.executable, "-m", "swmcli", "memprofile"]
COMMANDS = {
    "tiny": [*MEMPROFILE, "--preset", "tiny"],
    "res224": [*MEMPROFILE, "--resolution", "224"],
    "vitb": [*MEMPROFILE, "--preset", "vit-b-224", "--budget", "24GiB"],
}
IMPORTS = "import torch, swmcli.cli.app, swmcli.commands.memprofile"
START_UP = {
    "start-up: imports": [sys.executable, "-c", IMPORTS],
    "start-up: imports + torch._dynamo": [sys.executable, "-c", f"{IMPORTS}, torch._dynamo"],
}


def run_once(argv: list[str], source: Path | None) -> tuple[float, float, int]:
    """CPU seconds (user + system), wall seconds and peak RSS (bytes) of one run of ``argv``."""
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = str(source)
    start = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, env=env, cwd=source)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed (exit {os.waitstatus_to_exitcode(status)})")
    return usage.ru_utime + usage.ru_stime, wall, usage.ru_maxrss * 1024  # ru_maxrss: KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="source tree of another swm commit")
    parser.add_argument("--commands", default=",".join(COMMANDS), help="of: " + ",".join(COMMANDS))
    args = parser.parse_args()
    here = Path(__file__).resolve().parents[1]
    sides = {"this tree": here} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    names = [*START_UP, *args.commands.split(",")]
    argvs = {**START_UP, **COMMANDS}
    runs: dict[tuple[str, str], list] = {(name, side): [] for name in names for side in sides}
    for _ in range(args.repeats):
        for name in names:
            for side, source in sides.items():
                runs[name, side].append(run_once(argvs[name], source))
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'command':36} {'side':10} {'CPU s':>7} {'wall s':>7} {'RSS MiB':>8}")
    for name in names:
        for side in sides:
            columns = zip(*runs[name, side], strict=True)
            cpu, wall, rss = (statistics.median(column) for column in columns)
            print(f"{name:36} {side:10} {cpu:7.2f} {wall:7.2f} {rss / 2**20:8.0f}")
        if args.baseline:
            cpu = [statistics.median(r[0] for r in runs[name, side]) for side in sides]
            print(f"{'':36} {'ratio':10} {cpu[0] / cpu[1]:7.2f}  (CPU, this tree / baseline)")
    print(f"argv: {' '.join(COMMANDS['vitb'][1:])} ... (commands: {', '.join(COMMANDS)})")


if __name__ == "__main__":
    main()
