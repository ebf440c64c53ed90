"""Memory, one floor, one story: what a step uses (``measure``), will use (``trace``,
``predict``) and the cheapest set of memory techniques that fits a budget (``fitting``).

- ``measure.py``  host RAM and CUDA peaks per phase of a command, live tensor bytes on a CPU.
- ``trace.py``    live tensor bytes by category of any step run on fake tensors (no allocation).
- ``predict.py``  the steps swm runs (``training.step``), traced: one variant's peak, the
  largest batch in a budget, the preflight refusal of a step the device cannot hold.
- ``fitting.py``  every combination of techniques predicted, and the cheapest set that fits a
  budget.

It sits over ``training`` (it traces training's own step, with the model, optimizer and memory
techniques of ``training.recipe`` and ``training.techniques``) and under the commands; what the
data layer asks of the host (the RAM available) is ``swmcli/host.py`` on the ground floor.
This floor returns data and never prints. Importing this package imports nothing.
"""
