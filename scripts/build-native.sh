#!/bin/bash
# scripts/build-native.sh — build the probes' compiled loops (probes/native_loop, probes/rdma/native) in place.
# Idempotent (compiles only when a C source or its build.py changed); run as root on the host (the lane VM sees the host's files read-only and
# loads the module built here).
#   * libibverbs-dev (headers and the libibverbs.so link) from apt, when missing
#   * cffi in .venv, when missing
#   * probes/native_loop/_socketloop*.so compiled from socketloop.c (TCP loops; libc only)
#   * probes/rdma/native/_fastpath*.so compiled from fastpath.c
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
py=${PYTHON:-.venv/bin/python}
if ! dpkg-query -W -f='${db:Status-Abbrev}' libibverbs-dev 2>/dev/null | grep -q '^ii'; then
  echo "build-native: apt-get install libibverbs-dev"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends libibverbs-dev >/dev/null ||
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends libibverbs-dev >/dev/null; }
fi
if ! "$py" -c 'import cffi' 2>/dev/null; then
  echo "build-native: pip install cffi"
  "$(dirname "$py")/pip" install -q cffi
fi
# each extension: its directory, its C source, the stem of the .so
for loop in probes/native_loop:socketloop.c:_socketloop probes/rdma/native:fastpath.c:_fastpath; do
  IFS=: read -r dir src stem <<<"$loop"
  built=$(ls "$dir"/"$stem"*.so 2>/dev/null | head -1 || true)
  if [ -n "$built" ] && [ "$built" -nt "$dir/$src" ] && [ "$built" -nt "$dir/build.py" ]; then
    echo "build-native: $built is current"
  else
    "$py" "$dir/build.py"
  fi
done
