"""Planning in latent space: CEM and MPPI over action-block sequences toward a goal latent.

A plan is ``horizon`` action blocks (each ``frameskip * action_dim`` values in [-1, 1]). Candidate
plans are rolled out by the world model from the current latent, all candidates of an iteration
in one batched call per predicted block. A plan's cost is the squared latent distance to the goal
image's latent: at the last predicted latent (``terminal``, LeWM's cost), averaged over every
predicted latent (``trajectory``, which prefers plans that get close early and stay close), or the
closest any predicted latent comes (``reach``: where success counts at any step, a plan that
passes through the goal is as good as one that ends there). A
model trained with ``model.proprio`` carries the agent's state in the last ``proprio_dims``
values of its latent; their share of the distance is weighted by ``proprio_weight`` (DINO-WM's
proprio term).

CEM samples around its mean with white or iCEM's colored noise (``noise_beta`` > 0: a 1/f^beta
spectrum along time, smoother action sequences that travel further) and can carry its best
``keep_elites`` plans into the next iteration (iCEM's elite reuse). The caller executes the first
``replan_every`` blocks and plans again (receding horizon), warm-starting from the rest of the
previous plan. With ``shrink_horizon`` each new plan keeps the previous one's deadline instead: its
horizon is the blocks left of the previous plan, a full one once they are spent (shrinking-horizon
MPC: the terminal cost then always aims at the same env step, and a plan made closer to it
predicts fewer blocks). Everything runs under the runner's inference mode.

A recurrent model (``initial_state``, docs/bring-your-model.md) is rolled out from the state the
planner carries: each frame is encoded from the state before it and the blocks executed since
(the blocks that ran between two plans without a frame seen are predicted through), and every
candidate starts from that state, one model step per planned block.
"""

from dataclasses import dataclass

import torch

from swmcli.models.outputs import predict_checked
from swmcli.models.rollout import (
    encode_observation,
    is_recurrent,
    observe,
    repeat_state,
    rollout,
)

INITIAL_STD = 1.0  # actions live in [-1, 1]: start wide, CEM narrows it
MIN_STD = 0.05
MPPI_TEMPERATURE = 0.1  # of the batch's cost range: lower = greedier


@dataclass
class PlannerSettings:
    """The knobs of both planners (from ``EvalConfig``); ``action_dim`` is the env's."""

    horizon: int
    samples: int
    iterations: int
    elites: int
    cost: str = "terminal"
    noise_beta: float = 0.0
    keep_elites: int = 0
    replan_every: int = 1
    shrink_horizon: bool = False
    action_dim: int = 1
    proprio_weight: float = 1.0


def plan_costs(
    model,
    latent,
    goal,
    plans: torch.Tensor,
    cost: str = "terminal",
    proprio_weight: float = 1.0,
    state=None,
) -> torch.Tensor:
    """Cost of each plan ``(S, H, A)`` from ``latent (1, D)``: squared distance to ``goal``.
    A recurrent model's ``state`` (batch 1, at ``latent``) is where every plan starts."""
    count = plans.shape[0]
    history = latent.expand(count, 1, -1)
    no_actions = plans.new_zeros(count, 0, plans.shape[-1])
    if state is not None:
        history, state = history.contiguous(), repeat_state(state, count)
    predicted = rollout(model, history, no_actions, plans, state)
    return latent_costs(model, predicted, goal, cost, proprio_weight)


def latent_costs(
    model, latents: torch.Tensor, goal, cost: str = "terminal", proprio_weight: float = 1.0
) -> torch.Tensor:
    """Cost of each sequence of latents ``(S, H, D)`` (one per block): ``plan_costs``' rule."""
    squared = (latents.float() - goal.float()).pow(2)  # (S, H, D)
    proprio_dims = getattr(model, "proprio_dims", 0)
    if proprio_dims and proprio_weight != 1.0:
        squared[..., -proprio_dims:] *= proprio_weight
    return block_costs(squared.sum(-1), cost)


def block_costs(distances: torch.Tensor, cost: str) -> torch.Tensor:
    """Each plan's cost from its distances to the goal after each block ``(S, H)``."""
    if cost == "terminal":
        return distances[:, -1]
    return distances.amin(-1) if cost == "reach" else distances.mean(-1)


def colored_noise(count: int, steps: int, dims: int, beta: float, generator, device):
    """``(count, steps, dims)`` unit-variance noise with a 1/f^beta power spectrum along time.

    beta = 0 is white noise; iCEM uses 2-4 on long horizons (low frequencies dominate).
    """
    if beta == 0 or steps < 2:
        return torch.randn((count, steps, dims), generator=generator, device=device)
    frequencies = torch.fft.rfftfreq(steps, device=device)
    frequencies[0] = frequencies[1]  # keep a constant offset, with the weight of the lowest tone
    scale = frequencies.pow(-beta / 2)
    shape = (count, dims, len(frequencies))
    real = torch.randn(shape, generator=generator, device=device)
    imaginary = torch.randn(shape, generator=generator, device=device)
    noise = torch.fft.irfft(torch.complex(real, imaginary) * scale, n=steps)
    return (noise / noise.std()).transpose(1, 2)


def _sample(mean, std, settings: PlannerSettings, generator, carried=None) -> torch.Tensor:
    horizon, block = mean.shape
    steps = horizon * block // settings.action_dim
    noise = colored_noise(
        settings.samples, steps, settings.action_dim, settings.noise_beta, generator, mean.device
    ).reshape(settings.samples, horizon, block)
    plans = (mean + std * noise).clamp(-1.0, 1.0)
    plans[0] = mean  # keep the current mean in the pool, so an iteration never gets worse
    if carried is not None:
        plans[1 : 1 + len(carried)] = carried
    return plans


def cem(model, latent, goal, mean, settings: PlannerSettings, generator, state=None):
    """Cross-entropy method: refit a diagonal Gaussian to the ``elites`` cheapest plans
    (``state``: a recurrent model's, at ``latent``)."""
    std = torch.full_like(mean, INITIAL_STD)
    carried = None
    for _ in range(settings.iterations):
        plans = _sample(mean, std, settings, generator, carried)
        costs = plan_costs(
            model, latent, goal, plans, settings.cost, settings.proprio_weight, state
        )
        order = costs.topk(min(settings.elites, len(costs)), largest=False).indices
        elite = plans[order]
        mean, std = elite.mean(0), elite.std(0).clamp_min(MIN_STD)
        carried = elite[: settings.keep_elites] if settings.keep_elites else None
    return elite[0] if settings.keep_elites else mean


def mppi(model, latent, goal, mean, settings: PlannerSettings, generator, state=None):
    """MPPI: the exponentially cost-weighted average of sampled plans, iterated (``state``: a
    recurrent model's, at ``latent``)."""
    std = torch.full_like(mean, INITIAL_STD / 2)
    for _ in range(settings.iterations):
        plans = _sample(mean, std, settings, generator)
        costs = plan_costs(
            model, latent, goal, plans, settings.cost, settings.proprio_weight, state
        )
        spread = (costs.max() - costs.min()).clamp_min(1e-8)
        weights = torch.softmax(-(costs - costs.min()) / (MPPI_TEMPERATURE * spread), dim=0)
        mean = (weights[:, None, None] * plans).sum(0)
    return mean


PLANNERS = {"cem": cem, "mppi": mppi}


def planner_settings(e, action_dim: int) -> PlannerSettings:
    """The settings of ``EvalConfig`` ``e`` for an env of ``action_dim`` floats per action."""
    return PlannerSettings(
        e.horizon,
        e.samples,
        e.iterations,
        e.elites,
        cost=e.cost,
        noise_beta=e.noise_beta,
        keep_elites=e.keep_elites,
        replan_every=e.replan_every,
        shrink_horizon=e.shrink_horizon,
        action_dim=action_dim,
        proprio_weight=e.proprio_weight,
    )


class RecedingHorizon:
    """Plans toward one goal, some blocks at a time, reusing the previous plan as a warm start.

    With ``budget_blocks`` (the episode's budget in blocks) no plan reaches past the budget: near
    its end the horizon is the blocks left, so no cost counts a block that will never run."""

    def __init__(
        self,
        model,
        planner: str,
        settings: PlannerSettings,
        block: int,
        seed: int,
        budget_blocks: int | None = None,
    ):
        self.model = model
        self.plan_once = PLANNERS[planner]
        self.settings = settings
        self.block = block
        self.generator = None
        self.seed = seed
        self.mean = None
        self.budget_blocks = budget_blocks  # None: no end to plan toward
        self.blocks_left = budget_blocks
        self.recurrent = is_recurrent(model)
        self.state = None  # a recurrent model's: at the last frame seen
        self.latent = None  # its latent there, (1, 1, D)
        self.executed = None  # the blocks run since that frame

    def reset(self, goal_pixels: torch.Tensor, goal_proprio: torch.Tensor | None = None) -> None:
        """A new episode: encode the goal image ``(H, W, 3)`` uint8 on the device (and the
        agent's state there, for a model trained with it)."""
        device = goal_pixels.device
        self.state = None
        # A recurrent model sees the goal as an episode's first frame.
        self.goal = (self._observe if self.recurrent else self._encode)(goal_pixels, goal_proprio)
        self.mean = torch.zeros(self.settings.horizon, self.block, device=device)
        self.generator = torch.Generator(device=device).manual_seed(self.seed)
        self.blocks_left = self.budget_blocks
        self.state, self.latent, self.executed = None, None, None  # the goal was not seen

    def act(self, pixels: torch.Tensor, proprio: torch.Tensor | None = None) -> torch.Tensor:
        """The blocks ``(replan_every, block)`` to execute now, from the frame ``(H, W, 3)``
        (and the agent's state)."""
        latent = (self._observe if self.recurrent else self._encode)(pixels, proprio)
        mean = self.mean if self.blocks_left is None else self.mean[: self.blocks_left]
        plan = self.plan_once(
            self.model, latent, self.goal, mean, self.settings, self.generator, self.state
        )
        self.planned_from, self.plan = latent, plan  # this call's latent and its whole plan
        executed = min(self.settings.replan_every, len(plan))
        self.executed = plan[:executed]
        if self.blocks_left is not None:
            self.blocks_left -= executed
        rest = plan[executed:]
        if self.settings.shrink_horizon:
            # The same deadline: the rest of this plan is the next one's horizon and warm start.
            self.mean = rest if len(rest) else plan.new_zeros(self.settings.horizon, self.block)
        else:
            # Warm start: the rest of this plan, then zero blocks, seeds the next search.
            self.mean = torch.cat([rest, torch.zeros_like(plan[:executed])])
        return plan[:executed]

    def _encode(self, pixels: torch.Tensor, proprio: torch.Tensor | None) -> torch.Tensor:
        return encode_observation(self.model, _batch_of_one(pixels, proprio))

    def _observe(self, pixels: torch.Tensor, proprio: torch.Tensor | None) -> torch.Tensor:
        """A recurrent model's latent of this frame, from its state at the last frame and the
        blocks executed since (all but the last predicted through: their frames went unseen);
        keeps the state at this frame."""
        if self.state is None:  # the episode's first frame: no block led to it
            state = self.model.initial_state(1)
            action = pixels.new_zeros(1, self.block, dtype=torch.float32)
        else:
            state, latent = self.state, self.latent
            for block in self.executed[:-1]:
                latent, state = predict_checked(self.model, latent, block[None, None], state)
            action = self.executed[-1:]
        latent, self.state = observe(self.model, _batch_of_one(pixels, proprio), state, action)
        self.latent = latent[:, None]
        return latent


def _batch_of_one(pixels: torch.Tensor, proprio: torch.Tensor | None) -> dict:
    observation = {"pixels": pixels[None]}
    if proprio is not None:
        observation["proprio"] = proprio[None]
    return observation
