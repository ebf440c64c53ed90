"""stable-worldmodel 0.1.1's PLDM (with the inverse-dynamics MLP its training script trains beside
it) and DINO-WM (``PreJEPA``), as ``pldm.yaml`` and ``prejepa.yaml`` build them for Push-T (a 2-D
action, a 4-value proprio, frameskip 5, history 3), run in the side venv's interpreter
(``SWM_UPSTREAM_PYTHON`` with stable-pretraining and transformers) by
tests/test_published_models.py; swm is not imported here.

    python published_upstream.py OUT.pt

OUT.pt holds, for each model: its parameters per part, its state dict, and in eval mode (no
dropout) on one batch of random frames, actions and proprio (also saved): its embeddings, its
predictions and the loss terms of its training script's forward (``pldm_forward``,
``dinowm_forward``). DINOv2-small is built from ``facebook/dinov2-small``'s settings with random
weights (nothing is downloaded).
"""

import sys

import torch
import torch.nn.functional as F
from stable_pretraining.backbone.utils import vit_hf
from stable_worldmodel.wm.loss import PLDMLoss
from stable_worldmodel.wm.pldm import module as pldm_module
from stable_worldmodel.wm.pldm.pldm import PLDM
from stable_worldmodel.wm.prejepa import module as prejepa_module
from stable_worldmodel.wm.prejepa.prejepa import PreJEPA
from torch import nn
from torchvision.transforms.v2 import functional as TF
from transformers import Dinov2Config, Dinov2Model

FRAMESKIP, ACTION_DIM, PROPRIO_DIM, HISTORY, SIZE = 5, 2, 4, 3, 224
BATCH, FRAMES = 2, HISTORY + 1
ACTION_BLOCK = FRAMESKIP * ACTION_DIM
# pldm.yaml's loss weights (temp_straight and sigreg off or of weight 0)
PLDM_WEIGHTS = {"temp_align": 0.2, "std": 18.0, "std_t": 0.7, "cov": 12.0, "cov_t": 0.0, "idm": 0.0}


def pldm() -> tuple[PLDM, nn.Module]:
    """pldm.yaml's ``model`` and ``idm`` (input 2 x 192, output the action block)."""
    mlp = dict(input_dim=192, hidden_dim=2048, output_dim=192, norm_fn=nn.BatchNorm1d)
    model = PLDM(
        encoder=vit_hf(size="tiny", patch_size=14, image_size=SIZE, pretrained=False,
                       use_mask_token=False),
        predictor=pldm_module.Predictor(num_frames=HISTORY, input_dim=192, hidden_dim=192,
                                        output_dim=192, depth=6, heads=16, mlp_dim=2048,
                                        dim_head=64, dropout=0.1, emb_dropout=0.0),
        action_encoder=pldm_module.Embedder(input_dim=ACTION_BLOCK, emb_dim=192),
        projector=pldm_module.MLP(**mlp),
        pred_proj=pldm_module.MLP(**mlp),
    )  # fmt: skip
    return model, pldm_module.MLP(input_dim=2 * 192, hidden_dim=512, output_dim=ACTION_BLOCK)


def dino_wm() -> PreJEPA:
    """prejepa.yaml's model: DINOv2-small, its predictor over 3 frames of 16 x 16 patches, a
    proprio and an action embedder of 10 values each."""
    settings = Dinov2Config(hidden_size=384, num_hidden_layers=12, num_attention_heads=6,
                            image_size=518, patch_size=14)  # fmt: skip
    backbone = Dinov2Model(settings)
    return PreJEPA(
        encoder=backbone,
        predictor=prejepa_module.CausalPredictor(num_patches=(SIZE // 14) ** 2,
                                                 num_frames=HISTORY, dim=384 + 20, depth=6,
                                                 heads=16, mlp_dim=2048, dim_head=64,
                                                 dropout=0.1, emb_dropout=0.0),
        extra_encoders=nn.ModuleDict({
            "proprio": prejepa_module.Embedder(in_chans=PROPRIO_DIM, emb_dim=10),
            "action": prejepa_module.Embedder(in_chans=ACTION_BLOCK, emb_dim=10),
        }),
    )  # fmt: skip


def count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def parts(model: nn.Module) -> dict[str, int]:
    return {name: count(part) for name, part in model.named_children()}


def frames(pixels: torch.Tensor) -> torch.Tensor:
    """uint8 ``(B, T, H, W, 3)`` -> float ``(B, T, 3, H, W)`` as stable-pretraining's
    ``ToImage`` with ImageNet's statistics makes them (scaled to [0, 1], then normalized)."""
    images = TF.to_dtype(pixels.permute(0, 1, 4, 2, 3), torch.float32, scale=True)
    return TF.normalize(images, mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])


@torch.no_grad()
def pldm_outputs(model: PLDM, idm: nn.Module, batch: dict) -> dict:
    """pldm.py's ``pldm_forward``: the embeddings, the predictions, the loss terms."""
    out = model.encode({"pixels": frames(batch["pixels"]), "action": batch["action"]})
    emb = out["emb"]
    predicted = model.predict(emb[:, :HISTORY], out["act_emb"][:, :HISTORY])
    terms = PLDMLoss()(emb, idm(torch.cat([emb[:, 1:], emb[:, :-1]], dim=-1)),
                       batch["action"][:, :-1])  # fmt: skip
    terms = {name.removesuffix("_loss"): value for name, value in terms.items()}
    terms["pred"] = (predicted - emb[:, 1:]).square().mean()
    terms["loss"] = terms["pred"] + sum(w * terms[name] for name, w in PLDM_WEIGHTS.items())
    return {"emb": emb, "predicted": predicted, "terms": terms}


@torch.no_grad()
def dino_wm_outputs(model: PreJEPA, batch: dict) -> dict:
    """prejepa.py's ``dinowm_forward``: the embeddings, the predictions, the loss terms."""
    info = model.encode({"pixels": frames(batch["pixels"]), "proprio": batch["proprio"],
                         "action": batch["action"]})  # fmt: skip
    emb = info["emb"]  # (B, T, P, 384 + 10 + 10)
    predicted = model.predict(emb[:, :HISTORY])
    target = emb[:, 1:]
    pixels = info["pixels_emb"].shape[-1]
    proprio, actionless = slice(pixels, pixels + 10), slice(0, -10)  # the action's 10 come last
    terms = {
        "loss": F.mse_loss(predicted[..., actionless], target[..., actionless]),
        "pixels": F.mse_loss(predicted[..., :pixels], target[..., :pixels]),
        "proprio": F.mse_loss(predicted[..., proprio], target[..., proprio]),
    }
    return {"pixels_emb": info["pixels_emb"], "proprio_emb": info["proprio_emb"],
            "predicted": predicted, "terms": terms}  # fmt: skip


def main(out: str) -> None:
    torch.manual_seed(0)
    batch = {
        "pixels": torch.randint(0, 256, (BATCH, FRAMES, SIZE, SIZE, 3), dtype=torch.uint8),
        "action": torch.randn(BATCH, FRAMES, ACTION_BLOCK),
        "proprio": torch.randn(BATCH, FRAMES, PROPRIO_DIM),
    }
    model, idm = pldm()
    dino = dino_wm()
    for module in (model, idm, dino):
        module.eval()
    state = model.state_dict() | {f"idm.{key}": value for key, value in idm.state_dict().items()}
    torch.save({
        "batch": batch,
        "pldm": {"parts": parts(model) | {"idm": count(idm)}, "state": state,
                 **pldm_outputs(model, idm, batch)},
        "dino_wm": {"parts": parts(dino), "state": dino.state_dict(),
                    **dino_wm_outputs(dino, batch)},
    }, out)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
