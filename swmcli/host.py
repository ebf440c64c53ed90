"""The host's RAM: how much it has and can give now, and how this process hands freed memory back.

The ground floor's one look at the machine: the ReplayBuffer and the loaders ask it before they
allocate, the memory report and ``swm memprofile`` read it.
"""

import ctypes
import os
from pathlib import Path


def proc_bytes_field(path: str, name: str) -> int | None:
    """Bytes of a ``name: N kB`` line of a /proc file (None where there is no such file)."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(f"{name}:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def available_host_bytes() -> int:
    """Bytes of RAM the host can give without swapping (MemAvailable), else free physical pages."""
    available = proc_bytes_field("/proc/meminfo", "MemAvailable")
    if available is not None:
        return available
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def total_host_bytes() -> int:
    """Physical RAM of the host in bytes."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


# glibc's mallopt parameters (malloc.h) and what reading streams sets them to.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
KEEP_FREED_BELOW = 64 * 2**20


KEEP_FREED_TOP = 128 * 2**20


_keeping_freed = False


def keep_freed_memory() -> bool:
    """Let this process reuse the memory it frees instead of handing it to the kernel.

    A training step frees and reallocates its activations, and Lance decodes every take into
    fresh buffers of a few MiB; glibc serves such sizes with ``mmap`` and gives them back at
    once, so each step and each batch faults its pages in again (about 6,400 page faults and a
    third of the reading time per batch of 256 frames at 224x224, measured here). Serving
    allocations under ``KEEP_FREED_BELOW`` from the heap and trimming it only above
    ``KEEP_FREED_TOP`` of free memory removes those faults; the cost is that up to that much
    freed memory stays mapped to this process for its next use. Set where a process starts (the
    CLI's ``main``, ``run_train``, each DataLoader worker's reader); once per process; False
    where the C library is not glibc (nothing changes there).
    """
    global _keeping_freed
    if not _keeping_freed:
        try:
            libc = ctypes.CDLL(None)
            libc.gnu_get_libc_version  # noqa: B018 - only glibc has it (and these parameters)
        except (OSError, AttributeError):
            return False
        libc.mallopt(_M_MMAP_THRESHOLD, KEEP_FREED_BELOW)
        libc.mallopt(_M_TRIM_THRESHOLD, KEEP_FREED_TOP)
        _keeping_freed = True
    return True
