"""The runner: dtype and its reason, autocast, transfers, gradient-free inference, bf16."""

import numpy as np
import torch

from swmcli.config import ModelConfig
from swmcli.models.interface import Objective
from swmcli.models.runner import choose_dtype, make_runner
from swmcli.models.world_model import build_jepa

TINY = ModelConfig(
    latent_dim=16, cnn_width=8, predictor_dim=32, predictor_depth=1, predictor_heads=2
)


def _model():
    torch.manual_seed(0)
    return build_jepa(TINY, resolution=32, action_dim=2, frameskip=1, history_len=3)


def _numpy_batch():
    rng = np.random.default_rng(0)
    return {
        "pixels": rng.integers(0, 256, (4, 3, 32, 32, 3), dtype=np.uint8),
        "action": rng.uniform(-1, 1, (4, 3, 2)).astype(np.float32),
    }


def test_fp32_is_the_default_and_says_so():
    runner = make_runner()
    assert runner.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert runner.dtype == torch.float32
    assert "fp32" in runner.dtype_reason
    with runner.autocast():
        assert not torch.is_autocast_enabled("cpu")


def test_bf16_on_cpu_is_used_and_the_reason_names_the_cpu():
    dtype, reason = choose_dtype(True, torch.device("cpu"))
    assert dtype == torch.bfloat16
    assert "CPU" in reason


def test_to_device_keeps_pixels_uint8():
    batch = make_runner().to_device(_numpy_batch())
    assert batch["pixels"].dtype == torch.uint8
    assert batch["action"].dtype == torch.float32
    assert batch["pixels"].shape == (4, 3, 32, 32, 3)


def test_inference_is_gradient_free():
    runner = make_runner()
    model = runner.prepare(_model())
    batch = runner.to_device(_numpy_batch())
    model.train()
    model.predictor.requires_grad_(False)  # a frozen part stays frozen after
    with runner.inference(model):
        assert torch.is_inference_mode_enabled()
        assert not any(p.requires_grad for p in model.parameters())
        assert not model.training
        latents = model.encode(batch["pixels"])
    assert latents.is_inference() and not latents.requires_grad
    # Handed back as it came: training mode, and each parameter's own requires_grad.
    assert model.training
    assert all(p.requires_grad for p in model.encoder.parameters())
    assert not any(p.requires_grad for p in model.predictor.parameters())


def test_bf16_autocast_trains_tiny_model():
    runner = make_runner(bf16=True)
    model = runner.prepare(_model())
    batch = runner.to_device(_numpy_batch())
    with runner.autocast():
        assert torch.is_autocast_enabled("cpu")
        latents = model.encode(batch["pixels"])
        loss = Objective(model, TINY)(batch)["loss"]
    assert latents.dtype == torch.bfloat16  # the encoder's last matmul ran in bf16
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad.dtype == torch.float32 for p in model.parameters() if p.grad is not None)


def test_compile_compiles_a_models_own_loss_and_says_what_runs_eager():
    """A model with its own loss trains through it, not through encode/predict: --compile
    compiles it too (each compiled on its first call), and one line says what stays eager."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parent / "models" / "layernorm_world_model.py"
    spec = importlib.util.spec_from_file_location("layernorm_world_model_runner", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    own, jepa = module.build(action_dim=2, frameskip=1), _model()
    runner = make_runner(compile=True, device="cpu")
    for model in (own, jepa):
        runner.prepare(model)
    for name in ("encode", "predict", "loss"):
        compiled = getattr(own, name)  # the compiled wrapper of the model's own bound method
        assert compiled._torchdynamo_orig_callable == getattr(type(own), name).__get__(own)
    assert "loss" not in jepa.__dict__  # swm's own model has no loss to compile
    assert runner.compile_note(own).startswith("compile: the model's own loss")
    assert "eager: swm's loss terms" in runner.compile_note(jepa)
    runner.eager(own)
    assert not hasattr(own.loss, "_torchdynamo_orig_callable")
    assert make_runner().compile_note(own) is None
