"""Planning in latent space: CEM and MPPI over action-block sequences toward a goal latent.

A plan is ``horizon`` action blocks (each ``frameskip * action_dim`` values in [-1, 1]). Candidate
plans are rolled out by the world model from the current latent; a plan's cost is the squared
distance between the latent it ends in and the goal image's latent (LeWM's terminal cost). The
caller executes the first block and plans again (receding horizon), warm-starting from the
previous plan shifted by one block. Everything runs under the runner's inference mode.
"""

from dataclasses import dataclass

import torch

INITIAL_STD = 1.0  # actions live in [-1, 1]: start wide, CEM narrows it
MIN_STD = 0.05
MPPI_TEMPERATURE = 0.1  # of the batch's cost range: lower = greedier


@dataclass
class PlannerSettings:
    """The knobs of both planners (from ``EvalConfig``)."""

    horizon: int
    samples: int
    iterations: int
    elites: int


def plan_costs(model, latent, goal, plans: torch.Tensor) -> torch.Tensor:
    """Cost of each plan ``(S, H, A)`` from ``latent (1, D)``: squared distance to ``goal``."""
    count = plans.shape[0]
    history = latent.expand(count, 1, -1)
    no_actions = plans.new_zeros(count, 0, plans.shape[-1])
    final = model.rollout(history, no_actions, plans)[:, -1]
    return (final.float() - goal.float()).pow(2).sum(-1)


def _sample(mean, std, count: int, generator) -> torch.Tensor:
    noise = torch.randn((count, *mean.shape), generator=generator, device=mean.device)
    plans = (mean + std * noise).clamp(-1.0, 1.0)
    plans[0] = mean  # keep the current mean in the pool, so an iteration never gets worse
    return plans


def cem(model, latent, goal, mean, settings: PlannerSettings, generator) -> torch.Tensor:
    """Cross-entropy method: refit a diagonal Gaussian to the ``elites`` cheapest plans."""
    std = torch.full_like(mean, INITIAL_STD)
    for _ in range(settings.iterations):
        plans = _sample(mean, std, settings.samples, generator)
        costs = plan_costs(model, latent, goal, plans)
        elite = plans[costs.topk(min(settings.elites, len(costs)), largest=False).indices]
        mean, std = elite.mean(0), elite.std(0).clamp_min(MIN_STD)
    return mean


def mppi(model, latent, goal, mean, settings: PlannerSettings, generator) -> torch.Tensor:
    """MPPI: the exponentially cost-weighted average of sampled plans, iterated."""
    std = torch.full_like(mean, INITIAL_STD / 2)
    for _ in range(settings.iterations):
        plans = _sample(mean, std, settings.samples, generator)
        costs = plan_costs(model, latent, goal, plans)
        spread = (costs.max() - costs.min()).clamp_min(1e-8)
        weights = torch.softmax(-(costs - costs.min()) / (MPPI_TEMPERATURE * spread), dim=0)
        mean = (weights[:, None, None] * plans).sum(0)
    return mean


PLANNERS = {"cem": cem, "mppi": mppi}


class RecedingHorizon:
    """Plans toward one goal, one block at a time, reusing the previous plan as a warm start."""

    def __init__(self, model, planner: str, settings: PlannerSettings, block: int, seed: int):
        self.model = model
        self.plan_once = PLANNERS[planner]
        self.settings = settings
        self.block = block
        self.generator = None
        self.seed = seed
        self.mean = None

    def reset(self, goal_pixels: torch.Tensor) -> None:
        """A new episode: encode the goal image ``(H, W, 3)`` uint8 on the device."""
        device = goal_pixels.device
        self.goal = self.model.encode(goal_pixels[None])
        self.mean = torch.zeros(self.settings.horizon, self.block, device=device)
        self.generator = torch.Generator(device=device).manual_seed(self.seed)

    def act(self, pixels: torch.Tensor) -> torch.Tensor:
        """The action block ``(block,)`` to execute now, from the current frame ``(H, W, 3)``."""
        latent = self.model.encode(pixels[None])
        plan = self.plan_once(
            self.model, latent, self.goal, self.mean, self.settings, self.generator
        )
        # Warm start: the rest of this plan, then a zero block, seeds the next search.
        self.mean = torch.cat([plan[1:], torch.zeros_like(plan[:1])])
        return plan[0]
