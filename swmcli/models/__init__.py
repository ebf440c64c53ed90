"""World models: the protocol every command uses (``protocol``) and swm's own JEPA model, an
encoder + causal action-conditioned predictor (``world_model``).

``protocol.build_model(model_cfg, shape)`` is the one factory train, eval and memprofile use: swm's
model, or the one ``model.factory`` (``--model``) returns. Importing this package imports torch.
"""

from swmcli.models.world_model import WorldModel, build_world_model, normalize_pixels

__all__ = ["WorldModel", "build_world_model", "normalize_pixels"]
