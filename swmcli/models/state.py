"""The env's recorded state as swm's model reads it from a frame (``model.state_weight``).

The JEPA loss pays the encoder to keep what it can predict: on Push-T the agent, which follows
the action, and hardly the T, which turns only when pushed (docs/reports/pusht.md). With
``model.state_weight`` the first values of each frame's latent are the state itself, trained
against the data's ``state`` key: each value over its unit (``model.state_units``), each angle
(``model.state_angles``) as its cosine and sine over its unit, so a turn of 2 pi is no distance
and a small turn of one unit is a distance of about one. With the success region's size as the
units, the planner's squared distance over these values is the success criterion's own
(gym-pusht: ``(agent^2 + T^2) / 20^2 + (angle / (pi/9))^2`` near the goal). Planning still
sees only pixels (and the agent's state with ``model.proprio``): the recorded state is a training
target, never an input.
"""

import torch
from torch import nn

from swmcli.errors import UsageError
from swmcli.models.global_batch import GlobalBatchNorm1d


class StateFeatures(nn.Module):
    """The recorded state ``(..., S)`` -> the latent's state values ``(..., size)``: the values
    that are not angles, then each angle's cosine and sine, every one over its unit.

    ``norm`` tracks their mean and variance over training (``observe``): the encoder's output is
    standardized (its final BatchNorm), and ``unstandardize`` maps it back to these units."""

    def __init__(self, state_size: int, units: list[float], angles: list[int]):
        super().__init__()
        if units and len(units) != state_size:
            raise UsageError(
                f"model.state_units gives {len(units)} units and the data's state has "
                f"{state_size} values",
                hint=f"give one unit per value (--set 'model.state_units=[...]', {state_size} "
                "numbers), or none for 1 each",
            )
        outside = [index for index in angles if index >= state_size]
        if outside:
            raise UsageError(
                f"model.state_angles names {outside}, past the data's {state_size} state values",
                hint=f"name indices 0 to {state_size - 1}",
            )
        unit = torch.tensor(units or [1.0] * state_size, dtype=torch.float32)
        plain = [index for index in range(state_size) if index not in angles]
        self.register_buffer("plain", torch.tensor(plain, dtype=torch.long), persistent=False)
        self.register_buffer("angles", torch.tensor(angles, dtype=torch.long), persistent=False)
        self.register_buffer("plain_unit", unit[plain], persistent=False)
        self.register_buffer("angle_unit", unit[angles], persistent=False)
        self.size = len(plain) + 2 * len(angles)
        self.norm = GlobalBatchNorm1d(self.size, affine=False)

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        state = state.float()
        angles = state[..., self.angles]
        return torch.cat(
            [
                state[..., self.plain] / self.plain_unit,
                angles.cos() / self.angle_unit,
                angles.sin() / self.angle_unit,
            ],
            dim=-1,
        )

    def observe(self, features: torch.Tensor) -> None:
        """Update the running mean and variance with a batch of features ``(N, size)``."""
        if self.training:
            self.norm(features.detach())

    def unstandardize(self, standardized: torch.Tensor) -> torch.Tensor:
        """The encoder's standardized values ``(..., size)`` in the features' units."""
        scale = (self.norm.running_var + self.norm.eps).sqrt()
        return standardized * scale.to(standardized.dtype) + self.norm.running_mean.to(
            standardized.dtype
        )
