"""Where and how the model runs: device, dtype (and why), autocast, compile, transfers, inference.

One place used by train, eval and memprofile::

    runner = make_runner(bf16=cfg.runtime.bf16, compile=cfg.runtime.compile)
    model = runner.prepare(model)                 # on the device, compiled if asked
    batch = runner.to_device(numpy_or_tensor_batch)   # non-blocking, pixels stay uint8
    with runner.autocast():
        terms = objective(batch)       # interface.Objective: the model's loss terms
    with runner.inference(model):                 # eval: no autograd at all
        ...

fp32 is the CPU default (bf16 autocast on a CPU is far slower than fp32 unless the CPU has native
bf16 kernels); on CUDA, bf16 is used when asked and supported.
"""

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

#: The world-model protocol's methods (models/interface.py) that ``--compile`` compiles, each
#: where the model has it: a model's own ``loss`` is its whole training forward.
COMPILED_METHODS = ("encode", "predict", "loss")


@dataclass
class Runner:
    """The execution choices of one command, and the reasons given to the user."""

    device: torch.device
    dtype: torch.dtype  # the autocast dtype; float32 means no autocast
    dtype_reason: str
    compile: bool

    @property
    def device_type(self) -> str:
        return self.device.type

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 autocast around forward passes, or a no-op context in fp32."""
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        """Move ``model`` to the device and, if asked, compile its ``encode``, ``predict`` and
        its own ``loss`` where it has one.

        Each is compiled separately (their shapes differ: frames vs token sequences; a loss
        calling the other two traces through them), for any protocol model; the plain module
        stays the one saved and the fallback when compilation fails.
        """
        model.to(self.device)
        if self.compile:
            # Instance attributes shadow the methods: nothing enters the module tree or the
            # state_dict, and ``eager`` deletes them to fall back to the plain methods.
            for name in compiled_methods(model):
                object.__setattr__(model, name, torch.compile(getattr(model, name)))
        return model

    def compile_note(self, model: torch.nn.Module) -> str | None:
        """One line with compile on: what training's step compiles, and what runs eager and
        why; None with compile off."""
        if not self.compile:
            return None
        optimizer = "the optimizer step (torch's own AdamW kernels)"
        if "loss" in compiled_methods(model):
            return (
                "compile: the model's own loss (its whole forward) and its backward, encode and "
                f"predict; eager: {optimizer}"
            )
        return (
            "compile: encode and predict and their backward; eager: swm's loss terms around "
            f"them (a few reductions, little to gain) and {optimizer}"
        )

    def eager(self, model: torch.nn.Module) -> None:
        """Drop the compiled methods: run the plain ones (the eval fallback)."""
        for name in COMPILED_METHODS:
            model.__dict__.pop(name, None)

    def to_device(self, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """numpy arrays or tensors -> tensors on the device, copied without blocking.

        Pixels stay uint8 until the model normalizes them on the device (4x fewer bytes moved).
        With CUDA, pinned host tensors (the DataLoader pins them) make the copy asynchronous.
        """
        moved = {}
        for key, value in batch.items():
            tensor = torch.as_tensor(value)
            moved[key] = tensor.to(self.device, non_blocking=True)
        return moved

    @contextlib.contextmanager
    def inference(self, model: torch.nn.Module) -> Iterator[torch.nn.Module]:
        """Gradient-free evaluation: eval mode, ``requires_grad_(False)``, ``inference_mode``;
        the model's mode and ``requires_grad`` flags are restored after (online training plans
        with the model it trains)."""
        training = model.training
        wanted = [p.requires_grad for p in model.parameters()]
        model.eval()
        model.requires_grad_(False)
        try:
            with torch.inference_mode(), self.autocast():
                yield model
        finally:
            model.train(training)
            for parameter, flag in zip(model.parameters(), wanted, strict=True):
                parameter.requires_grad_(flag)


def compiled_methods(model: torch.nn.Module) -> list[str]:
    """The methods of ``COMPILED_METHODS`` that ``model`` has."""
    return [name for name in COMPILED_METHODS if callable(getattr(model, name, None))]


def choose_device(requested: str | None = None) -> torch.device:
    """``requested`` if given, else CUDA when available, else the CPU."""
    if requested:
        return torch.device(requested)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def cpu_has_native_bf16() -> bool:
    """Whether this CPU has bf16 instructions (AVX512-BF16 or AMX) that oneDNN can use."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def choose_dtype(bf16: bool, device: torch.device) -> tuple[torch.dtype, str]:
    """The autocast dtype for ``device`` and one line saying why it was chosen."""
    if not bf16:
        return torch.float32, "fp32: the default (pass --bf16 for bf16 autocast)"
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return torch.bfloat16, "bf16: requested, CUDA supports it"
        return torch.float32, "fp32: bf16 requested but this GPU has no bf16 support"
    if cpu_has_native_bf16():
        return torch.bfloat16, "bf16: requested; this CPU has native bf16, still often slower"
    return torch.bfloat16, "bf16 on a CPU without native bf16: slow (emulated)"


def make_runner(
    bf16: bool = False,
    compile: bool = False,
    device: str | None = None,
    cpu_threads: int | None = None,
) -> Runner:
    """The runner for a command: device, dtype with its reason, whether to compile.

    ``cpu_threads`` sets torch's intra-op threads; on a CPU shared with other jobs one thread
    avoids the stalls of threads waiting for each other at every operator.
    """
    if cpu_threads is not None:
        torch.set_num_threads(cpu_threads)
    chosen = choose_device(device)
    dtype, reason = choose_dtype(bf16, chosen)
    return Runner(device=chosen, dtype=dtype, dtype_reason=reason, compile=compile)


def untrack_tensors_if_compiling(runner: Runner, monitor) -> str | None:
    """With compile on, turn off the monitor's live-tensor tracking; returns the note to show.

    Tracking runs every operator through a TorchDispatchMode, under which ``torch.compile``
    silently runs the eager code; measured with it on, ``--compile`` would compile nothing.
    """
    if runner.compile and getattr(monitor, "track_tensors", False):
        monitor.track_tensors = False
        return "compile on: live tensor bytes not tracked (tracking would disable compilation)"
    return None
