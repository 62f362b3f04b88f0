#!/bin/bash
# lane/run.sh — run a command as root inside a throwaway VM that holds a small soft-RoCE
# fabric (see lane/README.md).
#
#   lane/run.sh [--hosts N] [--fabric bridge|leaf-spine] [--rails 1|2] [--leaves 2..4]
#               [--rwdir DIR]... [--no-fabric] [--] COMMAND [ARG]...
#
# The VM boots Debian's kernel under QEMU (TCG) with virtme-ng; it sees this machine's /
# read-only over 9p at the same paths (writes under /tmp /etc /var /usr /opt go to a tmpfs
# overlay and vanish). --rwdir DIR mounts DIR writable so results reach the host.
# Before COMMAND, lane/guest-fabric.sh builds N hosts (default 3) on a bridge, or on a
# routed leaf-spine of network namespaces (--fabric leaf-spine, at least 4 hosts, 3 leaves a
# rail unless --leaves; --rails 2 gives each host a second device on a second rail
# network); COMMAND gets the LANE_* variables it writes. Exit status: COMMAND's; 99 when the
# fabric could not be built; 98 when the VM was not ready twice (see the watchdog below);
# 124 when LANE_TIMEOUT (default 1800 s) ran out.
#
# Environment: LANE_CPUS (2), LANE_MEM (1G), LANE_TIMEOUT, LANE_READY_TIMEOUT (240 s),
#   LANE_KVER, LANE_VERBOSE=1,
#   LANE_ENV (more variable names to pass in; PATH, VIRTUAL_ENV, PYTHONPATH, CI, HOME,
#   TERM and every LANE_* are passed), LANE_ACCEL=kvm (only where /dev/kvm runs stock kernels),
#   LANE_CPU (the emulated CPU model under TCG; see below).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LANE_VENV=${LANE_VENV:-/opt/fabricprobe-lane/venv}
LANE_CACHE=${LANE_CACHE:-/var/cache/fabricprobe-lane}
hosts=${LANE_HOSTS:-3}
shape=${LANE_FABRIC:-bridge}
rails=${LANE_RAILS:-1}
leaves=${LANE_LEAVES:-3}
fabric=1
rwdirs=()
while (($#)); do
  case $1 in
    --hosts) hosts=$2; shift 2 ;;
    --fabric) shape=$2; shift 2 ;;
    --rails) rails=$2; shift 2 ;;
    --leaves) leaves=$2; shift 2 ;;
    --rwdir) rwdirs+=(--rwdir "$(realpath "$2")"); shift 2 ;;
    --no-fabric) fabric=0; shift ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    -*) echo "lane/run.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
(($#)) || set -- sh -c 'rdma link show; ibv_devices'
[[ $hosts =~ ^[0-9]+$ ]] && ((hosts >= 2 && hosts <= 8)) ||
  { echo "lane/run.sh: --hosts must be 2..8" >&2; exit 2; }
case $shape in
  bridge) ((rails == 1)) || { echo "lane/run.sh: --rails needs --fabric leaf-spine" >&2; exit 2; } ;;
  leaf-spine) ((hosts >= 4)) || { echo "lane/run.sh: a leaf-spine fabric needs --hosts 4 or more" >&2; exit 2; }
    [[ $rails =~ ^[12]$ ]] || { echo "lane/run.sh: --rails must be 1 or 2" >&2; exit 2; }
    [[ $leaves =~ ^[234]$ ]] && ((leaves <= hosts)) ||
      { echo "lane/run.sh: --leaves must be 2..4 and at most --hosts" >&2; exit 2; } ;;
  *) echo "lane/run.sh: --fabric must be bridge or leaf-spine" >&2; exit 2 ;;
esac
[ "$(id -u)" = 0 ] || { echo "lane/run.sh: must run as root (QEMU and the guest fabric)" >&2; exit 2; }
[ -x "$LANE_VENV/bin/vng" ] || { echo "lane/run.sh: run lane/install.sh first" >&2; exit 2; }

kver=${LANE_KVER:-}
if [ -z "$kver" ]; then
  for d in $(ls -1d /lib/modules/*/ 2>/dev/null | sort -rV); do
    v=$(basename "$d")
    [ -e "/boot/vmlinuz-$v" ] && [ -n "$(find "$d" -name 'rdma_rxe.ko*' -print -quit)" ] &&
      { kver=$v; break; }
  done
fi
[ -n "$kver" ] || { echo "lane/run.sh: no kernel with rdma_rxe; run lane/install.sh" >&2; exit 2; }
kernel=$LANE_CACHE/vmlinux-$kver
[ -s "$kernel" ] || kernel=/boot/vmlinuz-$kver

# The guest runs a script it reads from the host's /tmp (visible through the 9p root); the
# same directory is mounted writable in the guest, where the script leaves two marks for
# the watchdog below: `booted` as it starts, `ready` once the fabric is built.
work=$(mktemp -d /tmp/lane.XXXXXX)
trap 'rm -rf "$work"' EXIT
write_cmd() { # TRACE COMMAND...: TRACE 1 runs the fabric's build under `bash -x`
  local trace=$1
  shift
  {
    echo '#!/bin/bash'
    printf ': > %q/booted\n' "$work"
    for v in PATH VIRTUAL_ENV PYTHONPATH CI HOME TERM ${LANE_ENV:-} $(compgen -e | grep '^LANE_' || true); do
      [ -n "${!v+x}" ] && printf 'export %s=%q\n' "$v" "${!v}"
    done
    printf 'export LANE_HOSTS=%q LANE_FABRIC=%q LANE_RAILS=%q LANE_LEAVES=%q LANE_BOOT_T0=%q\n' \
      "$hosts" "$shape" "$rails" "$leaves" "$(date +%s.%N)"
    printf 'cd %q 2>/dev/null || cd /\n' "$PWD"
    if ((fabric)); then
      if ((trace)); then printf 'bash -x '; fi
      printf '%q || { echo "lane: building the fabric failed" >&2; exit 99; }\n' "$here/guest-fabric.sh"
      echo '. /run/fabricprobe-lane.env'
    fi
    printf ': > %q/ready\n' "$work"
    printf 'exec'; printf ' %q' "$@"; echo
  } > "$work/cmd.sh"
}

args=(--run "$kernel" --force-9p --cpus "${LANE_CPUS:-2}" --memory "${LANE_MEM:-1G}"
      --cwd / "${rwdirs[@]}" --rwdir "$work" --exec "bash $work/cmd.sh")
# vng uses KVM whenever /dev/kvm is usable; the /dev/kvm here runs only PVM guests and a
# stock kernel hangs in it, so software emulation is the default.
if [ "${LANE_ACCEL:-tcg}" != kvm ]; then
  args+=(--disable-kvm)
  # vng asks for `-cpu max`, which under TCG advertises AVX and AVX2. QEMU 7.2's TCG
  # (Debian 12's) gets numpy's AVX2 argsort wrong: np.argsort returns a permutation that
  # does not sort, pandas' unstack/pivot_table puts values in the wrong cells, and the
  # demo's request view showed one request's KV transfer in another's deliver column.
  # Without AVX in CPUID the guest kernel leaves the YMM state off and every library
  # takes its SSE path. (tests/rdma/test_workload_stages.py holds the guest to it.)
  args+=("--qemu-opts=-cpu ${LANE_CPU:-max,avx=off,avx2=off,fma=off,f16c=off}")
fi
# tsc=reliable: with 2 TCG vCPUs the guest would distrust the TSC and read the emulated
# HPET on every clock_gettime (no vDSO), which distorts every latency figure.
for a in ${LANE_APPEND-tsc=reliable mitigations=off}; do args+=(--append "$a"); done
[ "${LANE_VERBOSE:-0}" = 1 ] && args+=(--verbose)
export PATH="$LANE_CACHE/bin:$LANE_VENV/bin:$PATH"

# A private mount namespace hides udev's driver rules and systemd-tmpfiles from the guest
# (which sees this namespace's / through QEMU's 9p server); the host's mounts stay as
# they are. QEMU reopens /proc/self/fd/1 and 2 itself, so both go through pipes to keep
# a caller's `> log 2>&1` intact.
#
# The watchdog: the fabric is ready 8-15 s into the guest's uptime (20-30 s of wall time).
# A VM that has not built it within LANE_READY_TIMEOUT (default 240 s) is stopped and
# booted once more, that time with its boot console and the fabric's build traced on
# stderr, so that a second failure says where it stuck; LANE_TIMEOUT bounds both
# attempts together.
for v in LANE_TIMEOUT LANE_READY_TIMEOUT; do
  [[ ${!v:-1} =~ ^[1-9][0-9]{0,5}$ ]] || { echo "lane/run.sh: $v must be whole seconds" >&2; exit 2; }
done
# QEMU's main thread runs the guest's timers (its LAPIC deadline timer among them, and so
# every netem delay's end). Under TCG the vCPU threads take whole host CPUs while the guest
# is busy, and a main thread at their priority waited 2-3 ms for a CPU: a 1 ms netem
# delay then took 3-4 ms under a busy guest, against 1.4 ms in a quiet one. At nice -10
# the same busy guest gives 1.65-1.72 ms. Needs root (CAP_SYS_NICE); without it the lane
# runs as before, and says so.
timers_first() { # the QEMU of this lane's work directory: its main thread at nice -10
  local pid
  pid=$(pgrep -f -- "qemu-system.*$work" | head -1)
  [ -n "$pid" ] || return 1
  renice -n "${LANE_TIMER_NICE:--10}" -p "$pid" > /dev/null 2>&1 ||
    echo "lane: could not raise QEMU's timer thread's priority (not root?)" >&2
}
deadline=$((SECONDS + ${LANE_TIMEOUT:-1800}))
ready_s=${LANE_READY_TIMEOUT:-240}
set +e
for attempt in 1 2; do
  write_cmd "$((attempt > 1))" "$@"
  rm -f "$work/booted" "$work/ready"
  timeout -k 15 "$((deadline - SECONDS))" unshare -m --propagation private bash -c '
    cache=$1; shift
    [ -d /usr/lib/udev/rules.d ] && mount --bind "$cache/udev" /usr/lib/udev/rules.d
    [ -e /usr/bin/systemd-tmpfiles ] && mount --bind "$cache/empty" /usr/bin/systemd-tmpfiles
    exec "$@"' _ "$LANE_CACHE" vng "${args[@]}" < /dev/null > >(cat) 2> >(cat >&2) &
  vm=$! t0=$SECONDS reniced=0
  while [ ! -e "$work/ready" ] && kill -0 "$vm" 2> /dev/null && ((SECONDS - t0 < ready_s)); do
    ((reniced)) || ! timers_first || reniced=1
    sleep 1
  done
  ((reniced)) || timers_first
  if [ -e "$work/ready" ] || ! kill -0 "$vm" 2> /dev/null; then
    wait "$vm"; rc=$?
    break
  fi
  what="did not boot"; [ -e "$work/booted" ] && what="booted but did not build its fabric"
  echo "lane: the VM $what within ${ready_s} s (attempt $attempt of 2); stopping it" >&2
  kill -TERM "$vm"; wait "$vm"
  rc=98
  ((deadline - SECONDS > ready_s)) || break
  args+=(--verbose)
done
wait
exit $rc
