"""Peak on-disk size of a Lance dataset during a long `swm collect`, as a multiple of its end size.

    python benchmarks/disk_peak.py [EPISODES]

Polls the dataset's bytes every 0.1 s while `swm collect --preset tiny` appends EPISODES episodes
(default 300) into a temporary directory, then prints the peak, the final size and their ratio.
"""

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def size_on_disk(path: Path) -> int:
    """Bytes of every file under ``path`` (files vanish under a compaction: skip those)."""
    total = 0
    for file in path.rglob("*"):
        with contextlib.suppress(FileNotFoundError):
            total += file.stat().st_size if file.is_file() else 0
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("episodes", type=int, nargs="?", default=300, help="episodes to collect")
    episodes = parser.parse_args().episodes
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "peak.lance"
        command = [sys.executable, "-m", "swmcli", "collect", "--preset", "tiny"]
        command += ["--episodes", str(episodes), "--out", str(out)]
        # cwd: the scratch directory, so PYTHONPATH alone picks which swmcli runs.
        process = subprocess.Popen(
            command, cwd=scratch, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        peak = 0
        while process.poll() is None:
            peak = max(peak, size_on_disk(out) if out.exists() else 0)
            time.sleep(0.1)
        final = size_on_disk(out)
        versions = len(list((out / "_versions").iterdir()))
    print(
        f"episodes {episodes}: peak {peak:,} B, final {final:,} B, ratio {peak / final:.2f}x, "
        f"{versions} versions kept; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )


if __name__ == "__main__":
    main()
