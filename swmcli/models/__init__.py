"""World models: the protocol every command uses (``interface``) and swm's own JEPA model, an
encoder + causal action-conditioned predictor (``world_model``), its loss (``losses``), the
predictor rolled out (``rollout``), and where and how a model runs (``runner``: device, dtype,
autocast, compile, inference).

``interface.build_model(model_cfg, shape)`` is the one factory train, eval and memprofile use:
swm's model, or the one ``model.factory`` (``--model``) returns.
"""
