#!/bin/bash
# lane/guest-fabric.sh — runs INSIDE the lane VM as root (lane/run.sh calls it).
#
# Builds LANE_HOSTS (default 3) soft-RoCE hosts. Host i (0-based) is
#     rxe<i>  on netdev  fp<i>  with address 192.0.2.(i+1)/24   (TEST-NET-1, never routed)
# and fp<i>'s veth peer fp<i>b is a port of the bridge fpbr, so every pair of hosts has its
# own path fp<i> -> fpbr -> fp<j>. `lane/netem.sh` adds delay/loss to one (src, dst) pair
# with a u32 filter on the source's netdev, which touches no other path.
#
# Why it is built this way (kernel 6.1):
#   * rdma_rxe's UDP/4791 socket lives only in the initial network namespace, so all hosts
#     share it and are told apart by device, netdev and address.
#   * Traffic between two local addresses is normally routed over `lo`, and rxe (which
#     finds its device from skb->dev) drops it. A rule per host sends locally generated
#     packets *from* that host's address out of its own netdev; the `local` table is
#     consulted after those rules; accept_local lets the receiver accept a packet whose
#     source is one of its own addresses.
#   * On a shared bridge every netdev would answer ARP for every local address;
#     arp_ignore=1/arp_announce=2 keep each address bound to its own netdev.
# Each exec costs ~0.25 s under TCG, hence `ip -batch`, `rdma -b` and /proc/sys writes.
#
# Writes /run/fabricprobe-lane.env (shell) and /run/fabricprobe-lane.json (tests read it).
set -eu
n=${LANE_HOSTS:-3}
modprobe -a veth bridge rdma_rxe ib_uverbs rdma_ucm sch_netem sch_prio cls_u32 ${LANE_MODULES:-}

{
  echo "link set lo up"
  echo "link add fpbr type bridge forward_delay 0"
  for ((i = 0; i < n; i++)); do
    echo "link add fp$i type veth peer name fp${i}b"
    echo "link set fp${i}b master fpbr"
    echo "addr add 192.0.2.$((i + 1))/24 dev fp$i"
  done
} | ip -batch -
for c in all default lo fpbr $(for ((i = 0; i < n; i++)); do echo "fp$i fp${i}b"; done); do
  p=/proc/sys/net/ipv4/conf/$c
  echo 1 > "$p/accept_local"; echo 0 > "$p/rp_filter"
  echo 1 > "$p/arp_ignore"; echo 2 > "$p/arp_announce"
done
{
  echo "link set fpbr up"
  for ((i = 0; i < n; i++)); do
    echo "link set fp${i}b up"
    echo "link set fp$i up"
    echo "rule add pref $((10 + i)) from 192.0.2.$((i + 1)) iif lo lookup $((100 + i))"
    for ((j = 0; j < n; j++)); do
      ((i == j)) || echo "route add 192.0.2.$((j + 1)) dev fp$i src 192.0.2.$((i + 1)) table $((100 + i))"
    done
  done
  echo "rule add pref 1000 lookup local"
  echo "rule del pref 0"
} | ip -batch -
for ((i = 0; i < n; i++)); do echo "link add rxe$i type rxe netdev fp$i"; done | rdma -b -

# RoCE v2 GIDs appear asynchronously after `rdma link add`: wait for each host's
# IPv4-mapped entry rather than assuming index 1.
gid_index() { # dev ipv4 -> index of the RoCE v2 GID ::ffff:ipv4
  local want f g t a b c d
  IFS=. read -r a b c d <<< "$2"
  printf -v want '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$a" "$b" "$c" "$d"
  for f in /sys/class/infiniband/$1/ports/1/gids/*; do
    read -r g < "$f" || continue
    [ "$g" = "$want" ] || continue
    read -r t < "/sys/class/infiniband/$1/ports/1/gid_attrs/types/${f##*/}" || continue
    [ "$t" = "RoCE v2" ] && { echo "${f##*/}"; return 0; }
  done
  return 1
}
exec {pause}<> <(:)   # `read -t` on this fd sleeps without an exec
declare -a gidx
for ((try = 0; try < 200; try++)); do
  missing=0
  for ((i = 0; i < n; i++)); do
    [ -n "${gidx[i]:-}" ] || gidx[i]=$(gid_index "rxe$i" "192.0.2.$((i + 1))" || true)
    [ -n "${gidx[i]}" ] || missing=1
  done
  ((missing)) || break
  read -r -t 0.05 -u "$pause" _ || true
done
((missing == 0)) || { echo "lane: RoCE v2 GIDs did not appear on every rxe device" >&2; exit 1; }

names=() json=()
env=/run/fabricprobe-lane.env
: > "$env"
for ((i = 0; i < n; i++)); do
  h=h$i ip=192.0.2.$((i + 1))
  names+=("$h")
  echo "export LANE_${h^^}_DEV=rxe$i LANE_${h^^}_NETDEV=fp$i LANE_${h^^}_IP=$ip LANE_${h^^}_GID_INDEX=${gidx[i]}" >> "$env"
  json+=("{\"name\":\"$h\",\"device\":\"rxe$i\",\"netdev\":\"fp$i\",\"ip\":\"$ip\",\"gid_index\":${gidx[i]}}")
done
read -r up _ < /proc/uptime
echo "export LANE_HOST_NAMES=\"${names[*]}\" LANE_FILE=/run/fabricprobe-lane.json LANE_READY_UPTIME=$up" >> "$env"
(IFS=,; echo "{\"hosts\":[${json[*]}]}") > /run/fabricprobe-lane.json
echo "lane: fabric of $n hosts ready at guest uptime ${up}s:"
for ((i = 0; i < n; i++)); do
  echo "  h$i  rxe$i  fp$i  192.0.2.$((i + 1))  RoCE v2 gid_index ${gidx[i]}"
done
