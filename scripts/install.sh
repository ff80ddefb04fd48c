#!/usr/bin/env bash
# Install the project into ./.venv. Used by the README, CI and the Dockerfile alike.
#   scripts/install.sh            serving only (no torch)
#   scripts/install.sh dev,train  serving + extras
# Environment: PYTHON (default python3), S2S_ONNXRUNTIME=gpu to swap in onnxruntime-gpu (CUDA images).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
"${PYTHON:-python3}" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
if [ -n "$extras" ]; then
  python -m pip install -q -e ".[${extras}]"
else
  python -m pip install -q -e .
fi
if [ "${S2S_ONNXRUNTIME:-cpu}" = "gpu" ]; then
  python -m pip uninstall -q -y onnxruntime
  python -m pip install -q onnxruntime-gpu
fi
bash scripts/gen_proto.sh
