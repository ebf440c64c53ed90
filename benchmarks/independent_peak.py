"""A training step's peak tensor memory on the CPU, measured without swm, to check
`swm memprofile --predict-for cpu` against.

The model is any protocol model with its own ``loss`` (docs/bring-your-model.md), built by its
factory; nothing of swm is imported. The step is the one `swm train` runs (forward under CPU
autocast with --bf16, backward, global-norm clipping unless the optimizer steps in backward,
AdamW: foreach unless --optimizer-impl says otherwise), twice, as memprofile predicts it; the
memory techniques are made here with torch's own parts. Two counts of the peak:

- ``profiler``: torch.profiler's allocator events (``profile_memory=True``), a running sum from
  the bytes alive when it starts (parameters, buffers, the batch);
- ``storages``: a dispatch mode of this file counting every tensor storage from its first sight
  to its free (weakref finalizers).

    python benchmarks/independent_peak.py --model path/to/model.py:build --resolution 224 \
        --batch-size 16 [--bf16] [--checkpoint layers|CLASS] [--in-backward] [--count storages] \
        [--optimizer-impl foreach|for-loop|fused]
"""

import argparse
import contextlib
import importlib.util
import inspect
import json
import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import checkpoint


class Checkpointed(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return checkpoint(self.inner, x, use_reentrant=False)


def wrap(module, chosen):
    for name, child in module.named_children():
        if chosen(child):
            setattr(module, name, Checkpointed(child))
        else:
            wrap(child, chosen)


IMPLEMENTATIONS = {
    "foreach": {"foreach": True},
    "for-loop": {"foreach": False},
    "fused": {"fused": True},
}


def in_backward_adamw(net, impl: dict):
    optimizers, norms = {}, []

    def hook(parameter):
        norms.append(torch.linalg.vector_norm(parameter.grad.detach()))
        optimizers[parameter].step()
        parameter.grad = None

    for parameter in net.parameters():
        optimizers[parameter] = torch.optim.AdamW(
            [parameter], lr=5e-4, weight_decay=0.05, **impl
        )
        parameter.register_post_accumulate_grad_hook(hook)
    return norms


class Storages(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ids = set()
        self.live = self.peak = 0

    def count(self, tensor):
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self.ids:
            return
        self.ids.add(key)
        size = storage.nbytes()
        self.live += size
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self.free, key, size)

    def free(self, key, size):
        self.ids.discard(key)
        self.live -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves((args, kwargs, out)):
            if isinstance(leaf, torch.Tensor):
                self.count(leaf)
        return out


def load_factory(spec: str):
    """``path/to/file.py:function`` -> the function."""
    path, _, name = spec.rpartition(":")
    module_spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return getattr(module, name)


def build(spec: str, shape: dict):
    """The model, its factory given the settings of ``shape`` its signature names."""
    factory = load_factory(spec)
    parameters = inspect.signature(factory).parameters
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    return factory(**{k: v for k, v in shape.items() if takes_all or k in parameters})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True, help="path/to/file.py:function")
    parser.add_argument("--action-dim", type=int, default=2)
    parser.add_argument("--resolution", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--history-len", type=int, default=3)
    parser.add_argument("--frameskip", type=int, default=5)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--checkpoint")
    parser.add_argument("--in-backward", action="store_true")
    parser.add_argument("--count", choices=["profiler", "storages"], default="profiler")
    parser.add_argument("--optimizer-impl", choices=list(IMPLEMENTATIONS), default="foreach")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    shape = {"resolution": args.resolution, "action_dim": args.action_dim}
    shape |= {"frameskip": args.frameskip, "history_len": args.history_len}
    net = build(args.model, shape)
    if args.checkpoint == "layers":
        lists = [m for m in net.modules() if isinstance(m, torch.nn.ModuleList)]
        members = {id(child) for lst in lists for child in lst}
        wrap(net, lambda m: id(m) in members)
    elif args.checkpoint:
        wrap(net, lambda m: type(m).__name__ == args.checkpoint)
    net.train()
    side, steps = args.resolution, args.history_len
    batch = {
        "pixels": torch.randint(0, 256, (args.batch_size, steps, side, side, 3), dtype=torch.uint8),
        "action": torch.zeros(args.batch_size, steps, args.frameskip * args.action_dim),
    }
    if args.in_backward:
        norms = in_backward_adamw(net, IMPLEMENTATIONS[args.optimizer_impl])
        optimizer = None
    else:
        impl = IMPLEMENTATIONS[args.optimizer_impl]
        optimizer = torch.optim.AdamW(net.parameters(), lr=5e-4, weight_decay=0.05, **impl)

    def step():
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=True)
        else:
            norms.clear()
        autocast = (
            torch.autocast("cpu", dtype=torch.bfloat16) if args.bf16 else contextlib.nullcontext()
        )
        with autocast:
            terms = net.loss(batch)
        terms["loss"].backward()
        logged = {key: value.detach() for key, value in terms.items()}
        if optimizer is not None:
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            optimizer.step()
        else:
            torch.linalg.vector_norm(torch.stack(norms))
        return logged

    alive = [*net.parameters(), *net.buffers(), *batch.values()]
    if args.count == "storages":
        counter = Storages()
        for tensor in alive:
            counter.count(tensor)
        with counter:
            step()
            step()
        peak = counter.peak
    else:
        start = sum(t.untyped_storage().nbytes() for t in alive)
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
        ) as prof:
            step()
            step()
        # Every allocator event (+bytes allocated, -bytes freed) in time order.
        raw = prof.profiler.kineto_results.events()
        events = sorted((e for e in raw if e.name() == "[memory]"), key=lambda e: e.start_ns())
        running = highest = 0
        for event in events:
            running += event.nbytes()
            highest = max(highest, running)
        peak = start + highest
    print(json.dumps({"peak_bytes": peak, "count": args.count}))


if __name__ == "__main__":
    main()
