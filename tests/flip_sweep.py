"""Run by test_damage: flip one byte at each given offset of a copy of a dataset, then verify it.

Prints one line per offset: ``OFFSET error MESSAGE`` (a clean one-line SwmError), ``OFFSET intact``
(verify passed and every episode reads back equal to the original), or ``OFFSET SILENT``
(verify passed but the data differs). Dying or hanging is what the caller watches for.
"""

import shutil
import sys
from pathlib import Path

import numpy as np

from swmcli.convert import run_info
from swmcli.core.storage import open_reader
from swmcli.errors import SwmError


def fingerprint(path: Path) -> list[bytes]:
    reader = open_reader(path)
    try:
        episodes = (reader.read_episode(i) for i in range(reader.num_episodes))
        return [b"".join(v.tobytes() for v in episode.values()) for episode in episodes]
    finally:
        reader.close()


def main() -> None:
    source, relative, work = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    original = fingerprint(source)
    for offset in map(int, sys.argv[4:]):
        copy = work / source.name
        if copy.is_dir():
            shutil.rmtree(copy)
        elif copy.exists():
            copy.unlink()
        (shutil.copytree if source.is_dir() else shutil.copy)(source, copy)
        target = copy / relative if relative != "." else copy
        with target.open("r+b") as handle:
            handle.seek(offset)
            byte = handle.read(1)[0]
            handle.seek(offset)
            handle.write(bytes([byte ^ 0xFF]))
        print(offset, end=" ", flush=True)
        try:
            run_info(copy, verify=True)
            same = fingerprint(copy) == original
            print("intact" if same else "SILENT", flush=True)
        except SwmError as error:
            print("error", error.message.replace("\n", " ")[:200], flush=True)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
