"""Run by test_checksums and tests/damage_sweep.py: flip one byte of a copy of a dataset,
then use it as swm would: ``swm info --verify`` (which opens it, checking its metadata and
schema, and reads every row against its checksums) and a full read.

    python tests/flip_sweep.py SOURCE WORK FILE:OFFSET [FILE:OFFSET ...]

``FILE`` is relative to ``SOURCE`` (``.`` for a single-file dataset). Prints one line per flip:
``FILE:OFFSET error MESSAGE`` (a clean one-line SwmError), ``FILE:OFFSET intact`` (everything
passed and the metadata, schema and every episode read back equal the original's), or
``FILE:OFFSET SILENT`` (everything passed but something differs). Dying or hanging is what the
caller watches for.
"""

import json
import shutil
import sys
from pathlib import Path

import numpy as np

from swmcli.commands.convert import run_info
from swmcli.data.formats import open_reader
from swmcli.data.storage.schema import schema_to_json
from swmcli.errors import SwmError


def fingerprint(path: Path) -> list[bytes]:
    """The metadata, the schema and every episode's bytes, as a swm reader returns them."""
    reader = open_reader(path)
    try:
        described = json.dumps([reader.metadata, schema_to_json(reader.keys)], sort_keys=True)
        episodes = (reader.read_episode(i) for i in range(reader.num_episodes))
        return [described.encode(), *(b"".join(v.tobytes() for v in e.values()) for e in episodes)]
    finally:
        reader.close()


def dataset_files(path: Path) -> dict[str, bytes]:
    """Every file of the dataset at ``path``, by path relative to it (``.`` for a single file)."""
    if path.is_file():
        return {".": path.read_bytes()}
    files = sorted(p for p in path.rglob("*") if p.is_file())
    return {str(file.relative_to(path)): file.read_bytes() for file in files}


def metadata_span(data: bytes) -> range:
    """Where the swm metadata's JSON lies in a file's bytes (empty if the file holds none)."""
    start = max(data.find(b'{"env_id"'), data.find(b'{\n  "env_id"'))
    if start < 0:
        return range(0)
    seal = data.find(b"}", data.find(b"field_crc32", start))  # the seal closes last
    return range(start, data.find(b"}", seal + 1) + 1)


def flip(copy: Path, relative: str, offset: int) -> None:
    target = copy / relative if relative != "." else copy
    with target.open("r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)[0]
        handle.seek(offset)
        handle.write(bytes([byte ^ 0xFF]))


def main() -> None:
    source, work = Path(sys.argv[1]), Path(sys.argv[2])
    original = fingerprint(source)
    work.mkdir(parents=True, exist_ok=True)
    for target in sys.argv[3:]:
        relative, offset = target.rsplit(":", 1)
        copy = work / source.name
        if copy.is_dir():
            shutil.rmtree(copy)
        elif copy.exists():
            copy.unlink()
        (shutil.copytree if source.is_dir() else shutil.copy)(source, copy)
        flip(copy, relative, int(offset))
        print(target, end=" ", flush=True)
        try:
            run_info(copy, verify=True)
            same = fingerprint(copy) == original
            print("intact" if same else "SILENT", flush=True)
        except SwmError as error:
            print("error", error.message.replace("\n", " ")[:200], flush=True)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
