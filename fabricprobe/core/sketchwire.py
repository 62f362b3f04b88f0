"""Latency sketches as they travel between agent and collector (the `Sketch` message).

The collector takes thousands of window sketches per second. Rebuilding each into a
full HDR histogram allocates a 3,968-slot array, while a window of a few dozen
exchanges fills only a handful of slots. So a sketch travels as its exact figures
(count, loss, min, max, sum) and its non-empty slots as two packed lists, which the
protobuf runtime decodes in C; the collector keeps {slot index: count}, merging is
adding those up exactly as HdrHistogram.add does, and percentiles and Prometheus
buckets are read from them. Slot values come from HdrHistogram itself, so the index
space is the one LatencySketch records into.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from hdrh.histogram import HdrHistogram

from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.errors import ParseError
from fabricprobe.core.stats import (
    HIGHEST_NS,
    LOWEST_NS,
    SIGNIFICANT_DIGITS,
    LatencySketch,
    SlotTally,
    merge_exact,
)

_TEMPLATE = HdrHistogram(LOWEST_NS, HIGHEST_NS, SIGNIFICANT_DIGITS)
MAX_SLOTS = _TEMPLATE.counts_len
_KINDS = ("rtt", "one_way", "delay")


@lru_cache(maxsize=MAX_SLOTS)
def slot_value_ns(index: int) -> int:
    """Highest value (ns) that HDR slot INDEX stands for, as LatencySketch.buckets() gives."""
    return int(_TEMPLATE.get_highest_equivalent_value(_TEMPLATE.get_value_from_index(index)))


@dataclass
class MergedSketch:
    """One or many windows' sketches folded together (same kind); exact in count, lost,
    min, max and sum; HDR slots {index: count} for everything else."""

    kind: str = "rtt"
    count: int = 0
    lost: int = 0
    min_ns: int | None = None
    max_ns: int | None = None
    sum_ns: int = 0
    slots: dict[int, int] = field(default_factory=dict)

    def merge(self, sk: MergedSketch) -> None:
        merge_exact(self, sk)
        slots = self.slots
        for i, n in sk.slots.items():
            slots[i] = slots.get(i, 0) + n

    def percentile_ns(self, p: float) -> int | None:
        """Value at percentile P (0-100) as HdrHistogram gives it, clamped into [min, max]."""
        return self.percentiles_ns((p,))[0]

    def percentiles_ns(self, ps: Sequence[float]) -> list[int | None]:
        """percentile_ns() of each of PS (ascending), in one walk over the slots."""
        if not self.count:
            return [None] * len(ps)
        assert self.min_ns is not None and self.max_ns is not None
        lo, hi = self.min_ns, self.max_ns
        out: list[int | None] = []
        items = sorted(self.slots.items())
        k, running = 0, 0
        for p in ps:
            want = max(1, int(self.count * p / 100.0 + 0.5))  # as HdrHistogram rounds
            while k < len(items) and running + items[k][1] < want:
                running += items[k][1]
                k += 1
            v = slot_value_ns(items[k][0]) if k < len(items) else hi
            out.append(max(lo, min(v, hi)))
        return out

    def cumulative(self, bounds_ns: Sequence[int]) -> list[int]:
        """Counts at or below each bound (Prometheus `le` buckets), then the total."""
        per = [0] * (len(bounds_ns) + 1)
        for i, n in self.slots.items():
            per[bisect.bisect_left(bounds_ns, slot_value_ns(i))] += n
        out, running = [], 0
        for n in per:
            running += n
            out.append(running)
        return out

    @property
    def loss_ratio(self) -> float:
        total = self.count + self.lost
        return self.lost / total if total else 0.0


def to_wire(sk: LatencySketch | SlotTally) -> pb.Sketch:
    """SK as a Sketch message (what an agent sends)."""
    slots, counts = sk.slots()
    msg = pb.Sketch(kind=sk.kind, count=sk.count, lost=sk.lost, sum_ns=sk.sum_ns)
    if sk.count:
        assert sk.min_ns is not None and sk.max_ns is not None
        msg.min_ns, msg.max_ns = sk.min_ns, sk.max_ns
        msg.slots.extend(slots)
        msg.counts.extend(counts)
    return msg


def from_wire(msg: pb.Sketch) -> MergedSketch:
    """Read a Sketch message from an agent; ParseError for anything inconsistent."""
    kind, count = msg.kind, msg.count
    if kind not in _KINDS:
        raise ParseError(f"malformed latency sketch: unknown kind {kind!r}")
    slots, counts = list(msg.slots), list(msg.counts)
    if len(slots) != len(counts):
        raise ParseError(f"malformed latency sketch: {len(slots)} slots but {len(counts)} counts")
    sk = MergedSketch(kind=kind, count=count, lost=msg.lost, sum_ns=msg.sum_ns)
    if not count:
        if slots or msg.min_ns or msg.max_ns:
            raise ParseError("malformed latency sketch: slots or min/max with zero count")
        return sk
    sk.min_ns, sk.max_ns = msg.min_ns, msg.max_ns
    if sk.min_ns > sk.max_ns:
        raise ParseError("malformed latency sketch: min above max")
    sk.slots = dict(zip(slots, counts, strict=True))
    # A repeated slot shrinks the dict; an empty one or a wrong total fails the sum.
    if len(sk.slots) != len(slots) or sum(counts) != count or 0 in counts:
        raise ParseError("malformed latency sketch: slot counts do not add up to the count")
    if slots != sorted(slots):
        raise ParseError("malformed latency sketch: slots not ascending")
    if slots[-1] >= MAX_SLOTS:
        raise ParseError(f"malformed latency sketch: slot {slots[-1]} beyond {MAX_SLOTS}")
    return sk


def merged(sk: MergedSketch) -> MergedSketch:
    """A copy of SK that can take further merges without changing SK."""
    m = MergedSketch(kind=sk.kind)
    m.merge(sk)
    return m
