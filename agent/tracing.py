"""The agent's traces of its ECMP classes: each class's probes' 5-tuple traced hop by hop
(probes/trace.py, the UDP way, which needs no privilege), when the class is new and
when the collector asks (Ack.retrace: its answers' way back, a loss, a route that may
have changed). The paths ride on the next report (WindowReport.class_paths).

Gentle by construction: one trace round at a time, at most MAX_PER_ROUND classes in it,
at least MIN_GAP_S between rounds, one probe per class in flight, and only towards
peers the collector assigned or asked for. What it does is counted (TraceCounts).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.errors import ProbeError
from fabricprobe.probes.measure import source_address
from fabricprobe.probes.trace import ROCE_V2_PORT, TraceConfig, TraceResult, trace_udp

log = logging.getLogger("fabricprobe.agent")

MAX_PER_ROUND = 64
MAX_QUEUED = 1024
MAX_DONE = 1024
MIN_GAP_S = 1.0

Tracer = Callable[[str, str, list[int], TraceConfig, str], TraceResult]


@dataclass
class TraceCounts:
    rounds: int = 0
    classes: int = 0
    failed: int = 0
    dropped: int = 0  # asked for while the queue was full


Rail = int | None
WantKey = tuple[str, int, Rail]  # peer, source port, rail


@dataclass(frozen=True)
class _Want:
    dst: str
    address: str
    sport: int
    rail: Rail = None


@dataclass
class ClassTracer:
    """Queues classes to trace, traces them on its own thread, and hands the paths to
    the next window."""

    source: str | None  # the agent's source address (None: the route's, per peer)
    config: TraceConfig = field(default_factory=TraceConfig)
    trace: Tracer = trace_udp
    counts: TraceCounts = field(default_factory=TraceCounts)
    # a rail's classes are traced from this host's address on the rail (rail -> address)
    rail_sources: Mapping[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._queue: OrderedDict[WantKey, _Want] = OrderedDict()
        self._traced: set[WantKey] = set()  # (dst, sport, rail) traced at least once
        self._done: list[pb.ClassPath] = []

    def want(self, dst: str, address: str, sport: int, rail: Rail = None) -> None:
        """Trace (DST at ADDRESS, SPORT) in the next round, on RAIL's own source; a rail
        this host has no address on is not traced (any other source crosses rails)."""
        if not dst or not address or not 0 < sport <= 0xFFFF:
            return
        if rail is not None and rail not in self.rail_sources:
            return
        key = (dst, sport, rail)
        with self._lock:
            if key in self._queue:
                return
            if len(self._queue) >= MAX_QUEUED:
                self.counts.dropped += 1
                return
            self._queue[key] = _Want(dst, address, sport, rail)
        self._wake.set()

    def asked(self, retraces: Iterable[pb.Retrace]) -> None:
        for r in retraces:
            self.want(r.dst, r.address, r.sport, r.rail if r.HasField("rail") else None)

    def window(
        self, class_windows: Iterable[pb.ProbeWindow], addresses: Mapping[tuple[str, Rail], str]
    ) -> list[pb.ClassPath]:
        """Queue the window's classes never traced (ADDRESSES: (peer host, rail) -> its
        address); return the paths traced since the last window."""
        for w in class_windows:
            rail = w.rail if w.HasField("rail") else None
            peer = addresses.get((w.dst, rail))
            if (w.dst, w.sport, rail) not in self._traced and peer:
                self.want(w.dst, peer, w.sport, rail)
        with self._lock:
            done, self._done = self._done, []
        return done

    def loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self._wake.wait(timeout=5.0)
            self._wake.clear()
            if stop.is_set():
                return
            self.round()
            stop.wait(MIN_GAP_S)

    def round(self) -> int:
        """Trace what is queued (MAX_PER_ROUND at most, by peer); the classes traced."""
        with self._lock:
            batch = [
                self._queue.popitem(last=False)[1]
                for _ in range(min(MAX_PER_ROUND, len(self._queue)))
            ]
            if self._queue:
                self._wake.set()
        by_peer: dict[tuple[str, str, Rail], list[_Want]] = {}
        for w in batch:
            by_peer.setdefault((w.dst, w.address, w.rail), []).append(w)
        n = 0
        for (dst, address, rail), wants in by_peer.items():
            mine = self.source if rail is None else self.rail_sources.get(rail)
            try:
                source = source_address(address, ROCE_V2_PORT, mine)
                res = self.trace(source, address, [w.sport for w in wants], self.config, "")
            except (ProbeError, OSError, ValueError) as err:
                self.counts.failed += len(wants)
                log.info("trace to %s (%s) failed: %s", dst, address, err)
                continue
            paths = [
                pb.ClassPath(
                    dst=dst,
                    sport=c.sport,
                    src_ip=res.source,
                    dst_ip=res.peer,
                    hops=[h.address or "" for h in c.hops],
                    complete=c.complete,
                    method=res.method,
                    rail=rail,
                )
                for c in res.classes
            ]
            with self._lock:
                self._traced.update((dst, c.sport, rail) for c in res.classes)
                self._done.extend(paths)
                del self._done[:-MAX_DONE]
            n += len(paths)
        with self._lock:
            self.counts.rounds += 1
            self.counts.classes += n
        return n
