"""What swm opens to read is a regular file: one check, before any open.

A FIFO, a device or a socket where a dataset's file or a config file should be would make a read
wait forever (a FIFO with no writer) or never end (``/dev/zero``); ``check_regular`` refuses it by
its ``stat``, which never blocks. Dataset directories are checked whole as they are walked
(``data/storage/containment.py``), config files and single-file datasets by name.
"""

import os
import stat
from pathlib import Path

from swmcli.errors import UsageError

_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def special_kind(mode: int) -> str | None:
    """What a file of ``st_mode`` ``mode`` is when it is not a regular file, else None."""
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


def check_regular(path: Path, what: str = "file") -> None:
    """Refuse ``path`` (followed through links) when it is a FIFO, device or socket; a missing
    path or a directory is left to the reader's own error."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if not stat.S_ISDIR(mode) and (kind := special_kind(mode)):
        refuse_special(path, kind, what)


def refuse_special(path: Path, kind: str, what: str = "file") -> None:
    """The one error for a file swm would read that is ``kind`` (``special_kind``)."""
    raise UsageError(
        f"{path} is {kind}, not a regular file: swm reads its {what} from files",
        hint="point swm at a regular file (a FIFO or a device would block the read or never end)",
    )
