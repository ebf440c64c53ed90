"""The errors swm turns into one line, a hint and an exit code (1 runtime, 2 usage, 130 ^C)."""


class SwmError(Exception):
    """A known failure: a one-line message, a hint that says what to do, and the exit code."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None, exit_code: int | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(SwmError):
    """Bad flags, config or values: the user must change the command (exit 2)."""

    exit_code = 2


class BudgetExceeded(UsageError):
    """A memory budget the host cannot hold, refused before anything was allocated (exit 2)."""

    def __init__(self, message: str, hint: str | None = None, *, needed: int, available: int):
        super().__init__(message, hint)
        self.needed = needed
        self.available = available


class DatasetError(SwmError):
    """A dataset that is missing, of another format, truncated, corrupted or lacks a key."""


class CheckpointError(SwmError):
    """A run directory whose checkpoint or config is missing or unreadable."""


def first_line(error: BaseException) -> str:
    """An exception's message cut to its first line, for a one-line error.

    Drops the Rust source locations Lance appends (", /home/.../object_store.rs:1013:21").
    """
    import re

    lines = str(error).strip().splitlines()
    if not lines:
        return type(error).__name__
    return re.sub(r",?\s*/\S+\.rs:\d+:\d+", "", lines[0])[:300]
