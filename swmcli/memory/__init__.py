"""Memory: what a step uses (measure), will use (predict) and what to switch on so it fits (plan).

- ``measure.py``  host RAM and CUDA peaks per phase of a command, live tensor bytes on a CPU.
- ``trace.py``    live tensor bytes by category of any step run on fake tensors (no allocation).
- ``predict.py``  the steps swm runs, traced: one variant's peak, the largest batch in a budget,
  the preflight refusal of a step the device cannot hold.
- ``levers.py``   the memory levers a training step can switch on: activation checkpointing,
  the optimizer step fused into backward, fully sharded data parallel (FSDP2).
- ``plan.py``     every combination of levers predicted, and the cheapest set that fits a budget.

Floors (pyproject.toml): ``measure`` sits under ``core`` (the buffer and loaders ask it what the
host has), ``trace`` and ``levers`` beside it, ``predict`` over the training step it traces, and
``plan`` over ``predict``. Importing this package imports nothing.
"""
