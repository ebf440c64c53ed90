"""The zoo: world models made for one env or one paper, each named by a preset's
``model.factory`` (``swmcli.zoo.pusht_state:build``, preset ``pusht-state-64``).

Each is built on the general protocol and pieces of ``swmcli.models`` (the encoder's stages,
pixel normalization, ``encode``/``predict``/``loss``) as any user's model is
(docs/bring-your-model.md); it ships in the wheel because a shipped preset names it. Nothing in
swm imports the zoo: a preset's factory string loads it, as it loads a model of the user's own.

- ``pusht_state.py``  Push-T's model in the success criterion's units: a CNN that reads the T's
  pose, the agent's state given, a predictor in the T's frame (preset ``pusht-state-64``).
"""
