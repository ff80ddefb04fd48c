#!/usr/bin/env bash
# Install the project into ./.venv. Used by the README, CI and the Dockerfile alike.
#   scripts/install.sh            serving only (no torch)
#   scripts/install.sh dev,train  serving + extras
#   scripts/install.sh dev,train,import  + OpenNMT-py 3.5.1 and Joey NMT 2.3.0 (--no-deps) for s2s-import
# Environment: PYTHON (default python3), S2S_ONNXRUNTIME=gpu to swap in onnxruntime-gpu (CUDA images),
#   S2S_LOCK=requirements/serve.lock (the images): the hashed pins with --require-hashes, then the
#   project alone (--no-deps, built with the locked setuptools: no unpinned download at all).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
"${PYTHON:-python3}" -m venv .venv
. .venv/bin/activate
if [ -n "${S2S_LOCK:-}" ]; then
  [ -z "$extras" ] || { echo "S2S_LOCK installs the lock only, without extras" >&2; exit 2; }
  python -m pip install -q --require-hashes --no-deps -r "$S2S_LOCK"
  python -m pip install -q --no-deps --no-build-isolation -e .
else
  python -m pip install -q --upgrade pip
  if [ -n "$extras" ]; then
    python -m pip install -q -e ".[${extras}]"
  else
    python -m pip install -q -e .
  fi
fi
case ",$extras," in
  *,import,*)  # the toolkits s2s-import reads; their own pins (torch<2.3, protobuf<3.21) are too old
    python -m pip install -q --no-deps opennmt-py==3.5.1 joeynmt==2.3.0 ;;
esac
if [ "${S2S_ONNXRUNTIME:-cpu}" = "gpu" ]; then
  python -m pip uninstall -q -y onnxruntime
  python -m pip install -q onnxruntime-gpu
fi
bash scripts/gen_proto.sh
