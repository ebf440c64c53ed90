"""World models: a JEPA encoder + causal action-conditioned predictor (see ``world_model``).

``build_world_model(model_cfg, resolution=, action_dim=, frameskip=, history_len=)`` is the one
factory train, eval and memprofile use. Importing this package imports torch.
"""

from swmcli.models.world_model import WorldModel, build_world_model, normalize_pixels

__all__ = ["WorldModel", "build_world_model", "normalize_pixels"]
