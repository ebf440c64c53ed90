"""Ctrl-C and SIGTERM as a request to stop at the next safe point, not an exception anywhere.

A ``KeyboardInterrupt`` raised inside an optimizer step or a file write can leave half-updated
weights or a half-written file; raised inside a weakref callback it is swallowed and the work goes
on. Inside ``deferred_interrupts()`` the first signal only sets a flag that the loop checks between
units of work (after a training step, after an episode); a second one raises at once, so a stuck
loop can still be stopped.
"""

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def deferred_interrupts() -> Iterator[Callable[[], bool]]:
    """Yields ``requested()``: True once Ctrl-C or SIGTERM arrived. Handlers restored on exit.

    Off the main thread (where Python allows no signal handlers) signals keep their handlers and
    ``requested()`` stays False.
    """
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return

    def handler(signum, frame) -> None:
        if received:
            raise KeyboardInterrupt
        received.append(signum)

    previous = {signum: signal.signal(signum, handler) for signum in SIGNALS}
    try:
        yield lambda: bool(received)
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
