"""Checksums written with the data: carried by convert, checked by `swm info --verify`, and a
sweep of one-byte flips over each format that must end in a clean error or intact data."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from flip_sweep import dataset_files, metadata_span
from test_storage import make_episode, write

from swmcli.commands.convert import run_info
from swmcli.data.copy import copy_dataset
from swmcli.data.formats import open_reader
from swmcli.data.streaming import ClipDataset
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
    rows = np.array([7, 0, 7, 14, 3])  # any order, repeats: a batch's rows
    for reader in readers:  # the checksums read with the small keys are the stored ones
        read = reader.read_columns(["reward", "action"], rows, checksums=True)
        np.testing.assert_array_equal(read["swm_crc32"], reader.read_row_checksums(rows))
        np.testing.assert_array_equal(read["reward"], reader.read_rows("reward", rows))
    assert run_info(tmp_path / "c", verify=True).fields["checksums"] is True


def _damage_reward(path: Path, episode: int, key: str = "reward") -> None:
    """Change one reward (or ``key``) of ``episode`` behind swm's back (valid HDF5, wrong
    data)."""
    with h5py.File(path, "r+") as file:
        start = int(file["episode_offsets"][episode])
        file[key][start + 1] += 1


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
    targets = []
    for relative, data in dataset_files(path).items():
        offsets = {len(data) * i // per_file for i in range(per_file)} if data else set()
        span = metadata_span(data)
        offsets |= set(span[:: max(1, len(span) // per_metadata)])
        targets += [f"{relative}:{offset}" for offset in sorted(offsets)]
    return targets


def _sweep(path: Path, work: Path, targets: list[str]) -> dict[str, str]:
    """``tests/flip_sweep.py`` in a child: ``{FILE:OFFSET: outcome}``."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"}
    done = subprocess.run(
        [sys.executable, str(REPO / "tests" / "flip_sweep.py"), str(path), str(work), *targets],
        capture_output=True, text=True, errors="replace", env=env, timeout=300,
    )  # fmt: skip
    # A hang fails by the timeout; an abort or a traceback by the return code.
    assert done.returncode == 0, done.stderr[-2000:]
    results = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert sorted(results) == sorted(targets)
    return results


# Offsets per file and over the metadata: every file of the dataset is flipped somewhere.
_SWEEP = {"lance": (8, 16), "hdf5": (24, 16), "folder": (2, 8)}


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
    from swmcli.data.streaming import load_dataset, make_loader
    from swmcli.errors import SwmError

    path = tmp_path / "d.h5"
    write(path, [make_episode(seed, 6, resolution=8) for seed in range(4)])
    clips = load_dataset(path, history_len=2, frameskip=1)
    clips.__class__ = _AbortsInWorkers
    with pytest.raises(SwmError, match="a loader worker reading the hdf5 data died") as caught:
        for _ in make_loader(clips, 4, num_workers=1, processes=True):
            pass
    assert "swm info --verify" in caught.value.hint


def _rewrite_metadata(path: Path, fmt: str, change) -> None:
    """Change the stored swm metadata behind swm's back, as an editor (or a flipped byte that
    keeps it valid JSON) would: ``change(metadata dict)`` edits it in place."""

    def edited(text: str) -> str:
        meta = json.loads(text)
        change(meta)
        return json.dumps(meta)

    if fmt == "lance":
        import lance

        dataset = lance.dataset(str(path))
        raw = dataset.schema.metadata[b"swm"].decode()
        dataset.update_schema_metadata({"swm": edited(raw)}, replace=True)
    elif fmt == "hdf5":
        with h5py.File(path, "r+") as file:
            file.attrs["swm"] = edited(file.attrs["swm"])
    else:
        meta = path / "swm_folder.json"
        meta.write_text(edited(meta.read_text()))


REINTERPRETATIONS = {  # each keeps valid JSON and a plausible value: only the checksum knows
    "dtype": (lambda m: m["keys"]["pixels"].__setitem__(0, "|i1"), "keys (the schema)"),
    "shape": (lambda m: m["keys"]["pixels"].__setitem__(1, [16, 4, 3]), "keys (the schema)"),
    "env": (lambda m: m.__setitem__("env_id", "swm/TwoRoom-v1"), "env_id"),
    "action_dim": (lambda m: m.__setitem__("action_dim", 3), "action_dim"),
    "resolution": (lambda m: m.__setitem__("resolution", [4, 16]), "resolution"),
}


@pytest.mark.parametrize("change", sorted(REINTERPRETATIONS))
@pytest.mark.parametrize("fmt", ["lance", "hdf5", "folder"])
def test_a_reinterpreted_dataset_is_refused_on_every_open(tmp_path, fmt, change):
    from typer.testing import CliRunner

    from swmcli.cli import app

    path = _small_dataset(tmp_path, fmt)
    edit, named = REINTERPRETATIONS[change]
    _rewrite_metadata(path, fmt, edit)
    with pytest.raises(DatasetError, match=f"metadata is damaged: {re.escape(named)}"):
        open_reader(path)
    runner = CliRunner()
    for command in (["info", str(path)], ["convert", str(path), str(tmp_path / "copy.h5")]):
        result = runner.invoke(app, command)
        assert result.exit_code == 1 and "metadata is damaged" in result.output, result.output
    assert not (tmp_path / "copy.h5").exists()


def test_metadata_that_is_not_json_names_the_damage(tmp_path):
    path = _small_dataset(tmp_path, "folder")
    meta = path / "swm_folder.json"
    meta.write_text(meta.read_text()[:-3])
    with pytest.raises(DatasetError, match="swm metadata is not valid JSON"):
        open_reader(path)


@pytest.mark.parametrize("fmt", ["lance", "hdf5", "folder"])
def test_metadata_without_its_checksums_is_refused(tmp_path, fmt):
    path = _small_dataset(tmp_path, fmt)
    _rewrite_metadata(path, fmt, lambda meta: meta.pop("field_crc32"))
    with pytest.raises(DatasetError, match="has no field_crc32"):
        open_reader(path)


def test_a_stored_column_that_disagrees_with_the_schema_is_refused(tmp_path):
    path = _small_dataset(tmp_path, "hdf5")
    with h5py.File(path, "r+") as file:
        del file["reward"]
        file.create_dataset("reward", data=np.zeros(24, dtype=np.float64))
    with pytest.raises(DatasetError, match="column reward holds float64"):
        open_reader(path)


def _damage_episode(path: Path, fmt: str, episode: int) -> None:
    """One pixel of ``episode`` changed behind swm's back, in a way the format itself accepts."""
    if fmt == "hdf5":
        _damage_reward(path, episode)
        return
    reader = open_reader(path)
    episodes = [reader.read_episode(i) for i in range(reader.num_episodes)]
    sums = [reader.read_checksums(i) for i in range(reader.num_episodes)]
    reader.close()
    # Rewrite the dataset with the old checksums: as if a bit rotted under them.
    episodes[episode]["pixels"][2, 0, 0, 0] ^= 0xFF
    shutil.rmtree(path)
    write(path, episodes, fmt=fmt)
    if fmt == "lance":
        import lance
        import pyarrow as pa

        dataset = lance.dataset(str(path))
        table = dataset.to_table()
        column = pa.FixedSizeListArray.from_arrays(pa.array(np.concatenate(sums).reshape(-1)), 7)
        table = table.set_column(table.schema.get_field_index("swm_crc32"), "swm_crc32", column)
        lance.write_dataset(table, str(path), mode="overwrite", data_storage_version="2.1")
    else:
        directory = path / f"episode_{episode:06d}"
        with np.load(directory / "arrays.npz") as npz:
            arrays = {k: npz[k] for k in npz.files}
        arrays["swm_crc32"] = sums[episode]
        np.savez(directory / "arrays.npz", **arrays)


@pytest.mark.parametrize("fmt", ["lance", "hdf5", "folder"])
def test_streamed_and_in_memory_reads_stop_at_a_damaged_episode_or_skip_it(tmp_path, fmt):
    from swmcli.data.streaming import load_dataset, make_loader
    from swmcli.training.sources import load_clips

    path = _small_dataset(tmp_path, fmt)
    _damage_episode(path, fmt, 2)
    clips = load_dataset(path, history_len=2, frameskip=1)
    with pytest.raises(DatasetError, match="episode 2 is damaged"):
        for _ in make_loader(clips, 4, num_workers=2, shuffle=False):
            pass
    with pytest.raises(DatasetError, match="episode 2 is damaged"):
        load_clips(clips, 2**30, seed=0)
    skipping = load_dataset(path, history_len=2, frameskip=1, skip_damaged=True)
    batches = list(make_loader(skipping, 4, num_workers=2, shuffle=False))
    assert list(skipping.damaged) == [2] and sum(len(b["reward"]) for b in batches) == 20
    # No damaged row was consumed: every clip is one of the clips as collected.
    originals = [make_episode(seed, 6, resolution=8) for seed in range(4)]
    allowed = {
        (e["pixels"][t : t + 2].tobytes(), e["reward"][t : t + 2].tobytes())
        for e in originals
        for t in range(5)
    }
    for batch in batches:
        for pixels, reward in zip(batch["pixels"], batch["reward"], strict=True):
            assert (pixels.numpy().tobytes(), reward.numpy().tobytes()) in allowed
    in_memory = load_dataset(path, history_len=2, frameskip=1, skip_damaged=True)
    assert load_clips(in_memory, 2**30, seed=0).num_episodes == 3
    assert list(in_memory.damaged) == [2]


def test_swm_train_stops_at_a_damaged_episode_or_skips_it_when_asked(tmp_path):
    """Streamed (the in-memory load: test_streamed_and_in_memory_reads_...)."""
    from typer.testing import CliRunner

    from swmcli.cli import app

    data = tmp_path / "tiny.h5"
    runner = CliRunner()
    collected = runner.invoke(app, ["collect", "--preset", "tiny", "--out", str(data)])
    assert collected.exit_code == 0, collected.output
    _damage_reward(data, 3, key="action")  # a key training reads
    # 16 steps of 16 clips: an epoch, so every training clip is read once
    train = ["train", "--preset", "tiny", "--data", str(data), "--steps", "16", "--no-in-memory"]
    stopped = runner.invoke(app, [*train, "--out", str(tmp_path / "a")])
    assert stopped.exit_code == 1 and "episode 3 is damaged" in stopped.output, stopped.output
    assert "--skip-damaged" in stopped.output  # the hint names the way on
    skipped = runner.invoke(app, [*train, "--out", str(tmp_path / "b"), "--skip-damaged", "--json"])
    assert skipped.exit_code == 0, skipped.output
    result = json.loads(skipped.stdout)
    assert result["skipped_damaged_episodes"] == 1
    assert any("skipped 1 damaged episodes: episode 3" in w for w in result["warnings"])
