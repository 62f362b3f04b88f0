"""Running histograms of stage durations, KV-transfer time per path, TTFT and ITL.

Each stage is counted once: a span the engine measured when it arrives, a stage laid
out from a request's totals when its request is complete (collector/attribution/sync.py).
KV-transfer time is kept per (src, dst, transport) for the paths that are known, at most
MAX_PATHS of them; transfers on further paths are counted under src = dst = "other".
`snapshot()` hands out what /metrics shows, copied under the lock.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from fabricprobe.collector.attribution.stages import STAGES, RequestRecord, StageRecord

DURATION_BUCKETS_S: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
)  # fmt: skip
MAX_PATHS = 1024  # distinct (src, dst, transport) label sets; the rest are counted as "other"
PathLabels = tuple[str, str, str]


@dataclass
class Histogram:
    """Cumulative-at-scrape histogram kept as per-bucket counts."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(DURATION_BUCKETS_S) + 1))
    total: float = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(DURATION_BUCKETS_S, seconds)] += 1
        self.total += seconds

    def buckets(self) -> list[tuple[str, float]]:
        out, running = [], 0
        for bound, n in zip((*DURATION_BUCKETS_S, float("inf")), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(bound), float(running)))
        return out

    def figures(self) -> HistogramFigures:
        return HistogramFigures(tuple(self.buckets()), self.total)


class HistogramFigures(NamedTuple):
    """One histogram as exposed: cumulative counts by upper bound, and the sum."""

    buckets: tuple[tuple[str, float], ...]  # (le, observations at or below it)
    sum: float


class StageHistogram(NamedTuple):
    stage: str
    figures: HistogramFigures


class PathHistogram(NamedTuple):
    src: str
    dst: str
    transport: str
    figures: HistogramFigures


@dataclass(frozen=True)
class HistogramSnapshot:
    """Every histogram at one moment: stages in STAGES order, paths sorted."""

    stages: tuple[StageHistogram, ...]
    kv: tuple[PathHistogram, ...]
    ttft: HistogramFigures
    itl: HistogramFigures


class StageHistograms:
    """The running histograms, thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stage: dict[str, Histogram] = {s: Histogram() for s in STAGES}
        self.kv: dict[PathLabels, Histogram] = {}
        self.ttft = Histogram()
        self.itl = Histogram()

    def observe(self, stages: Iterable[StageRecord], requests: Iterable[RequestRecord]) -> None:
        """Count STAGES' durations (a KV transfer also on its path, when the path is known)
        and REQUESTS' TTFT and inter-token latency."""
        with self.lock:
            for s in stages:
                self.stage[s.stage].observe(s.duration_s)
                if s.stage == "kv_transfer" and s.src and s.dst:
                    self._kv(s).observe(s.duration_s)
            for r in requests:
                if r.ttft_s is not None:
                    self.ttft.observe(r.ttft_s)
                if r.itl_s is not None:
                    self.itl.observe(r.itl_s)

    def _kv(self, s: StageRecord) -> Histogram:
        transport = s.transport or "unknown"
        key = (s.src, s.dst, transport)
        h = self.kv.get(key)
        if h is None:
            if len(self.kv) >= MAX_PATHS:
                key = ("other", "other", transport)
                h = self.kv.get(key)
            if h is None:
                h = self.kv[key] = Histogram()
        return h

    def snapshot(self) -> HistogramSnapshot:
        with self.lock:
            return HistogramSnapshot(
                stages=tuple(StageHistogram(s, h.figures()) for s, h in self.stage.items()),
                kv=tuple(PathHistogram(*p, h.figures()) for p, h in sorted(self.kv.items())),
                ttft=self.ttft.figures(),
                itl=self.itl.figures(),
            )
