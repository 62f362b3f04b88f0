"""The newest stage and request records the receiver took, bounded, their figures checked.

A record whose figures cannot go into a frame or a histogram (times out of order or
too far ahead of the collector's clock, bytes beyond what a float holds exactly, a day
or more of TTFT) is counted and dropped; the rest are kept, newest last, up to
`max_records` of each kind (0: checked and counted only; the attribution's assembly
keeps them until they settle, attribution/assembly.py).
"""

from __future__ import annotations

import math
import threading
from collections import deque

from fabricprobe.collector.attribution.stages import RequestRecord, StageRecord

MAX_RECORDS = 50_000  # stage records kept (and as many request records), newest first
MAX_BYTES = 2**53  # a KV transfer larger than this (8 PiB) is not a measurement
MAX_SECONDS = 86_400.0  # request figures (TTFT, e2e) beyond a day are not either
FUTURE_TOLERANCE_NS = 300 * 10**9  # records may end this far past the collector's clock


def _seconds_ok(v: float | None) -> bool:
    return v is None or (math.isfinite(v) and 0.0 <= v <= MAX_SECONDS)


def stage_ok(s: StageRecord, now_ns: int) -> bool:
    """A stage record whose figures can go into a frame and a histogram: times in
    range and ordered, bytes a count a float holds exactly."""
    return (
        0 <= s.start_ns <= s.end_ns <= now_ns + FUTURE_TOLERANCE_NS
        and 0 <= s.bytes <= MAX_BYTES
        and s.duration_s <= MAX_SECONDS
    )


def request_ok(r: RequestRecord, now_ns: int) -> bool:
    counts = (r.output_tokens, r.prompt_tokens)
    return (
        0 <= r.start_ns <= r.end_ns <= now_ns + FUTURE_TOLERANCE_NS
        and _seconds_ok(r.ttft_s)
        and _seconds_ok(r.e2e_s)
        and all(n is None or 0 <= n <= MAX_BYTES for n in counts)
    )


class RecentRecords:
    """Stage and request records, the newest MAX_RECORDS of each, thread-safe."""

    def __init__(self, max_records: int = MAX_RECORDS) -> None:
        self.lock = threading.Lock()
        self.stages: deque[StageRecord] = deque(maxlen=max_records)
        self.requests: deque[RequestRecord] = deque(maxlen=max_records)
        self.dropped = 0  # records whose figures were out of range

    def keep(
        self, stages: list[StageRecord], requests: list[RequestRecord], now_ns: int
    ) -> tuple[list[StageRecord], list[RequestRecord]]:
        """Keep the records whose figures are in range (stage_ok, request_ok) and count
        the others; the kept ones are returned."""
        good_st = [s for s in stages if stage_ok(s, now_ns)]
        good_rq = [r for r in requests if request_ok(r, now_ns)]
        with self.lock:
            self.dropped += len(stages) - len(good_st) + len(requests) - len(good_rq)
            self.stages.extend(good_st)
            self.requests.extend(good_rq)
        return good_st, good_rq

    def since(self, since_ns: int) -> tuple[list[StageRecord], list[RequestRecord]]:
        """The records kept that ended after SINCE_NS."""
        with self.lock:
            st = [s for s in self.stages if s.end_ns > since_ns]
            rq = [r for r in self.requests if r.end_ns > since_ns]
        return st, rq

    def dropped_total(self) -> int:
        with self.lock:
            return self.dropped
