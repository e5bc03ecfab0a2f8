#!/usr/bin/env bash
# Generates Python messages, gRPC stubs, typing stubs, the edge's descriptor set and the
# edge's OpenAPI document from protos/ into the directory given (default: gen/). One
# generator, one output: `make proto` writes gen/, and the drift check writes a temporary
# directory and compares.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-gen}"
venv_bin="$(dirname "$(command -v python)")"
mkdir -p "$out"
find "$out" -mindepth 1 -delete
mapfile -t sources < <(find protos -name '*.proto' | LC_ALL=C sort)
python -m grpc_tools.protoc \
  -I protos -I third_party \
  --plugin=protoc-gen-mypy="$venv_bin/protoc-gen-mypy" \
  --plugin=protoc-gen-mypy_grpc="$venv_bin/protoc-gen-mypy_grpc" \
  --python_out="$out" --grpc_python_out="$out" \
  --mypy_out=quiet:"$out" --mypy_grpc_out=quiet:"$out" \
  "${sources[@]#protos/}"
# The edge's descriptor set: the public services plus everything they import, with
# comments, and google/rpc/error_details so ErrorInfo renders in JSON error bodies.
python -m grpc_tools.protoc \
  -I protos -I third_party \
  --include_imports --include_source_info \
  --descriptor_set_out="$out/atelier.binpb" \
  "${sources[@]#protos/}" google/rpc/error_details.proto
# The OpenAPI document of the JSON edge: that descriptor set, for the services the edge's
# transcoder serves (deploy/envoy/envoy.yaml). The edge serves it at /openapi.json. Beside
# it the edge's route table (its routes Lua filter: 405 with allow, unknown body fields)
# and schemathesis's configuration for the document (the fuzz test's, and anyone's).
python -m services.dev.openapi --descriptor "$out/atelier.binpb" \
  --edge deploy/envoy/envoy.yaml --out "$out/openapi.json" --routes-out "$out/edge_routes.lua" \
  --fuzzing-out "$out/schemathesis.toml"
