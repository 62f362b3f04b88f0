#!/usr/bin/env bash
# Regenerate the gRPC/protobuf Python code of fabricprobe/core/api/ from fabricprobe.proto.
#   scripts/gen-proto.sh            # write next to the .proto
#   scripts/gen-proto.sh OUT_DIR    # write into OUT_DIR/fabricprobe/core/api (the staleness test)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root}"
python="${PYTHON:-$root/.venv/bin/python}"
mkdir -p "$out/fabricprobe/core/api"
cd "$root"
"$python" -m grpc_tools.protoc -I . \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  fabricprobe/core/api/fabricprobe.proto
# The Prometheus exposition messages (no service): /metrics in protobuf, native histograms.
"$python" -m grpc_tools.protoc -I . --python_out="$out" --pyi_out="$out" \
  fabricprobe/core/api/prom_metrics.proto
# grpcio-tools writes no type hints for the service module; keep mypy out of it
# (callers see its classes as untyped) rather than checking generated code.
grpc_py="$out/fabricprobe/core/api/fabricprobe_pb2_grpc.py"
{ echo "# mypy: ignore-errors"; cat "$grpc_py"; } > "$grpc_py.tmp" && mv "$grpc_py.tmp" "$grpc_py"
# The stub is generated too: keep lint and the formatter out of it.
for pyi in "$out"/fabricprobe/core/api/{fabricprobe,prom_metrics}_pb2.pyi; do
  { echo "# ruff: noqa"; echo "# fmt: off"; cat "$pyi"; } > "$pyi.tmp" && mv "$pyi.tmp" "$pyi"
done
