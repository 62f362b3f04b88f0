"""The collector's memory: probe windows merged per path, counter totals and rates, hosts.

Plain Python, no gRPC and no prometheus_client: the servicer hands reports in, the
exporter reads a consistent snapshot out. Windows are merged per
(src, dst, transport, op, size); a report is taken once per (host, epoch, seq), so a
window replayed from an agent's spool after an outage is acknowledged but not
counted twice.

One lock guards four tables, each in its own module: the hosts (collector/hosttable.py),
the path figures (collector/pathtable.py), the counter tracks
(collector/countertable.py) and the rails' own figures (collector/railtable.py). Readers
outside the store get copies with named fields (`HostView`, `PathView`, `StoreSnapshot`)
from methods that take the lock themselves.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from fabricprobe.collector.countertable import (
    MAX_COUNTERS_PER_HOST,
    CounterKey,
    CounterTable,
    CounterTrack,
)
from fabricprobe.collector.hosttable import MAX_HOSTS, HostState, HostTable, HostView
from fabricprobe.collector.pathfold import Folded, PathFold
from fabricprobe.collector.pathtable import (
    MAX_PATHS_PER_HOST,
    FleetClass,
    NamedPairs,
    PathKey,
    PathStats,
    PathTable,
    PathView,
)
from fabricprobe.collector.pathtable import host_pair as host_pair  # its importers' old home
from fabricprobe.collector.railtable import RailSummary, RailTable
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.cumulative import CumulativeSketch
from fabricprobe.core.errors import ParseError
from fabricprobe.core.sketchwire import MergedSketch, from_wire

COUNTER_KINDS = frozenset({"rdma", "pfc", "netdev", "nixl"})  # nixl: agent/nixl.py
_WIDTHS = frozenset({32, 64})
MAX_NAME = 128  # peer host names and counter names
MAX_DEVICE = 64  # RDMA device and netdev names (the kernel's are shorter)

# Bounds of what one host can make the collector hold (collector/README.md lists them;
# the tables' own are in their modules: MAX_HOSTS, MAX_PATHS_PER_HOST, MAX_COUNTERS_PER_HOST).
FUTURE_TOLERANCE_S = 300.0  # a window may end this far past the collector's clock
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


class ReportError(ValueError):
    """A report that cannot be taken; the message says what was wrong with it."""


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


class RailView(NamedTuple):
    """The rails as the store holds them at one moment."""

    paths: list[pb.RailPath]  # each pair's rails, those standing out first
    summary: dict[int, RailSummary]  # each rail over its fresh paths
    windows: dict[str, int]  # rail windows taken, by outcome


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
        self.clock = clock
        self.future_tolerance_ns = int(future_tolerance_s * 1e9)
        self.dropped: dict[str, int] = dict.fromkeys(DROPS, 0)
        self.lock = threading.RLock()
        self.host_table = HostTable(
            self.dropped, stale_after=stale_after, forget_after=forget_after, max_hosts=max_hosts
        )
        self.path_table = PathTable(self.dropped, max_paths_per_host)
        self.counter_table = CounterTable(self.dropped, max_counters_per_host)
        self.rail_table = RailTable()  # each pair's probes per rail (rail hosts only)
        self.named = NamedPairs()  # host pairs requests named lately (collector/detail.py)
        self.reports_total = self.duplicates_total = self.rejected_total = 0
        # told of every report taken, under the lock (collector/history.py)
        self.listeners: list[ReportListener] = []
        # told of every report's paths and of paths let go, under the lock: the ranking
        # figures folded as reports arrive (collector/pathfold.py)
        self.folds: list[PathFold] = []

    # the tables, for code that holds the lock (reading without it: the views below)
    @property
    def hosts(self) -> dict[str, HostState]:
        return self.host_table.by_name

    @property
    def paths(self) -> dict[PathKey, PathStats]:
        return self.path_table.by_key

    @property
    def counters(self) -> dict[CounterKey, CounterTrack]:
        return self.counter_table.by_key

    @property
    def merges_total(self) -> int:
        return self.path_table.merges

    @property
    def stale_after(self) -> float:
        return self.host_table.stale_after

    @property
    def forget_after(self) -> float:
        return self.host_table.forget_after

    # -- hosts --------------------------------------------------------------------------

    def register(self, info: pb.HostInfo) -> HostState:
        """Add or refresh a host; its sequence history survives a re-registration."""
        if not info.host:
            raise ReportError("host name is empty")
        with self.lock:
            try:
                state, moved = self.host_table.register(info, self.clock())
            except ValueError as e:  # the table is full
                raise ReportError(str(e)) from None
            if moved:  # its ToR label is another now
                for f in self.folds:
                    f.relabel(info.host, self.paths)
            return state

    def is_stale(self, state: HostState, now_ns: int | None = None) -> bool:
        return self.host_table.is_stale(state, self.clock() if now_ns is None else now_ns)

    def live_hosts(self) -> list[HostState]:
        """Hosts that reported (or registered) within stale_after seconds."""
        with self.lock:
            now = self.clock()
            return [h for h in self.hosts.values() if not self.host_table.is_stale(h, now)]

    def forget_idle(self, *, also: Callable[[str, HostState], bool] | None = None) -> list[str]:
        """Drop hosts silent for forget_after seconds, and those ALSO picks (a shard lets go
        of hosts another shard owns now), with their series; and the paths and counters no
        window touched for forget_after (their host's bound frees up). The hosts' names."""
        with self.lock:
            now = self.clock()
            gone = self.host_table.silent(now, also)
            idle = now - int(self.forget_after * 1e9)
            dead = set(gone)
            old_paths = self.path_table.forget(dead, idle, self.hosts)
            self.counter_table.forget(dead, idle, self.hosts)
            self.rail_table.forget(dead, idle)
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
            order = self.host_table.admit(state, report.epoch, report.seq, now)
            if order is None:
                self.duplicates_total += 1
                return TakeResult(duplicate=True, probes=0, counters=0)
            self.reports_total += 1
            end = report.window_end_unix_ns
            agent = report.agent if report.HasField("agent") else None
            self.host_table.newest(state, order, end, agent)
            windows: list[tuple[PathKey, MergedSketch]] = []
            delays: dict[PathKey, MergedSketch] = {}
            touched: list[PathKey] = []
            merge_probe = self.path_table.merge
            for w, sketch, prober in zip(report.probes, sketches, probers, strict=True):
                key = merge_probe(state, end, order, now, w, sketch, prober)
                if key is not None:
                    touched.append(key)
                if key is not None and sketch is not None and sketch.kind == "rtt":
                    windows.append((key, sketch))
                    if prober is not None:
                        delays[key] = prober
            rates: list[tuple[CounterKey, float]] = []
            merge_counter = self.counter_table.merge
            for c in report.counters:
                updated = merge_counter(state, end, order, now, c)
                if updated is not None:
                    rates.append(updated)
            if report.rail_windows:
                self.rail_table.take(report.host, end, now, report.rail_windows)
            if touched:
                for f in self.folds:
                    f.taken(report.host, now, touched, self.paths)
            for listener in self.listeners:
                listener.report_taken(end, windows, rates, delays)
            return TakeResult(False, len(report.probes), len(report.counters))

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
            hosts = self.host_table.views(now)
            path_keys = list(self.paths) if paths is None else list(paths)
            counter_keys = list(self.counters)
            totals = (self.reports_total, self.duplicates_total, self.rejected_total)
            merges = self.merges_total
            dropped = dict(self.dropped)
        if counter_hosts is not None:
            counter_keys = [k for k in counter_keys if k.src in counter_hosts]
        copied: dict[PathKey, PathStats] = {}
        for i in range(0, len(path_keys), chunk):
            with self.lock:
                copied |= self.path_table.copies(path_keys[i : i + chunk])
        counters: dict[CounterKey, CounterTrack] = {}
        for i in range(0, len(counter_keys), chunk):
            with self.lock:
                counters |= self.counter_table.copies(counter_keys[i : i + chunk])
        return StoreSnapshot(now, hosts, copied, counters, *totals, merges, dropped)

    def counter_rates(self, names: Container[str]) -> list[tuple[CounterKey, float]]:
        """(key, rate) of every counter named in NAMES that has a rate (the alert rules'
        counters: which hosts are in trouble)."""
        with self.lock:
            return self.counter_table.rates(names)

    def nixl_counter_totals(self) -> list[NixlTotal]:
        """Every NIXL counter's total, per host and engine."""
        with self.lock:
            held = self.counters.items()
            return [
                NixlTotal(k.src, k.device, k.name, t.total) for k, t in held if k.kind == "nixl"
            ]

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

    def folded(self, fold: PathFold, since_ns: int) -> list[Folded]:
        """FOLD's folded reports whose paths are fresh (touched at or after SINCE_NS)."""
        with self.lock:
            return fold.fresh(since_ns)

    def fresh_paths(self, since_ns: int, limit: int) -> tuple[list[PathKey], int]:
        """(the first LIMIT paths touched at or after SINCE_NS, in the store's order; how
        many paths the store holds)."""
        with self.lock:
            return self.path_table.fresh(since_ns, limit), len(self.paths)

    def paths_of_pairs(self, pairs: Iterable[tuple[str, str]]) -> list[PathKey]:
        """The paths of the host pairs PAIRS (host_pair() order), in the store's order."""
        with self.lock:
            return self.path_table.of_pairs(pairs)

    def fleet_sketches(self) -> dict[FleetClass, CumulativeSketch]:
        with self.lock:
            return self.path_table.fleet_sketches()

    def name_pairs(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Note host pairs a request's KV transfer ran over (the export shows their paths
        in full for a while); the oldest of more than MAX_NAMED_PAIRS are forgotten."""
        with self.lock:
            self.named.name(pairs, self.clock())

    def named_since(self, since_ns: int) -> set[tuple[str, str]]:
        with self.lock:
            return self.named.since(since_ns)

    def seqs_taken(self, host: str) -> dict[int, set[int]]:
        """epoch -> every seq taken for HOST (tests and diagnostics)."""
        with self.lock:
            state = self.hosts.get(host)
            if state is None:
                return {}
            return {e: s.taken() for e, (_, s) in state.seen.items()}

    # -- views for readers outside the lock -----------------------------------------------

    def host_names(self) -> list[str]:
        """The hosts registered now, in the order they first registered."""
        with self.lock:
            return list(self.hosts)

    def window_ends(self, hosts: Iterable[str]) -> dict[str, int]:
        """The end of each registered one of HOSTS' newest window (0 before its first)."""
        with self.lock:
            got = {h: self.hosts.get(h) for h in hosts}
            return {h: st.last_window_end_ns for h, st in got.items() if st is not None}

    def has_host(self, name: str) -> bool:
        with self.lock:
            return name in self.hosts

    def host_view(self, name: str) -> HostView | None:
        """NAME's registration and newest figures, None when it is not registered."""
        with self.lock:
            state = self.hosts.get(name)
            return None if state is None else self.host_table.view(state, self.clock())

    def host_views(self) -> dict[str, HostView]:
        """Every registered host's registration and newest figures, by name."""
        with self.lock:
            return self.host_table.views(self.clock())

    def pair_paths(self, a: str, b: str) -> list[PathView]:
        """The newest figures of each path between hosts A and B, both ways."""
        with self.lock:
            return self.path_table.views(a, b)

    def rail_view(self, pairs: Iterable[tuple[str, str]] | None = None) -> RailView:
        """The rails of the host PAIRS (all when None) with a window within stale_after
        seconds (collector/railtable.py)."""
        with self.lock:
            since = self.clock() - int(self.stale_after * 1e9)
            paths = self.rail_table.paths(since, None if pairs is None else set(pairs))
            return RailView(paths, self.rail_table.summary(since), dict(self.rail_table.windows))


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


@dataclass(frozen=True)
class StoreSnapshot:
    """What one scrape reads of the store (WindowStore.snapshot()): copies, by name."""

    now_ns: int
    hosts: dict[str, HostView]
    paths: dict[PathKey, PathStats]
    counters: dict[CounterKey, CounterTrack]
    reports_total: int
    duplicates_total: int
    rejected_total: int
    merges_total: int
    dropped: dict[str, int] = field(default_factory=dict)
