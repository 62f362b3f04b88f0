"""The collector's memory: probe windows merged per path, counter totals and rates, hosts.

Plain Python, no gRPC and no prometheus_client: the servicer hands reports in, the
exporter reads a consistent snapshot out. Windows are merged per
(src, dst, transport, op, size); a report is taken once per (host, epoch, seq), so a
window replayed from an agent's spool after an outage is acknowledged but not
counted twice.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.sketchwire import MergedSketch, from_wire, merged
from fabricprobe.probes.counters import counter_delta
from fabricprobe.probes.errors import ParseError

PathKey = tuple[str, str, str, str, int]  # src, dst, transport, op, size
# src, kind, device, port, netdev, priority, name
CounterKey = tuple[str, str, str, int, str, int, str]

COUNTER_KINDS = frozenset({"rdma", "pfc", "netdev", "nixl"})  # nixl: agent/nixl.py
_WIDTHS = frozenset({32, 64})
MAX_NAME = 128


def host_pair(a: str, b: str) -> tuple[str, str]:
    """The two hosts of a path in one order, whichever way it is probed."""
    return (a, b) if a <= b else (b, a)


class ReportError(ValueError):
    """A report that cannot be taken; the message says what was wrong with it."""


@dataclass
class PathStats:
    """Everything known about one probed path, over all windows seen."""

    rtt: MergedSketch = field(default_factory=MergedSketch)  # all windows merged
    last_rtt: MergedSketch | None = None  # the newest window only
    last_end_ns: int = 0
    bytes_moved: int = 0
    busy_seconds: float = 0.0
    last_bytes_per_second: float | None = None
    failures: int = 0
    windows: int = 0

    def copy(self) -> PathStats:
        """A copy that later merges into this one leave alone."""
        c = copy.copy(self)
        c.rtt = merged(self.rtt)
        return c


@dataclass
class CounterTrack:
    """One counter of one host: the last reading, a wrap/reset-corrected total, a rate."""

    width: int
    last_value: int
    last_ns: int
    total: int = 0  # increase since the collector first saw it, wraps and resets counted
    rate: float | None = None  # per second between the two newest readings
    wraps: int = 0
    resets: int = 0


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
    seen: dict[int, _SeqSet] = field(default_factory=dict)  # epoch -> seqs taken


class _SeqSet:
    """Sequence numbers taken for one epoch: a contiguous floor plus a bounded set above."""

    __slots__ = ("above", "floor")
    MAX_ABOVE = 100_000

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
    ) -> None: ...


@dataclass(frozen=True)
class TakeResult:
    duplicate: bool
    probes: int
    counters: int


class WindowStore:
    """Thread-safe store of hosts, path windows and counters (see the module docstring)."""

    def __init__(
        self,
        *,
        stale_after: float = 30.0,
        forget_after: float = 600.0,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.stale_after = stale_after
        self.forget_after = forget_after
        self.clock = clock
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

    # -- hosts --------------------------------------------------------------------------

    def register(self, info: pb.HostInfo) -> HostState:
        """Add or refresh a host; its sequence history survives a re-registration."""
        if not info.host:
            raise ReportError("host name is empty")
        with self.lock:
            state = self.hosts.get(info.host)
            now = self.clock()
            if state is None:
                state = HostState(info=info, registered_ns=now, last_report_ns=now)
                self.hosts[info.host] = state
            else:
                state.info = info
                state.last_report_ns = max(state.last_report_ns, now)
            return state

    def is_stale(self, state: HostState, now_ns: int | None = None) -> bool:
        now = self.clock() if now_ns is None else now_ns
        return (now - state.last_report_ns) / 1e9 > self.stale_after

    def live_hosts(self) -> list[HostState]:
        """Hosts that reported (or registered) within stale_after seconds."""
        with self.lock:
            now = self.clock()
            return [h for h in self.hosts.values() if not self.is_stale(h, now)]

    def forget_idle(self) -> list[str]:
        """Drop hosts silent for forget_after seconds, with their series; return their names."""
        with self.lock:
            now = self.clock()
            gone = [
                name
                for name, h in self.hosts.items()
                if (now - h.last_report_ns) / 1e9 > self.forget_after
            ]
            for name in gone:
                del self.hosts[name]
            if gone:
                dead = set(gone)
                self.paths = {k: v for k, v in self.paths.items() if k[0] not in dead}
                self._pair_paths = {
                    pair: kept
                    for pair, keys in self._pair_paths.items()
                    if (kept := [k for k in keys if k[0] not in dead])
                }
                self.counters = {k: v for k, v in self.counters.items() if k[0] not in dead}
            return gone

    # -- reports ------------------------------------------------------------------------

    def take(self, report: pb.WindowReport) -> TakeResult:
        """Merge one report. Raises ReportError for a malformed one (nothing is merged)."""
        try:
            sketches = self._validate(report)
        except ReportError:
            with self.lock:
                self.rejected_total += 1
            raise
        with self.lock:
            state = self.hosts.get(report.host)
            if state is None:
                self.rejected_total += 1
                raise ReportError(f"host {report.host!r} has not registered")
            seqs = state.seen.setdefault(report.epoch, _SeqSet())
            if report.seq in seqs:
                state.duplicates += 1
                self.duplicates_total += 1
                return TakeResult(duplicate=True, probes=0, counters=0)
            seqs.add(report.seq)
            if len(state.seen) > 4:  # old agent lifetimes: keep the newest few
                for epoch in sorted(state.seen)[:-4]:
                    del state.seen[epoch]
            now = self.clock()
            state.last_report_ns = now
            state.reports += 1
            self.reports_total += 1
            newest = report.window_end_unix_ns >= state.last_window_end_ns
            if newest:
                state.last_window_end_ns = report.window_end_unix_ns
                if report.HasField("agent"):
                    state.agent = report.agent
            end = report.window_end_unix_ns
            windows: list[tuple[PathKey, MergedSketch]] = []
            for w, sketch in zip(report.probes, sketches, strict=True):
                key = self._merge_probe(report.host, end, w, sketch)
                if sketch is not None and sketch.kind == "rtt":
                    windows.append((key, sketch))
            rates: list[tuple[CounterKey, float]] = []
            for c in report.counters:
                updated = self._merge_counter(report.host, end, c)
                if updated is not None:
                    rates.append(updated)
            for listener in self.listeners:
                listener.report_taken(end, windows, rates)
            return TakeResult(False, len(report.probes), len(report.counters))

    def _validate(self, report: pb.WindowReport) -> list[MergedSketch | None]:
        if not report.host:
            raise ReportError("report without a host name")
        if report.seq < 1:
            raise ReportError("seq must start at 1")
        if report.window_end_unix_ns < report.window_start_unix_ns:
            raise ReportError("window ends before it starts")
        sketches: list[MergedSketch | None] = []
        for w in report.probes:
            if not w.dst or len(w.dst) > MAX_NAME or w.transport not in ("tcp", "rdma"):
                raise ReportError(f"bad probe window dst={w.dst!r} transport={w.transport!r}")
            if not w.op or len(w.op) > 32:
                raise ReportError(f"bad probe op {w.op!r}")
            if w.HasField("rtt"):
                try:
                    sketches.append(from_wire(w.rtt))
                except ParseError as e:
                    raise ReportError(f"probe window to {w.dst}: {e}") from None
            else:
                sketches.append(None)
        kinds, widths = COUNTER_KINDS, _WIDTHS
        for c in report.counters:
            name = c.name
            if c.kind not in kinds or not name or len(name) > MAX_NAME or c.width not in widths:
                raise ReportError(
                    f"bad counter kind={c.kind!r} name={name[:40]!r} width={c.width}"
                    " (kinds rdma, pfc, netdev, nixl; width 32 or 64)"
                )
        return sketches

    def _merge_probe(
        self, src: str, end_ns: int, w: pb.ProbeWindow, sketch: MergedSketch | None
    ) -> PathKey:
        key: PathKey = (src, w.dst, w.transport, w.op, int(w.size))
        stats = self.paths.get(key)
        if stats is None:
            stats = self.paths[key] = PathStats()
            self._pair_paths.setdefault(host_pair(src, w.dst), []).append(key)
        stats.windows += 1
        stats.failures += w.failures
        if sketch is not None:
            if sketch.kind == "rtt":
                stats.rtt.merge(sketch)
                self.merges_total += 1
            if end_ns >= stats.last_end_ns:
                stats.last_rtt = sketch  # parsed for this report alone: never merged into
        if w.bytes_moved:
            stats.bytes_moved += w.bytes_moved
            stats.busy_seconds += w.busy_seconds
            if end_ns >= stats.last_end_ns and w.busy_seconds > 0:
                stats.last_bytes_per_second = w.bytes_moved / w.busy_seconds
        stats.last_end_ns = max(stats.last_end_ns, end_ns)
        return key

    def _merge_counter(
        self, src: str, end_ns: int, c: pb.CounterReading
    ) -> tuple[CounterKey, float] | None:
        """Fold one reading in; the counter and its new rate when the rate changed."""
        key: CounterKey = (src, c.kind, c.device, c.port, c.netdev, c.priority, c.name)
        value = c.value
        track = self.counters.get(key)
        if track is None:
            self.counters[key] = CounterTrack(c.width, value, end_ns)
            return None
        if end_ns <= track.last_ns:
            return None  # a replayed older reading: the totals already passed it
        if value >= track.last_value:  # the common case, without the wrap/reset analysis
            delta = value - track.last_value
        else:
            d = counter_delta(track.last_value, value, track.width)
            delta = d.delta
            track.wraps += d.wrapped
            track.resets += d.reset
        track.total += delta
        rate = track.rate = delta / ((end_ns - track.last_ns) / 1e9)
        track.last_value, track.last_ns, track.width = value, end_ns, c.width
        return key, rate

    # -- reading ------------------------------------------------------------------------

    def snapshot(self, chunk: int = 5_000) -> StoreSnapshot:
        """A copy of what the exporter needs, safe to read while reports go on being
        taken: what reports change (merged sketches, counter tracks) is copied; a
        newest-window sketch is never changed once taken, so it is shared. Each path and
        counter is copied whole under the lock, CHUNK at a time, so a scrape of a large
        fleet never holds ingest up for long."""
        with self.lock:
            now = self.clock()
            hosts = {name: (h, self.is_stale(h, now)) for name, h in self.hosts.items()}
            path_keys, counter_keys = list(self.paths), list(self.counters)
            totals = (self.reports_total, self.duplicates_total, self.rejected_total)
            merges = self.merges_total
        paths: dict[PathKey, PathStats] = {}
        for i in range(0, len(path_keys), chunk):
            with self.lock:
                for k in path_keys[i : i + chunk]:
                    st = self.paths.get(k)  # None: its host was forgotten meanwhile
                    if st is not None:
                        paths[k] = st.copy()
        counters: dict[CounterKey, CounterTrack] = {}
        for i in range(0, len(counter_keys), chunk):
            with self.lock:
                for ck in counter_keys[i : i + chunk]:
                    t = self.counters.get(ck)
                    if t is not None:
                        counters[ck] = copy.copy(t)
        return StoreSnapshot(now, hosts, paths, counters, *totals, merges)

    def newest_windows(self, a: str, b: str) -> list[tuple[PathKey, int, MergedSketch]]:
        """(path, end, RTT sketch) of the newest window of each path between A and B, both
        ways."""
        with self.lock:
            out = []
            for key in self._pair_paths.get(host_pair(a, b), ()):
                st = self.paths.get(key)
                if st is not None and st.last_rtt is not None and st.last_rtt.kind == "rtt":
                    out.append((key, st.last_end_ns, st.last_rtt))
            return out

    def seqs_taken(self, host: str) -> dict[int, set[int]]:
        """epoch -> every seq taken for HOST (tests and diagnostics)."""
        with self.lock:
            state = self.hosts.get(host)
            if state is None:
                return {}
            return {e: set(range(1, s.floor + 1)) | set(s.above) for e, s in state.seen.items()}


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

    def counters_of(self, kind: str) -> Iterable[tuple[CounterKey, CounterTrack]]:
        return ((k, t) for k, t in self.counters.items() if k[1] == kind)
