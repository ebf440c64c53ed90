"""A dataset reads nothing outside itself: one rule for every file of every format.

A dataset is a directory (or one file) that swm, another tool or someone hostile wrote. Before
any of its files is opened, ``check_tree`` walks the directory once: a symbolic link is followed
only where it resolves inside the dataset's root (the root itself may be a link), so a link out
(``ep_len.npz -> /etc/passwd``, ``meta/info.json -> ~/.ssh/...``) is one error, whichever file it
is and whichever reader would open it; a file read beside a dataset named by an inner path is
held to the same rule (``check_side``). A path a dataset *names* (a LeRobot template, a frame's
file) is joined to the root with ``inside``. HDF5 files can reach outside themselves in three
ways (external links, external raw storage, virtual datasets): ``check_hdf5`` refuses each.
"""

import os
from collections.abc import Callable
from pathlib import Path

from swmcli.errors import DatasetError, first_line
from swmcli.files import check_regular, refuse_special, special_kind

_HINT = (
    "swm reads nothing outside a dataset: copy the file into the dataset, or point swm at the "
    "real dataset"
)


def inside(root: Path, relative: str) -> Path:
    """``root / relative``, refused when it would lead out of ``root`` (a dataset naming
    ``../../etc/passwd`` or an absolute path)."""
    target = (root / relative).resolve()
    if not target.is_relative_to(root.resolve()):
        raise DatasetError(f"{root}: names a path outside the dataset ({relative})", _HINT)
    return target


def check_tree(root: Path, skip: Callable[[str], bool] | None = None) -> None:
    """Refuse a dataset directory holding a symbolic link that resolves outside it (or a link
    that loops), or a FIFO, device or socket; a dataset that is one file must be a regular file.
    The entries of ``root`` whose name ``skip`` accepts are left out: their reader checks each
    with ``check_part`` before reading it. A file that vanishes while it is walked (a writer's
    temporary) is passed over."""
    if not root.is_dir():
        check_regular(root, "data")
        return
    _walk(root, root, root.resolve(), skip)


def check_part(root: Path, part: Path) -> None:
    """``check_tree`` for ``part`` (itself included), an entry of the dataset at ``root``."""
    if part.is_symlink():
        _check_link(part, root.resolve(), root)
    if part.is_dir():
        _walk(part, root, root.resolve(), None)
    else:
        check_regular(part, "data")


def _walk(top: Path, root: Path, base: Path, skip) -> None:
    pending = [top]
    while pending:
        directory = pending.pop()
        try:
            entries = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            if skip is not None and directory is top and skip(entry.name):
                continue
            if entry.is_symlink():
                _check_link(Path(entry.path), base, root)
            elif entry.is_dir(follow_symlinks=False):
                pending.append(Path(entry.path))
            elif not entry.is_file(follow_symlinks=False):
                _check_special(Path(entry.path))


def check_side(directory: Path, side: Path) -> None:
    """``check_tree``'s rule for a file or directory ``side`` that a dataset reads beside the
    path it was named by (a Minari ``data/metadata.json`` when named by its ``main_data.hdf5``,
    stable-worldmodel's ``NAME_videos.lance`` when named by ``NAME.lance``): a link resolving
    outside ``directory`` (the dataset's own) is refused, and ``side`` is walked as a dataset."""
    if side.is_symlink():
        _check_link(side, directory.resolve(), directory)
    if side.exists():
        check_tree(side)


def _check_special(path: Path) -> None:
    """Refuse a FIFO, device or socket in a dataset: a reader opening it would block."""
    try:
        kind = special_kind(path.lstat().st_mode)
    except FileNotFoundError:  # a writer's temporary, gone meanwhile
        return
    if kind is not None:
        refuse_special(path, kind, "data")


def _check_link(link: Path, base: Path, root: Path) -> None:
    try:
        target = link.resolve(strict=False)
    except (RuntimeError, OSError):  # a loop
        raise DatasetError(f"{link} is a link that loops", _HINT) from None
    if not target.is_relative_to(base):
        shown = link.relative_to(root)
        raise DatasetError(f"{root}: {shown} is a link to {target}, outside the dataset", _HINT)


def check_hdf5(file, where) -> None:
    """Refuse an open h5py ``file`` with an external link, a dataset stored in another file
    (``external=``) or a virtual dataset: reading any of them reads outside ``where``."""
    import h5py

    def visit(name: str, link) -> str | None:  # what reaches out (a value stops the visit)
        if isinstance(link, h5py.ExternalLink):
            return f"{name} is an external link to {link.filename}:{link.path}"
        if not isinstance(link, h5py.HardLink):
            return None  # a soft link names an object of this file, visited on its own
        dataset = file.get(name)
        if not isinstance(dataset, h5py.Dataset):
            return None
        if dataset.is_virtual:
            return f"{name} is a virtual dataset of other files"
        if dataset.external:
            files = ", ".join(os.fsdecode(part[0]) for part in dataset.external)
            return f"{name} is stored outside the file ({files})"
        return None

    # An exception raised inside h5py's visit would reach it as a SystemError: the problem is
    # returned instead, which ends the visit, and raised here.
    try:
        problem = file.visititems_links(visit)
    except (RuntimeError, OSError, KeyError, ValueError) as error:  # damaged metadata
        raise DatasetError(
            f"cannot read {where}: {first_line(error)}",
            "the file is damaged or truncated: restore it or collect again",
        ) from None
    if problem is not None:
        raise DatasetError(f"{where}: {problem}", _HINT)
