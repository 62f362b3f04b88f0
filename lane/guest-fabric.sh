#!/bin/bash
# lane/guest-fabric.sh — runs INSIDE the lane VM as root (lane/run.sh calls it).
#
# Builds LANE_HOSTS (default 3) soft-RoCE hosts on one of two fabrics (LANE_FABRIC):
#
# bridge (the default). Host i (0-based) is
#     rxe<i>  on netdev  fp<i>  with address 192.0.2.(i+1)/24   (TEST-NET-1, never routed)
# and fp<i>'s veth peer fp<i>b is a port of the bridge fpbr, so every pair of hosts has its
# own path fp<i> -> fpbr -> fp<j>. `fabricprobe/cli/netem.py` adds delay/loss to one
# (src, dst) pair with a u32 filter on the source's netdev, which touches no other path.
#
# leaf-spine (at least 4 hosts). LANE_LEAVES (default 3) leaves per rail and two spines,
# every leaf cabled to every spine; each router is a network namespace (leaf0, leaf1,
# leaf2, spine0, spine1) that
# forwards with equal-cost multipath routes hashed on the 5-tuple
# (fib_multipath_hash_policy=1) and answers an expiring packet with ICMP time-exceeded
# from the address of the interface it came in on, as a switch does. Names:
#     leafX <-> spineY   veth lXsY in leafX, sYlX in spineY
#     host i <-> leafX   veth hilX on the host (its netdev), lXhi in leafX
# Host i hangs off leaf (i x leaves / hosts): with 4 hosts and 3 leaves, h0 and h1 on
# leaf0, h2 on leaf1, h3 on leaf2. Three leaves, not two: with two, every path through
# leaf0->spine1 goes on through spine1->leaf1 and no end-to-end measurement can tell the
# two apart; a third leaf gives each link classes of its own. Rail 0's hosts are
# 192.0.2.(i+1) on rxe<i>; with LANE_RAILS=2 each host has a second device rxe<i>r1 on
# 198.51.100.(i+1) (TEST-NET-2) behind leaves of its own (leaf3..leaf5), a rail network
# that shares the spines (a leaf routes only its own rail's hosts). Every link has a /31 from
# 203.0.113.0/24 (TEST-NET-3): the router ends carry those, a host end carries only the
# host's /32 and reaches its leaf on-link.
#
# Why it is built this way (kernel 6.1):
#   * rdma_rxe's UDP/4791 socket lives only in the initial network namespace, so all hosts
#     share it and are told apart by device, netdev and address. Routers need no rxe, so
#     they can have namespaces of their own.
#   * Traffic between two local addresses is normally routed over `lo`, and rxe (which
#     finds its device from skb->dev) drops it. A rule per host sends locally generated
#     packets *from* that host's address out of its own netdev; the `local` table is
#     consulted after those rules; accept_local lets the receiver accept a packet whose
#     source is one of its own addresses.
#   * On a shared bridge every netdev would answer ARP for every local address;
#     arp_ignore=1/arp_announce=2 keep each address bound to its own netdev.
#   * rdma_rxe takes a QP's UDP source port from its QP number and writes the address
#     handle's hop_limit into the IPv4 TTL, so different QPs take different ECMP paths and
#     a hop-limited probe expires at each router in turn.
# Each exec costs ~0.25 s under TCG, hence `ip -batch`, `rdma -b` and /proc/sys writes.
#
# Writes /run/fabricprobe-lane.env (shell) and /run/fabricprobe-lane.json (tests read it):
# its "hosts" are rail 0's devices; on leaf-spine it also lists every device ("nics"),
# router and link with their addresses.
set -eu
n=${LANE_HOSTS:-3}
fabric=${LANE_FABRIC:-bridge}
rails=${LANE_RAILS:-1}
modprobe -a veth bridge rdma_rxe ib_uverbs rdma_ucm sch_netem sch_prio cls_u32 ${LANE_MODULES:-}

# One entry per RDMA device: its host, device, netdev, address, rail and leaf.
nic_host=() nic_dev=() nic_nd=() nic_ip=() nic_rail=() nic_leaf=()
# Routers and links (leaf-spine only), as JSON objects.
routers_json=() links_json=()

lane_conf() { # netdev... : the per-netdev settings every host end needs
  local c p
  for c in "$@"; do
    p=/proc/sys/net/ipv4/conf/$c
    echo 1 > "$p/accept_local"; echo 0 > "$p/rp_filter"
    echo 1 > "$p/arp_ignore"; echo 2 > "$p/arp_announce"
  done
}

build_bridge() {
  local i
  {
    echo "link set lo up"
    echo "link add fpbr type bridge forward_delay 0"
    for ((i = 0; i < n; i++)); do
      echo "link add fp$i type veth peer name fp${i}b"
      echo "link set fp${i}b master fpbr"
      echo "addr add 192.0.2.$((i + 1))/24 dev fp$i"
    done
  } | ip -batch -
  lane_conf all default lo fpbr $(for ((i = 0; i < n; i++)); do echo "fp$i fp${i}b"; done)
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
  for ((i = 0; i < n; i++)); do
    nic_host+=("h$i") nic_dev+=("rxe$i") nic_nd+=("fp$i") nic_ip+=("192.0.2.$((i + 1))")
    nic_rail+=(0) nic_leaf+=("")
  done
}

build_leaf_spine() {
  ((n >= 4)) || { echo "lane: a leaf-spine fabric needs at least 4 hosts" >&2; return 1; }
  ((rails == 1 || rails == 2)) || { echo "lane: LANE_RAILS must be 1 or 2" >&2; return 1; }
  local L=${LANE_LEAVES:-3}
  ((L >= 2 && L <= 4 && L <= n)) || { echo "lane: LANE_LEAVES must be 2..4, at most the hosts" >&2; return 1; }
  local nets=(192.0.2 198.51.100) i r x y k=0 h leaf ip a b
  local spines=(spine0 spine1) leaves=() init=() hostdevs=()
  declare -A cmds=() ifjson=()   # per router: its `ip -batch` lines; its interfaces' JSON
  link_pair() { # A ADEV AIP B BDEV BIP RAIL TIER: one veth, its /31, and its JSON
    local aip=$3 bip=$6
    links_json+=("{\"a\":\"$1\",\"a_dev\":\"$2\",\"a_ip\":\"$aip\",\"b\":\"$4\",\"b_dev\":\"$5\",\"b_ip\":\"$bip\",\"rail\":$7,\"tier\":\"$8\"}")
  }
  for ((r = 0; r < rails; r++)); do
    for ((x = L * r; x < L * r + L; x++)); do leaves+=("leaf$x"); done
  done
  init+=("link set lo up")
  for leaf in "${leaves[@]}" "${spines[@]}"; do init+=("netns add $leaf"); done
  printf '%s\n' "${init[@]}" | ip -batch -
  init=()
  for leaf in "${leaves[@]}" "${spines[@]}"; do
    ip netns exec "$leaf" sh -c '
      for c in all default; do
        echo 0 > /proc/sys/net/ipv4/conf/$c/rp_filter
        echo 1 > /proc/sys/net/ipv4/conf/$c/forwarding
      done
      echo 1 > /proc/sys/net/ipv4/fib_multipath_hash_policy
      echo 1 > /proc/sys/net/ipv4/icmp_errors_use_inbound_ifaddr
      echo 0 > /proc/sys/net/ipv4/icmp_ratelimit
      echo 100000 > /proc/sys/net/ipv4/icmp_msgs_per_sec
      ip link set lo up'
  done
  # leaf-spine links: leaf end 203.0.113.(2k), spine end 203.0.113.(2k+1)
  declare -A lsip=()   # "x,y" -> leaf end's address, "y,x" (as sY) -> spine end's
  for ((r = 0; r < rails; r++)); do
    for ((x = L * r; x < L * r + L; x++)); do
      for ((y = 0; y < 2; y++)); do
        a=203.0.113.$((2 * k)) b=203.0.113.$((2 * k + 1)); k=$((k + 1))
        lsip["l$x,s$y"]=$a lsip["s$y,l$x"]=$b
        init+=("link add l${x}s$y netns leaf$x type veth peer name s${y}l$x netns spine$y")
        cmds[leaf$x]+="addr add $a/31 dev l${x}s$y"$'\n'"link set l${x}s$y up"$'\n'
        cmds[spine$y]+="addr add $b/31 dev s${y}l$x"$'\n'"link set s${y}l$x up"$'\n'
        ifjson[leaf$x]+="{\"dev\":\"l${x}s$y\",\"ip\":\"$a\",\"peer\":\"spine$y\"},"
        ifjson[spine$y]+="{\"dev\":\"s${y}l$x\",\"ip\":\"$b\",\"peer\":\"leaf$x\"},"
        link_pair "leaf$x" "l${x}s$y" "$a" "spine$y" "s${y}l$x" "$b" "$r" leaf-spine
      done
    done
  done
  # host uplinks: leaf end 203.0.113.(2k); the host end holds only the host's /32
  local rules=()
  for ((r = 0; r < rails; r++)); do
    for ((i = 0; i < n; i++)); do
      x=$((L * r + i * L / n)) h=h$i ip=${nets[r]}.$((i + 1))
      a=203.0.113.$((2 * k)); k=$((k + 1))
      init+=("link add h${i}l$x type veth peer name l${x}h$i netns leaf$x")
      init+=("addr add $ip/32 dev h${i}l$x")
      hostdevs+=("h${i}l$x")
      rules+=("link set h${i}l$x up")
      rules+=("rule add pref $((10 + 16 * r + i)) from $ip iif lo lookup $((100 + 16 * r + i))")
      rules+=("route add ${nets[r]}.0/24 via $a dev h${i}l$x onlink src $ip table $((100 + 16 * r + i))")
      cmds[leaf$x]+="addr add $a/31 dev l${x}h$i"$'\n'"link set l${x}h$i up"$'\n'
      cmds[leaf$x]+="route add $ip/32 dev l${x}h$i"$'\n'
      for ((y = 0; y < 2; y++)); do
        cmds[spine$y]+="route add $ip/32 via ${lsip["l$x,s$y"]} dev s${y}l$x"$'\n'
      done
      ifjson[leaf$x]+="{\"dev\":\"l${x}h$i\",\"ip\":\"$a\",\"peer\":\"$h\"},"
      link_pair "$h" "h${i}l$x" "$ip" "leaf$x" "l${x}h$i" "$a" "$r" host
      nic_host+=("$h") nic_ip+=("$ip") nic_nd+=("h${i}l$x") nic_rail+=("$r") nic_leaf+=("leaf$x")
      if ((r == 0)); then nic_dev+=("rxe$i"); else nic_dev+=("rxe${i}r$r"); fi
    done
    for ((x = L * r; x < L * r + L; x++)); do  # the rail's other hosts: over both spines
      cmds[leaf$x]+="route add ${nets[r]}.0/24 nexthop via ${lsip["s0,l$x"]} dev l${x}s0 nexthop via ${lsip["s1,l$x"]} dev l${x}s1"$'\n'
    done
  done
  printf '%s\n' "${init[@]}" | ip -batch -
  lane_conf all default lo "${hostdevs[@]}"
  { printf '%s\n' "${rules[@]}"; echo "rule add pref 1000 lookup local"; echo "rule del pref 0"; } |
    ip -batch -
  for leaf in "${leaves[@]}" "${spines[@]}"; do
    printf '%s' "${cmds[$leaf]}" | ip -n "$leaf" -batch -
    a=${ifjson[$leaf]}
    if [[ $leaf == leaf* ]]; then x=${leaf#leaf}; r=$((x / 2)); else r=null; fi
    routers_json+=("{\"name\":\"$leaf\",\"kind\":\"${leaf%%[0-9]*}\",\"rail\":$r,\"interfaces\":[${a%,}]}")
  done
}

case $fabric in
  bridge) build_bridge ;;
  leaf-spine) build_leaf_spine ;;
  *) echo "lane: unknown fabric $fabric (bridge or leaf-spine)" >&2; exit 2 ;;
esac
m=${#nic_dev[@]}
for ((k = 0; k < m; k++)); do echo "link add ${nic_dev[k]} type rxe netdev ${nic_nd[k]}"; done |
  rdma -b -

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
  for ((k = 0; k < m; k++)); do
    [ -n "${gidx[k]:-}" ] || gidx[k]=$(gid_index "${nic_dev[k]}" "${nic_ip[k]}" || true)
    [ -n "${gidx[k]}" ] || missing=1
  done
  ((missing)) || break
  read -r -t 0.05 -u "$pause" _ || true
done
((missing == 0)) || { echo "lane: RoCE v2 GIDs did not appear on every rxe device" >&2; exit 1; }

names=() json=() nics=()
env=/run/fabricprobe-lane.env
: > "$env"
for ((k = 0; k < m; k++)); do
  h=${nic_host[k]} r=${nic_rail[k]}
  one="\"device\":\"${nic_dev[k]}\",\"netdev\":\"${nic_nd[k]}\",\"ip\":\"${nic_ip[k]}\",\"gid_index\":${gidx[k]}"
  if [ "$fabric" = leaf-spine ]; then one+=",\"rail\":$r,\"leaf\":\"${nic_leaf[k]}\""; fi
  nics+=("{\"name\":\"$h\",$one}")
  if ((r == 0)); then
    names+=("$h") json+=("{\"name\":\"$h\",$one}")
    v=LANE_${h^^}
  else
    v=LANE_${h^^}_R$r
  fi
  echo "export ${v}_DEV=${nic_dev[k]} ${v}_NETDEV=${nic_nd[k]} ${v}_IP=${nic_ip[k]} ${v}_GID_INDEX=${gidx[k]}" >> "$env"
done
read -r up _ < /proc/uptime
echo "export LANE_HOST_NAMES=\"${names[*]}\" LANE_FILE=/run/fabricprobe-lane.json LANE_READY_UPTIME=$up LANE_FABRIC=$fabric" >> "$env"
{
  IFS=,
  if [ "$fabric" = leaf-spine ]; then
    echo "{\"fabric\":\"leaf-spine\",\"rails\":$rails,\"hosts\":[${json[*]}],\"nics\":[${nics[*]}],\"routers\":[${routers_json[*]}],\"links\":[${links_json[*]}]}"
  else
    echo "{\"fabric\":\"bridge\",\"hosts\":[${json[*]}]}"
  fi
} > /run/fabricprobe-lane.json
echo "lane: $fabric fabric of $n hosts ($m devices) ready at guest uptime ${up}s:"
for ((k = 0; k < m; k++)); do
  echo "  ${nic_host[k]}  ${nic_dev[k]}  ${nic_nd[k]}  ${nic_ip[k]}  RoCE v2 gid_index ${gidx[k]}${nic_leaf[k]:+  ${nic_leaf[k]}}"
done
