#!/usr/bin/env bash
# Install everything the tests need and run them (the README's second command; CI runs this).
set -euo pipefail
cd "$(dirname "$0")/.."
# promtool (Debian's prometheus package) checks the metrics, chromium and chromedriver drive the
# explorer's browser tests; installed when we can, those tests skipped otherwise.
packages=()
command -v promtool >/dev/null 2>&1 || packages+=(prometheus)
command -v chromium >/dev/null 2>&1 || packages+=(chromium)
command -v chromedriver >/dev/null 2>&1 || packages+=(chromium-driver)
if [ ${#packages[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null || true
fi
# marian: pymarian 1.12.42 (a 604 MB wheel, from pip's cache after the first run) trains and
# decodes the tiny Marian models tests/test_import_marian.py checks the importer against (~25 s)
bash scripts/install.sh dev,train,import,benchmark,marian
. .venv/bin/activate
ruff check .
ruff format --check .
mypy
lint-imports --no-cache
# two workers (pytest-xdist), each test file whole in one of them (its module fixtures built once):
# 899 s against 1,668 s in one process on the 2-core machine CI runs on
python -m pytest -q -n "${S2S_TEST_WORKERS:-2}" --dist loadfile
