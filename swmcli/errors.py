"""The errors swm turns into one line, a hint and an exit code (1 runtime, 2 usage, 130 ^C).

A bad argument is also the Python exception a library user expects: every ``UsageError`` is a
``ValueError``, a missing key a ``KeyError``, an index out of range an ``IndexError`` and a path
that does not exist a ``FileNotFoundError``; ``DatasetError`` is kept for damaged data.
"""

import os
import sys


class SwmError(Exception):
    """A known failure: a one-line message, a hint that says what to do, and the exit code."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None, exit_code: int | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:  # KeyError would quote the message
        return self.message

    def __reduce__(self):  # through a process pool whole: hint and exit code kept
        return (_rebuilt, (type(self), self.message, dict(self.__dict__)))


def _rebuilt(kind: type, message: str, state: dict) -> "SwmError":
    error = Exception.__new__(kind)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error


class UsageError(SwmError, ValueError):
    """Bad flags, config or values: the user must change the command (exit 2)."""

    exit_code = 2


class MissingKeyError(UsageError, KeyError):
    """A key (dataset column, setting) that does not exist (exit 2)."""


class OutOfRangeError(UsageError, IndexError):
    """An index (clip, episode, row) outside what exists (exit 2)."""


class MissingPathError(UsageError, FileNotFoundError):
    """A dataset, run or config path that does not exist (exit 2)."""


class BudgetExceeded(UsageError):
    """A memory budget the host cannot hold, refused before anything was allocated (exit 2)."""

    def __init__(self, message: str, hint: str | None = None, *, needed: int, available: int):
        super().__init__(message, hint)
        self.needed = needed
        self.available = available


class DatasetError(SwmError):
    """A dataset that is damaged: truncated, corrupted, of an unreadable version (exit 1)."""


class CheckpointError(SwmError):
    """A run directory whose checkpoint or config is missing or unreadable."""


class UserCodeError(SwmError):
    """An error raised inside the user's own code (a ``--model`` factory, a policy, an env, a
    logger): named with the user's function, file and line, never as a bug in swm (exit 1)."""


class InternalError(RuntimeError):
    """An error of swm's own machinery (a dispatch mode, a hook) that surfaced while it ran the
    user's code: swm's, so ``blame_user`` names no user frame for it, whatever called it."""


# The files of the modules swm imports on the user's behalf (``--model``, ``--policy
# module:factory``, ``--env module:Id`` and its env's class): a traceback frame in one of them
# is the user's code.
_USER_FILES: set[str] = set()


def remember_user_file(file: str | None) -> None:
    """Note ``file`` (a module's ``__file__``) as the user's code; from then on an
    ``os._exit`` it calls is reported, not obeyed (``UserExit``)."""
    if file:
        _USER_FILES.add(os.path.realpath(file))
        os._exit = _exit_unless_user_code


class UserExit(SystemExit):
    """``os._exit`` called by the user's code: it would end swm at once, with nothing said and
    its exit code passed off as swm's; raised instead, and named as their error."""


_REAL_EXIT = os._exit


def _exit_unless_user_code(status: int) -> None:
    """``os._exit``, except when the user's code calls it (``UserExit``)."""
    if os.path.realpath(sys._getframe(1).f_code.co_filename) in _USER_FILES:
        raise UserExit(status)
    _REAL_EXIT(status)


def _user_frame(error: BaseException) -> tuple[str | None, str, int] | None:
    """(function, file, line) of the innermost frame of the user's code that ``error`` (or the
    error it was raised from) passed through; for a SyntaxError in a user file, its line."""
    import traceback

    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, InternalError):
            return None
        syntax = isinstance(error, SyntaxError) and error.filename
        if syntax and os.path.realpath(error.filename) in _USER_FILES:
            return None, error.filename, error.lineno or 0
        found = None
        for frame, line in traceback.walk_tb(error.__traceback__):
            file = frame.f_code.co_filename
            if os.path.realpath(file) in _USER_FILES:
                found = (frame.f_code.co_name, file, line)
        if found is not None:
            return found
        error = error.__cause__
    return None


def shown_path(file: str) -> str:
    """``file`` relative to the working directory when it lies under it, else as it is."""
    try:
        relative = os.path.relpath(file)
    except ValueError:  # another drive
        return file
    return file if relative.startswith("..") else relative


def blame_user(error: BaseException) -> UserCodeError | None:
    """A UserCodeError naming the user's function, file and line that ``error`` came from, or
    None when it did not pass through the user's code."""
    frame = _user_frame(error)
    if frame is None:
        return None
    function, file, line = frame
    file = shown_path(file)
    where = f"{file}:{line}" if function is None else f"{function} ({file}:{line})"
    if isinstance(error, UserExit):
        what = f"called os._exit({error.code!r})"
    elif isinstance(error, SystemExit):
        what = f"called sys.exit({error.code!r})"
    elif isinstance(error, SyntaxError):
        what = f"has a syntax error: {error.msg}"
    else:
        what = f"raised {type(error).__name__}: {first_line(error)}"
    return UserCodeError(
        f"your code {what}, in {where}",
        hint="the error is in your code, not in swm: fix it there (SWM_DEBUG=1 shows the "
        "whole traceback)",
    )


def first_line(error: BaseException) -> str:
    """An exception's message cut to its first line, for a one-line error.

    Drops the Rust source locations Lance appends (", /home/.../object_store.rs:1013:21").
    """
    import re

    try:
        lines = str(error).strip().splitlines()
    except Exception as unprintable:  # the user's __str__ may raise anything
        return f"{type(error).__name__} (its message cannot be shown: {type(unprintable).__name__})"
    if not lines:
        return type(error).__name__
    return re.sub(r",?\s*/\S+\.rs:\d+:\d+", "", lines[0])[:300]


def describe_unexpected(err: Exception) -> tuple[str, str]:
    """One line and a hint for an error no swm code anticipated: the user's code's (named with
    its function, file and line), the machine's, or a bug."""
    blamed = blame_user(err)
    if blamed is not None:
        return blamed.message, blamed.hint
    message = first_line(err)
    if isinstance(err, InternalError):
        return message, "this is a bug in swm: rerun with SWM_DEBUG=1 and report the traceback"
    if isinstance(err, MemoryError):
        return (
            f"out of memory: {message}",
            "lower --resolution, --batch-size or --max-steps (`swm memprofile` shows what fits)",
        )
    store = _object_store_failure(err)
    if store is not None:
        return store
    if isinstance(err, OSError):
        where = f"{err.filename}: " if err.filename else ""
        return (
            f"{where}{err.strerror or message}",
            "check the path, its permissions and the free disk space",
        )
    return (
        f"{type(err).__name__}: {message}",
        "this is a bug in swm: rerun with SWM_DEBUG=1 and report the traceback",
    )


# How an unreachable object store and a missing bucket read in boto's, s3fs's and Lance's errors.
_UNREACHABLE = (
    "EndpointConnectionError",
    "Could not connect to the endpoint",
    "Connection refused",
    "ConnectTimeout",
    "error sending request",
    "dns error",
)
_NO_BUCKET = ("NoSuchBucket", "specified bucket does not exist")


def _object_store_failure(err: Exception) -> tuple[str, str] | None:
    """One line naming the endpoint for an object store that cannot be reached or lacks the
    bucket (instead of a raw ``EndpointConnectionError`` or Lance's XML); None otherwise."""
    import re

    text = f"{type(err).__name__}: {err}"
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or "the AWS default endpoint"
    if any(word in text for word in _NO_BUCKET):
        found = re.search(r"<BucketName>([^<]+)</BucketName>", text)
        bucket = f"bucket {found.group(1)}" if found else "the bucket"
        return (
            f"{bucket} does not exist at {endpoint}",
            "create the bucket, or check the s3:// URI and AWS_ENDPOINT_URL",
        )
    if any(word in text for word in _UNREACHABLE):
        return (
            f"cannot reach the object store at {endpoint}",
            "check that it is running and that AWS_ENDPOINT_URL names it",
        )
    return None
