#!/usr/bin/env bash
# Headless load test (see loadtest/run.py --help), from the repository root with the project's venv:
#   bash loadtest/run.sh --users 32 --duration 30s --policy iteration --out runs/loadtest/iteration-u32
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-.venv/bin/python}" -m loadtest.run "$@"
