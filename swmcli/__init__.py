"""swm: collect, store, stream, train and profile pixel world models inside a memory budget.

Importing ``swmcli`` stays light: the public names load their modules (and torch, Lance, h5py)
only when first used.
"""

__version__ = "0.1.0"

_LAZY = {
    "ReplayBuffer": "swmcli.data.buffer",
    "BudgetExceeded": "swmcli.errors",
    "SwmError": "swmcli.errors",
    "load_dataset": "swmcli.data.streaming",
    "make_loader": "swmcli.data.streaming",
    "open_writer": "swmcli.data.formats",
    "open_reader": "swmcli.data.formats",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'swmcli' has no attribute {name!r}")
