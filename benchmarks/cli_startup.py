"""How long `swm --help` takes and how much memory it needs, next to baselines in the same run.

    python benchmarks/cli_startup.py [--repeats 10]

Baselines: a bare interpreter (`python -c pass`, the floor) and `import torch` (what a CLI that
imports its heavy dependencies up front pays at least; stable-worldmodel's import is about 8 s and
800 MB). Prints the median wall time and the peak RSS of each, and swm's ratio to each baseline.
"""

import argparse
import resource
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "swm --help": [sys.executable, "-m", "swmcli", "--help"],
    "swm collect --help": [sys.executable, "-m", "swmcli", "collect", "--help"],
    "python -c 'import torch'": [sys.executable, "-c", "import torch"],
}


def measure(argv: list[str], repeats: int) -> tuple[float, int]:
    """Median seconds and the peak RSS (bytes) of running ``argv`` ``repeats`` times."""
    seconds = []
    peak = 0
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, check=True)
        seconds.append(time.perf_counter() - start)
        # ru_maxrss of children is the largest child so far, in KiB on Linux.
        peak = max(peak, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
    return statistics.median(seconds), peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    results = {}
    # Run in ascending expected size so each peak RSS belongs to its own command.
    for name, argv in COMMANDS.items():
        results[name] = measure(argv, args.repeats)
    floor, torch_import = results["python -c pass"][0], results["python -c 'import torch'"][0]
    print(f"{'command':28} {'median s':>9} {'peak RSS MiB':>13}")
    for name, (seconds, peak) in results.items():
        print(f"{name:28} {seconds:9.3f} {peak / 2**20:13.0f}")
    help_s = results["swm --help"][0]
    print(f"swm --help: {help_s - floor:.3f} s above a bare interpreter; ")
    print(f"swm --help / import torch: {help_s / torch_import:.2f}x (goal: < 0.5 s in all)")


if __name__ == "__main__":
    main()
