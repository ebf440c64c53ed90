"""The JEPA world model: shapes, the loss and its regularizers, NaN actions, rollouts."""

import math

import pytest
import torch

from swmcli.config import ModelConfig
from swmcli.errors import UsageError
from swmcli.models.encoder import CNNDecoder, cnn_stages
from swmcli.models.interface import Objective
from swmcli.models.losses import effective_rank, sigreg, vicreg
from swmcli.models.rollout import rollout
from swmcli.models.state import StateFeatures
from swmcli.models.world_model import build_jepa

TINY = ModelConfig(
    latent_dim=16, cnn_width=8, predictor_dim=32, predictor_depth=1, predictor_heads=2
)


def _model(cfg=TINY, history_len=3, frameskip=2):
    torch.manual_seed(0)
    return build_jepa(
        cfg, resolution=32, action_dim=2, frameskip=frameskip, history_len=history_len
    )


def _batch(size=6, history_len=3, frameskip=2):
    generator = torch.Generator().manual_seed(1)
    pixels = torch.randint(0, 256, (size, history_len, 32, 32, 3), generator=generator)
    actions = torch.rand(size, history_len, 2 * frameskip, generator=generator) * 2 - 1
    return {"pixels": pixels.to(torch.uint8), "action": actions}


def test_encode_predict_and_rollout_shapes():
    model = _model().eval()
    batch = _batch()
    latents = model.encode(batch["pixels"])
    assert latents.shape == (6, 3, 16)
    assert model.encode(batch["pixels"][:, 0]).shape == (6, 16)
    context = latents[:, :-1]  # the predictor's length: history_len - 1
    assert model.predict(context, batch["action"][:, :-1]).shape == (6, 2, 16)
    plans = torch.zeros(6, 5, 4)
    imagined = rollout(model, latents[:, :1], batch["action"][:, :0], plans)
    assert imagined.shape == (6, 5, 16)


def test_predictor_is_causal():
    model = _model().eval()
    batch = _batch()
    latents = model.encode(batch["pixels"])[:, :-1]
    changed = latents.clone()
    changed[:, -1] += 5.0
    first = model.predict(latents, batch["action"][:, :-1])
    second = model.predict(changed, batch["action"][:, :-1])
    assert torch.allclose(first[:, :-1], second[:, :-1], atol=1e-5)
    assert not torch.allclose(first[:, -1], second[:, -1])


def test_nan_in_last_action_block_does_not_poison_gradients():
    model = _model()
    batch = _batch()
    batch["action"][:, -1] = float("nan")  # the episode's last observation has no action
    terms = Objective(model, TINY)(batch)
    terms["loss"].backward()
    assert torch.isfinite(terms["loss"])
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert set(terms) == {"loss", "prediction", "regularizer", "latent_rank"}
    # Fed to the predictor directly (as a planner or memprofile might), NaN still becomes 0.
    latents = model.encode(batch["pixels"])[:, 1:]
    assert torch.isfinite(model.predict(latents, batch["action"][:, 1:])).all()


def test_vit_encoder_option_runs():
    cfg = TINY.model_copy(
        update={"encoder": "vit", "vit_patch": 8, "vit_dim": 32, "vit_depth": 1, "vit_heads": 2}
    )
    loss = Objective(_model(cfg), cfg)(_batch())["loss"]
    loss.backward()
    assert torch.isfinite(loss)


def test_sigreg_and_vicreg_penalize_collapse():
    torch.manual_seed(0)
    gaussian = torch.randn(512, 32)
    collapsed = torch.randn(512, 1).expand(512, 32) + 0.01 * torch.randn(512, 32)
    assert sigreg(collapsed) > 10 * sigreg(gaussian)
    assert vicreg(collapsed) > 10 * vicreg(gaussian)
    assert vicreg(torch.zeros(512, 32) + 0.001 * torch.randn(512, 32)) > vicreg(gaussian)


def test_effective_rank_sees_collapse():
    torch.manual_seed(0)
    assert effective_rank(torch.randn(1024, 16)) > 14
    line = torch.randn(1024, 1) * torch.ones(1, 16)
    assert effective_rank(line) < 1.1


def test_regularizer_choice_is_used():
    model, batch = _model(), _batch()
    vic = TINY.model_copy(update={"regularizer": "vicreg", "regularizer_weight": 1.0})
    latents = model.encode(batch["pixels"])
    expected = vicreg(latents.reshape(-1, latents.shape[-1]))
    assert Objective(model, vic)(batch)["regularizer"].item() == pytest.approx(expected.item())


def test_history_len_one_is_refused():
    with pytest.raises(UsageError, match="history_len"):
        _model(history_len=1)


@pytest.mark.parametrize(("resolution", "stages"), [(32, 3), (64, 4), (224, 6)])
def test_cnn_depth_follows_resolution(resolution, stages):
    assert cnn_stages(resolution) == stages


def test_multi_step_loss_adds_the_rolled_out_error_and_trains_through_it():
    batch = _batch(history_len=4)
    model = _model(history_len=4)
    plain = Objective(model, TINY)
    rolled = Objective(model, TINY.model_copy(update={"rollout_weight": 0.5}))
    torch.manual_seed(2)
    base_parts = plain(batch)
    base = base_parts["loss"]
    torch.manual_seed(2)  # the same SIGReg directions
    parts = rolled(batch)
    total = parts["loss"]
    assert "rollout" not in base_parts and parts["rollout"] > 0
    assert total.item() == pytest.approx(base.item() + 0.5 * parts["rollout"].item(), rel=1e-5)
    # The rolled-out error differs from teacher forcing past the first step.
    assert parts["rollout"].item() != pytest.approx(parts["prediction"].item())
    total.backward()
    assert model.predictor.out.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("resolution", [32, 64, 96, 224])
def test_the_decoder_draws_frames_of_the_encoders_resolution(resolution):
    decoder = CNNDecoder(resolution, latent_dim=20, width=4)
    assert decoder(torch.randn(2, 20)).shape == (2, 3, resolution, resolution)


def test_reconstruction_adds_the_drawing_error_and_teaches_the_encoder_to_draw():
    cfg = TINY.model_copy(update={"reconstruction_weight": 2.0})
    model, batch = _model(cfg), _batch()
    objective = Objective(model, cfg)
    torch.manual_seed(2)
    parts = objective(batch)
    torch.manual_seed(2)  # the same SIGReg directions
    without = Objective(model, TINY)(batch)
    expected = without["loss"].item() + 2.0 * parts["reconstruction"].item()
    assert parts["loss"].item() == pytest.approx(expected, rel=1e-5)
    assert "reconstruction" not in without
    parts["loss"].backward()
    assert model.encoder.features[0].weight.grad.abs().sum() > 0
    # A real fit: frames with something to draw (a square, placed differently in each clip)
    # are drawn better after a few steps.
    batch["pixels"].zero_()
    for clip in range(len(batch["pixels"])):
        batch["pixels"][clip, :, 4 * clip : 4 * clip + 8, 20 - 3 * clip : 28 - 3 * clip] = 255
    first = objective(batch)["reconstruction"].item()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(30):
        optimizer.zero_grad()
        terms = objective(batch)
        terms["loss"].backward()
        optimizer.step()
    assert terms["reconstruction"].item() < 0.5 * first


def test_reconstruction_is_refused_where_nothing_can_draw():
    vit = TINY.model_copy(
        update={"encoder": "vit", "vit_patch": 8, "vit_dim": 32, "vit_depth": 1, "vit_heads": 2}
    )
    with pytest.raises(UsageError, match="CNN encoder's mirror"):
        _model(vit.model_copy(update={"reconstruction_weight": 1.0}))
    with pytest.raises(UsageError, match="no reconstruction_error"):
        Objective(torch.nn.Linear(2, 2), TINY.model_copy(update={"reconstruction_weight": 1.0}))


def test_state_features_put_angles_on_the_circle_and_values_in_their_units():
    features = StateFeatures(3, [20.0, 20.0, math.pi / 9], angles=[2])
    state = torch.tensor([[40.0, -10.0, 0.0], [40.0, -10.0, 2 * math.pi], [0.0, 0.0, math.pi / 9]])
    read = features(state)
    assert features.size == 4
    assert torch.allclose(read[0], torch.tensor([2.0, -0.5, 9 / math.pi, 0.0]), atol=1e-6)
    assert torch.allclose(read[0], read[1], atol=1e-5)  # a full turn is no distance
    # one unit of angle is a squared distance of about one, as one unit of position is
    assert (read[2, 2:] - read[0, 2:]).pow(2).sum().item() == pytest.approx(1.0, rel=0.02)
    with pytest.raises(UsageError, match="gives 2 units and the data's state has 3"):
        StateFeatures(3, [1.0, 1.0], angles=[])
    with pytest.raises(UsageError, match="past the data's 3 state values"):
        StateFeatures(3, [], angles=[3])


def test_the_latent_learns_to_read_the_recorded_state():
    cfg = TINY.model_copy(update={"state_weight": 1.0, "state_units": [4.0, 4.0]})
    torch.manual_seed(0)
    model = build_jepa(
        cfg, resolution=32, action_dim=2, frameskip=2, history_len=3, state_size=2
    )
    objective = Objective(model, cfg)
    batch = _batch(size=16)
    batch["pixels"].zero_()
    rows, columns = torch.randint(0, 24, (2, 16, 3), generator=torch.Generator().manual_seed(3))
    for clip in range(16):
        for step in range(3):
            row, column = rows[clip, step], columns[clip, step]
            batch["pixels"][clip, step, row : row + 8, column : column + 8] = 255
    batch["state"] = torch.stack([rows, columns], dim=-1).float()  # where the square is
    first = objective(batch)
    assert "state" in first and "reconstruction" not in first
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(150):
        optimizer.zero_grad()
        terms = objective(batch)
        terms["loss"].backward()
        optimizer.step()
    assert terms["state"].item() < 0.05 * first["state"].item()
    model.eval()
    read = model.encode(batch["pixels"])[..., :2] * 4.0  # the first values, in pixels
    assert (read - batch["state"]).abs().mean().item() < 2.0
    with pytest.raises(UsageError, match="latent_dim is 1"):
        build_jepa(
            cfg.model_copy(update={"latent_dim": 1}),
            resolution=32,
            action_dim=2,
            frameskip=2,
            history_len=3,
            state_size=2,
        )
    with pytest.raises(UsageError, match="no state_error"):
        Objective(torch.nn.Linear(2, 2), cfg)


def test_a_full_disk_while_checkpointing_is_one_error_and_leaves_no_partial(tmp_path):
    from swmcli.errors import CheckpointError
    from swmcli.training.checkpoints import checkpoint_path, save_checkpoint

    model = torch.nn.Linear(2, 2)
    save_checkpoint(
        tmp_path, model=model.state_dict(), optimizer=None, step=1, model_args={}, config_text="{}"
    )
    before = checkpoint_path(tmp_path).read_bytes()
    partial = tmp_path / "checkpoint.pt.partial"
    partial.symlink_to("/dev/full")  # every write there fails with ENOSPC, as on a full disk
    with pytest.raises(CheckpointError, match="cannot write the checkpoint"):
        save_checkpoint(
            tmp_path,
            model=model.state_dict(),
            optimizer=None,
            step=2,
            model_args={},
            config_text="{}",
        )
    assert not partial.exists() and not partial.is_symlink()
    assert checkpoint_path(tmp_path).read_bytes() == before


def test_proprio_joins_the_latent_standardized_and_is_required_once_trained_with():
    model = build_jepa(
        TINY, resolution=32, action_dim=2, frameskip=2, history_len=3, proprio_dim=4
    )
    batch = _batch()
    proprio = torch.rand(6, 3, 4) * 512  # arena pixels: far from unit scale
    latents = model.encode(batch["pixels"], proprio)
    assert latents.shape == (6, 3, 16 + 4) and model.proprio_dims == 4
    state = latents[..., -4:].reshape(-1, 4)
    torch.testing.assert_close(state.mean(0), torch.zeros(4), atol=1e-5, rtol=0)
    torch.testing.assert_close(state.std(0, unbiased=False), torch.ones(4), atol=1e-3, rtol=0)
    assert model.predict(latents[:, :-1], batch["action"][:, :-1]).shape == (6, 2, 20)
    loss = Objective(model, TINY)({**batch, "proprio": proprio})["loss"]
    assert torch.isfinite(loss)
    with pytest.raises(UsageError, match=r"model\.proprio"):
        model.encode(batch["pixels"])


def test_a_model_without_proprio_is_the_model_it_was():
    torch.manual_seed(0)
    plain = _model()
    assert plain.proprio_dims == 0 and not hasattr(plain, "proprio_norm")
    before = {key for key in plain.state_dict()}
    torch.manual_seed(0)
    again = build_jepa(
        TINY, resolution=32, action_dim=2, frameskip=2, history_len=3, proprio_dim=0
    )
    assert set(again.state_dict()) == before  # old checkpoints load as they did
