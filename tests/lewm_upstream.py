"""stable-worldmodel 0.1.1's LeWM, run in the side venv's interpreter (``SWM_UPSTREAM_PYTHON``,
with stable-pretraining, transformers and hydra-core installed) by tests/test_lewm.py; swm is
not imported here.

    python lewm_upstream.py outputs SIZE OUT.pt         a LeWM, a batch and its outputs
    python lewm_upstream.py save SIZE FOLDER            save_pretrained + an object checkpoint
    python lewm_upstream.py load FOLDER PIXELS.pt OUT.pt   load_pretrained, encode, get_cost

SIZE is "full" (``lewm.yaml``'s model, a 2-D action, frameskip 5) or "tiny" (the same modules,
small: a 28-px ViT of width 32). The model config is ``lewm.yaml``'s ``model`` section, resolved
as its training script resolves it (``action_encoder.input_dim = frameskip x action_dim``).
"""

import copy
import sys
from pathlib import Path

import torch

FRAMESKIP, ACTION_DIM, HISTORY = 5, 2, 3
MLP = "stable_worldmodel.wm.lewm.module.MLP"
BATCHNORM = {"_target_": "torch.nn.BatchNorm1d", "_partial_": True}
FULL = {
    "_target_": "stable_worldmodel.wm.lewm.LeWM",
    "encoder": {"_target_": "stable_pretraining.backbone.utils.vit_hf", "size": "tiny",
                "patch_size": 14, "image_size": 224, "pretrained": False,
                "use_mask_token": False},
    "predictor": {"_target_": "stable_worldmodel.wm.lewm.module.Predictor",
                  "num_frames": HISTORY, "input_dim": 192, "hidden_dim": 192, "output_dim": 192,
                  "depth": 6, "heads": 16, "mlp_dim": 2048, "dim_head": 64, "dropout": 0.1,
                  "emb_dropout": 0.0},
    "action_encoder": {"_target_": "stable_worldmodel.wm.lewm.module.Embedder",
                       "input_dim": FRAMESKIP * ACTION_DIM, "emb_dim": 192},
    "projector": {"_target_": MLP, "input_dim": 192, "output_dim": 192, "hidden_dim": 2048,
                  "norm_fn": BATCHNORM},
    "pred_proj": {"_target_": MLP, "input_dim": 192, "output_dim": 192, "hidden_dim": 2048,
                  "norm_fn": BATCHNORM},
}  # fmt: skip
LOSS = {"weight": 0.09, "kwargs": {"knots": 17, "num_proj": 1024}}


def config(size: str) -> dict:
    """The model config of ``size`` (the module's docstring)."""
    cfg = copy.deepcopy(FULL)
    if size == "tiny":
        cfg["encoder"].update(image_size=28, hidden_size=32, num_hidden_layers=2,
                              num_attention_heads=2, intermediate_size=128)  # fmt: skip
        cfg["predictor"].update(input_dim=16, hidden_dim=16, output_dim=16, depth=2, heads=2,
                                mlp_dim=32, dim_head=8)  # fmt: skip
        cfg["action_encoder"]["emb_dim"] = 16
        cfg["projector"].update(input_dim=32, output_dim=16, hidden_dim=64)
        cfg["pred_proj"].update(input_dim=16, output_dim=16, hidden_dim=64)
    return cfg


def build(size: str):
    from hydra.utils import instantiate

    torch.manual_seed(0)
    return instantiate(config(size))


def pixels_in(model, pixels: torch.Tensor) -> torch.Tensor:
    """uint8 ``(B, T, H, W, 3)`` through stable-worldmodel's eval transform (eval_wm.py's
    img_transform: ToImage, ToDtype scaled, ImageNet's Normalize, Resize), ``(B, T, 3, S, S)``."""
    import stable_pretraining as spt
    from torchvision.transforms import v2 as transforms

    side = model.encoder.config.image_size
    transform = transforms.Compose([
        transforms.ToImage(), transforms.ToDtype(torch.float32, scale=True),
        transforms.Normalize(**spt.data.dataset_stats.ImageNet), transforms.Resize(size=side),
    ])  # fmt: skip
    frames = [transform(frame.numpy()) for frame in pixels.flatten(0, 1)]
    return torch.stack(frames).unflatten(0, pixels.shape[:2])


def loss(model, pixels: torch.Tensor, action: torch.Tensor) -> dict:
    """scripts/train/lewm.py's lejepa_forward: history 3, one predicted step, SIGReg 0.09."""
    from stable_worldmodel.wm.loss import SIGReg

    batch = {"pixels": pixels, "action": torch.nan_to_num(action, 0.0)}
    output = model.encode(batch)
    emb, act_emb = output["emb"], output["act_emb"]
    pred = model.predict(emb[:, :HISTORY], act_emb[:, :HISTORY])
    pred_loss = (pred - emb[:, 1:]).pow(2).mean()
    sigreg_loss = SIGReg(**LOSS["kwargs"])(emb.transpose(0, 1))
    total = pred_loss + LOSS["weight"] * sigreg_loss
    return {"loss": total, "prediction": pred_loss, "sigreg": sigreg_loss, "emb": emb,
            "pred": pred}  # fmt: skip


def outputs(size: str, out: Path) -> None:
    model = build(size)
    side = model.encoder.config.image_size
    generator = torch.Generator().manual_seed(1)
    pixels = torch.randint(0, 256, (4, HISTORY + 1, side, side, 3), generator=generator,
                           dtype=torch.uint8)  # fmt: skip
    action = torch.randn(4, HISTORY + 1, FRAMESKIP * ACTION_DIM, generator=generator)
    action[:, -1] = float("nan")  # an episode's last block
    frames = pixels_in(model, pixels)
    model.train()
    torch.manual_seed(2)  # dropout and SIGReg's projections: the same draws on both sides
    train = loss(model, frames, action)
    model.eval()
    with torch.no_grad():
        info = model.encode({"pixels": frames, "action": torch.nan_to_num(action, 0.0)})
        pred = model.predict(info["emb"][:, :HISTORY], info["act_emb"][:, :HISTORY])
    torch.save({
        "state": model.state_dict(), "pixels": pixels, "action": action,
        "parameters": {name: sum(p.numel() for p in child.parameters())
                       for name, child in model.named_children()},
        "train": {key: value.detach() for key, value in train.items()},
        "emb": info["emb"], "pred": pred,
    }, out)  # fmt: skip


def save(size: str, folder: Path) -> None:
    """Upstream's own save code: save_pretrained (weights.pt + config.json) into ``folder``,
    and the object checkpoint (the pickled module) into ``folder``-object."""
    from omegaconf import OmegaConf
    from stable_worldmodel.wm.utils import save_pretrained

    model = build(size)
    save_pretrained(model, run_name=folder.name, config=OmegaConf.create(config(size)),
                    cache_dir=folder.parent)  # fmt: skip
    (folder.parent / "checkpoints" / folder.name).rename(folder)
    objects = folder.with_name(folder.name + "-object")
    objects.mkdir()
    torch.save(model, objects / "lewm_object.ckpt")


def load(folder: Path, pixels_file: Path, out: Path) -> None:
    """load_pretrained(folder), then what planning calls: encode and get_cost."""
    from stable_worldmodel.wm.utils import load_pretrained

    model = load_pretrained(str(folder.resolve())).eval()
    pixels = torch.load(pixels_file)  # uint8 (B, T, H, W, 3)
    frames = pixels_in(model, pixels)
    block = model.action_encoder.input_dim
    with torch.no_grad():
        emb = model.encode({"pixels": frames})["emb"]
        # one start and goal (the first clip's first and last frames), three plans of 4 blocks
        info = {"pixels": frames[:1, None, :1].expand(-1, 3, -1, -1, -1, -1),
                "goal": frames[:1, None, -1:].expand(-1, 3, -1, -1, -1, -1),
                "action": torch.zeros(1, 3, 1, block)}  # fmt: skip
        candidates = torch.randn(1, 3, 4, block, generator=torch.Generator().manual_seed(3))
        cost = model.get_cost(info, candidates)
    torch.save({"emb": emb, "cost": cost, "candidates": candidates,
                "parameters": sum(p.numel() for p in model.parameters())}, out)  # fmt: skip


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "outputs":
        outputs(args[0], Path(args[1]))
    elif command == "save":
        save(args[0], Path(args[1]))
    else:
        load(Path(args[0]), Path(args[1]), Path(args[2]))
