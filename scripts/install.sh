#!/usr/bin/env bash
# Install the project into ./.venv. Used by the README, CI and the Dockerfile alike.
#   scripts/install.sh            serving only (no torch)
#   scripts/install.sh dev,train  serving + extras
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
if [ -n "$extras" ]; then
  python -m pip install -q -e ".[${extras}]"
else
  python -m pip install -q -e .
fi
