"""Probe assignments: who probes whom, how and how often.

Small fleets get a full mesh. Past the per-host budget of k peers, the plan follows
Pingmesh and R-Pingmesh: every host probes peers under its own ToR (a ring-offset
mesh, the whole ToR when it fits) and spends the rest of its budget on hosts under
other ToRs, spread so that the hosts of one ToR together reach every other ToR. Each
host gets at most k peers, so a plan costs O(N·k), never O(N²).

Plans are recomputed when hosts join or leave; a host's generation grows only when
its own targets changed, so agents re-read their assignments only when they must.

Rails: a GPU host of a rail-optimized fabric has one NIC per rail, each rail a network of
its own. When both hosts of a pair name their devices' rails, each RDMA kind goes device
to device on every rail they share, from the prober's device on rail r to the peer's
device on rail r, never across; a pair with no rail in common gets no RDMA target. A
host that names no rail (a laptop, the lane's bridge, a host of an older agent) is
planned as before: one RDMA device, from the host's own source.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

MAX_REPLAN_WAIT_S = 5.0
# Probe kinds in the order they are handed out; a pair gets each kind both ends offer.
DEFAULT_KINDS: tuple[str, ...] = ("tcp_lat", "rdma_rc_lat", "rdma_ud")
# Every kind an agent can run (agent/probing.py TCP_RUNNERS, agent/rdma_runners.py); a
# test holds the two lists together.
PROBE_KINDS: tuple[str, ...] = (
    "tcp_lat",
    "tcp_bw",
    "rdma_rc_lat",
    "rdma_rc_read",
    "rdma_rc_bw",
    "rdma_ud",
)


@dataclass(frozen=True)
class RailNic:
    """A host's device on one rail, where peers probe it."""

    rail: int
    device: str
    gid: str  # its RoCE v2 GID
    address: str  # the registered address that GID maps


@dataclass(frozen=True)
class HostSpec:
    """What the planner needs of one host."""

    name: str
    topology: str = ""  # ToR label; "" puts the host in one shared group
    address: str = ""
    port: int = 0
    kinds: frozenset[str] = frozenset({"tcp_lat"})
    device: str = ""  # RDMA device peers should probe
    gid: str = ""
    rails: tuple[RailNic, ...] = ()  # one device per rail, by rail; () off the rails


class Target(NamedTuple):
    """One probe a host runs: KIND against DST, COUNT exchanges every INTERVAL_MS."""

    dst: str
    address: str
    port: int
    kind: str
    size: int
    interval_ms: int
    exchanges: int  # exchanges per burst
    device: str = ""
    gid: str = ""
    rail: int | None = None  # both ends' devices' rail (RDMA kinds between rail hosts)
    src_device: str = ""  # the prober's device on that rail


@dataclass(frozen=True)
class PlanConfig:
    """How dense the plan is and how often each target is probed."""

    budget: int = 16  # peers per host
    intra_share: float = 0.5  # share of the budget spent under the host's own ToR
    interval_ms: int = 10_000  # one burst per target per interval
    count: int = 10  # exchanges per burst
    sizes: tuple[int, ...] = (64,)
    kinds: tuple[str, ...] = DEFAULT_KINDS
    bursts_per_second: int = 20  # rate budget handed to each agent

    def __post_init__(self) -> None:
        if self.budget < 1:
            raise ValueError("budget must be >= 1")
        if not 0.0 <= self.intra_share <= 1.0:
            raise ValueError("intra_share must be within 0..1")
        if self.interval_ms < 100 or self.count < 1 or not self.sizes:
            raise ValueError("interval_ms >= 100, count >= 1 and at least one size")


def plan_peers(hosts: Iterable[HostSpec], cfg: PlanConfig) -> dict[str, list[str]]:
    """Peer names for every host (see the module docstring); deterministic for one input."""
    specs = sorted(hosts, key=lambda h: h.name)
    names = [h.name for h in specs]
    n = len(names)
    if n - 1 <= cfg.budget:
        return {a: [b for b in names if b != a] for a in names}
    groups: dict[str, list[str]] = {}
    for h in specs:
        groups.setdefault(h.topology, []).append(h.name)
    tors = sorted(groups)
    tor_index = {t: i for i, t in enumerate(tors)}
    t_count = len(tors)
    plan: dict[str, list[str]] = {}
    for tor, members in groups.items():
        m = len(members)
        ti = tor_index[tor]
        q_in = cfg.budget if t_count == 1 else round(cfg.budget * cfg.intra_share)
        q_in = min(m - 1, q_in)
        q_out = 0 if t_count == 1 else cfg.budget - q_in
        for r, name in enumerate(members):
            peers = [members[(r + j) % m] for j in range(1, q_in + 1)]
            chosen = set(peers)
            for j in range(q_out):
                # Host r of this ToR takes other-ToR slots r*q_out .. r*q_out+q_out-1, so
                # the ToR's hosts walk through all the other ToRs between them.
                slot = r * q_out + j
                other = tors[(ti + 1 + slot % (t_count - 1)) % t_count]
                pool = groups[other]
                pick = pool[(slot // (t_count - 1) + r) % len(pool)]
                if pick not in chosen:
                    chosen.add(pick)
                    peers.append(pick)
            plan[name] = peers
    return plan


def targets_for(src: HostSpec, peers: Iterable[HostSpec], cfg: PlanConfig) -> list[Target]:
    """The probes SRC runs against PEERS: every kind both ends offer, at every size; an
    RDMA kind between two rail hosts once per rail they share (see the module docstring)."""
    kinds = [(k, k.startswith("rdma")) for k in cfg.kinds if k in src.kinds]
    interval, count = cfg.interval_ms, cfg.count
    mine = {n.rail: n for n in src.rails}
    out = []
    for peer in peers:
        for kind, rdma in kinds:
            if kind not in peer.kinds:
                continue
            if rdma and mine and peer.rails:
                out += _rail_targets(mine, peer, kind, cfg)
                continue
            device, gid = (peer.device, peer.gid) if rdma else ("", "")
            for size in cfg.sizes:
                out.append(
                    Target(
                        peer.name, peer.address, peer.port, kind, size, interval, count, device, gid
                    )
                )
    return out


def _rail_targets(
    mine: dict[int, RailNic], peer: HostSpec, kind: str, cfg: PlanConfig
) -> list[Target]:
    """KIND to PEER on each rail both hosts are on: from my device on the rail to
    PEER's on the same rail."""
    return [
        Target(
            peer.name,
            nic.address,
            peer.port,
            kind,
            size,
            cfg.interval_ms,
            cfg.count,
            nic.device,
            nic.gid,
            rail=nic.rail,
            src_device=mine[nic.rail].device,
        )
        for nic in peer.rails
        if nic.rail in mine
        for size in cfg.sizes
    ]


@dataclass
class _Assigned:
    generation: int
    peers: tuple[str, ...] = ()
    versions: tuple[int, ...] = ()  # spec versions of the host and its peers, in order


class Planner:
    """Keeps the fleet, replans on join/leave, and hands out versioned assignments.

    A replan only computes peer lists (O(N·k)); a host's targets are expanded when
    asked for. A host's generation grows when its peers, or any peer's address,
    port or probe kinds, changed.
    """

    def __init__(self, cfg: PlanConfig | None = None, *, pace: float = 10.0) -> None:
        self.cfg = cfg or PlanConfig()
        # A replan waits PACE times as long as the last one took, so a fleet registering
        # at once (a collector restart) costs a few replans, not one per host; a small
        # fleet, whose replans take microseconds, sees every change at once.
        self.pace = pace
        self._last_cost = 0.0
        self._last_end = float("-inf")
        self._lock = threading.Lock()
        self._hosts: dict[str, HostSpec] = {}
        self._versions: dict[str, int] = {}
        self._assigned: dict[str, _Assigned] = {}
        self._dirty = False
        self.replans = 0

    def upsert(self, host: HostSpec) -> None:
        with self._lock:
            if self._hosts.get(host.name) != host:
                self._hosts[host.name] = host
                self._versions[host.name] = self._versions.get(host.name, 0) + 1
                self._dirty = True

    def remove(self, names: Iterable[str]) -> None:
        with self._lock:
            for name in names:
                if self._hosts.pop(name, None) is not None:
                    self._dirty = True

    def hosts(self) -> list[str]:
        with self._lock:
            return sorted(self._hosts)

    def topology(self, name: str) -> str | None:
        """The ToR label the plan holds for NAME (None: not in the plan)."""
        with self._lock:
            h = self._hosts.get(name)
            return None if h is None else h.topology

    def assignments(self, host: str) -> tuple[int, tuple[Target, ...]]:
        """(generation, targets) for HOST; replans first if the fleet changed."""
        with self._lock:
            self._maybe_replan()
            a = self._assigned.get(host)
            if a is None:
                return 0, ()
            src = self._hosts.get(host)
            if src is None:
                return a.generation, ()
            # Expanded on each request, not kept: a fleet's worth of Target objects
            # would only weigh on the garbage collector. Callers cache what they send.
            return a.generation, tuple(
                targets_for(
                    # a paced replan may still list a peer that has left: skip it
                    src,
                    (self._hosts[p] for p in a.peers if p in self._hosts),
                    self.cfg,
                )
            )

    def generation(self, host: str) -> int:
        with self._lock:
            self._maybe_replan()
            a = self._assigned.get(host)
            return a.generation if a else 0

    def _maybe_replan(self) -> None:
        if not self._dirty:
            return
        now = time.monotonic()
        if now - self._last_end < min(self.pace * self._last_cost, MAX_REPLAN_WAIT_S):
            return  # hosts asking meanwhile get the current plan; their next ack says more
        self._replan()
        self._last_end = time.monotonic()
        self._last_cost = self._last_end - now

    def _replan(self) -> None:
        plan = plan_peers(self._hosts.values(), self.cfg)
        versions = self._versions
        for name, peers in plan.items():
            names = tuple(peers)
            vers = (versions[name], *(versions[p] for p in peers))
            old = self._assigned.get(name)
            if old is None:
                self._assigned[name] = _Assigned(1, names, vers)
            elif old.peers != names or old.versions != vers:
                old.generation += 1
                old.peers, old.versions = names, vers
        for name in set(self._assigned) - set(plan):
            gone = self._assigned[name]
            if gone.peers:  # keep the generation so a returning host sees a newer one
                gone.peers, gone.versions = (), ()
                gone.generation += 1
        self._dirty = False
        self.replans += 1
