"""Memory, one floor, one story: what a step uses (``measure``), will use (``trace``,
``predict``), the levers that change it (``levers``) and the cheapest set that fits a budget
(``fitting``).

- ``measure.py``  host RAM and CUDA peaks per phase of a command, live tensor bytes on a CPU.
- ``trace.py``    live tensor bytes by category of any step run on fake tensors (no allocation).
- ``predict.py``  the steps swm runs (``training.step``), traced: one variant's peak, the
  largest batch in a budget, the preflight refusal of a step the device cannot hold.
- ``levers.py``   the memory levers a training step can switch on: activation checkpointing,
  the optimizer step fused into backward, fully sharded data parallel (FSDP2).
- ``fitting.py``  every combination of levers predicted, and the cheapest set that fits a budget.

It sits over ``training`` (it traces training's own step) and under the commands; what the
data layer asks of the host (the RAM available) is ``swmcli/host.py`` on the ground floor.
This floor returns data and never prints. Importing this package imports nothing.
"""
