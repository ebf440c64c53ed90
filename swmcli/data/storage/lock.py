"""One writer per dataset or run directory, and readers a writer can see: ``flock`` lock files.

``.NAME.swm-writer``, beside the dataset or run directory ``NAME``, is held exclusively by the one
process writing it (and removed when it is done); it is taken before anything of ``NAME`` is
touched, so a second writer is refused at once and told the first one's PID and command. The
same lock serves datasets (``open_writer``) and run directories (``swm train``, ``swm eval``:
``run_lock``). ``NAME/_swm_readers.lock``, inside a Lance dataset, is held shared by a reader
while it opens the dataset; then the reader holds ``NAME/_swm_reading/VERSION.lock`` shared,
for the version it opened, as long as it reads. A Lance writer deletes superseded versions only
while it holds the readers' lock exclusively (no reader is opening), and never a version a reader
holds: it never deletes a file a reader's version still uses, and the versions between go.

``flock`` locks belong to an open file and the kernel drops them when their process dies, so a
killed writer or reader never leaves a lock behind. They are local: on object storage (``s3://``)
nothing is locked, and one writer at a time is the user's to arrange.
"""

import errno
import fcntl
import os
import sys
from pathlib import Path

from swmcli.errors import DatasetError, SwmError
from swmcli.files import special_kind

COMMAND_CHARS = 200  # of the holder's command line, written in the lock file


def writer_lock_path(path: Path) -> Path:
    """The writer's lock file of the dataset at ``path``."""
    path = Path(path)
    return path.with_name(f".{path.name}.swm-writer")


def _readers_lock_path(path: Path) -> Path:
    return Path(path) / "_swm_readers.lock"


def _open_lock(path: Path, error: type[SwmError] = DatasetError):
    """The lock file at ``path``, opened (made if missing) without following a link: a link
    planted there (``.NAME.swm-writer -> ~/.bashrc``) or anything but a regular file (a FIFO)
    is refused, never written through. The handle is the lock: it lives as long as the lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    hint = f"remove {path} (swm makes its lock files itself) and run again"
    try:
        descriptor = os.open(path, flags, 0o644)
    except OSError as err:
        if err.errno != errno.ELOOP:
            raise
        target = os.readlink(path)
        raise error(f"the lock file {path} is a link (to {target})", hint=hint) from None
    kind = special_kind(os.fstat(descriptor).st_mode)
    if kind is not None:
        os.close(descriptor)
        raise error(f"the lock file {path} is {kind}, not a regular file", hint=hint)
    os.set_blocking(descriptor, True)
    return os.fdopen(descriptor, "a+")


_NAME_MAX = 255  # bytes of one file name on Linux's and macOS's file systems


def _check_name_fits(path: Path, error: type[SwmError]) -> None:
    """Refuse a dataset or run name too long for its lock file ``.NAME.swm-writer`` beside it
    (the OS would say "File name too long" of a file the user never named)."""
    size = len(os.fsencode(writer_lock_path(path).name))
    if size > _NAME_MAX:
        most = _NAME_MAX - (size - len(os.fsencode(path.name)))
        raise error(
            f"the name {path.name[:40]}... is {len(os.fsencode(path.name))} bytes: swm's lock "
            f"beside it (.NAME.swm-writer) would pass the {_NAME_MAX} bytes a file name can have",
            hint=f"choose a name of at most {most} bytes",
        )


class WriterLock:
    """The exclusive right to write one dataset (or run directory), held until ``release`` (or
    the process dies). A refused writer gets ``error`` (a ``DatasetError`` for a dataset) naming
    the holder's PID and command."""

    def __init__(self, path: Path, error: type[SwmError] = DatasetError, hint: str | None = None):
        _check_name_fits(Path(path), error)
        self.path = writer_lock_path(path)
        while True:
            handle = _open_lock(self.path, error)
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid, command = _holder(handle)
                handle.close()
                who = f"process {pid}" if pid.isdigit() else "another process"
                who += f" ({command})" if command else ""
                raise error(
                    f"{path} is being written by {who}",
                    hint=hint or "wait for that process to finish, or write to another path",
                ) from None
            if _same_file(handle, self.path):
                break
            handle.close()  # its holder removed it as we opened it: take the new one
        handle.truncate(0)
        handle.write(f"{os.getpid()}\n{_command()}\n")  # one write: a reader sees both or none
        handle.flush()
        self._handle = handle

    def __enter__(self) -> "WriterLock":
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

    def release(self) -> None:
        """Remove the lock file, then let go: a writer that opened it meanwhile sees it removed
        and takes a fresh one."""
        if self._handle is not None:
            self.path.unlink(missing_ok=True)
            self._handle.close()
            self._handle = None


HOLDER_WAIT_SECONDS = 1.0  # the holder writes its PID just after it takes the lock


def _holder(handle) -> tuple[str, str]:
    """The PID and command written in a held lock file; waits briefly for a holder that has
    just locked it."""
    import time

    deadline = time.monotonic() + HOLDER_WAIT_SECONDS
    while True:
        handle.seek(0)
        pid, _, command = handle.read().strip().partition("\n")
        if pid.isdigit() or time.monotonic() > deadline:
            return pid, command.strip()
        time.sleep(0.01)


def _command() -> str:
    """This process's command line as a user would recognise it (``swm train --out runs/x``)."""
    import shlex

    program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    if program in ("__main__.py", "-m"):  # python -m swmcli
        program = "swm"
    return shlex.join([program, *sys.argv[1:]])[:COMMAND_CHARS]


def run_lock(run_dir: Path) -> WriterLock:
    """The writer lock of a run directory (``swm train``, fresh or resumed, and ``swm eval``,
    which writes its pictures there): a second writer is refused (exit 1) naming the holder."""
    return WriterLock(
        Path(run_dir).resolve(),
        error=SwmError,
        hint="wait for that process to finish, or use another run directory (--out)",
    )


def _same_file(handle, path: Path) -> bool:
    try:
        return os.fstat(handle.fileno()).st_ino == path.stat().st_ino
    except FileNotFoundError:
        return False


class ReaderLock:
    """A shared hold on a dataset while a reader opens it; ``pin`` then holds only the version it
    opened, for as long as it reads."""

    def __init__(self, path: Path):
        self._path = Path(path)
        self._handle = None
        self._pinned = None  # the version file held, once pinned
        try:
            handle = _open_lock(_readers_lock_path(path))
        except OSError:
            return  # a read-only place: nobody can write there either
        fcntl.flock(handle, fcntl.LOCK_SH)
        self._handle = handle

    def pin(self, version: int) -> None:
        """Hold ``version`` (shared) and let go of the whole dataset; where no version file can
        be made, keep holding the whole dataset (a writer then deletes nothing)."""
        if self._handle is None:
            return
        file = _reading_path(self._path) / f"{int(version)}.lock"
        while True:
            try:
                pinned = _open_lock(file)  # held while reading
            except OSError:
                return
            fcntl.flock(pinned, fcntl.LOCK_SH)
            if _same_file(pinned, file):
                break
            pinned.close()  # the last reader of that version removed it meanwhile: a fresh one
        self._handle.close()
        self._handle, self._pinned = pinned, file

    def release(self) -> None:
        """Let go; the last reader of a pinned version removes its file (a reader leaves
        nothing behind in the dataset)."""
        if self._handle is None:
            return
        if self._pinned is not None:
            try:
                fcntl.flock(self._handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._pinned.unlink(missing_ok=True)
                self._pinned.parent.rmdir()  # the last reader of any version: no folder left
            except OSError:  # BlockingIOError: another reader holds this version (or another)
                pass
        self._handle.close()
        self._handle = self._pinned = None


def _reading_path(path: Path) -> Path:
    return Path(path) / "_swm_reading"


def no_readers(path: Path):
    """An exclusive hold on the readers' lock if no process is opening ``path`` (or reading it
    through a swm that holds the whole dataset), else None.

    While it is held, a new reader waits (briefly) before opening the dataset.
    """
    handle = _open_lock(_readers_lock_path(path))
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def being_read(path: Path) -> bool:
    """True while a process holds the dataset at ``path`` open for reading (a local Lance
    dataset: its readers share a lock in it while they open it, then pin the version they
    read; a streaming train's included)."""
    if not _readers_lock_path(path).is_file():
        return False
    hold = no_readers(path)
    if hold is None:
        return True
    try:
        return bool(pinned_versions(path))
    finally:
        hold.close()


def pinned_versions(path: Path) -> set[int]:
    """The versions readers hold; the version files no one holds are removed. Call it under
    ``no_readers`` (no reader pins a version meanwhile)."""
    held = set()
    folder = _reading_path(path)
    for file in folder.iterdir() if folder.is_dir() else ():
        if not file.stem.isdigit() or file.suffix != ".lock":
            continue
        with _open_lock(file) as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held.add(int(file.stem))
                continue
            file.unlink()
    return held
