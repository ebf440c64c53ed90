"""What a step will use, predicted without allocating: live tensor bytes by category.

``trace_step_peak`` runs a step on fake tensors under ``CategorisedLiveBytes`` and gives the peak
of live tensor bytes by category (parameters, gradients, optimizer state, inputs, activations,
temporaries); ``cuda_autocast_on_cpu`` makes a CPU trace keep the dtypes CUDA bf16 autocast keeps
(a trace for the CPU leaves CPU autocast as it is), and ``cuda_allowance_bytes`` adds what is not a
tensor. Measuring is ``measure.py``.
"""

import contextlib
import functools
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from swmcli.errors import InternalError
from swmcli.memory.measure import run_op

#: What a byte alive at the peak is for. "optimizer_state" also holds the temporaries of the
#: optimizer step (foreach AdamW makes a few parameter-sized ones), as torch's MemTracker does.
CATEGORIES = (
    "parameters",
    "buffers",
    "gradients",
    "optimizer_state",
    "inputs",
    "activations",
    "temporaries",
    "ddp_buckets",  # data-parallel only: DDP's flat gradient buffers, added by the predictor
    "fsdp_gathered",  # sharded only: the whole weights FSDP gathers, added by the predictor
)

#: The CUDA caching allocator rounds each allocation up to a multiple of 512 bytes;
#: max_memory_allocated counts the rounded sizes, so predictions round each storage the same way.
CUDA_ROUNDING_BYTES = 512


@dataclass
class StepPeak:
    """The most tensor bytes alive at once in a traced step, and what they were at that moment."""

    peak_bytes: int
    by_category: dict[str, int]
    seconds: float


class CategorisedLiveBytes:
    """Live bytes of tensor storages by category, through a torch dispatch mode (real or fake).

    Parameters, buffers and inputs are registered up front; every other storage an operator
    touches is counted from its first sight until it is freed, as an activation in forward code,
    a temporary inside the autograd engine, optimizer state inside ``Optimizer.step``, and moved
    to "gradients" once autograd accumulates it into a ``.grad``. ``round_bytes`` rounds each
    storage up the way an allocator does (512 for CUDA).
    """

    def __init__(self, round_bytes: int = 1) -> None:
        self.round_bytes = round_bytes
        self.live = dict.fromkeys(CATEGORIES, 0)
        self.total = 0
        self.peak = 0
        self.at_peak = dict(self.live)
        self._in_optimizer = False
        self._handles: list = []
        self._mode = None
        from torch.utils.weak import WeakIdKeyDictionary

        # storage -> [category, bytes]; weak, so a freed storage is forgotten
        self._records = WeakIdKeyDictionary()

    def _size(self, storage) -> int:
        nbytes = storage.nbytes()
        return -(-nbytes // self.round_bytes) * self.round_bytes

    def _add(self, category: str, nbytes: int) -> None:
        self.live[category] += nbytes
        self.total += nbytes
        if self.total > self.peak:
            self.peak = self.total
            self.at_peak = dict(self.live)

    def _free(self, record: list) -> None:
        category, nbytes = record
        self.live[category] -= nbytes
        self.total -= nbytes

    def _track(self, storage, category: str, recategorise: bool = False) -> None:
        record = self._records.get(storage)
        if record is None:
            record = [category, self._size(storage)]
            self._records[storage] = record
            self._add(category, record[1])
            weakref.finalize(storage, self._free, record)
            return
        size = self._size(storage)
        if size != record[1]:  # resized in place by an out= kernel
            self._free(record)
            record[1] = size
            self._add(record[0], size)
        if recategorise and record[0] != category:
            self._free(record)
            record[0] = category
            self._add(category, size)

    def track(self, tensors, category: str) -> None:
        """Count tensors made before tracking (a batch, a state dict) under ``category``."""
        import torch
        from torch.utils._pytree import tree_leaves

        for leaf in tree_leaves(tensors):
            if isinstance(leaf, torch.Tensor):
                self._track(leaf.untyped_storage(), category, recategorise=True)

    def track_module(self, module) -> None:
        """Count a module's parameters and buffers, and its gradients as they are accumulated."""
        self.track(list(module.parameters()), "parameters")
        self.track(list(module.buffers()), "buffers")
        for param in module.parameters():
            if param.requires_grad:
                hook = param.register_post_accumulate_grad_hook(
                    lambda p: self.track(p.grad, "gradients")
                )
                self._handles.append(hook)

    def _category_now(self) -> str:
        import torch

        if self._in_optimizer:
            return "optimizer_state"
        if torch._C._current_autograd_node() is not None:
            return "temporaries"
        return "activations"

    def __enter__(self) -> "CategorisedLiveBytes":
        import torch
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )
        from torch.utils._python_dispatch import TorchDispatchMode

        tracker = self
        reads_device = torch.ops.prim.device.default

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func is reads_device:
                    # Allocates nothing, and most calls of a fake step are these (the autograd
                    # engine and every foreach kernel ask each tensor): the tensor answers.
                    return args[0].device
                out = cpu_norm_statistics(func, args, run_op(self, func, args, kwargs or {}))
                try:
                    category = tracker._category_now()
                    for tensor in _tensors((out, args, kwargs)):
                        tracker._track(tensor.untyped_storage(), category)
                except Exception as error:
                    raise InternalError(f"swm's tensor trace failed: {error}") from error
                return out

        def _enter_step(*_):
            self._in_optimizer = True

        def _leave_step(optimizer, *_):
            self._in_optimizer = False
            self.track([list(s.values()) for s in optimizer.state.values()], "optimizer_state")

        self._handles += [
            register_optimizer_step_pre_hook(_enter_step),
            register_optimizer_step_post_hook(_leave_step),
        ]
        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        self._mode = None
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def cpu_norm_statistics(func, args: tuple, out):
    """``out`` of ``func``, with a CPU LayerNorm's or GroupNorm's saved mean and rstd in float32
    where the CPU kernel keeps them so.

    Under CPU autocast a norm takes bf16 (or fp16) activations with float32 weights; the CPU
    kernel then saves its statistics for backward in float32, the weights' type, while the fake
    kernel gives them the input's type (half their bytes). Real kernels' outputs pass as they are.
    """
    import torch

    weight_index = _norm_weight_index().get(func)
    if weight_index is None or out[1].dtype not in (torch.bfloat16, torch.float16):
        return out
    weight = args[weight_index] if len(args) > weight_index else None
    if weight is None or weight.dtype != torch.float32 or out[1].device.type != "cpu":
        return out
    return out[0], out[1].float(), out[2].float()


@functools.cache
def _norm_weight_index() -> dict:
    """The norms whose CPU statistics follow their weights' type: where their weight is."""
    import torch

    aten = torch.ops.aten
    return {aten.native_layer_norm.default: 2, aten.native_group_norm.default: 1}


def _tensors(value) -> Iterator:
    """The tensors in an operator's outputs, arguments and keyword arguments (tuples, lists and
    dicts of them): what ``torch.utils._pytree.tree_leaves`` finds there, at a fraction of its
    cost on the hundreds of thousands of operators a large model's trace dispatches."""
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, tuple | list):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def trace_step_peak(
    module,
    make_step: Callable[[Any], tuple[Any, Callable[[], Any]]],
    *,
    fake: bool = True,
    round_bytes: int = CUDA_ROUNDING_BYTES,
) -> StepPeak:
    """The peak of live tensor bytes, by category, of a step run on ``module``.

    ``make_step(module)`` returns ``(alive, run)``: what is alive before the step, as a mapping
    of category to tensors (its ``"inputs"``, already "on the device"; an ``"optimizer_state"``
    made before it), and a callable doing the work measured (an optimizer step; one eval
    forward). Parameters, buffers and ``alive`` count from the start.

    With ``fake`` the step runs on a fake copy of ``module`` (FakeTensorMode: exact shapes,
    dtypes and storage sizes, no memory touched), so a step needing tens of GB traces in about a
    second on a CPU and ``module`` itself is left as it was. Trace CPU modules: fake CUDA tensors
    need a CUDA build of torch. The CUDA context, cuBLAS/cuDNN workspaces and the caching
    allocator's slack are not tensors and are not included (see ``cuda_allowance_bytes``).
    """
    start = time.perf_counter()
    mode = _new_fake_mode() if fake else contextlib.nullcontext()
    # Copied outside the mode: its real tensors are converted, not traced.
    traced = _fake_copy(module, mode) if fake else module
    with mode:
        alive, run = make_step(traced)
        tracker = CategorisedLiveBytes(round_bytes)
        tracker.track_module(traced)
        for category, tensors in alive.items():
            tracker.track(tensors, category)
        with tracker:
            run()
        del alive, run, traced
    return StepPeak(tracker.peak, tracker.at_peak, time.perf_counter() - start)


def _fake_copy(module, mode):
    """A copy of ``module`` whose parameters and buffers are fake tensors of ``mode``."""
    # Built real, then converted: a module built under a fake mode breaks where it deep-copies
    # its layers (nn.TransformerEncoder does). ``_apply`` swaps the shared real tensors for fakes
    # in the copy's own dicts, so ``module`` is left as it was and its weights are never copied.
    return copy_sharing_weights(module)._apply(mode.from_tensor)


def copy_sharing_weights(module):
    """A deep copy of ``module`` (its own submodules, attributes and parameter dicts) that shares
    its parameters and buffers: a large model's weights (680 MB at 170 M parameters) are not
    copied to change its structure or to trace it."""
    import copy

    shared = {id(tensor): tensor for tensor in (*module.parameters(), *module.buffers())}
    return copy.deepcopy(module, shared)


def _new_fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode()


#: Device memory a training process needs beyond its tensors, for fitting a budget: the CUDA
#: context and kernels (about 500 MiB on recent GPUs; outside the allocator's counters), cuBLAS
#: and cuDNN workspaces (tens to hundreds of MiB), and the caching allocator's rounding and
#: fragmentation (reserved over allocated, typically under 10%).
CUDA_CONTEXT_BYTES = 512 * 2**20
CUDA_WORKSPACE_BYTES = 256 * 2**20
ALLOCATOR_OVERHEAD = 0.10


def cuda_allowance_bytes(peak_bytes: int) -> int:
    """Bytes to add to a predicted tensor peak before comparing it with a GPU's memory."""
    return CUDA_CONTEXT_BYTES + CUDA_WORKSPACE_BYTES + int(ALLOCATOR_OVERHEAD * peak_bytes)


#: Functions CUDA autocast runs in float32 (casting bf16/fp16 inputs up) but CPU autocast leaves
#: in the input's precision; from torch's autocast op reference. CPU autocast already matches CUDA
#: on the ops it lowers (conv, linear, matmul, attention), so a trace adds only these casts.
CUDA_FP32_FUNCTIONS = frozenset(
    " ".join(
        (
            "__pow__ __rpow__ __rdiv__ __rtruediv__ pow acos asin cosh sinh tan exp expm1 log",
            "log10 log1p log2 erfinv reciprocal rsqrt cumprod cumsum prod sum norm normalize dist",
            "cdist pdist renorm cosine_similarity group_norm layer_norm softmax softmin",
            "log_softmax softplus mse_loss l1_loss smooth_l1_loss kl_div nll_loss cross_entropy",
            "binary_cross_entropy_with_logits cosine_embedding_loss hinge_embedding_loss",
            "margin_ranking_loss multilabel_margin_loss multi_margin_loss poisson_nll_loss",
            "soft_margin_loss triplet_margin_loss",
        )
    ).split()
)


@contextmanager
def cuda_fp32_casts() -> Iterator[None]:
    """While CPU autocast runs in bf16 or fp16: the float32 casts CUDA autocast makes and CPU's
    does not.

    Lets a trace on CPU tensors keep what a CUDA bf16 step keeps: e.g. GroupNorm and LayerNorm
    take float32 copies of their bf16 inputs and return float32, which the next layer saves.
    The casts are made where those functions are called from Python (a torch function mode), so
    they are recorded by autograd as CUDA's are; calls nested inside other torch functions are
    not seen (none of the world model's memory hinges on one). It casts only while CPU autocast
    lowers (as CUDA's casts happen only under autocast): ``recompute_with_cuda_casts`` enters it
    for the recomputation of checkpointed modules, which torch runs under its forward's autocast
    but outside the function modes the forward ran under.
    """
    import torch
    from torch.overrides import TorchFunctionMode

    lowered = (torch.bfloat16, torch.float16)

    def up(value):
        if isinstance(value, torch.Tensor) and value.dtype in lowered:
            return value.float()
        return value

    class _Fp32Casts(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if (
                getattr(func, "__name__", None) in CUDA_FP32_FUNCTIONS
                and torch.is_autocast_enabled("cpu")
                and torch.get_autocast_dtype("cpu") in lowered
            ):
                args = tuple(up(a) for a in args)
                kwargs = {k: up(v) for k, v in kwargs.items()}
            return func(*args, **kwargs)

    with _Fp32Casts():
        yield


def recompute_with_cuda_casts(module) -> None:
    """Make the checkpointed modules of ``module`` (``techniques.checkpoint_activations``) recompute
    under ``cuda_fp32_casts`` too: torch recomputes under its forward's autocast but not under the
    function modes around it, so a checkpointed GroupNorm would recompute in bf16 what its
    forward saved in float32 (torch's CheckpointError). For traced copies only."""
    from functools import partial

    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    for wrapper in module.modules():
        if isinstance(wrapper, CheckpointWrapper):
            wrapper.checkpoint_fn = partial(wrapper.checkpoint_fn, context_fn=_recompute_casts)


def _recompute_casts():
    return contextlib.nullcontext(), cuda_fp32_casts()


@contextmanager
def cuda_autocast_on_cpu(dtype) -> Iterator[None]:
    """CPU autocast to ``dtype`` with CUDA autocast's float32 casts (``cuda_fp32_casts``)."""
    import torch

    with cuda_fp32_casts(), torch.autocast("cpu", dtype=dtype):
        yield
