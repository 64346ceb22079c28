#!/usr/bin/env bash
# Many trajectories per agent worker at full size: `speceyes bench agent` on
# Qwen2.5-VL-7B's architecture with random weights built on the GPU (no hub, nothing
# stored), N = 1, 4, 16 at once. Runs from the source tree with a python3 that already
# has a CUDA torch (a GPU image), so it needs no network: what such an image lacks
# (transformers >= 5.20, pydantic, ...) is installed from wheels in .whl/ if there are
# any (WHEELS names another folder), made beforehand where PyPI is reachable by
# `make gpu-wheels`.
#
#   bash lab/bench/gpu.sh                       # on the GPU machine, from the repo root
#   PRESET=test DEVICE=cpu DTYPE=float32 bash lab/bench/gpu.sh   # the same path on a CPU
#
# Environment: PYTHON (python3), PRESET (qwen2.5-vl-7b | test), DEVICE (cuda),
# DTYPE (bfloat16), CONCURRENCY (1,4,16), TRAJECTORIES (32), WHEELS (.whl), OUT (a
# folder: the figures are also written to OUT/bench-gpu.txt).
set -euo pipefail

python=${PYTHON:-python3}
preset=${PRESET:-qwen2.5-vl-7b}
device=${DEVICE:-cuda}
wheels=${WHEELS:-.whl}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

if compgen -G "$wheels/*.whl" >/dev/null; then
    "$python" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir \
        --target "$scratch/site" "$wheels"/*.whl
    export PYTHONPATH="$scratch/site"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

"$python" - "$device" <<'EOF'
import sys

import torch
import transformers

device = sys.argv[1]
if device.startswith("cuda"):
    if not torch.cuda.is_available():
        sys.exit(f"no CUDA device visible to torch {torch.__version__}; DEVICE=cpu runs on the CPU")
    name = torch.cuda.get_device_name(torch.device(device))
else:
    name = "CPU"
print(f"device: {name}; torch {torch.__version__}, transformers {transformers.__version__}")
EOF

"$python" -m cli.main models build-random --preset "$preset" --out "$scratch/model"
"$python" -m cli.main bench agent --large "$scratch/model" --device "$device" \
    --dtype "${DTYPE:-bfloat16}" --concurrency "${CONCURRENCY:-1,4,16}" \
    --trajectories "${TRAJECTORIES:-32}" | tee "${OUT:-$scratch}/bench-gpu.txt"
