"""Every case of the hostile-input corpus (``tests/hostile.py``) through a real ``swm`` process,
counted: writes outside the destination, reads outside the dataset, "bug in swm" lines,
tracebacks, other libraries' logs on the terminal (torch's, SDL's), hangs, and outcomes other
than the case's (a case's ``check`` reads what was written with this checkout's swm).

Writes: the whole tree under each case's root, before and after (every hostile target lies in
it). Reads: under ``strace`` (when it runs here), every file the process and its children opened,
resolved through links once it has ended; one under the root's ``outside/`` is a read outside.

    python tests/hostile_sweep.py WORK_DIR [--timeout SECONDS] [--case NAME ...] [--source DIR]

``--source DIR`` runs the swm whose ``swmcli`` package is in DIR (an older checkout, e.g.
``git archive c17ebe7 | tar -x -C DIR``): the same corpus, counted against it.

Prints one line per case and the totals (as JSON last); exits 1 when any count is not 0.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from hostile import CASES, make, tree, written_outside

# strace -y prints an opened descriptor with the file it is, links resolved: "= 3</path>"
_OPENED = re.compile(r"^open\w*\(.*\) = \d+<(.*)>$")
# What other libraries print past swm: torch's logs (glog style) and SDL's complaint.
_STRAY = re.compile(r"^[EWI]\d{4} \d\d:\d\d:\d\d|XDG_RUNTIME_DIR", re.M)


def opened_files(log: Path) -> set[Path]:
    """The files an strace log (one per process with -ff) shows opened."""
    found = set()
    for file in log.parent.glob(log.name + ".*"):
        for line in file.read_text(errors="replace").splitlines():
            if match := _OPENED.match(line):
                found.add(Path(match.group(1)))
    return found


def run_case(name: str, work: Path, timeout: float, strace: bool, source: Path | None) -> dict:
    root = work / name
    shutil.rmtree(root, ignore_errors=True)
    case = make(name, root)
    paths = [str(root / "code"), *([str(source)] if source else [])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    for key, value in case.env.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    log = work / f"{name}.strace"
    prefix = ["strace", "-f", "-ff", "-y", "-e", "trace=open,openat,openat2", "-o", str(log)]
    command = [*(prefix if strace else []), shutil.which("swm"), *case.args]
    before, started = tree(root), time.perf_counter()
    try:
        done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
        output, code, hung = done.stdout + done.stderr, done.returncode, False
    except subprocess.TimeoutExpired as expired:
        output, code, hung = str(expired.output or "") + str(expired.stderr or ""), None, True
    outside = (root / "outside").resolve()
    opened = opened_files(log) if strace else set()
    read = sorted(str(path) for path in opened if path.is_relative_to(outside))
    expected = code == case.code and case.says in output
    if expected and case.check is not None:
        try:
            case.check(root)  # what was read or written is what it must be
        except AssertionError:
            expected = False
    return {
        "case": name,
        "seconds": round(time.perf_counter() - started, 1),
        "outcome_as_expected": expected,
        "writes_outside": written_outside(before, tree(root), case.writes),
        "reads_outside": read,
        "bug_in_swm_lines": output.count("bug in swm"),
        "tracebacks": output.count("Traceback"),
        "stray_log_lines": len(_STRAY.findall(output)),
        "hung": hung,
        "exit_code": code,
        "last_line": (output.strip().splitlines() or [""])[-1][:160],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--case", action="append", choices=sorted(CASES))
    parser.add_argument("--source", type=Path, help="a directory holding another swmcli")
    options = parser.parse_args()
    options.work.mkdir(parents=True, exist_ok=True)
    strace = shutil.which("strace") is not None and subprocess.run(
        ["strace", "-o", os.devnull, "true"], capture_output=True
    ).returncode == 0
    results = []
    for name in options.case or sorted(CASES):
        result = run_case(name, options.work, options.timeout, strace, options.source)
        results.append(result)
        flag = "ok " if result["outcome_as_expected"] else "BAD"
        print(f"{flag} {name:36} {result['seconds']:6.1f} s  {result['last_line']}", flush=True)
    totals = {
        "cases": len(results),
        "outcomes_not_as_expected": sum(not r["outcome_as_expected"] for r in results),
        "writes_outside": sum(len(r["writes_outside"]) for r in results),
        "reads_outside": sum(len(r["reads_outside"]) for r in results) if strace else None,
        "bug_in_swm_lines": sum(r["bug_in_swm_lines"] for r in results),
        "tracebacks": sum(r["tracebacks"] for r in results),
        "stray_log_lines": sum(r["stray_log_lines"] for r in results),
        "hangs": sum(r["hung"] for r in results),
        "strace": strace,
    }
    (options.work / "sweep.json").write_text(json.dumps({"totals": totals, "cases": results},
                                                         indent=1))  # fmt: skip
    print(json.dumps(totals))
    counts = [v for k, v in totals.items() if k not in ("cases", "strace") and v]
    return 1 if counts else 0


if __name__ == "__main__":
    sys.exit(main())
