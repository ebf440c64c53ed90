#!/usr/bin/env bash
# benchmarks/gpu_check.sh: on a CUDA machine, install swm, run the GPU tests, and print
# memprofile's predicted vs measured peaks for the gpu24-224-bf16 preset, row by row.
#
#   bash benchmarks/gpu_check.sh            # about 3-6 minutes on one H100/H200; under 10
#
# Needs the machine's CUDA build of torch and swm's other dependencies already installed (no
# network is assumed: swm itself is installed without dependencies, or used from the checkout).
# Writes its outputs under $OUT (default: a temporary directory): the printed table and a CUDA
# memory snapshot (open it at https://pytorch.org/memory_viz). A failing GPU test does not stop
# the table from being printed; the script then exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 COLUMNS="${COLUMNS:-200}"
step() { printf '\n== %s (%ss elapsed)\n' "$1" "$SECONDS"; }

step "device"
python3 - <<'EOF'
import torch
assert torch.cuda.is_available(), "gpu_check.sh needs a CUDA device and a CUDA build of torch"
props = torch.cuda.get_device_properties(0)
print(f"torch {torch.__version__}, {props.name}, {props.total_memory / 2**30:.1f} GiB")
EOF

step "install swm (no dependencies, keeps the machine's torch)"
if ! python3 -m pip install --quiet --no-deps --no-build-isolation -e . 2>"$OUT/pip.log"; then
  echo "pip install failed (see $OUT/pip.log); using the checkout on PYTHONPATH"
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
python3 - <<'EOF'
import importlib.util
import swmcli, gymnasium, pydantic, rich, typer  # required: fail here, not halfway
missing = [name for name in ("lance", "lancedb", "h5py") if importlib.util.find_spec(name) is None]
print("swm", swmcli.__version__, "| missing (disk estimate skips them):", missing or "none")
EOF

step "GPU tests (prediction within 10% of the measured peak; snapshot; compile measured)"
status=0
timeout 300 python3 -m pytest tests/test_memprofile.py -m gpu -q -s || status=$?

step "swm memprofile --preset gpu24-224-bf16 --budget 24GiB (predicted vs measured per row)"
timeout 270 python3 -m swmcli memprofile --preset gpu24-224-bf16 --budget 24GiB \
  --snapshot "$OUT/gpu24-224-bf16.pickle" | tee "$OUT/memprofile.txt" || status=$?

step "done (exit $status): outputs in $OUT"
ls -l "$OUT"
exit "$status"
