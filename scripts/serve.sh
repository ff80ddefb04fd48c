#!/usr/bin/env bash
# Install (serving only, no torch) and serve every model in models/ (numbers en→fr, the default; G2P;
# grc-en-nt, trained on gold links; grc-en-nt-silver, on eflomal's links only; grc-en-nt-transformer,
# trained by Marian): gRPC :50051, HTTP/JSON and
# the attention explorer page :8080, metrics :9090.
# Extra arguments go to the server, e.g. scripts/serve.sh --port 6000 --policy request
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/python -m service.serve.server --models models --http-port 8080 --ui "$@"  # the embedded models
