"""Memory: what a step uses (measure), will use (predict) and what to switch on so it fits (plan).

- ``measure.py``  host RAM and CUDA peaks per phase of a command, live tensor bytes on a CPU.
- ``trace.py``    live tensor bytes by category of any step run on fake tensors (no allocation).
- ``predict.py``  the steps swm runs, traced: one variant's peak, the largest batch in a budget,
  the preflight refusal of a step the device cannot hold.

Floors (pyproject.toml): ``measure`` sits under ``core`` (the buffer and loaders ask it what the
host has), ``trace`` beside it, ``predict`` over the training step it traces. Importing this package
imports nothing.
"""
