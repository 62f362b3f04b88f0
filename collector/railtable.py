"""Rail figures: each host pair's probes on each rail, from the agents' rail windows
(WindowReport.rail_windows), beside the pair's figures that mix the rails.

A GPU host's probes to a peer go device to device on every rail the two share
(collector/assign.py). The pair's path figures (collector/pathtable.py) merge them all,
as they merge a pair's ECMP classes; here each rail keeps its own newest window, so a
fault on rail 1 is named "rail 1": a rail whose median RTT is over twice its pair's other
rails' (and MIN_RISE_NS over), or that lost probes while they lost none, stands out.

Plain Python with no lock of its own: the window store (collector/store.py) calls it with
its lock held. Bounds: MAX_PER_HOST rail paths a prober, MAX_PATHS in all (the least
recently updated evicted); a window that cannot be read is refused and counted, and never
fails its report.
"""

from __future__ import annotations

import statistics
from collections import OrderedDict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.errors import ParseError
from fabricprobe.core.sketchwire import from_wire

MAX_RAIL = 63  # as the fabric file's (collector/fabric/topology.py) and the agents'
MAX_PER_HOST = 2048  # 8 rails x 64 peers x 4 kinds
MAX_PATHS = 200_000
MAX_NAME = 128
MIN_RISE_NS = 10_000  # a rail's rise below 10 us never makes it stand out
RATIO = 2.0  # over its pair's other rails' median p50
WINDOW_OUTCOMES = ("taken", "refused", "dropped", "evicted")


class RailKey(NamedTuple):
    src: str
    dst: str
    rail: int
    transport: str
    op: str
    size: int


@dataclass
class RailStats:
    """One rail path's newest window."""

    end_ns: int  # the end of its newest window
    touched_ns: int  # collector clock when a window last arrived
    p50_ns: int | None
    p99_ns: int | None
    count: int  # RTTs of the newest window
    lost: int  # exchanges of it that got no answer

    @property
    def loss(self) -> float:
        sent = self.count + self.lost
        return self.lost / sent if sent else 0.0


@dataclass(frozen=True)
class RailSummary:
    """One rail over the fleet: its fresh paths, those standing out, and its loss."""

    paths: int
    standing_out: int
    sent: int
    lost: int


@dataclass
class RailTable:
    """Rail paths by RailKey (see the module docstring)."""

    max_per_host: int = MAX_PER_HOST
    max_paths: int = MAX_PATHS
    by_key: OrderedDict[RailKey, RailStats] = field(default_factory=OrderedDict)
    per_host: dict[str, int] = field(default_factory=dict)
    windows: dict[str, int] = field(default_factory=lambda: dict.fromkeys(WINDOW_OUTCOMES, 0))

    def take(
        self, host: str, end_ns: int, now_ns: int, rail_windows: Iterable[pb.ProbeWindow]
    ) -> None:
        """One report's rail windows of HOST, its window ending at END_NS."""
        for w in rail_windows:
            key = _key(host, w)
            try:
                sk = from_wire(w.rtt) if key is not None and w.HasField("rtt") else None
            except ParseError:
                sk = None
            if key is None or sk is None or sk.kind != "rtt":
                self.windows["refused"] += 1
                continue
            have = self.by_key.get(key)
            if have is None:
                if self.per_host.get(host, 0) >= self.max_per_host:
                    self.windows["dropped"] += 1
                    continue
                self.per_host[host] = self.per_host.get(host, 0) + 1
                while len(self.by_key) >= self.max_paths:
                    self._drop(next(iter(self.by_key)))
                    self.windows["evicted"] += 1
            elif have.end_ns > end_ns:  # a replayed older window: the newest stays
                self.windows["taken"] += 1
                continue
            p50, p99 = (
                (sk.percentile_ns(50.0), sk.percentile_ns(99.0)) if sk.count else (None, None)
            )
            self.by_key[key] = RailStats(end_ns, now_ns, p50, p99, sk.count, sk.lost)
            self.by_key.move_to_end(key)
            self.windows["taken"] += 1

    def _drop(self, key: RailKey) -> None:
        del self.by_key[key]
        left = self.per_host.get(key.src, 1) - 1
        if left > 0:
            self.per_host[key.src] = left
        else:
            self.per_host.pop(key.src, None)

    def forget(self, hosts: Collection[str], idle_ns: int) -> None:
        """Drop the rail paths of HOSTS (gone from the fleet) and those untouched since
        IDLE_NS."""
        old = [
            k
            for k, v in self.by_key.items()
            if k.src in hosts or k.dst in hosts or v.touched_ns < idle_ns
        ]
        for k in old:
            self._drop(k)

    def paths(
        self, since_ns: int, pairs: Collection[tuple[str, str]] | None = None
    ) -> list[pb.RailPath]:
        """The rail paths touched at or after SINCE_NS (of the host PAIRS only, either
        way, when given), each saying whether it stands out from its pair's other rails:
        those that do first, then by pair, kind and rail."""
        fresh = [
            (k, v)
            for k, v in self.by_key.items()
            if v.touched_ns >= since_ns
            and (pairs is None or (k.src, k.dst) in pairs or (k.dst, k.src) in pairs)
        ]
        groups: dict[tuple[str, str, str, str, int], list[tuple[RailKey, RailStats]]] = {}
        for k, v in fresh:
            groups.setdefault((k.src, k.dst, k.transport, k.op, k.size), []).append((k, v))
        out = []
        for members in groups.values():
            for k, v in members:
                others = [o for ok, o in members if ok.rail != k.rail]
                out.append(_message(k, v, stands_out(v, others)))
        out.sort(key=lambda m: (not m.stands_out, m.src, m.dst, m.transport, m.op, m.size, m.rail))
        return out

    def summary(self, since_ns: int) -> dict[int, RailSummary]:
        """Each rail over the paths touched at or after SINCE_NS."""
        acc: dict[int, list[int]] = {}
        for m in self.paths(since_ns):
            a = acc.setdefault(m.rail, [0, 0, 0, 0])
            v = self.by_key[RailKey(m.src, m.dst, m.rail, m.transport, m.op, m.size)]
            a[0] += 1
            a[1] += int(m.stands_out)
            a[2] += v.count + v.lost
            a[3] += v.lost
        return {r: RailSummary(*a) for r, a in sorted(acc.items())}


def stands_out(v: RailStats, others: list[RailStats]) -> bool:
    """Whether rail path V stands out from its pair's OTHER rails (module docstring)."""
    if not others:
        return False
    if v.lost and not any(o.lost for o in others):
        return True
    theirs = [o.p50_ns for o in others if o.p50_ns is not None]
    if v.p50_ns is None or not theirs:
        return False
    med = statistics.median(theirs)
    return v.p50_ns > RATIO * med and v.p50_ns - med > MIN_RISE_NS


def _key(host: str, w: pb.ProbeWindow) -> RailKey | None:
    """W's key, None for a window that names no rail or a bad one."""
    ok = (
        w.HasField("rail")
        and w.rail <= MAX_RAIL
        and 0 < len(w.dst) <= MAX_NAME
        and w.transport in ("tcp", "rdma")
        and 0 < len(w.op) <= 32
    )
    return RailKey(host, w.dst, w.rail, w.transport, w.op, int(w.size)) if ok else None


def _message(k: RailKey, v: RailStats, out: bool) -> pb.RailPath:
    return pb.RailPath(
        src=k.src,
        dst=k.dst,
        rail=k.rail,
        transport=k.transport,
        op=k.op,
        size=k.size,
        rtt_p50_s=None if v.p50_ns is None else v.p50_ns / 1e9,
        rtt_p99_s=None if v.p99_ns is None else v.p99_ns / 1e9,
        loss=v.loss,
        newest_unix_ns=v.end_ns,
        stands_out=out,
    )
