"""Checksums written with the data: carried by convert, checked by `swm info --verify`, and a
sweep of one-byte flips over each format that must end in a clean error or intact data."""

import os
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from test_storage import make_episode, write

from swmcli.convert import run_info
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


def _flip_targets(tmp_path: Path, fmt: str) -> tuple[Path, list[tuple[str, int]]]:
    """A small dataset of ``fmt`` and the files (relative) whose bytes the sweep flips."""
    path = tmp_path / {"lance": "d.lance", "hdf5": "d.h5", "folder": "d"}[fmt]
    write(path, [make_episode(seed, 6, resolution=8) for seed in range(4)], fmt=fmt)
    if fmt == "lance":
        files = [str(p.relative_to(path)) for p in (path / "data").glob("*.lance")]
    elif fmt == "hdf5":
        files = ["."]
    else:
        files = ["episode_000002/arrays.npz", "episode_000001/pixels/000003.png"]
    return path, files


# Offsets of this dataset's Lance data file where a flip crashed pylance 14's decoder (an abort
# on an absurd allocation size), or made numpy allocate PiB for episode_idx counts, or gave an
# image column a size its shape cannot hold: found by sweeping every byte of the file.
LANCE_CRASH_OFFSETS = [100, 102, 397, 399, 436, 443, 3565, 3567, 3581, 3586, 9539]


def _sweep(path: Path, relative: str, work: Path, offsets: list[int]) -> dict[int, str]:
    """``tests/flip_sweep.py`` in a child: ``{offset: outcome}``."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"}
    work.mkdir(exist_ok=True)
    done = subprocess.run(
        [sys.executable, str(REPO / "tests" / "flip_sweep.py"), str(path), relative, str(work),
         *map(str, offsets)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    # A hang fails by the timeout; an abort or a traceback by the return code.
    assert done.returncode == 0, done.stderr[-2000:]
    results = {int(o): r for o, r in (line.split(" ", 1) for line in done.stdout.splitlines())}
    assert sorted(results) == offsets
    return results


@pytest.mark.parametrize("fmt", ["lance", "hdf5", "folder"])
def test_one_byte_flips_end_in_a_clean_error_or_intact_data(tmp_path, fmt):
    path, files = _flip_targets(tmp_path, fmt)
    for relative in files:
        size = (path / relative).stat().st_size if relative != "." else path.stat().st_size
        offsets = sorted({int(size * i / 40) + 5 for i in range(40)} - {size + 5})
        offsets = [o for o in offsets if o < size]
        results = _sweep(path, relative, tmp_path / "work", offsets)
        assert not [o for o, r in results.items() if r.startswith("SILENT")], results
        # Most flips land in data and are caught, not ignored.
        assert sum(r.startswith("error") for r in results.values()) > len(offsets) // 3


def test_flips_that_crash_a_decoder_are_one_error_naming_the_episode(tmp_path):
    path, (relative,) = _flip_targets(tmp_path, "lance")
    size = (path / relative).stat().st_size
    offsets = [o for o in LANCE_CRASH_OFFSETS if o < size]
    results = _sweep(path, relative, tmp_path / "work", offsets)
    assert all(r.startswith(("error", "intact")) for r in results.values()), results
    crashed = [r for r in results.values() if "crashed the decoder (killed by SIGABRT)" in r]
    if not crashed:
        pytest.skip("this pylance's file layout moved: no flip at the known offsets crashes it")
    assert all(re.search(r"episode \d+: reading it crashed", r) for r in crashed)


def test_a_loader_worker_process_that_a_decoder_crash_kills_is_one_error(tmp_path):
    from swmcli.core.data import load_dataset, make_loader
    from swmcli.errors import SwmError

    path, (relative,) = _flip_targets(tmp_path, "lance")
    with (path / relative).open("r+b") as handle:
        handle.seek(397)  # one of LANCE_CRASH_OFFSETS
        byte = handle.read(1)[0]
        handle.seek(397)
        handle.write(bytes([byte ^ 0xFF]))
    with pytest.raises(DatasetError) as verified:
        run_info(path, verify=True)
    if "crashed the decoder" not in verified.value.message:
        pytest.skip("this pylance's file layout moved: the flip does not crash its decoder")
    clips = load_dataset(path, history_len=2, frameskip=1)
    with pytest.raises(SwmError, match="a loader worker reading the lance data died") as caught:
        for _ in make_loader(clips, 4, num_workers=1, processes=True):
            pass
    assert "swm info --verify" in caught.value.hint
