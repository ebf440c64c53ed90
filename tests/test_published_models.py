"""PLDM and DINO-WM as stable-worldmodel 0.1.1 builds them (swmcli/zoo/pldm.py and dino_wm.py,
presets pldm-224 and dino-wm-224).

Here: each preset's model, part by part, with its training settings. In the side venv
(``SWM_UPSTREAM_PYTHON`` with stable-worldmodel 0.1.1, stable-pretraining and transformers; a
visible skip elsewhere): upstream's own models (tests/published_upstream.py builds them) load
into swm's, which give the same embeddings, predictions and loss terms on the same batch (within
1e-5 in fp32).
"""

import os
import subprocess
from pathlib import Path

import pytest
import torch

from swmcli.config import resolve_config
from swmcli.models.interface import build_model

UPSTREAM = Path(__file__).with_name("published_upstream.py")
# stable-worldmodel 0.1.1's models for Push-T (a 2-D action, a 4-value proprio, frameskip 5),
# part by part, as tests/published_upstream.py counts them; PLDM's IDM is trained beside it
UPSTREAM_PARAMETERS = {
    "pldm-224": {"encoder": 5_501_376, "predictor": 10_791_360, "action_encoder": 156_206,
                 "projector": 792_768, "pred_proj": 792_768, "idm": 203_274},
    "dino-wm-224": {"backbone": 22_056_576, "predictor": 20_195_320, "extra_encoders": 160},
}  # fmt: skip
SETTINGS = {  # lr, weight decay, clipping, batch, history (3 + 1 predicted), frameskip
    "pldm-224": (5e-5, 1e-3, 1.0, 128, 4, 5),
    "dino-wm-224": (5e-4, 0.0, 1.0, 32, 4, 5),
}


def _parts(model: torch.nn.Module) -> dict[str, int]:
    return {name: sum(p.numel() for p in part.parameters())
            for name, part in model.named_children()}  # fmt: skip


@pytest.mark.parametrize("preset", ["pldm-224", "dino-wm-224"])
def test_the_preset_builds_the_published_model_part_for_part(preset):
    cfg = resolve_config(preset=preset)
    shape = {"resolution": 224, "action_dim": 2, "frameskip": cfg.data.frameskip,
             "history_len": cfg.data.history_len}  # fmt: skip
    if cfg.model.proprio:
        shape["proprio_dim"] = 4  # gym-pusht's [x, y, vx, vy]
    with torch.device("meta"):  # shapes only: tens of millions of parameters need no values
        model = build_model(cfg.model, shape)
    assert _parts(model) == UPSTREAM_PARAMETERS[preset]
    assert model.context_len == 3
    train = cfg.train
    assert (train.lr, train.weight_decay, train.grad_clip, train.batch_size,
            cfg.data.history_len, cfg.data.frameskip) == SETTINGS[preset]  # fmt: skip
    assert cfg.runtime.bf16
    assert train.freeze == ("backbone" if preset == "dino-wm-224" else None)


def _upstream_outputs(upstream_python: str, out: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = subprocess.run([upstream_python, "-c", "import stable_pretraining, transformers"],
                           capture_output=True, env=env)  # fmt: skip
    if probe.returncode:
        pytest.skip("SWM_UPSTREAM_PYTHON lacks stable-pretraining or transformers: install them "
                    "there (pip install stable-pretraining transformers)")  # fmt: skip
    done = subprocess.run([upstream_python, str(UPSTREAM), str(out)], capture_output=True,
                          text=True, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(out, weights_only=True)


def test_upstreams_pldm_and_dino_wm_load_into_swms_and_give_the_same_outputs(
    upstream_python, tmp_path
):
    from swmcli.zoo import dino_wm, pldm

    up = _upstream_outputs(upstream_python, tmp_path / "upstream.pt")
    batch = up["batch"]
    close = {"atol": 1e-5, "rtol": 1e-5}

    model = pldm.build(resolution=224, action_dim=2, frameskip=5, history_len=4)
    assert _parts(model) == up["pldm"]["parts"] == UPSTREAM_PARAMETERS["pldm-224"]
    model.load_state_dict(up["pldm"]["state"])  # strict: every name and shape upstream's
    model.eval()
    with torch.no_grad():
        latents = model.encode(batch["pixels"])
        torch.testing.assert_close(latents, up["pldm"]["emb"], **close)
        predicted = model.predict(latents[:, :3], batch["action"][:, :3])
        torch.testing.assert_close(predicted, up["pldm"]["predicted"], **close)
        terms = model.loss(batch)
    for name, value in up["pldm"]["terms"].items():
        torch.testing.assert_close(terms[name], value, **close, msg=name)

    model = dino_wm.build(resolution=224, action_dim=2, frameskip=5, history_len=4, proprio_dim=4)
    assert _parts(model) == up["dino_wm"]["parts"] == UPSTREAM_PARAMETERS["dino-wm-224"]
    model.load_state_dict(up["dino_wm"]["state"])
    model.eval()
    theirs = up["dino_wm"]
    with torch.no_grad():
        latents = model.encode(batch["pixels"], batch["proprio"])
        expected = torch.cat([theirs["pixels_emb"].flatten(2), theirs["proprio_emb"]], dim=-1)
        torch.testing.assert_close(latents, expected, **close)
        predicted = model.predicted_tokens(latents[:, :3], batch["action"][:, :3])
        torch.testing.assert_close(predicted, theirs["predicted"], **close)
        terms = model.loss(batch)
    for name, value in theirs["terms"].items():
        torch.testing.assert_close(terms[name], value, **close, msg=name)
