"""Recurrent world models: swm carries their state, so a rollout of H blocks costs H model steps;
the RSSM in tests/models (written from docs/bring-your-model.md) trains, is profiled with every
technique, and plans."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from swmcli.commands.evaluate import run_eval, warm_up
from swmcli.commands.train import run_train
from swmcli.config import load_run_config, resolve_config
from swmcli.errors import UsageError
from swmcli.memory.measure import MemoryMonitor
from swmcli.models.interface import load_factory
from swmcli.models.losses import jepa_loss, prediction_loss
from swmcli.models.rollout import observe, observe_clip, rollout
from swmcli.models.runner import make_runner
from swmcli.planning.planners import PlannerSettings, RecedingHorizon

RSSM = f"{Path(__file__).parent / 'models' / 'rssm_world_model.py'}:build"
SIDE, BLOCK = 32, 2


def _rssm():
    torch.manual_seed(0)
    return load_factory(RSSM)(action_dim=BLOCK, frameskip=1, resolution=SIDE).eval()


def _count_cell_steps(model) -> list[int]:
    """A list whose length is how many times the model's GRUCell has run since."""
    steps: list[int] = []
    model.cell.register_forward_hook(lambda *_: steps.append(1))
    return steps


def _frames(count: int, steps: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    shape = (count, steps, SIDE, SIDE, 3)
    return torch.randint(0, 256, shape, generator=generator, dtype=torch.uint8)


@torch.inference_mode()
def test_a_rollout_of_h_blocks_is_h_model_steps_with_the_state_carried():
    model, horizon = _rssm(), 6
    plans = torch.rand(4, horizon, BLOCK) * 2 - 1
    latents, state = observe_clip(model, {"pixels": _frames(4, 1), "action": plans[:, :1]})
    steps = _count_cell_steps(model)
    carried = rollout(model, latents, plans[:, :0], plans, state)
    assert len(steps) == horizon
    steps.clear()
    # The model's stateless predict rebuilds the cell from zero on every call: 2 + 3 + ... + 7.
    rebuilt = rollout(model, latents, plans[:, :0], plans)
    assert len(steps) == sum(range(2, horizon + 2))
    torch.testing.assert_close(carried, rebuilt)  # from a first frame the two agree


@torch.inference_mode()
def test_the_planner_carries_the_state_through_the_blocks_it_executed():
    model = _rssm()
    settings = PlannerSettings(horizon=4, samples=8, iterations=2, elites=2, action_dim=BLOCK,
                               replan_every=2)  # fmt: skip
    planner = RecedingHorizon(model, "cem", settings, BLOCK, seed=0)
    frames = _frames(1, 3)[0]
    planner.reset(frames[2])
    steps = _count_cell_steps(model)
    first = planner.act(frames[0])
    assert len(steps) == 1 + 2 * 4  # the frame seen, then 2 iterations of 4-block rollouts
    start_latent, start_state = planner.latent, planner.state
    steps.clear()
    planner.act(frames[1])
    assert len(steps) == 2 + 2 * 4  # the first block predicted through, the second observed
    # The frame is seen from the state the executed blocks led to, not from a fresh one.
    _, state = model.predict(start_latent, first[None, :1], state=start_state)
    expected, _ = observe(model, {"pixels": frames[1][None]}, state, first[1:])
    torch.testing.assert_close(planner.latent[:, 0], expected)
    fresh, _ = observe(model, {"pixels": frames[1][None]}, model.initial_state(1), first[1:])
    assert not torch.allclose(planner.latent[:, 0], fresh)


@torch.inference_mode()
def test_a_recurrent_predict_that_returns_no_state_is_named_in_one_line():
    model = _rssm()
    latents, state = observe_clip(model, {"pixels": _frames(2, 1), "action": torch.zeros(2, 1, 2)})
    model.predict = lambda latents, actions, state=None: latents
    with pytest.raises(UsageError, match=r"predict\(\.\.\., state=\.\.\.\) returned a tensor"):
        rollout(model, latents, torch.zeros(2, 0, 2), torch.zeros(2, 3, 2), state)


def _train(tiny_data, out: Path, factory: str = RSSM, **flags):
    """``swm train`` of the RSSM with live tensors tracked: its metrics rows, the preflight's
    prediction and the live-bytes peak of its steady steps."""
    settings = {"data.path": tiny_data, "train.out": out, "train.log_every": 1, **flags}
    cfg = resolve_config("tiny", flags={**settings, "model.factory": factory})
    monitor = MemoryMonitor(track_tensors=True)
    result = run_train(cfg, monitor)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steady = next(p for p in monitor.report.phases if p.name == "steady state")
    return rows, result.fields["preflight_step_bytes"], steady.live_tensor_peak_bytes


def test_the_rssm_trains_as_predicted_and_plans_with_its_state(tiny_data, tmp_path):
    run_dir = tmp_path / "run"
    flags = {"train.steps": 15, "train.lr": 3e-3, "train.batch_size": 8}
    rows, predicted, measured = _train(tiny_data, run_dir, **flags)
    assert predicted == pytest.approx(measured, rel=0.05)
    # The loss holds the KL at its free nats at least: the frames drawn back are what improves.
    drawn = [row["reconstruction"] for row in rows]
    first, last = np.mean(drawn[:5]), np.mean(drawn[-5:])
    assert last < 0.75 * first, (first, last)
    assert rows[-1]["loss"] < rows[0]["loss"] and "kl" in rows[-1]
    sets = ["eval.episodes=1", "eval.horizon=3", "eval.step_budget=6"]
    result = run_eval(run_dir, MemoryMonitor(), load_run_config(run_dir, sets=sets), video=True)
    assert result.fields["episodes"] == 1
    assert [p.stat().st_size > 0 for p in (run_dir / "eval" / "videos").glob("*.mp4")] == [True]
    assert result.fields["planning_seconds_per_env_step"] > 0
    assert np.isfinite(result.fields["open_loop_mse_last"])


def test_every_technique_at_once_trains_the_rssm_as_predicted(tiny_data, tmp_path):
    """bf16, checkpointing by class (the GRUCell in its loop too) and the optimizer in backward:
    the preflight within 5% of the steady steps' live bytes."""
    techniques = {"runtime.bf16": True, "runtime.optimizer_in_backward": True,
                  "runtime.activation_checkpointing": "EncoderStage,GRUCell"}  # fmt: skip
    flags = {"train.steps": 3, "train.grad_clip": 0, "train.batch_size": 4, **techniques}
    rows, predicted, measured = _train(tiny_data, tmp_path / "run", **flags)
    assert all(np.isfinite(row["loss"]) for row in rows)
    assert predicted == pytest.approx(measured, rel=0.05)


def test_swms_loss_carries_a_recurrent_models_state_through_the_clip():
    """Without a loss of its own, a recurrent model is trained on latents seen with its state
    carried from frame to frame, and predicts from the state at the first."""
    model = load_factory(f"{RSSM[: -len(':build')]}:build_without_loss")(
        action_dim=BLOCK, frameskip=1, resolution=SIDE
    )
    batch = {"pixels": _frames(2, 3), "action": torch.rand(2, 3, BLOCK)}
    terms = jepa_loss(model.eval(), batch, "vicreg", 0.0, rollout_weight=1.0)
    with torch.no_grad():
        latents, state = observe_clip(model, batch)
        predicted, _ = model.predict(latents[:, :-1], batch["action"][:, :-1], state=state)
        imagined = rollout(model, latents[:, :1], batch["action"][:, :0], batch["action"][:, :-1],
                           state)  # fmt: skip
    torch.testing.assert_close(terms["prediction"], prediction_loss(predicted, latents[:, 1:]))
    torch.testing.assert_close(terms["rollout"], prediction_loss(imagined, latents[:, 1:]))
    stateless = model.encode(batch["pixels"])  # every frame as an episode's first
    assert not torch.allclose(stateless[:, 1:], latents[:, 1:])


def _layouts(model, calls: set) -> None:
    """Record in ``calls`` each encode and predict call's layout as a compiled method's guards
    see it: every tensor's shape past the batch, batch 1 or more, and whether it is laid out as a
    fresh tensor."""

    def layout(value):
        fresh = value.contiguous().stride() == value.stride() and value.storage_offset() == 0
        return tuple(value.shape[1:]), min(len(value), 2), fresh

    for name in ("encode", "predict"):
        method = getattr(model, name)

        def recorded(*arguments, method=method, name=name, **keywords):
            tensors = [*arguments, *torch.utils._pytree.tree_leaves(keywords)]
            calls.add((name, *(layout(t) for t in tensors if isinstance(t, torch.Tensor))))
            return method(*arguments, **keywords)

        object.__setattr__(model, name, recorded)


@torch.inference_mode()
def test_eval_calls_the_model_at_every_horizon_as_its_warm_up_did():
    """What lets ``swm eval --compile`` compile once, in the warm-up: planning at any horizon and
    the open-loop rollouts call ``encode`` and ``predict`` with the layouts the warm-up compiled
    (benchmarks/eval_compile.py counts the graphs)."""
    model = _rssm()
    warmed, used = set(), set()
    _layouts(model, warmed)
    runner = make_runner()
    warm_up(model, {"resolution": SIDE, "frameskip": 1, "action_dim": BLOCK}, runner)
    _layouts(model, used)
    frames = _frames(3, 5)
    for horizon in (1, 3, 5):
        settings = PlannerSettings(horizon=horizon, samples=8, iterations=1, elites=2,
                                   action_dim=BLOCK, replan_every=2)  # fmt: skip
        planner = RecedingHorizon(model, "cem", settings, BLOCK, seed=0)
        planner.reset(frames[0, 0])
        for step in range(1, 4):
            planner.act(frames[0, step])
        actions = torch.rand(3, 5, BLOCK)
        latents, state = observe_clip(model, {"pixels": frames, "action": actions})
        rollout(model, latents[:, :1], actions[:, :0], actions[:, :horizon], state)
    assert used <= warmed, used - warmed
