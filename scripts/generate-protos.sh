#!/usr/bin/env bash
# Regenerates shim/proto/*_pb2.py from the .proto files with grpcio-tools' bundled protoc.
# The generated modules are committed; `make generate` followed by `git diff --exit-code`
# is the drift check.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PY:-.venv/bin/python}
"$py" -m grpc_tools.protoc -I . --python_out=. --pyi_out=. shim/proto/*.proto
