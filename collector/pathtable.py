"""Path figures: probe windows merged per (src, dst, transport, op, size), the fleet's
RTT sketches per probe kind, and the host pairs requests named lately.

Plain Python with no lock of its own: the window store (collector/store.py) calls it
with its lock held, and hands readers `PathView` copies.
"""

from __future__ import annotations

import copy
import math
from collections import OrderedDict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from fabricprobe.collector.hosttable import HostState
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.cumulative import CumulativeSketch
from fabricprobe.core.sketchwire import MergedSketch


class PathKey(NamedTuple):
    """One probed path: the prober's host, its peer, and the probe's kind."""

    src: str
    dst: str
    transport: str  # rdma, tcp
    op: str
    size: int  # bytes a message


FleetClass = tuple[str, str, int]  # transport, op, size

MAX_PATHS_PER_HOST = 4096  # new paths beyond it are dropped and counted; idle ones expire
MAX_BUSY_S = 86_400.0  # seconds a bandwidth window can have spent moving bytes
MAX_BYTES_PER_S = 1e14  # 800 Tb/s: a bandwidth figure above it is not a measurement
MAX_FLEET_CLASSES = 64  # (transport, op, size) classes of the fleet-wide RTT sketches
MAX_NAMED_PAIRS = 4096  # host pairs recently named by requests (collector/detail.py)
P99_EWMA_ALPHA = 0.1  # weight of a new window in a path's running p99


def host_pair(a: str, b: str) -> tuple[str, str]:
    """The two hosts of a path in one order, whichever way it is probed."""
    return (a, b) if a <= b else (b, a)


@dataclass
class PathStats:
    """Everything known about one probed path, over all windows seen."""

    rtt: CumulativeSketch = field(default_factory=CumulativeSketch)  # all windows, for export
    last_rtt: MergedSketch | None = None  # the newest window only
    last_end_ns: int = 0
    last_order: tuple[int, int] = (0, 0)  # (lifetime, seq) of the newest window
    touched_ns: int = 0  # collector clock when a window last arrived (idle paths expire)
    bytes_moved: int = 0
    busy_seconds: float = 0.0
    last_bytes_per_second: float | None = None
    # the highest throughput a window of this path measured: what the path can carry (a
    # lower figure is a busy sender's as often as the fabric's; collector/kvparts.py)
    peak_bytes_per_second: float | None = None
    failures: int = 0
    windows: int = 0
    # what the bounded export ranks the path by (collector/detail.py), set as each newest
    # window is taken so that a scrape reads them instead of walking every sketch
    last_p99_ns: int | None = None
    last_loss: float = 0.0
    p99_ewma: float = 0.0  # running p99 over the windows before the newest
    p99_windows: int = 0  # windows folded into p99_ewma
    # UD: the prober's own delay in the newest window's RTTs, None without one (never
    # changed once taken, like last_rtt)
    last_prober_delay: MergedSketch | None = None
    seq: int = 0  # the store's order: paths made earlier have lower numbers
    first_ns: int = 0  # collector clock when its first window arrived (`rtt` counts from it)

    @property
    def last_prober_delay_ns(self) -> int | None:
        """The newest window's prober delay p50 (ns)."""
        d = self.last_prober_delay
        return None if d is None else d.percentile_ns(50.0)

    def copy(self) -> PathStats:
        """A copy that later merges into this one leave alone."""
        c = copy.copy(self)
        c.rtt = self.rtt.copy()
        return c

    def rank(self, sketch: MergedSketch) -> None:
        """Fold the newest window into the ranking figures. Up to 50 exchanges (10 at the
        default plan) the p99 rank is the last exchange, so the p99 is the window's exact
        max and no walk over the slots is needed."""
        sent = sketch.count + sketch.lost
        self.last_loss = sketch.lost / sent if sent else 0.0
        prev = self.last_p99_ns
        if prev is not None:  # the running p99 holds the windows before the newest
            n = self.p99_windows
            self.p99_ewma = (
                float(prev) if n == 0 else self.p99_ewma + P99_EWMA_ALPHA * (prev - self.p99_ewma)
            )
            self.p99_windows = n + 1
        if not sketch.count:
            self.last_p99_ns = None
        elif sketch.count <= 50:
            self.last_p99_ns = sketch.max_ns
        else:
            self.last_p99_ns = sketch.percentile_ns(99.0)


@dataclass(frozen=True, slots=True)
class PathView:
    """A path's newest figures at one moment, for readers outside the store's lock (the
    sketches are the newest window's, which the store never changes once taken)."""

    key: PathKey
    last_end_ns: int
    last_rtt: MergedSketch | None
    last_prober_delay: MergedSketch | None
    last_bytes_per_second: float | None
    peak_bytes_per_second: float | None

    @property
    def rtt(self) -> MergedSketch | None:
        """The newest window's RTT sketch, None when the newest window held none."""
        sk = self.last_rtt
        return sk if sk is not None and sk.kind == "rtt" else None


def bandwidth_ok(moved: int, busy: float) -> bool:
    return math.isfinite(busy) and 1e-9 <= busy <= MAX_BUSY_S and moved / busy <= MAX_BYTES_PER_S


class PathTable:
    """Every probed path by PathKey within a bound per host, indexed by host pair, and
    the fleet's RTT sketches per (transport, op, size)."""

    def __init__(self, drops: dict[str, int], max_per_host: int = MAX_PATHS_PER_HOST) -> None:
        self.drops = drops  # the store's drop counts (path, value, class)
        self.max_per_host = max_per_host
        self.by_key: dict[PathKey, PathStats] = {}
        self.by_pair: dict[tuple[str, str], list[PathKey]] = {}  # host_pair() -> paths
        # every window's RTT sketch merged per class: the fleet's histograms, which grow
        # with nothing but the plan's kinds and sizes
        self.fleet: dict[FleetClass, CumulativeSketch] = {}
        self.merges = 0  # RTT sketches merged
        self._seq = 0

    def merge(
        self,
        state: HostState,
        end_ns: int,
        order: tuple[int, int],
        now: int,
        w: pb.ProbeWindow,
        sketch: MergedSketch | None,
        prober: MergedSketch | None = None,
    ) -> PathKey | None:
        """Fold one probe window of STATE's host in; its path, None when it was dropped."""
        src = state.info.host
        key = PathKey(src, w.dst, w.transport, w.op, int(w.size))
        if w.bytes_moved and not bandwidth_ok(w.bytes_moved, w.busy_seconds):
            self.drops["value"] += 1
            return None
        stats = self.by_key.get(key)
        if stats is None:
            if state.paths >= self.max_per_host:
                self.drops["path"] += 1
                return None
            stats = self.by_key[key] = PathStats(seq=self._seq, first_ns=now)
            self._seq += 1
            state.paths += 1
            self.by_pair.setdefault(host_pair(src, w.dst), []).append(key)
        stats.windows += 1
        stats.failures += w.failures
        stats.touched_ns = now
        newest = order > stats.last_order
        if sketch is not None:
            if sketch.kind == "rtt":
                stats.rtt.merge(sketch)
                self.merges += 1
                self._merge_fleet((w.transport, w.op, int(w.size)), sketch)
            if newest:
                stats.last_rtt = sketch  # parsed for this report alone: never merged into
                if sketch.kind == "rtt":
                    stats.rank(sketch)
        if w.bytes_moved:
            stats.bytes_moved += w.bytes_moved
            stats.busy_seconds += w.busy_seconds
            bps = w.bytes_moved / w.busy_seconds
            stats.peak_bytes_per_second = max(stats.peak_bytes_per_second or 0.0, bps)
            if newest:
                stats.last_bytes_per_second = bps
        if newest:
            stats.last_order = order
            stats.last_end_ns = end_ns
            stats.last_prober_delay = prober
        return key

    def _merge_fleet(self, cls: FleetClass, sketch: MergedSketch) -> None:
        fleet = self.fleet.get(cls)
        if fleet is None and len(self.fleet) < MAX_FLEET_CLASSES:
            fleet = self.fleet[cls] = CumulativeSketch()
        if fleet is None:
            self.drops["class"] += 1
        else:
            fleet.merge(sketch)

    def forget(
        self, dead: Collection[str], idle_ns: int, hosts: dict[str, HostState]
    ) -> list[PathKey]:
        """Drop the paths of the DEAD hosts, and those no window touched since IDLE_NS (a
        host that probes new peers does not pile up old ones); the paths dropped."""
        old = [k for k, v in self.by_key.items() if k.src in dead or v.touched_ns < idle_ns]
        if not old:
            return old
        for k in old:
            del self.by_key[k]
            if (h := hosts.get(k.src)) is not None:
                h.paths -= 1
        gone = set(old)
        self.by_pair = {
            pair: kept
            for pair, keys in self.by_pair.items()
            if (kept := [k for k in keys if k not in gone])
        }
        return old

    def copies(self, keys: Iterable[PathKey]) -> dict[PathKey, PathStats]:
        """Copies of the paths of KEYS that are still held (a host may have gone)."""
        out: dict[PathKey, PathStats] = {}
        for k in keys:
            st = self.by_key.get(k)
            if st is not None:
                out[k] = st.copy()
        return out

    def fresh(self, since_ns: int, limit: int) -> list[PathKey]:
        """The first LIMIT paths touched at or after SINCE_NS, in the store's order."""
        out: list[PathKey] = []
        for key, v in self.by_key.items():
            if v.touched_ns >= since_ns:
                out.append(key)
                if len(out) >= limit:
                    break
        return out

    def of_pairs(self, pairs: Iterable[tuple[str, str]]) -> list[PathKey]:
        """The paths of the host pairs PAIRS (host_pair() order), in the store's order."""
        got = {k for p in pairs for k in self.by_pair.get(p, ()) if k in self.by_key}
        return sorted(got, key=lambda k: self.by_key[k].seq)

    def views(self, a: str, b: str) -> list[PathView]:
        """The newest figures of each path between A and B, both ways."""
        out = []
        for key in self.by_pair.get(host_pair(a, b), ()):
            st = self.by_key.get(key)
            if st is not None:
                out.append(
                    PathView(
                        key,
                        st.last_end_ns,
                        st.last_rtt,
                        st.last_prober_delay,
                        st.last_bytes_per_second,
                        st.peak_bytes_per_second,
                    )
                )
        return out

    def fleet_sketches(self) -> dict[FleetClass, CumulativeSketch]:
        return {cls: sk.copy() for cls, sk in self.fleet.items()}


class NamedPairs:
    """Host pairs a request's KV transfer ran over lately (the export shows their paths
    in full for a while), the oldest of more than MAX_NAMED_PAIRS forgotten."""

    def __init__(self, limit: int = MAX_NAMED_PAIRS) -> None:
        self.limit = limit
        self.at: OrderedDict[tuple[str, str], int] = OrderedDict()  # host_pair() -> when

    def name(self, pairs: Iterable[tuple[str, str]], now: int) -> None:
        for a, b in pairs:
            key = host_pair(a, b)
            self.at[key] = now
            self.at.move_to_end(key)
        while len(self.at) > self.limit:
            self.at.popitem(last=False)

    def since(self, since_ns: int) -> set[tuple[str, str]]:
        return {p for p, t in self.at.items() if t >= since_ns}
