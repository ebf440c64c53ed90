"""LeWM as stable-worldmodel 0.1.1 builds it (swmcli/zoo/lewm.py, preset lewm-224), and its
checkpoint folders in and out.

Here: the preset's model, parameter for parameter, and a tiny LeWM (the same modules, small)
trained, exported as a stable-worldmodel folder, evaluated and trained from. In the side venv
(``SWM_UPSTREAM_PYTHON`` with stable-worldmodel 0.1.1, stable-pretraining, transformers and
hydra-core; a visible skip elsewhere): upstream's own LeWM and swm's, equal to 1e-5 on one batch,
and the folders each side writes loaded by the other (tests/lewm_upstream.py runs upstream's
side).
"""

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from swmcli.commands.convert import run_convert
from swmcli.commands.evaluate import eval_config, run_eval
from swmcli.commands.train import run_train
from swmcli.config import resolve_config
from swmcli.errors import UsageError
from swmcli.memory.measure import MemoryMonitor
from swmcli.models.interface import build_model, load_factory
from swmcli.training.checkpoints import load_checkpoint
from swmcli.training.lewm_checkpoints import init_from_run

UPSTREAM = Path(__file__).with_name("lewm_upstream.py")
# stable-worldmodel 0.1.1's LeWM for a 2-D action at frameskip 5 (lewm.yaml), part by part
UPSTREAM_PARAMETERS = {"encoder": 5_501_376, "predictor": 10_791_360, "action_encoder": 156_206,
                       "projector": 792_768, "pred_proj": 792_768}  # fmt: skip
# tests/lewm_upstream.py's "tiny": the same modules at a 28-px ViT of width 32
TINY = {"image_size": 28, "vit": [32, 2, 2], "embed_dim": 16, "hidden_dim": 64, "depth": 2,
        "heads": 2, "dim_head": 8, "mlp_dim": 32}  # fmt: skip
# one short planning episode in fp32 without compilation: what swm eval does, at a test's cost
SMALL_EVAL = ["eval.episodes=1", "eval.samples=8", "eval.iterations=1", "eval.elites=2",
              "eval.keep_elites=0", "eval.replan_every=1", "eval.horizon=1", "eval.step_budget=4",
              "eval.heldout_episodes=2", "runtime.bf16=false", "runtime.compile=false"]  # fmt: skip


def _tiny_lewm_cfg(data: Path, out: Path, **flags):
    settings = {"data.path": data, "train.out": out, "data.history_len": 4, "train.steps": 6,
                "train.checkpoint_every": 6, "model.factory": "swmcli.zoo.lewm:build",
                "model.kwargs": TINY, **flags}  # fmt: skip
    return resolve_config("tiny", flags=settings)


def test_lewm_224_is_stable_worldmodels_lewm_with_its_loss_and_optimizer():
    cfg = resolve_config(preset="lewm-224")
    shape = {"resolution": 224, "action_dim": 2, "frameskip": cfg.data.frameskip,
             "history_len": cfg.data.history_len}  # fmt: skip
    with torch.device("meta"):  # shapes only: 18 M parameters need no values here
        model = build_model(cfg.model, shape)
    parts = {
        name: sum(p.numel() for p in part.parameters()) for name, part in model.named_children()
    }
    assert parts == UPSTREAM_PARAMETERS
    assert sum(p.numel() for p in model.parameters()) == 18_034_478
    assert (model.context_len, cfg.data.frameskip, model.sigreg_weight) == (3, 5, 0.09)
    assert model.sigreg == {"knots": 17, "projections": 1024}
    train = cfg.train
    assert (train.lr, train.weight_decay, train.grad_clip, train.batch_size) == (5e-5, 1e-3, 1, 128)
    assert cfg.runtime.bf16


def test_a_tiny_lewm_trains_exports_evaluates_and_restarts_as_a_stable_worldmodel_folder(
    tiny_data, tmp_path
):
    run_dir, folder = tmp_path / "run", tmp_path / "lewm"
    run_train(_tiny_lewm_cfg(tiny_data, run_dir, **{"train.log_every": 1}), MemoryMonitor())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert {"prediction", "sigreg"} <= set(rows[0]) and rows[-1]["loss"] < rows[0]["loss"]

    result = run_convert(run_dir, folder, layout="stable-worldmodel")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "weights.pt"]
    config = json.loads((folder / "config.json").read_text())
    assert config["_target_"] == "stable_worldmodel.wm.lewm.LeWM"
    assert config["action_encoder"]["input_dim"] == 2 and config["predictor"]["num_frames"] == 3
    saved = torch.load(folder / "weights.pt", weights_only=True)
    trained = load_checkpoint(run_dir)["model"]
    assert saved.keys() == trained.keys() and all(torch.equal(saved[k], trained[k]) for k in saved)
    assert result.fields["checkpoint_step"] == 6

    with pytest.raises(UsageError, match="names no dataset") as error:
        eval_config(folder, sets=[])
    assert "--set data.path=" in error.value.hint
    with pytest.raises(UsageError, match=r"cannot change model\.kwargs"):
        eval_config(folder, sets=[f"data.path={tiny_data}", "model.kwargs.depth=3"])
    cfg = eval_config(folder, sets=[f"data.path={tiny_data}", *SMALL_EVAL])
    assert (cfg.model.factory, cfg.data.history_len, cfg.data.frameskip) == (
        "swmcli.zoo.lewm:build", 4, 1)  # fmt: skip
    evaluated = run_eval(folder, MemoryMonitor(), cfg)
    assert evaluated.fields["episodes"] == 1 and evaluated.fields["open_loop_mse_first"] >= 0

    fresh = load_factory("swmcli.zoo.lewm:build")(action_dim=2, frameskip=1, history_len=4, **TINY)
    assert init_from_run(fresh, folder).endswith("every weight loaded")  # train.init_from's
    assert all(torch.equal(fresh.state_dict()[k], trained[k]) for k in trained)


def test_a_folder_of_transformers_4_names_loads_as_todays(tmp_path):
    """Checkpoints saved under transformers 4 name the ViT's layers as HuggingFace did then
    (encoder.encoder.layer.N.attention.attention.query, ...): they load into the same model."""
    from swmcli.training.lewm_checkpoints import read_lewm_folder, upstream_config

    model = load_factory("swmcli.zoo.lewm:build")(action_dim=2, frameskip=1, history_len=4, **TINY)
    old_names = {"attention.q_proj.": "attention.attention.query.",
                 "attention.k_proj.": "attention.attention.key.",
                 "attention.v_proj.": "attention.attention.value.",
                 "attention.o_proj.": "attention.output.dense.", "mlp.fc1.": "intermediate.dense.",
                 "mlp.fc2.": "output.dense."}  # fmt: skip
    weights = {}
    for name, tensor in model.state_dict().items():
        for new, old in old_names.items():
            name = name.replace(f".{new}", f".{old}")
        weights[name.replace("encoder.layers.", "encoder.encoder.layer.")] = tensor
    assert "encoder.encoder.layer.1.intermediate.dense.weight" in weights
    torch.save(weights, tmp_path / "weights.pt")
    shape = {"action_dim": 2, "frameskip": 1, "history_len": 4}
    (tmp_path / "config.json").write_text(json.dumps(upstream_config(TINY, shape)))
    read = read_lewm_folder(tmp_path)
    assert (read.kwargs["vit"], read.action_inputs, read.num_frames) == ([32, 2, 2], 2, 3)
    assert read.weights.keys() == model.state_dict().keys()
    assert all(torch.equal(read.weights[k], v) for k, v in model.state_dict().items())


def test_lewm_folders_refuse_a_run_of_another_model_and_weights_that_do_not_fit(tmp_path):
    from swmcli.training.lewm_checkpoints import load_weights

    model = load_factory("swmcli.zoo.lewm:build")(action_dim=2, frameskip=1, history_len=4, **TINY)
    weights = model.state_dict()
    weights.pop("predictor.pos_embedding")
    with pytest.raises(Exception, match=r"1 weight\(s\) missing, first predictor\.pos_embedding"):
        load_weights(model, weights, tmp_path)


# -- the side venv: upstream's own code ------------------------------------------------------


@pytest.fixture(scope="module")
def lewm_python(upstream_python) -> str:
    """The side venv's interpreter, where stable-pretraining, transformers and hydra import."""
    probe = "import hydra, stable_pretraining, transformers, stable_worldmodel.wm.lewm"
    if subprocess.run([upstream_python, "-c", probe], capture_output=True).returncode:
        pytest.skip(f"{upstream_python} lacks LeWM's packages: pip install stable-pretraining "
                    "transformers hydra-core there")  # fmt: skip
    return upstream_python


def _upstream(python: str, *args) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([python, str(UPSTREAM), *map(str, args)], capture_output=True,
                          text=True, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


def test_swms_lewm_equals_stable_worldmodels_on_one_batch(lewm_python, tmp_path):
    """Upstream's LeWM (lewm.yaml, full size, fp32) and its state dict loaded into swm's: the
    same embeddings and predictions (eval mode), and the same training loss (train mode:
    BatchNorm's batch statistics, the predictor's dropout and SIGReg's projections drawn from
    one seed) within 1e-5."""
    from swmcli.zoo.lewm import build

    _upstream(lewm_python, "outputs", "full", tmp_path / "upstream.pt")
    upstream = torch.load(tmp_path / "upstream.pt", weights_only=True)
    model = build(action_dim=2, frameskip=5, history_len=4)
    assert upstream["parameters"] == UPSTREAM_PARAMETERS
    model.load_state_dict(upstream["state"])  # strict: every name and shape
    pixels, action = upstream["pixels"], upstream["action"]
    model.eval()  # first: the state holds BatchNorm's running statistics after upstream's step
    with torch.no_grad():
        latents = model.encode(pixels)
        predicted = model.predict(latents[:, :3], action[:, :3])
    model.train()
    torch.manual_seed(2)
    loss = model.loss({"pixels": pixels, "action": action})
    differences = {
        "embeddings": (latents - upstream["emb"]).abs().max().item(),
        "predictions": (predicted - upstream["pred"]).abs().max().item(),
        **{
            k: (loss[k] - upstream["train"][k]).abs().item()
            for k in ("loss", "prediction", "sigreg")
        },
    }
    print("max abs differences:", differences)
    assert all(difference < 1e-5 for difference in differences.values()), differences


def test_upstreams_folders_plan_under_swm_and_swms_export_loads_upstream(
    lewm_python, tiny_data, tmp_path
):
    """A folder written by upstream's save_pretrained (and its object checkpoint) evaluates under
    swm eval with the same embeddings; swm's export loads with upstream's load_pretrained, whose
    embeddings and get_cost (what its planner calls) match swm's."""
    from swmcli import load_dataset
    from swmcli.training.lewm_checkpoints import load_lewm_model

    _upstream(lewm_python, "save", "tiny", tmp_path / "theirs")
    pixels = torch.as_tensor(load_dataset(tiny_data, history_len=4)[0]["pixels"])[None]
    torch.save(pixels, tmp_path / "pixels.pt")
    _upstream(lewm_python, "load", tmp_path / "theirs", tmp_path / "pixels.pt", tmp_path / "t.pt")
    theirs = torch.load(tmp_path / "t.pt", weights_only=True)
    sets = [f"data.path={tiny_data}", *SMALL_EVAL]
    for folder in (tmp_path / "theirs", tmp_path / "theirs-object"):
        cfg = eval_config(folder, sets=sets)
        model, _ = load_lewm_model(folder, cfg)
        with torch.no_grad():
            assert (model.eval().encode(pixels) - theirs["emb"]).abs().max() < 1e-5
    assert run_eval(tmp_path / "theirs", MemoryMonitor(), cfg).fields["episodes"] == 1

    run_dir = tmp_path / "run"
    run_train(_tiny_lewm_cfg(tiny_data, run_dir), MemoryMonitor())
    run_convert(run_dir, tmp_path / "ours", layout="stable-worldmodel")
    _upstream(lewm_python, "load", tmp_path / "ours", tmp_path / "pixels.pt", tmp_path / "o.pt")
    ours = torch.load(tmp_path / "o.pt", weights_only=True)
    model, _ = load_lewm_model(tmp_path / "ours", eval_config(tmp_path / "ours", sets=sets))
    assert ours["parameters"] == sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        assert (model.eval().encode(pixels) - ours["emb"]).abs().max() < 1e-5
    assert torch.isfinite(ours["cost"]).all() and ours["cost"].shape == (1, 3)
