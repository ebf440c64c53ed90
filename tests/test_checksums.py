"""Checksums written with the data: carried by convert, checked by `swm info --verify`, and a
sweep of one-byte flips over each format that must end in a clean error or intact data."""

import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from test_storage import make_episode, write

from swmcli.convert import run_info
from swmcli.core.data import ClipDataset
from swmcli.core.storage import open_reader
from swmcli.core.storage.copy import copy_dataset
from swmcli.errors import DatasetError

REPO = Path(__file__).resolve().parents[1]


def test_checksums_are_written_and_carried_by_copy_dataset(tmp_path):
    episodes = [make_episode(seed, 4 + seed, resolution=8) for seed in range(3)]
    write(tmp_path / "a.lance", episodes)
    copy_dataset(tmp_path / "a.lance", tmp_path / "b.h5")
    copy_dataset(tmp_path / "b.h5", tmp_path / "c", to="folder")
    readers = [open_reader(tmp_path / name) for name in ("a.lance", "b.h5", "c")]
    for index in range(3):
        sums = [reader.read_checksums(index) for reader in readers]
        assert sums[0].shape == (4 + index, 7) and sums[0].dtype == np.uint32
        for other in sums[1:]:
            np.testing.assert_array_equal(other, sums[0])
    assert run_info(tmp_path / "c", verify=True).fields["checksums"] is True


def _damage_reward(path: Path, episode: int) -> None:
    """Change one reward of ``episode`` behind swm's back (valid HDF5, wrong data)."""
    with h5py.File(path, "r+") as file:
        start = int(file["episode_offsets"][episode])
        file["reward"][start + 1] += 1


def test_verify_names_the_damaged_episode_and_convert_refuses_it(tmp_path):
    path = tmp_path / "d.h5"
    write(path, [make_episode(seed, 5, resolution=8) for seed in range(4)])
    assert run_info(path, verify=True).fields["verified_episodes"] == 4
    _damage_reward(path, 2)
    assert run_info(path).fields["episodes"] == 4  # a plain info does not read the data
    with pytest.raises(DatasetError, match=r"1 of 4 episodes are damaged: episode 2: .*reward"):
        run_info(path, verify=True)
    with pytest.raises(DatasetError, match=r"episode 2 is damaged \(checksum mismatch in reward"):
        copy_dataset(path, tmp_path / "copy.lance")
    assert not (tmp_path / "copy.lance").exists()


def _small_dataset(tmp_path: Path, fmt: str) -> Path:
    path = tmp_path / {"lance": "d.lance", "hdf5": "d.h5", "folder": "d"}[fmt]
    write(path, [make_episode(seed, 6, resolution=8) for seed in range(4)], fmt=fmt)
    return path


def sweep_targets(path: Path, per_file: int, per_metadata: int) -> list[str]:
    """``FILE:OFFSET`` flips over EVERY file of the dataset at ``path``: ``per_file`` offsets
    spread over each file, and ``per_metadata`` more over the swm metadata's JSON wherever a
    file holds it (a Lance manifest, the HDF5 file's attribute, the folder's swm_folder.json)."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    targets = []
    for file in files:
        data = file.read_bytes()
        relative = "." if file == path else str(file.relative_to(path))
        offsets = {int(len(data) * i / per_file) for i in range(per_file)} if data else set()
        start = data.find(b'{"env_id"')
        if start < 0:
            start = data.find(b'{\n  "env_id"')
        if start >= 0:
            seal = data.find(b"}", data.find(b"field_crc32", start))  # the seal closes last
            stop = data.find(b"}", seal + 1) + 1
            offsets |= {start + (stop - start) * i // per_metadata for i in range(per_metadata)}
        targets += [f"{relative}:{offset}" for offset in sorted(offsets)]
    return targets


def _sweep(path: Path, work: Path, targets: list[str]) -> dict[str, str]:
    """``tests/flip_sweep.py`` in a child: ``{FILE:OFFSET: outcome}``."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"}
    done = subprocess.run(
        [sys.executable, str(REPO / "tests" / "flip_sweep.py"), str(path), str(work), *targets],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    # A hang fails by the timeout; an abort or a traceback by the return code.
    assert done.returncode == 0, done.stderr[-2000:]
    results = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert sorted(results) == sorted(targets)
    return results


# Offsets per file and over the metadata: every file of the dataset is flipped somewhere.
_SWEEP = {"lance": (12, 24), "hdf5": (40, 24), "folder": (2, 16)}


@pytest.mark.parametrize("fmt", ["lance", "hdf5", "folder"])
def test_one_byte_flips_in_every_file_end_in_a_clean_error_or_intact_data(tmp_path, fmt):
    path = _small_dataset(tmp_path, fmt)
    targets = sweep_targets(path, *_SWEEP[fmt])
    results = _sweep(path, tmp_path / "work", targets)
    # 0 silent changes (data, schema or metadata differing after a command that passed),
    # 0 tracebacks and 0 hangs (the child's exit code and timeout).
    assert not [t for t, r in results.items() if r.startswith("SILENT")], results
    # Most flips land in data or metadata and are caught, not ignored.
    assert sum(r.startswith("error") for r in results.values()) > len(targets) // 3
    # Flips in the metadata's JSON are caught as damaged metadata, not as a bug.
    assert any("metadata" in r for r in results.values()), results


def test_flips_in_a_lance_footer_are_one_error_naming_the_file(tmp_path):
    path = _small_dataset(tmp_path, "lance")
    (data,) = (path / "data").glob("*.lance")
    relative, size = str(data.relative_to(path)), data.stat().st_size
    targets = [f"{relative}:{offset}" for offset in range(size - 40, size)]  # lance._check_footer
    results = _sweep(path, tmp_path / "work", targets)
    assert all(r.startswith(("error", "intact")) for r in results.values()), results
    # The top byte of the number of global buffers: pylance itself aborts on a 68 GB allocation.
    assert "footer is cut or points outside it" in results[f"{relative}:{size - 13}"]
    assert relative in results[f"{relative}:{size - 13}"]


class _AbortsInWorkers(ClipDataset):
    """Clips whose reads abort the process in a loader worker, as a decoder that trusts a
    damaged size does (pylance 14 did on some flipped bytes of its pages)."""

    def read_batch(self, indices):
        if torch.utils.data.get_worker_info() is not None:
            os.abort()
        return super().read_batch(indices)


def test_a_loader_worker_process_that_a_decoder_crash_kills_is_one_error(tmp_path):
    from swmcli.core.data import load_dataset, make_loader
    from swmcli.errors import SwmError

    path = tmp_path / "d.h5"
    write(path, [make_episode(seed, 6, resolution=8) for seed in range(4)])
    clips = load_dataset(path, history_len=2, frameskip=1)
    clips.__class__ = _AbortsInWorkers
    with pytest.raises(SwmError, match="a loader worker reading the hdf5 data died") as caught:
        for _ in make_loader(clips, 4, num_workers=1, processes=True):
            pass
    assert "swm info --verify" in caught.value.hint
