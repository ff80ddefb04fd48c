#!/usr/bin/env bash
# Install everything the tests need and run them (the README's second command; CI runs this).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev,train
. .venv/bin/activate
ruff check .
ruff format --check .
mypy
python -m pytest -q
