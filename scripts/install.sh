#!/usr/bin/env bash
# Install the project into ./.venv. Used by the README, CI and the Dockerfile alike.
#   scripts/install.sh            serving only (no torch)
#   scripts/install.sh dev,train  serving + extras (train adds bible-alignments 0.4.2 --no-deps: its data only)
#   scripts/install.sh dev,train,import  + OpenNMT-py 3.5.1 and Joey NMT 2.3.0 (--no-deps) for s2s-import
# Environment: PYTHON (default python3),
#   S2S_LOCK=requirements/serve.lock (the images): the hashed pins with --require-hashes, then the
#   project alone (--no-deps, built with the locked setuptools: no unpinned download at all);
#   S2S_LOCK=requirements/serve-gpu.lock (or serve-gpu-cu12.lock) for NVIDIA GPUs: onnxruntime-gpu
#   and the CUDA and cuDNN libraries it needs, as NVIDIA's pip packages, pinned the same way.
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
  *,train,*)  # the Greek→English corpus (export/data/bible.py): only its data files, not its heavy deps
    # (it declares Python <3.12, which concerns only its code: we read its data files)
    python -m pip install -q --no-deps --ignore-requires-python bible-alignments==0.4.2 ;;
esac
case ",$extras," in
  *,import,*)  # the toolkits s2s-import reads; their own pins (torch<2.3, protobuf<3.21) are too old
    python -m pip install -q --no-deps opennmt-py==3.5.1 joeynmt==2.3.0 ;;
esac
bash scripts/gen_proto.sh
