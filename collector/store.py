"""The collector's memory: probe windows merged per path, counter totals and rates, hosts.

Plain Python, no gRPC and no prometheus_client: the servicer hands reports in, the
exporter reads a consistent snapshot out. Windows are merged per
(src, dst, transport, op, size); a report is taken once per (host, epoch, seq), so a
window replayed from an agent's spool after an outage is acknowledged but not
counted twice.
"""

from __future__ import annotations

import copy
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from fabricprobe.collector.pathfold import PathFold
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.cumulative import CumulativeSketch
from fabricprobe.core.errors import ParseError
from fabricprobe.core.sketchwire import MergedSketch, from_wire

PathKey = tuple[str, str, str, str, int]  # src, dst, transport, op, size
# src, kind, device, port, netdev, priority, name
CounterKey = tuple[str, str, str, int, str, int, str]

COUNTER_KINDS = frozenset({"rdma", "pfc", "netdev", "nixl"})  # nixl: agent/nixl.py
_WIDTHS = frozenset({32, 64})
MAX_NAME = 128  # peer host names and counter names
MAX_DEVICE = 64  # RDMA device and netdev names (the kernel's are shorter)

# Bounds of what one host can make the collector hold (collector/README.md lists them).
MAX_PATHS_PER_HOST = 4096  # new paths beyond it are dropped and counted; idle ones expire
MAX_COUNTERS_PER_HOST = 4096  # the same for counters
MAX_EPOCHS = 4  # agent lifetimes whose sequence numbers are kept per host
MAX_RETIRED = 64  # older lifetimes remembered per host: their replays are not counted again
MAX_HOSTS = 10_000  # registered hosts (tokens bound them already; plain text does not)
FUTURE_TOLERANCE_S = 300.0  # a window may end this far past the collector's clock
MAX_BUSY_S = 86_400.0  # seconds a bandwidth window can have spent moving bytes
MAX_BYTES_PER_S = 1e14  # 800 Tb/s: a bandwidth figure above it is not a measurement
MAX_STAT = 1e15  # agent self-figures (CPU seconds, probe rate)
# A 32-bit counter read lower than before wrapped only if it could have travelled
# 2**32 - prev + new in the time between the readings: at up to WRAP_RATE_FACTOR times the
# fastest rate it has shown (at least MIN_WRAP_RATE a second), or, before it has shown
# one, at a rate that wraps it once a minute (a counter faster than that cannot be read
# at 10 s windows anyway). Anything else is a reset of the device.
WRAP_RATE_FACTOR = 4.0
MIN_WRAP_RATE = 1e6
FIRST_WRAP_RATE = 2**32 / 60.0
DROPS = (
    "path",  # a new path over the host's bound
    "counter",  # a new counter over the host's bound
    "value",  # a figure out of range (non-finite, negative, wider than its counter)
    "stale_epoch",  # a report from a lifetime older than the ones kept
    "stale_reading",  # a counter reading older (by epoch and seq) than the one held
    "clock_step",  # a counter reading dated at or before the previous one: no rate
    "host",  # a registration over MAX_HOSTS
    "class",  # a fleet class (transport, op, size) over MAX_FLEET_CLASSES
)
MAX_FLEET_CLASSES = 64  # (transport, op, size) classes of the fleet-wide RTT sketches
MAX_NAMED_PAIRS = 4096  # host pairs recently named by requests (collector/detail.py)


def host_pair(a: str, b: str) -> tuple[str, str]:
    """The two hosts of a path in one order, whichever way it is probed."""
    return (a, b) if a <= b else (b, a)


class ReportError(ValueError):
    """A report that cannot be taken; the message says what was wrong with it."""


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


@dataclass
class CounterTrack:
    """One counter of one host: the last reading, a wrap/reset-corrected total, a rate."""

    width: int
    last_value: int
    last_ns: int
    order: tuple[int, int] = (0, 0)  # (lifetime, seq) of the last reading
    total: int = 0  # increase since the collector first saw it, wraps and resets counted
    rate: float | None = None  # per second between the two newest readings
    peak_rate: float = 0.0  # the fastest it has moved (tells a wrap from a reset)
    wraps: int = 0
    resets: int = 0
    touched_ns: int = 0

    def advance(self, value: int, width: int, end_ns: int, order: tuple[int, int]) -> float | None:
        """Take a newer reading: the increase since the last one goes into the total (a
        32-bit counter that went down wrapped if it could have travelled that far at a
        speed it has shown, else it was reset, as a 64-bit one always was); the new rate,
        or None when the agent's clock stepped back (no rate from it)."""
        dt = (end_ns - self.last_ns) / 1e9
        if value >= self.last_value:  # the common case, without the wrap/reset analysis
            delta = value - self.last_value
        elif self.width == 32 and width == 32 and dt > 0:
            travelled = (1 << 32) - self.last_value + value
            fastest = (
                max(MIN_WRAP_RATE, WRAP_RATE_FACTOR * self.peak_rate)
                if self.peak_rate > 0
                else FIRST_WRAP_RATE
            )
            if travelled <= fastest * dt:
                delta = travelled
                self.wraps += 1
            else:
                delta = value
                self.resets += 1
        else:
            delta = value  # a 64-bit counter never wraps in practice: it was reset
            self.resets += 1
        self.total += delta
        self.last_value, self.order, self.width, self.last_ns = value, order, width, end_ns
        if dt <= 0:
            return None
        self.rate = delta / dt
        self.peak_rate = max(self.peak_rate, self.rate)
        return self.rate


@dataclass
class HostState:
    """What the collector knows of one agent."""

    info: pb.HostInfo
    registered_ns: int
    last_report_ns: int = 0  # collector clock (time.time_ns) when the last report arrived
    last_window_end_ns: int = 0
    agent: pb.AgentStats | None = None
    reports: int = 0
    duplicates: int = 0
    # epoch -> (its lifetime number, seqs taken), in the order the collector first heard
    # of each lifetime: that order, not the epoch's value (a clock), says which is newer
    seen: OrderedDict[int, tuple[int, _SeqSet]] = field(default_factory=OrderedDict)
    retired: OrderedDict[int, None] = field(default_factory=OrderedDict)
    lifetimes: int = 0
    newest: tuple[int, int] = (0, 0)  # (lifetime, seq) of the newest report taken
    paths: int = 0
    counters: int = 0

    def lifetime(self, epoch: int) -> int | None:
        """EPOCH's lifetime number (a new lifetime gets the next one), or None
        for a lifetime retired to make room for newer ones."""
        held = self.seen.get(epoch)
        if held is not None:
            return held[0]
        if epoch in self.retired:
            return None
        self.lifetimes += 1
        self.seen[epoch] = (self.lifetimes, _SeqSet())
        while len(self.seen) > MAX_EPOCHS:  # the lifetime heard of first goes
            old, _ = self.seen.popitem(last=False)
            self.retired[old] = None
            while len(self.retired) > MAX_RETIRED:
                self.retired.popitem(last=False)
        return self.lifetimes


class _SeqSet:
    """Sequence numbers taken for one epoch: a contiguous floor plus a bounded set above."""

    __slots__ = ("above", "floor")
    MAX_ABOVE = 1024  # seqs held above the floor; a gap older than that is given up

    def __init__(self) -> None:
        self.floor = 0  # every seq <= floor was taken
        self.above: set[int] = set()

    def __contains__(self, seq: int) -> bool:
        return seq <= self.floor or seq in self.above

    def add(self, seq: int) -> None:
        self.above.add(seq)
        while self.floor + 1 in self.above:
            self.floor += 1
            self.above.discard(self.floor)
        if len(self.above) > self.MAX_ABOVE:  # a gap that will never fill: move past it
            self.floor = min(self.above)
            self.above.discard(self.floor)


class ReportListener(Protocol):
    def report_taken(
        self,
        end_ns: int,
        windows: list[tuple[PathKey, MergedSketch]],
        rates: list[tuple[CounterKey, float]],
        prober_delays: Mapping[PathKey, MergedSketch] | None = None,
    ) -> None: ...


@dataclass(frozen=True)
class TakeResult:
    duplicate: bool
    probes: int
    counters: int


class NixlTotal(NamedTuple):
    """One NIXL counter of one host (agent/nixl.py reads it from an engine's telemetry)."""

    host: str
    engine: str  # the telemetry's source (host:port), the counter's device
    name: str  # transfers, bytes, xfer_time_us, post_time_us, errors
    total: int


class WindowStore:
    """Thread-safe store of hosts, path windows and counters (see the module docstring)."""

    def __init__(
        self,
        *,
        stale_after: float = 30.0,
        forget_after: float = 600.0,
        clock: Callable[[], int] = time.time_ns,
        max_paths_per_host: int = MAX_PATHS_PER_HOST,
        max_counters_per_host: int = MAX_COUNTERS_PER_HOST,
        max_hosts: int = MAX_HOSTS,
        future_tolerance_s: float = FUTURE_TOLERANCE_S,
    ) -> None:
        self.stale_after = stale_after
        self.forget_after = forget_after
        self.clock = clock
        self.max_paths_per_host = max_paths_per_host
        self.max_counters_per_host = max_counters_per_host
        self.max_hosts = max_hosts
        self.future_tolerance_ns = int(future_tolerance_s * 1e9)
        self.dropped: dict[str, int] = dict.fromkeys(DROPS, 0)
        self.lock = threading.RLock()
        self.hosts: dict[str, HostState] = {}
        self.paths: dict[PathKey, PathStats] = {}
        self.counters: dict[CounterKey, CounterTrack] = {}
        self.reports_total = 0
        self.duplicates_total = 0
        self.rejected_total = 0
        self.merges_total = 0
        # told of every report taken, under the lock (collector/history.py)
        self.listeners: list[ReportListener] = []
        self._pair_paths: dict[tuple[str, str], list[PathKey]] = {}  # host_pair() -> paths
        # every window's RTT sketch merged per (transport, op, size): the fleet's
        # histograms, which grow with nothing but the plan's kinds and sizes
        self.fleet: dict[tuple[str, str, int], CumulativeSketch] = {}
        # host_pair() -> collector clock when a request's KV transfer last named it
        self.named: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._path_seq = 0
        # told of every report's paths and of paths let go, under the lock: the ranking
        # figures folded as reports arrive (collector/pathfold.py)
        self.folds: list[PathFold] = []

    # -- hosts --------------------------------------------------------------------------

    def register(self, info: pb.HostInfo) -> HostState:
        """Add or refresh a host; its sequence history survives a re-registration."""
        if not info.host:
            raise ReportError("host name is empty")
        with self.lock:
            state = self.hosts.get(info.host)
            now = self.clock()
            if state is None:
                if len(self.hosts) >= self.max_hosts:
                    self.dropped["host"] += 1
                    raise ReportError(f"the collector holds {self.max_hosts} hosts already")
                state = HostState(info=info, registered_ns=now, last_report_ns=now)
                self.hosts[info.host] = state
                moved = True
            else:
                moved = state.info.topology != info.topology
                state.info = info
                state.last_report_ns = max(state.last_report_ns, now)
            if moved:  # its ToR label is another now
                for f in self.folds:
                    f.relabel(info.host, self.paths)
            return state

    def is_stale(self, state: HostState, now_ns: int | None = None) -> bool:
        now = self.clock() if now_ns is None else now_ns
        return (now - state.last_report_ns) / 1e9 > self.stale_after

    def live_hosts(self) -> list[HostState]:
        """Hosts that reported (or registered) within stale_after seconds."""
        with self.lock:
            now = self.clock()
            return [h for h in self.hosts.values() if not self.is_stale(h, now)]

    def forget_idle(self, *, also: Callable[[str, HostState], bool] | None = None) -> list[str]:
        """Drop hosts silent for forget_after seconds, and those ALSO picks (a shard lets go
        of hosts another shard owns now), with their series; return their names."""
        with self.lock:
            now = self.clock()
            gone = [
                name
                for name, h in self.hosts.items()
                if (now - h.last_report_ns) / 1e9 > self.forget_after
                or (also is not None and also(name, h))
            ]
            for name in gone:
                del self.hosts[name]
            old_paths: list[PathKey] = []
            # a path or counter no window has touched for forget_after goes too (its
            # host's bound frees up): a host that probes new peers does not pile up old ones
            idle = now - int(self.forget_after * 1e9)
            dead = set(gone)
            old_paths = [k for k, v in self.paths.items() if k[0] in dead or v.touched_ns < idle]
            old_counters = [
                k for k, t in self.counters.items() if k[0] in dead or t.touched_ns < idle
            ]
            if old_paths:
                for k in old_paths:
                    del self.paths[k]
                    if (h := self.hosts.get(k[0])) is not None:
                        h.paths -= 1
                gone_paths = set(old_paths)
                self._pair_paths = {
                    pair: kept
                    for pair, keys in self._pair_paths.items()
                    if (kept := [k for k in keys if k not in gone_paths])
                }
            for ck in old_counters:
                del self.counters[ck]
                if (h := self.hosts.get(ck[0])) is not None:
                    h.counters -= 1
            if old_paths or gone:
                for f in self.folds:
                    f.forgot(old_paths, gone, self.paths)
            return gone

    # -- reports ------------------------------------------------------------------------

    def take(self, report: pb.WindowReport) -> TakeResult:
        """Merge one report. Raises ReportError for a malformed one (nothing is merged)."""
        try:
            sketches, probers = validate_report(report)
        except ReportError:
            with self.lock:
                self.rejected_total += 1
            raise
        with self.lock:
            state = self.hosts.get(report.host)
            if state is None:
                self.rejected_total += 1
                raise ReportError(f"host {report.host!r} has not registered")
            now = self.clock()
            if report.window_end_unix_ns > now + self.future_tolerance_ns:
                self.rejected_total += 1
                ahead = (report.window_end_unix_ns - now) / 1e9
                raise ReportError(
                    f"window ends {ahead:,.0f} s after the collector's clock"
                    f" (tolerance {self.future_tolerance_ns / 1e9:g} s): check the agent's clock"
                )
            lifetime = state.lifetime(report.epoch)
            if lifetime is None:  # a lifetime older than the ones kept: taken long ago
                self.dropped["stale_epoch"] += 1
                state.duplicates += 1
                self.duplicates_total += 1
                return TakeResult(duplicate=True, probes=0, counters=0)
            seqs = state.seen[report.epoch][1]
            if report.seq in seqs:
                state.duplicates += 1
                self.duplicates_total += 1
                return TakeResult(duplicate=True, probes=0, counters=0)
            seqs.add(report.seq)
            state.last_report_ns = now
            state.reports += 1
            self.reports_total += 1
            order = (lifetime, report.seq)
            if order > state.newest:  # newest by lifetime and seq: clocks may step
                state.newest = order
                state.last_window_end_ns = report.window_end_unix_ns
                if report.HasField("agent"):
                    if _agent_ok(report.agent):
                        state.agent = report.agent
                    else:
                        self.dropped["value"] += 1
            end = report.window_end_unix_ns
            windows: list[tuple[PathKey, MergedSketch]] = []
            delays: dict[PathKey, MergedSketch] = {}
            touched: list[PathKey] = []
            for w, sketch, prober in zip(report.probes, sketches, probers, strict=True):
                key = self._merge_probe(state, end, order, now, w, sketch, prober)
                if key is not None:
                    touched.append(key)
                if key is not None and sketch is not None and sketch.kind == "rtt":
                    windows.append((key, sketch))
                    if prober is not None:
                        delays[key] = prober
            rates: list[tuple[CounterKey, float]] = []
            for c in report.counters:
                updated = self._merge_counter(state, end, order, now, c)
                if updated is not None:
                    rates.append(updated)
            if touched:
                for f in self.folds:
                    f.taken(report.host, now, touched, self.paths)
            for listener in self.listeners:
                listener.report_taken(end, windows, rates, delays)
            return TakeResult(False, len(report.probes), len(report.counters))

    def _merge_probe(
        self,
        state: HostState,
        end_ns: int,
        order: tuple[int, int],
        now: int,
        w: pb.ProbeWindow,
        sketch: MergedSketch | None,
        prober: MergedSketch | None = None,
    ) -> PathKey | None:
        src = state.info.host
        key: PathKey = (src, w.dst, w.transport, w.op, int(w.size))
        if w.bytes_moved and not _bandwidth_ok(w.bytes_moved, w.busy_seconds):
            self.dropped["value"] += 1
            return None
        stats = self.paths.get(key)
        if stats is None:
            if state.paths >= self.max_paths_per_host:
                self.dropped["path"] += 1
                return None
            stats = self.paths[key] = PathStats(seq=self._path_seq)
            self._path_seq += 1
            state.paths += 1
            self._pair_paths.setdefault(host_pair(src, w.dst), []).append(key)
        stats.windows += 1
        stats.failures += w.failures
        stats.touched_ns = now
        newest = order > stats.last_order
        if sketch is not None:
            if sketch.kind == "rtt":
                stats.rtt.merge(sketch)
                self.merges_total += 1
                cls = (w.transport, w.op, int(w.size))
                fleet = self.fleet.get(cls)
                if fleet is None and len(self.fleet) < MAX_FLEET_CLASSES:
                    fleet = self.fleet[cls] = CumulativeSketch()
                if fleet is None:
                    self.dropped["class"] += 1
                else:
                    fleet.merge(sketch)
            if newest:
                stats.last_rtt = sketch  # parsed for this report alone: never merged into
                if sketch.kind == "rtt":
                    _rank(stats, sketch)
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

    def _merge_counter(
        self, state: HostState, end_ns: int, order: tuple[int, int], now: int, c: pb.CounterReading
    ) -> tuple[CounterKey, float] | None:
        """Fold one reading in; the counter and its new rate when the rate changed."""
        src = state.info.host
        key: CounterKey = (src, c.kind, c.device, c.port, c.netdev, c.priority, c.name)
        value = c.value
        if value >= 1 << c.width:
            self.dropped["value"] += 1
            return None
        track = self.counters.get(key)
        if track is None:
            if state.counters >= self.max_counters_per_host:
                self.dropped["counter"] += 1
                return None
            state.counters += 1
            self.counters[key] = CounterTrack(c.width, value, end_ns, order, touched_ns=now)
            return None
        if order <= track.order:
            self.dropped["stale_reading"] += 1
            return None  # a replayed older reading: the totals already passed it
        track.touched_ns = now
        rate = track.advance(value, c.width, end_ns, order)
        if rate is None:  # the agent's clock stepped back: the increase counts, no rate
            self.dropped["clock_step"] += 1
            return None
        return key, rate

    # -- reading ------------------------------------------------------------------------

    def snapshot(
        self,
        chunk: int = 5_000,
        *,
        paths: Iterable[PathKey] | None = None,
        counter_hosts: Container[str] | None = None,
    ) -> StoreSnapshot:
        """A copy of what the exporter needs, safe to read while reports go on being
        taken: what reports change (merged sketches, counter tracks) is copied; a
        newest-window sketch is never changed once taken, so it is shared. Each path and
        counter is copied whole under the lock, CHUNK at a time, so a scrape of a large
        fleet never holds ingest up for long. PATHS and COUNTER_HOSTS limit the copy to
        those paths and to the counters of those hosts (None: all)."""
        with self.lock:
            now = self.clock()
            hosts = {name: (h, self.is_stale(h, now)) for name, h in self.hosts.items()}
            path_keys = list(self.paths) if paths is None else list(paths)
            counter_keys = list(self.counters)
            totals = (self.reports_total, self.duplicates_total, self.rejected_total)
            merges = self.merges_total
            dropped = dict(self.dropped)
        if counter_hosts is not None:
            counter_keys = [k for k in counter_keys if k[0] in counter_hosts]
        copied: dict[PathKey, PathStats] = {}
        for i in range(0, len(path_keys), chunk):
            with self.lock:
                for k in path_keys[i : i + chunk]:
                    st = self.paths.get(k)  # None: its host was forgotten meanwhile
                    if st is not None:
                        copied[k] = st.copy()
        counters: dict[CounterKey, CounterTrack] = {}
        for i in range(0, len(counter_keys), chunk):
            with self.lock:
                for ck in counter_keys[i : i + chunk]:
                    t = self.counters.get(ck)
                    if t is not None:
                        counters[ck] = copy.copy(t)
        return StoreSnapshot(now, hosts, copied, counters, *totals, merges, dropped)

    def counter_rates(self, names: Container[str]) -> list[tuple[CounterKey, float]]:
        """(key, rate) of every counter named in NAMES that has a rate (the alert rules'
        counters: which hosts are in trouble)."""
        with self.lock:
            held = self.counters.items()
            return [(k, t.rate) for k, t in held if k[6] in names and t.rate is not None]

    def nixl_counter_totals(self) -> list[NixlTotal]:
        """Every NIXL counter's total, per host and engine."""
        with self.lock:
            held = self.counters.items()
            return [NixlTotal(k[0], k[2], k[6], t.total) for k, t in held if k[1] == "nixl"]

    def path_views(self) -> list[tuple[PathKey, PathStats]]:
        """Every path with its live stats, for the bounded export to rank without copying
        (one C-level copy of the table under the lock). Reports go on changing the stats
        meanwhile: a reader takes each field once (each is replaced whole, never changed
        in place: the newest sketch, its clock and order), so the worst it sees is a
        window newer than the one it read the other field of."""
        with self.lock:
            return list(self.paths.items())

    def add_fold(self, fold: PathFold) -> None:
        """Keep FOLD up to date from now on, with what the store holds already."""
        with self.lock:
            fold.rebuild(self.paths)
            self.folds.append(fold)

    def fresh_paths(self, since_ns: int, limit: int) -> tuple[list[PathKey], int]:
        """(the first LIMIT paths touched at or after SINCE_NS, in the store's order; how
        many paths the store holds)."""
        out: list[PathKey] = []
        with self.lock:
            for key, v in self.paths.items():
                if v.touched_ns >= since_ns:
                    out.append(key)
                    if len(out) >= limit:
                        break
            return out, len(self.paths)

    def paths_of_pairs(self, pairs: Iterable[tuple[str, str]]) -> list[PathKey]:
        """The paths of the host pairs PAIRS (host_pair() order), in the store's order."""
        with self.lock:
            got = {k for p in pairs for k in self._pair_paths.get(p, ()) if k in self.paths}
            return sorted(got, key=lambda k: self.paths[k].seq)

    def fleet_sketches(self) -> dict[tuple[str, str, int], CumulativeSketch]:
        with self.lock:
            return {cls: sk.copy() for cls, sk in self.fleet.items()}

    def name_pairs(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Note host pairs a request's KV transfer ran over (the export shows their paths
        in full for a while); the oldest of more than MAX_NAMED_PAIRS are forgotten."""
        with self.lock:
            now = self.clock()
            for a, b in pairs:
                key = host_pair(a, b)
                self.named[key] = now
                self.named.move_to_end(key)
            while len(self.named) > MAX_NAMED_PAIRS:
                self.named.popitem(last=False)

    def named_since(self, since_ns: int) -> set[tuple[str, str]]:
        with self.lock:
            return {p for p, t in self.named.items() if t >= since_ns}

    def newest_windows(
        self, a: str, b: str
    ) -> list[tuple[PathKey, int, MergedSketch, MergedSketch | None]]:
        """(path, end, RTT sketch, prober-delay sketch or None) of the newest window of
        each path between A and B, both ways."""
        with self.lock:
            out = []
            for key in self._pair_paths.get(host_pair(a, b), ()):
                st = self.paths.get(key)
                if st is not None and st.last_rtt is not None and st.last_rtt.kind == "rtt":
                    out.append((key, st.last_end_ns, st.last_rtt, st.last_prober_delay))
            return out

    def seqs_taken(self, host: str) -> dict[int, set[int]]:
        """epoch -> every seq taken for HOST (tests and diagnostics)."""
        with self.lock:
            state = self.hosts.get(host)
            if state is None:
                return {}
            return {
                e: set(range(1, s.floor + 1)) | set(s.above) for e, (_, s) in state.seen.items()
            }


def validate_report(
    report: pb.WindowReport,
) -> tuple[list[MergedSketch | None], list[MergedSketch | None]]:
    """Each probe window's RTT sketch and prober-delay sketch (None where absent), parsed;
    ReportError for a report the store cannot take (nothing of it is merged)."""
    if not report.host:
        raise ReportError("report without a host name")
    if report.seq < 1:
        raise ReportError("seq must start at 1")
    if report.window_end_unix_ns < report.window_start_unix_ns:
        raise ReportError("window ends before it starts")
    sketches: list[MergedSketch | None] = []
    probers: list[MergedSketch | None] = []
    for w in report.probes:
        if not w.dst or len(w.dst) > MAX_NAME or w.transport not in ("tcp", "rdma"):
            raise ReportError(f"bad probe window dst={w.dst!r} transport={w.transport!r}")
        if not w.op or len(w.op) > 32:
            raise ReportError(f"bad probe op {w.op!r}")
        rtt = None
        if w.HasField("rtt"):
            try:
                rtt = from_wire(w.rtt)
            except ParseError as e:
                raise ReportError(f"probe window to {w.dst}: {e}") from None
            if rtt.kind == "delay":
                raise ReportError(f"probe window to {w.dst}: an RTT sketch of kind delay")
        sketches.append(rtt)
        probers.append(_prober_delay(w, rtt) if w.HasField("prober_delay") else None)
    kinds, widths = COUNTER_KINDS, _WIDTHS
    for c in report.counters:
        name = c.name
        if c.kind not in kinds or not name or len(name) > MAX_NAME or c.width not in widths:
            raise ReportError(
                f"bad counter kind={c.kind!r} name={name[:40]!r} width={c.width}"
                " (kinds rdma, pfc, netdev, nixl; width 32 or 64)"
            )
        if len(c.device) > MAX_DEVICE or len(c.netdev) > MAX_DEVICE:
            raise ReportError(f"counter {name[:40]!r}: device name over {MAX_DEVICE}")
    return sketches, probers


P99_EWMA_ALPHA = 0.1  # weight of a new window in a path's running p99


def _rank(stats: PathStats, sketch: MergedSketch) -> None:
    """Fold the newest window into STATS' ranking figures. Up to 50 exchanges (10 at the
    default plan) the p99 rank is the last exchange, so the p99 is the window's exact
    max and no walk over the slots is needed."""
    sent = sketch.count + sketch.lost
    stats.last_loss = sketch.lost / sent if sent else 0.0
    prev = stats.last_p99_ns
    if prev is not None:  # the running p99 holds the windows before the newest
        n = stats.p99_windows
        stats.p99_ewma = (
            float(prev) if n == 0 else stats.p99_ewma + P99_EWMA_ALPHA * (prev - stats.p99_ewma)
        )
        stats.p99_windows = n + 1
    if not sketch.count:
        stats.last_p99_ns = None
    elif sketch.count <= 50:
        stats.last_p99_ns = sketch.max_ns
    else:
        stats.last_p99_ns = sketch.percentile_ns(99.0)


def _prober_delay(w: pb.ProbeWindow, rtt: MergedSketch | None) -> MergedSketch:
    """W's prober-delay sketch, held to what it can be: a delay inside each of the
    window's answered RDMA probes (kind delay, no loss, no more samples than RTTs)."""
    try:
        sk = from_wire(w.prober_delay)
    except ParseError as e:
        raise ReportError(f"probe window to {w.dst}: prober delay: {e}") from None
    if w.transport != "rdma" or sk.kind != "delay" or sk.lost:
        raise ReportError(
            f"probe window to {w.dst}: a prober delay must be an RDMA window's, of kind"
            f" delay and without loss (got {w.transport} {sk.kind!r}, {sk.lost} lost)"
        )
    if rtt is None or sk.count > rtt.count:
        have = 0 if rtt is None else rtt.count
        raise ReportError(f"probe window to {w.dst}: {sk.count} prober delays for {have} RTTs")
    return sk


def _bandwidth_ok(moved: int, busy: float) -> bool:
    return math.isfinite(busy) and 1e-9 <= busy <= MAX_BUSY_S and moved / busy <= MAX_BYTES_PER_S


def _agent_ok(a: pb.AgentStats) -> bool:
    return all(math.isfinite(v) and 0.0 <= v <= MAX_STAT for v in (a.cpu_seconds, a.probe_rate))


@dataclass(frozen=True)
class StoreSnapshot:
    now_ns: int
    hosts: dict[str, tuple[HostState, bool]]  # name -> (state, stale)
    paths: dict[PathKey, PathStats]
    counters: dict[CounterKey, CounterTrack]
    reports_total: int
    duplicates_total: int
    rejected_total: int
    merges_total: int
    dropped: dict[str, int] = field(default_factory=dict)

    def counters_of(self, kind: str) -> Iterable[tuple[CounterKey, CounterTrack]]:
        return ((k, t) for k, t in self.counters.items() if k[1] == kind)
