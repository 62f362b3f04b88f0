"""Per-window aggregation: probe outcomes merged into one sketch per path and window."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import NamedTuple

from fabricprobe.agent.probing import ProbeOutcome, ProbeSpec
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.sketchwire import to_wire
from fabricprobe.core.stats import SlotTally


class PathKey(NamedTuple):
    """One path this host probes: the peer, and the probe's kind."""

    dst: str
    transport: str  # rdma, tcp
    op: str
    size: int  # bytes a message


Rail = int | None
ClassKey = tuple[PathKey, int, int, Rail]  # the path, the source ports out and back, rail
RailKey = tuple[PathKey, int]  # a path's probes on one rail


class Cut(NamedTuple):
    """One window's results: per path (the rails mixed, as before rails), per ECMP class
    (with its source ports and rail) and per path and rail (rail targets only)."""

    pairs: list[pb.ProbeWindow]
    classes: list[pb.ProbeWindow]
    rails: list[pb.ProbeWindow]


@dataclass
class _PathWindow:
    # sparse tallies, not LatencySketches: a path's window holds a burst or two, and a
    # histogram per path and window was most of the cost of taking a burst in
    rtt: SlotTally = field(default_factory=SlotTally)
    prober: SlotTally = field(default_factory=lambda: SlotTally("delay"))  # RDMA
    bytes_moved: int = 0
    busy_seconds: float = 0.0
    failures: int = 0


class WindowAggregator:
    """Collects outcomes from the probe threads; cut() hands over the window and starts anew."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._paths: dict[PathKey, _PathWindow] = {}
        self._classes: dict[ClassKey, _PathWindow] = {}
        self._rails: dict[RailKey, _PathWindow] = {}
        self.bursts = 0

    def add(self, spec: ProbeSpec, outcome: ProbeOutcome) -> None:
        key = PathKey(spec.dst, outcome.transport, outcome.op, spec.size)
        with self._lock:
            w = self._paths.get(key)
            if w is None:
                w = self._paths[key] = _PathWindow()
            self._fold(w, outcome)
            if outcome.sport:
                ck = (key, outcome.sport, outcome.return_sport, spec.rail)
                c = self._classes.get(ck)
                if c is None:
                    c = self._classes[ck] = _PathWindow()
                self._fold(c, outcome)
            if spec.rail is not None:
                r = self._rails.get((key, spec.rail))
                if r is None:
                    r = self._rails[(key, spec.rail)] = _PathWindow()
                self._fold(r, outcome)
            self.bursts += 1

    @staticmethod
    def _fold(w: _PathWindow, outcome: ProbeOutcome) -> None:
        if outcome.rtt is not None:
            w.rtt.merge(outcome.rtt)
        if outcome.rtt_ns:
            w.rtt.record_many(outcome.rtt_ns)
        if outcome.prober_ns:
            w.prober.record_many(outcome.prober_ns)
        if outcome.lost:
            w.rtt.record_lost(outcome.lost)
        w.bytes_moved += outcome.bytes_moved
        w.busy_seconds += outcome.busy_seconds
        w.failures += int(outcome.failed)

    def cut(self) -> list[pb.ProbeWindow]:
        """The window's probe results as messages; the aggregator is empty afterwards."""
        return self.cut_all().pairs

    def cut_all(self) -> Cut:
        """The window's results per path, per ECMP class and per rail (see Cut); the
        aggregator is empty afterwards."""
        with self._lock:
            paths, self._paths = self._paths, {}
            classes, self._classes = self._classes, {}
            rails, self._rails = self._rails, {}
        pairs = [_message(k, w) for k, w in sorted(paths.items())]
        per_class = []
        for (path, sport, back, rail), w in sorted(classes.items(), key=_class_order):
            m = _message(path, w, rail)
            m.sport, m.return_sport = sport, back
            per_class.append(m)
        per_rail = [_message(k, w, rail) for (k, rail), w in sorted(rails.items())]
        return Cut(pairs, per_class, per_rail)


def _class_order(item: tuple[ClassKey, _PathWindow]) -> tuple[PathKey, int, int, int]:
    path, sport, back, rail = item[0]
    return path, sport, back, -1 if rail is None else rail


def _message(key: PathKey, w: _PathWindow, rail: Rail = None) -> pb.ProbeWindow:
    dst, transport, op, size = key
    return pb.ProbeWindow(
        rail=rail,
        dst=dst,
        transport=transport,
        op=op,
        size=size,
        rtt=to_wire(w.rtt) if (w.rtt.count or w.rtt.lost) else None,
        bytes_moved=w.bytes_moved,
        busy_seconds=w.busy_seconds,
        failures=w.failures,
        prober_delay=to_wire(w.prober) if w.prober.count else None,
    )
