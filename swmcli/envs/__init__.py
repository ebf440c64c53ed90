"""Environments as pixel envs: ``make_env`` (``make``: swm/TwoRoom-v0 and any gymnasium id),
TwoRoom itself and its expert (``tworoom``), what swm knows of a kind of env (``plugins``;
Push-T's in ``pusht``), the policies that collect (``policies``), and an episode rolled out as
a dataset's rows (``recording``)."""
