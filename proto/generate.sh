#!/usr/bin/env bash
# Regenerates the Go and Python code of the v1 API from proto/hoptrace/v1.
# One protoc (grpcio-tools') for both languages, so `make proto-check` is stable.
set -euo pipefail
cd "$(dirname "$0")/.."
py_out=proto/gen/python
go_out=agent/internal/pb
rm -rf "$py_out/hoptrace/v1" "$go_out/hoptracev1"
mkdir -p "$py_out/hoptrace/v1" "$go_out"
protos=(proto/hoptrace/v1/*.proto)
.venv/bin/python -m grpc_tools.protoc -Iproto \
	--python_out="$py_out" --pyi_out="$py_out" --grpc_python_out="$py_out" \
	--plugin=protoc-gen-go="$(command -v protoc-gen-go)" \
	--plugin=protoc-gen-go-grpc="$(command -v protoc-gen-go-grpc)" \
	--go_out="$go_out" --go_opt=module=github.com/hoptrace/hoptrace/agent/internal/pb \
	--go-grpc_out="$go_out" --go-grpc_opt=module=github.com/hoptrace/hoptrace/agent/internal/pb \
	"${protos[@]}"
touch "$py_out/hoptrace/v1/__init__.py"
