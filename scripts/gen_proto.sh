#!/usr/bin/env bash
# Generate the Python stubs from proto/translation/v1/translation.proto (grpcio-tools).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m grpc_tools.protoc -I . --python_out=. --grpc_python_out=. --pyi_out=. proto/translation/v1/translation.proto
