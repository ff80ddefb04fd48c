#!/usr/bin/env bash
# Check a GPU host and measure it, in one command (docs/gpu.md):
#   scripts/gpu_check.sh OUT [--parts DIR ...] [--site DIR] [--short] [-- benchmarks.gpu.gpu_check flags]
# With --parts (scripts/offline.py's parts; give several folders if the parts came in several), it
# first checks and installs them with no network into --site (default OUT/site; only what the host
# lacks or has older: a PyTorch image keeps its numpy, onnx, ...), timed, and puts that folder first
# on PYTHONPATH. Where CUDA's libraries come from NVIDIA's pip packages (nvidia-*-cu13, as in a
# PyTorch image), the server finds them itself (onnxruntime.preload_dlls); the check also puts their
# folders on LD_LIBRARY_PATH, and its providers stage says whether preload_dlls alone sufficed.
# Then python -m benchmarks.gpu.gpu_check OUT: OUT/gpu_check.json and OUT/gpu_check.md. On a machine
# without a GPU it runs the CPU rows, says that the CUDA rows did not run, and exits 0.
# PYTHON picks the interpreter (default: .venv/bin/python if there is one, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: scripts/gpu_check.sh OUT [--parts DIR ...] [--short]}"
shift
parts=()
flags=()
site=""
while [ $# -gt 0 ]; do
  case "$1" in
    --parts) parts+=("$2"); shift 2 ;;
    --site) site="$2"; shift 2 ;;
    --) shift; flags+=("$@"); break ;;
    *) flags+=("$1"); shift ;;
  esac
done
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
mkdir -p "$out"
out="$(cd "$out" && pwd)"
site="${site:-$out/site}"
install_flags=()
if [ ${#parts[@]} -gt 0 ]; then
  started=$(date +%s%N)
  for dir in "${parts[@]}"; do
    "$PYTHON" scripts/offline.py install "$dir" --target "$site" --only-missing
  done
  ms=$(( ($(date +%s%N) - started) / 1000000 ))
  install_s="$((ms / 1000)).$(printf '%03d' $((ms % 1000)))"
  install_flags=(--install-s "$install_s")
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
nvidia_libs="$("$PYTHON" - <<'PY' 2>/dev/null || true
import importlib.util, pathlib
spec = importlib.util.find_spec("nvidia")
roots = list(spec.submodule_search_locations) if spec and spec.submodule_search_locations else []
print(":".join(sorted({str(p.parent) for r in roots for p in pathlib.Path(r).glob("**/lib/*.so*")})))
PY
)"
if [ -n "$nvidia_libs" ]; then
  export S2S_LD_LIBRARY_PATH_BEFORE="${LD_LIBRARY_PATH:-}"
  export LD_LIBRARY_PATH="$nvidia_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
if [ ! -f proto/translation/v1/translation_pb2.py ]; then
  PATH="$(dirname "$PYTHON"):$PATH" bash scripts/gen_proto.sh
fi
exec "$PYTHON" -m benchmarks.gpu.gpu_check "$out" "${install_flags[@]}" "${flags[@]}"
