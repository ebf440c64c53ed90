#!/usr/bin/env bash
# benchmarks/gpu_check.sh: on a CUDA machine, measure what swm predicts for the GPU (issue 36).
#
#   OUT=out bash benchmarks/gpu_check.sh        # about 6-8 minutes on one H100/H200
#
# Every `swm memprofile` row of gpu24-224-bf16 and lewm-224 (compile included), vit-b-224 at
# B=128 with activation checkpointing (its rows: each technique alone), the conv + GroupNorm test model
# with bf16 + checkpointing: predicted vs measured (max_memory_allocated and reserved) and their
# ratio (target within 10%); then lewm-224's steady steps/s, bf16 + compile against fp32, and the
# loader's clips/s against the trainer's; then `pytest -m gpu`. Needs the machine's CUDA build of
# torch and swm's other dependencies installed (swm itself is installed without dependencies, or
# used from the checkout). Writes under $OUT: summary.txt (what it printed, the table last),
# rows.jsonl (every memprofile result), speed.json, pytest.txt and a CUDA memory snapshot.
# A failing step does not stop the others; the script then exits non-zero.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$(mktemp -d)}"
WORK="$(mktemp -d)"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 COLUMNS="${COLUMNS:-200}"
exec > >(tee "$OUT/summary.txt") 2>&1
status=0
step() { printf '\n== %s (%ss elapsed)\n' "$1" "$SECONDS"; }
profile() {  # swm memprofile ARGS... --json, one line of rows.jsonl labelled $1
  local label="$1"; shift
  if timeout 240 python3 -m swmcli memprofile "$@" --json > "$WORK/row.json"; then
    python3 -c 'import json,sys; d=json.load(open(sys.argv[2])); d["label"]=sys.argv[1]; print(json.dumps(d))' \
      "$label" "$WORK/row.json" >> "$OUT/rows.jsonl"
  else
    echo "memprofile failed: $label"; status=1
  fi
}

step "device"
python3 - <<'EOF' || exit 1
import torch
assert torch.cuda.is_available(), "gpu_check.sh needs a CUDA device and a CUDA build of torch"
props = torch.cuda.get_device_properties(0)
print(f"torch {torch.__version__}, {props.name}, {props.total_memory / 2**30:.1f} GiB")
EOF

step "install swm (no dependencies, keeps the machine's torch)"
if ! python3 -m pip install --quiet --no-deps --no-build-isolation -e . 2>"$WORK/pip.log"; then
  echo "pip install failed; using the checkout on PYTHONPATH"
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
python3 -c 'import swmcli, lance, h5py, gymnasium; print("swm", swmcli.__version__)' || exit 1

step "memprofile rows, predicted vs measured"
profile "gpu24-224-bf16" --preset gpu24-224-bf16 --budget 24GiB --snapshot "$OUT/gpu24-224-bf16.pickle"
profile "lewm-224" --preset lewm-224 --budget 24GiB
# One run gives vit-b-224's rows with checkpointing configured (the compile row) and each technique
# alone (bf16, optimizer in backward, checkpointing) against fp32 without any.
profile "vit-b-224 B=128 checkpointing" --preset vit-b-224 --batch-size 128 \
  --activation-checkpointing layers --budget 24GiB
profile "conv user model bf16 + checkpointing" --preset tworoom-224 \
  --model tests/models/conv_world_model.py:build --bf16 --activation-checkpointing ConvStage

step "lewm-224: steady steps/s (bf16 + compile vs fp32) and the loader's clips/s"
timeout 120 python3 -m swmcli collect --preset lewm-224 --episodes 300 --out "$WORK/lewm.lance" > /dev/null || status=1
train() {  # label, extra flags: about 30 s of steady steps each
  timeout 200 python3 -m swmcli train --preset lewm-224 --data "$WORK/lewm.lance" --steps 200 \
    --no-in-memory --set eval.heldout_episodes=4 --out "$WORK/run-$1" --json "${@:2}" > "$WORK/train-$1.json" || status=1
}
train bf16-compile --bf16 --compile
train fp32 --fp32 --eager
timeout 60 python3 - "$WORK" "$OUT/speed.json" <<'EOF' || status=1
import json, sys, time
from pathlib import Path
from swmcli.config import resolve_config
from swmcli.data.streaming import load_dataset, make_loader
work, out = Path(sys.argv[1]), Path(sys.argv[2])
cfg = resolve_config("lewm-224")
data = load_dataset(work / "lewm.lance", keys_to_load=["pixels", "action"],
                    history_len=cfg.data.history_len, frameskip=cfg.data.frameskip)
loader = iter(make_loader(data, cfg.train.batch_size, num_workers=cfg.data.num_workers))
next(loader)
clips, began = 0, time.perf_counter()
while time.perf_counter() - began < 15:
    clips += len(next(loader)["pixels"])
speed = {"loader_clips_per_s": clips / (time.perf_counter() - began)}
for label in ("bf16-compile", "fp32"):
    fields = json.loads((work / f"train-{label}.json").read_text())
    speed[f"train_{label}_clips_per_s"] = fields["steady_clips_per_s"]
    speed[f"train_{label}_steps_per_s"] = fields["steady_clips_per_s"] / cfg.train.batch_size
print(json.dumps(speed, indent=1))
out.write_text(json.dumps(speed))
EOF

step "GPU tests"
timeout 300 python3 -m pytest -o addopts='' -m gpu -q -s > "$OUT/pytest.txt" 2>&1 || status=1
tail -5 "$OUT/pytest.txt"

step "predicted vs measured, every row (measured / predicted: target 0.9-1.1)"
python3 - "$OUT/rows.jsonl" <<'EOF' || status=1
import json, sys
for line in open(sys.argv[1]):
    result = json.loads(line)
    table = result["tables"][0]
    print(f"\n{result['label']} ({result['model']}, B={result['batch_size']})")
    for row in table["rows"]:
        cells = dict(zip(table["columns"], row, strict=True))
        predicted, allocated = cells["predicted_peak_bytes"], cells.get("measured_allocated_bytes")
        show = lambda b: f"{b / 2**20:10.1f} MiB" if isinstance(b, int) else f"{b!s:>14}"
        reserved = cells.get("measured_reserved_bytes")
        print(f"  {cells['technique']:<38} {show(predicted)} {show(allocated)} {show(reserved)}"
              f"  {cells.get('measured / predicted', '-')}")
EOF

step "done (exit $status): outputs in $OUT"
ls -l "$OUT"
exit "$status"
