"""How much memory there is, and how much a command used: host RAM and CUDA, per phase.

On CUDA the peaks come from the caching allocator (reset at the start of each phase). Without
CUDA the report gives the host's peak RSS (reset per phase through ``/proc/self/clear_refs`` where
Linux allows it) and the peak of live tensor bytes seen by a torch dispatch mode.

What a step *will* use is predicted in ``trace.py`` and ``predict.py``.
"""

import resource
import sys
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from swmcli.errors import InternalError
from swmcli.host import proc_bytes_field, total_host_bytes


def run_op(mode, func, args: tuple, kwargs: dict):
    """``func(*args, **kwargs)`` inside the dispatch mode ``mode``, as it runs without the mode.

    An operator torch implements by composing others (``CompositeImplicitAutograd``: GRUCell's
    ``gru_cell``, ``linear``) reaches a dispatch mode whole only where autograd is off
    (``inference_mode``), and below autocast: run as it is, its parts would skip autocast's casts
    (bf16 activations against fp32 weights: "mat1 and mat2 must have the same dtype"). Its parts
    run instead with the caller's dispatch state restored (autocast on again) and ``mode``
    pushed back, so each is cast and counted as it would be untracked. An operator that still
    fails is run once more untracked: failing there too, the error is the caller's; running, it
    is swm's (``InternalError``).
    """
    import torch

    try:
        if _is_composite(func):
            with torch._C._RestorePythonTLSSnapshot(), mode:
                return func.decompose(*args, **kwargs)
        return func(*args, **kwargs)
    except InternalError:
        raise
    except Exception as error:
        with torch._C._RestorePythonTLSSnapshot():
            func(*args, **kwargs)  # raises the caller's own error, if it is theirs
        raise InternalError(
            f"swm's live-tensor tracking broke {func} ({type(error).__name__}: {error}), "
            "which runs without it"
        ) from error


_COMPOSITE: dict = {}


def _is_composite(func) -> bool:
    """Whether torch implements ``func`` only by composing other operators (cached per
    operator)."""
    import torch

    found = _COMPOSITE.get(func)
    if found is None:
        keys = torch._C.DispatchKey

        def has(key) -> bool:
            return torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), key)

        # Only composed: an operator with a kernel of its own as well (silu_backward) runs it.
        found = has(keys.CompositeImplicitAutograd) and not (has(keys.CPU) or has(keys.Meta))
        _COMPOSITE[func] = found
    return found


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (since the last reset, on Linux)."""
    peak = proc_bytes_field("/proc/self/status", "VmHWM")
    if peak is not None:
        return peak
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark so the next phase is measured alone (False: unsupported)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False




def cuda_status() -> str:
    """'cuda' when this process uses CUDA; else why not, without importing torch just to ask."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return "cuda"
    if torch is None and any(Path("/proc/driver/nvidia/gpus").glob("*")):
        return "CUDA device present, not used by this command"
    return "no CUDA device"


@dataclass
class PhasePeak:
    """Peak memory of one phase of a command, in bytes (None where not measured)."""

    name: str
    seconds: float
    host_peak_rss_bytes: int
    live_tensor_peak_bytes: int | None = None
    cuda_allocated_bytes: int | None = None
    cuda_reserved_bytes: int | None = None
    cuda_device_bytes: int | None = None
    cuda_alloc_retries: int | None = None
    cuda_ooms: int | None = None


def combined_peak(name: str, phases: list[PhasePeak]) -> PhasePeak:
    """One row for several phases (a whole run, or every rank's): the largest of each peak, the
    longest time, the sum of allocator retries and OOMs."""

    def largest(values):
        known = [v for v in values if v is not None]
        return max(known) if known else None

    def total(values):
        known = [v for v in values if v is not None]
        return sum(known) if known else None

    return PhasePeak(
        name,
        max(p.seconds for p in phases),
        max(p.host_peak_rss_bytes for p in phases),
        largest(p.live_tensor_peak_bytes for p in phases),
        largest(p.cuda_allocated_bytes for p in phases),
        largest(p.cuda_reserved_bytes for p in phases),
        largest(p.cuda_device_bytes for p in phases),
        total(p.cuda_alloc_retries for p in phases),
        total(p.cuda_ooms for p in phases),
    )


@dataclass
class MemoryReport:
    """What a command used: one PhasePeak per phase and the CUDA status in words."""

    cuda: str
    phases: list[PhasePeak] = field(default_factory=list)
    host_total_bytes: int = field(default_factory=total_host_bytes)

    def to_dict(self) -> dict:
        return asdict(self)


class LiveTensorBytes:
    """Live and peak bytes of tensor storages, seen through a torch dispatch mode.

    Every storage an operator reads or returns is counted once until it is freed, so the peak is
    the most tensor memory alive at once inside the tracked span (a CPU stand-in for
    ``torch.cuda.max_memory_allocated``). Works on real and on fake tensors.
    """

    def __init__(self) -> None:
        from torch.utils.weak import WeakIdKeyDictionary

        self.live = 0
        self.peak = 0
        self._mode = None
        # before __enter__ too: track_tensor counts parameters and batches made outside the span
        self._seen = WeakIdKeyDictionary()

    def _track(self, storage) -> None:
        if storage in self._seen:
            return
        nbytes = storage.nbytes()
        self._seen[storage] = nbytes
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._free, nbytes)

    def _free(self, nbytes: int) -> None:
        self.live -= nbytes

    def track_tensor(self, tensor) -> None:
        """Count a tensor made outside the tracked span (parameters, a batch) as live."""
        self._track(tensor.untyped_storage())

    def __enter__(self) -> "LiveTensorBytes":
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves

        tracker = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = run_op(self, func, args, kwargs or {})
                try:
                    for leaf in tree_leaves((args, kwargs, out)):
                        if isinstance(leaf, torch.Tensor):
                            tracker._track(leaf.untyped_storage())
                except Exception as error:
                    raise InternalError(f"swm's live-tensor tracking failed: {error}") from error
                return out

        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop counting (the peak so far is kept); nothing happens when already stopped."""
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None


class MemoryMonitor:
    """Measures each phase of a command alone: CUDA peaks reset at its start, else host peaks.

    ``track_tensors`` counts live tensor bytes on CPU (a dispatch mode: every operator costs more,
    1.3x on a training step), for commands that run torch. A phase that repeats one kind of work
    (training steps, planning episodes) calls ``stop_tracking`` once the first has run: its peak
    is the phase's, and the rest runs at full speed.
    """

    def __init__(self, track_tensors: bool = False) -> None:
        self.track_tensors = track_tensors
        self.report = MemoryReport(cuda=cuda_status())
        self._live: LiveTensorBytes | None = None

    def stop_tracking(self) -> None:
        """Stop counting live tensor bytes for the rest of the current phase (its peak so far is
        the phase's); nothing happens when the phase is not tracked."""
        if self._live is not None:
            self._live.stop()

    @contextmanager
    def phase(self, name: str, track_tensors: bool | None = None) -> Iterator[None]:
        """Measure the ``with`` body as phase ``name``; ``track_tensors`` overrides the monitor's
        choice (off for a body that traces fake tensors of its own)."""
        self.report.cuda = cuda_status()
        use_cuda = self.report.cuda == "cuda"
        torch = sys.modules.get("torch")
        if use_cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        reset_peak_rss()
        track = self.track_tensors if track_tensors is None else track_tensors
        live = LiveTensorBytes() if track and not use_cuda else None
        self._live = live
        start = time.perf_counter()
        try:
            if live is not None:
                live.__enter__()
            yield
        finally:
            if live is not None:
                live.stop()
            self._live = None
            peak = PhasePeak(name, time.perf_counter() - start, peak_rss_bytes())
            if live is not None:
                peak.live_tensor_peak_bytes = live.peak
            if use_cuda:
                torch.cuda.synchronize()
                stats = torch.cuda.memory_stats()
                peak.cuda_allocated_bytes = torch.cuda.max_memory_allocated()
                peak.cuda_reserved_bytes = torch.cuda.max_memory_reserved()
                peak.cuda_device_bytes = torch.cuda.get_device_properties(0).total_memory
                peak.cuda_alloc_retries = stats.get("num_alloc_retries", 0)
                peak.cuda_ooms = stats.get("num_ooms", 0)
            self.report.phases.append(peak)


def rank_peaks(every_rank: list) -> list:
    """Memory-panel rows for a data-parallel run: each rank's peaks over the whole run, and the
    largest of them (what one device must hold)."""
    rows = []
    for rank, phases in enumerate(every_rank):
        whole = combined_peak(f"rank {rank}: whole run", phases)
        rows.append(replace(whole, seconds=sum(p.seconds for p in phases)))
    return [*rows, combined_peak(f"max over {len(rows)} ranks", rows)]
