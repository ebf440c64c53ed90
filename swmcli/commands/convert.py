"""``swm convert``, ``swm merge`` and ``swm info``: a dataset copied between formats, several
merged into one, or one described.

The copy itself (streamed, verified by checksums, renamed into place) is ``data/copy.py``, the
merge its copy of several sources' episodes (``data/merge.py``); these jobs show its progress
and build the result.
"""

import time
from contextlib import nullcontext
from pathlib import Path

from swmcli.data.copy import Copied, copy_dataset
from swmcli.data.exports.layouts import CONVENTIONS, LAYOUTS, export_dataset
from swmcli.data.formats import open_reader
from swmcli.data.mapping import parse_mapping
from swmcli.data.merge import merge_datasets
from swmcli.data.verify import verify as verify_checksums
from swmcli.errors import UsageError
from swmcli.report import CommandResult, Table, progress, warn
from swmcli.training.checkpoints import checkpoint_path
from swmcli.training.lewm_checkpoints import export_lewm_run


def run_convert(
    src: str | Path,
    dst: str | Path,
    to: str | None = None,
    keys: list[str] | None = None,
    overwrite: bool = False,
    mapping: list[str] | None = None,
    layout: str = "swm",
    monitor=None,
    skip_damaged: bool = False,
) -> CommandResult:
    """Convert the dataset at ``src`` into ``dst`` (format ``to``, else from the suffix, else
    lance), keeping only ``keys`` if given, with a progress bar; the result names both sizes.
    ``mapping`` (``COLUMN=KEY`` pairs) renames the source's columns on the way in (any source,
    swm's own included: on an export it chooses the names written); ``layout``
    "stable-worldmodel", "lerobot" or "minari" writes that tool's own layout instead of swm's,
    and the result says, in one line, what that tool's convention made of the last row.
    ``monitor`` (a MemoryMonitor) measures it as the phase "convert"; ``skip_damaged`` leaves
    out (and counts) episodes that fail their checksum.
    """
    if layout not in LAYOUTS:
        raise UsageError(f"unknown layout {layout!r}", hint=f"use one of {', '.join(LAYOUTS)}")
    if checkpoint_path(Path(src)).exists():  # a run directory: its model, not a dataset
        return _export_run(Path(src), Path(dst), layout, overwrite, to, keys, mapping)
    if layout != "swm" and to is not None:
        raise UsageError(f"--to and --layout {layout} together", hint="--to is for swm's formats")
    if layout != "swm" and skip_damaged:
        raise UsageError(
            f"--skip-damaged and --layout {layout} together",
            hint="convert to swm's layout first with --skip-damaged, then export that",
        )
    started = time.perf_counter()
    copy = copy_dataset if layout == "swm" else export_dataset
    copied = _shown(
        monitor, "convert", _episode_count(src), copy,
        src, dst, keys=keys, overwrite=overwrite, mapping=parse_mapping(mapping),
        **({"to": to, "skip_damaged": skip_damaged} if layout == "swm" else {"layout": layout}),
    )  # fmt: skip
    fields = {
        "src": str(copied.src),
        **_written(copied),
        "skipped_damaged_episodes": len(copied.skipped),
        "seconds": round(time.perf_counter() - started, 2),
    }
    if layout in CONVENTIONS:
        fields["convention"] = CONVENTIONS[layout]
    warnings = []
    if copied.skipped:
        shown = "; ".join(f"episode {e}: {why}" for e, why in list(copied.skipped.items())[:5])
        warnings.append(warn(f"left out {len(copied.skipped)} damaged episodes: {shown}"))
    return CommandResult(title="swm convert", fields=fields, warnings=warnings)


def _export_run(
    src: Path, dst: Path, layout: str, overwrite: bool, *dataset_options
) -> CommandResult:
    """``swm convert RUN_DIR DST --layout stable-worldmodel``: a LeWM run as the checkpoint
    folder stable-worldmodel's ``load_pretrained`` loads (``lewm_checkpoints.export_lewm_run``);
    ``dataset_options`` (--to, --keys, --map) are for datasets only."""
    if layout != "stable-worldmodel" or any(dataset_options):
        raise UsageError(
            f"{src} is a run directory: it converts to --layout stable-worldmodel only, without "
            "--to, --keys or --map",
            hint=f"swm convert {src} {dst} --layout stable-worldmodel",
        )
    started = time.perf_counter()
    fields = export_lewm_run(src, dst, overwrite)
    fields["seconds"] = round(time.perf_counter() - started, 2)
    return CommandResult(title="swm convert", fields=fields)


def run_merge(
    sources: list[str],
    dst: str | Path,
    to: str | None = None,
    overwrite: bool = False,
    mapping: list[str] | None = None,
    heldout: int = 0,
    monitor=None,
) -> CommandResult:
    """Merge the datasets ``sources`` into ``dst`` (``data.merge.merge_datasets``) with a
    progress bar; the result names each source, its episodes and where they went, and both
    sizes. ``monitor`` (a MemoryMonitor) measures it as the phase "merge"."""
    started = time.perf_counter()
    merged = _shown(
        monitor, "merge", sum(map(_episode_count, sources)), merge_datasets,
        sources, dst, to=to, overwrite=overwrite, mapping=parse_mapping(mapping), heldout=heldout,
    )  # fmt: skip
    fields = {
        **_written(merged),
        "heldout_last": heldout,
        "seconds": round(time.perf_counter() - started, 2),
    }
    return CommandResult(title="swm merge", fields=fields, tables=[_provenance(merged.dst)])


def _shown(monitor, phase: str, episodes: int, copy, *args, **kwargs) -> Copied:
    """``copy(*args, **kwargs)`` (a copy of ``episodes`` episodes) with a progress bar, measured
    as the memory phase ``phase``."""
    with _phase(monitor, phase), progress(phase, total=episodes) as advance:
        return copy(*args, on_episode=lambda *_: advance(1), **kwargs)


def _written(copied: Copied) -> dict:
    """What a convert or a merge wrote: where, in which format, how much, both sizes; it was
    verified (it is in place only once it was)."""
    return {
        "dst": str(copied.dst),
        "format": copied.format,
        "episodes": copied.episodes,
        "steps": copied.steps,
        "src_size_bytes": copied.src_size_bytes,
        "dst_size_bytes": copied.dst_size_bytes,
        "verified": True,
    }


def _provenance(path) -> Table:
    """Where each source's episodes went, as the merge's metadata records it."""
    reader = open_reader(path)
    try:
        merged_from = reader.metadata["merged_from"]
    finally:
        reader.close()
    rows = [
        [
            part["dataset"],
            part["episodes"],
            ", ".join(f"{a}-{b - 1}" if b - a > 1 else f"{a}" for a, b in part["written_as"]),
        ]
        for part in merged_from
    ]
    return Table(title="sources", columns=["dataset", "episodes", "written as"], rows=rows)


def _episode_count(path: str | Path) -> int:
    """The episodes of the dataset at ``path``, for the progress bar."""
    reader = open_reader(path)
    try:
        return reader.num_episodes
    finally:
        reader.close()


def _phase(monitor, name: str):
    return monitor.phase(name) if monitor is not None else nullcontext()


def run_info(
    path: str | Path, verify: bool = False, mapping: list[str] | None = None, monitor=None
) -> CommandResult:
    """What ``swm info PATH`` shows: format, episodes, steps, bytes on disk and per step, the
    metadata, and a table of keys with their per-row dtype and shape. ``verify`` first reads
    every episode against its checksums and fails naming the damaged ones. Another tool's
    dataset also shows its codec, whether it is lossy, its convention and the column mapping
    (``mapping``: ``COLUMN=KEY`` overrides). ``monitor`` (a MemoryMonitor) measures it as the
    phase "inspect".
    """
    with _phase(monitor, "inspect"):
        return _info(path, verify, mapping)


def _info(path: str | Path, verify: bool, mapping: list[str] | None) -> CommandResult:
    import numpy as np

    reader = open_reader(path, parse_mapping(mapping))
    try:
        verified = verify_checksums(reader) if verify else {}
        on_disk = reader.nbytes_on_disk
        steps = reader.num_steps
        fields = {
            "path": str(path),
            "format": reader.format,
            "episodes": reader.num_episodes,
            "steps": steps,
            "on_disk_bytes": on_disk,
            "per_step_bytes": on_disk // steps if steps else None,
        }
        fields.update({k: v for k, v in reader.metadata.items() if k != "keys"})
        # Another tool's datasets carry no metadata checksums: theirs cannot be checked.
        sealed = reader.metadata_sealed
        fields["metadata_checksums"] = "verified" if sealed else "unverified metadata"
        fields.update(verified)
        rows = [
            [key, np.dtype(dtype).name, list(shape), np.dtype(dtype).itemsize * int(np.prod(shape))]
            for key, (dtype, shape) in reader.keys.items()
        ]
    finally:
        reader.close()
    columns = ["key", "dtype", "shape", "raw bytes"]
    table = Table(title="keys (per step)", columns=columns, rows=rows)
    return CommandResult(title="swm info", fields=fields, tables=[table])
