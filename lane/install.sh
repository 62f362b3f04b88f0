#!/bin/bash
# lane/install.sh — prepare this machine for the soft-RoCE VM lane. Idempotent; run as root.
#
# Installs (only what is missing):
#   * Debian packages: QEMU (TCG), Debian's 6.1 kernel with rdma_rxe/veth/bridge/netem
#     modules, rdma-core user space, python3-pyverbs, perftest, sockperf, qperf, iproute2.
#   * virtme-ng (pinned) in its own venv, $LANE_VENV.
#   * $LANE_CACHE: an uncompressed vmlinux per kernel (PVH boot skips the in-guest XZ
#     decompression, ~6 s under TCG), a one-rule udev dir, an empty file to hide
#     systemd-tmpfiles, and a virtme-run wrapper that mounts the guest root with 9p
#     cache=loose (path lookups over uncached 9p cost ~13 ms each under TCG).
set -euo pipefail
LANE_VENV=${LANE_VENV:-/opt/fabricprobe-lane/venv}
LANE_CACHE=${LANE_CACHE:-/var/cache/fabricprobe-lane}
VIRTME_NG_VERSION=1.42
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
say() { echo "[lane-install] $*"; }

[ "$(id -u)" = 0 ] || { echo "lane/install.sh: must run as root" >&2; exit 2; }

packages=(qemu-system-x86 linux-image-amd64 kmod udev iproute2 busybox-static file
          rdma-core ibverbs-providers ibverbs-utils libibverbs1 python3-pyverbs
          perftest rdmacm-utils sockperf qperf python3-venv curl)
need=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null | grep -q '^ii' || need+=("$p")
done
if ((${#need[@]})); then
  t0=$SECONDS
  say "apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # No recommends (keeps QEMU's GUI stack out); INITRD=No skips update-initramfs: the
  # lane never boots /boot/initrd.img, virtme-ng builds its own initramfs.
  INITRD=No apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  say "apt took $((SECONDS - t0)) s"
fi

if [ ! -x "$LANE_VENV/bin/vng" ]; then
  t0=$SECONDS
  say "virtme-ng $VIRTME_NG_VERSION -> $LANE_VENV"
  /usr/bin/python3 -m venv "$LANE_VENV"
  "$LANE_VENV/bin/pip" install -q "virtme-ng==$VIRTME_NG_VERSION"
  say "pip took $((SECONDS - t0)) s"
fi

mkdir -p "$LANE_CACHE/udev" "$LANE_CACHE/bin"
# The guest's udev only has to name the virtio console ports that virtme-ng's init uses for
# the command's stdio and exit status. Leaving out the driver rules stops udev from loading
# every module the emulated machine suggests (about 15 s under TCG).
printf '%s\n' 'SUBSYSTEM=="virtio-ports", KERNEL=="vport*", ATTR{name}=="?*", SYMLINK+="virtio-ports/$attr{name}"' \
  > "$LANE_CACHE/udev/50-lane-vport.rules"
: > "$LANE_CACHE/empty"
chmod 0644 "$LANE_CACHE/empty"

# vng starts `virtme-run` by name; this one is found first on PATH (run.sh) and asks the
# initramfs to mount the read-only 9p root with cache=loose. Safe: the guest never writes
# the root (its writable paths are tmpfs overlays) and the host does not change it mid-run.
cat > "$LANE_CACHE/bin/virtme-run" <<PY
#!$LANE_VENV/bin/python3
import sys

import virtme.mkinitramfs as initramfs
from virtme.commands.run import main

if "cache=loose" not in initramfs._MOUNT_ROOT_HOST:
    initramfs._MOUNT_ROOT_HOST = initramfs._MOUNT_ROOT_HOST.replace(
        "msize=524288", "msize=524288,cache=loose")
sys.exit(main())
PY
chmod 0755 "$LANE_CACHE/bin/virtme-run"

for moddir in /lib/modules/*/; do
  kver=$(basename "$moddir")
  [ -e "/boot/vmlinuz-$kver" ] || continue
  [ -n "$(find "$moddir" -name 'rdma_rxe.ko*' -print -quit)" ] || continue
  out="$LANE_CACHE/vmlinux-$kver"
  if [ ! -s "$out" ] || [ "/boot/vmlinuz-$kver" -nt "$out" ]; then
    /usr/bin/python3 "$here/vmlinux.py" "/boot/vmlinuz-$kver" "$out" || rm -f "$out"
  fi
done
say "ready: $(cd "$LANE_CACHE" && ls vmlinux-* 2>/dev/null | tr '\n' ' ')"
