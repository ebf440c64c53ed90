"""Arrays to read batches into, reused once nothing else holds them.

A fresh batch array costs its page faults on every batch (about half a gather's time at 224x224,
measured by ``benchmarks/buffer.py``). An array handed out before is handed out again only when
the pool's own references are its only ones: a caller still holding a batch, or any view or
tensor of it, keeps that array out of reuse, so a batch is never written over while in use.
Thread-safe: reader threads take arrays at the same time.
"""

import sys
import threading
from collections.abc import Hashable

import numpy as np


class Spares:
    """Up to ``keep`` arrays per key, the newest kept when more were needed."""

    def __init__(self, keep: int = 2):
        self.keep = keep
        self._arrays: dict[Hashable, list[np.ndarray]] = {}
        self._lock = threading.Lock()

    def array(self, key: Hashable, shape: tuple[int, ...], dtype) -> np.ndarray:
        """A ``shape`` array of ``dtype`` that nobody holds: a spare one, else a new one."""
        dtype = np.dtype(dtype)
        with self._lock:
            arrays = self._arrays.setdefault(key, [])
            for index in range(len(arrays)):
                # Two references: the list's and getrefcount's argument. Anything more is a holder.
                if (
                    sys.getrefcount(arrays[index]) == 2
                    and arrays[index].shape == shape
                    and arrays[index].dtype == dtype
                ):
                    return arrays[index]
            array = np.empty(shape, dtype)
            arrays[:] = [*arrays[max(0, len(arrays) - self.keep + 1) :], array]
            return array

    def clear(self) -> None:
        """Let every spare go (arrays still held elsewhere live on with their holders)."""
        with self._lock:
            self._arrays.clear()
