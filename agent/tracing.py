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
from collections.abc import Callable, Iterable
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


@dataclass(frozen=True)
class _Want:
    dst: str
    address: str
    sport: int


@dataclass
class ClassTracer:
    """Queues classes to trace, traces them on its own thread, and hands the paths to
    the next window."""

    source: str | None  # the agent's source address (None: the route's, per peer)
    config: TraceConfig = field(default_factory=TraceConfig)
    trace: Tracer = trace_udp
    counts: TraceCounts = field(default_factory=TraceCounts)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._queue: OrderedDict[tuple[str, int], _Want] = OrderedDict()
        self._traced: set[tuple[str, int]] = set()  # (dst, sport) traced at least once
        self._done: list[pb.ClassPath] = []

    def want(self, dst: str, address: str, sport: int) -> None:
        """Trace (DST at ADDRESS, SPORT) in the next round."""
        if not dst or not address or not 0 < sport <= 0xFFFF:
            return
        with self._lock:
            if (dst, sport) in self._queue:
                return
            if len(self._queue) >= MAX_QUEUED:
                self.counts.dropped += 1
                return
            self._queue[(dst, sport)] = _Want(dst, address, sport)
        self._wake.set()

    def asked(self, retraces: Iterable[pb.Retrace]) -> None:
        for r in retraces:
            self.want(r.dst, r.address, r.sport)

    def window(
        self, class_windows: Iterable[pb.ProbeWindow], addresses: dict[str, str]
    ) -> list[pb.ClassPath]:
        """Queue the window's classes never traced (ADDRESSES: peer host -> address);
        return the paths traced since the last window."""
        for w in class_windows:
            if (w.dst, w.sport) not in self._traced and w.dst in addresses:
                self.want(w.dst, addresses[w.dst], w.sport)
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
        by_peer: dict[tuple[str, str], list[_Want]] = {}
        for w in batch:
            by_peer.setdefault((w.dst, w.address), []).append(w)
        n = 0
        for (dst, address), wants in by_peer.items():
            try:
                source = source_address(address, ROCE_V2_PORT, self.source)
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
                )
                for c in res.classes
            ]
            with self._lock:
                self._traced.update((dst, c.sport) for c in res.classes)
                self._done.extend(paths)
                del self._done[:-MAX_DONE]
            n += len(paths)
        with self._lock:
            self.counts.rounds += 1
            self.counts.classes += n
        return n
