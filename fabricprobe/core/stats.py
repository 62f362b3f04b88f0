"""Latency statistics kept as a mergeable HDR histogram with exact min, max and count.

Values are recorded in nanoseconds. The histogram keeps two significant digits (1 %
relative resolution) from 1 ns to 100 s in about 31 KiB, so an agent can hold one per
(peer, transport, op, size) window; exact min/max/count ride beside it because the
histogram only knows bucket edges. Percentiles always come from the histogram, never
from an average. Every figure says whether it is an RTT or a one-way (RTT/2) value.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from typing import Literal, Protocol

from hdrh.histogram import HdrHistogram

LOWEST_NS = 1
HIGHEST_NS = 100_000_000_000  # 100 s: anything slower is a loss, not a latency
SIGNIFICANT_DIGITS = 2
PERCENTILES: tuple[float, ...] = (50.0, 90.0, 99.0, 99.9)

Kind = Literal["rtt", "one_way", "delay"]  # delay: a host delay inside an RTT (UD)


class ExactFigures(Protocol):
    """What a distribution keeps exactly beside its slots (LatencySketch, SlotTally and
    the collector's MergedSketch)."""

    @property
    def kind(self) -> str: ...

    count: int
    lost: int
    sum_ns: int
    min_ns: int | None
    max_ns: int | None


def merge_exact(into: ExactFigures, other: ExactFigures) -> None:
    """Fold OTHER's exact figures into INTO's (same kind only: RTT and one-way never mix)."""
    if other.kind != into.kind:
        raise ValueError(f"cannot merge a {other.kind} sketch into a {into.kind} sketch")
    into.count += other.count
    into.lost += other.lost
    into.sum_ns += other.sum_ns
    if other.min_ns is not None and (into.min_ns is None or other.min_ns < into.min_ns):
        into.min_ns = other.min_ns
    if other.max_ns is not None and (into.max_ns is None or other.max_ns > into.max_ns):
        into.max_ns = other.max_ns


def checked_percentiles(ps: Iterable[float]) -> list[float]:
    """PS as a list, each a percentile within 0..100 (ValueError names the first that is
    not)."""
    out = list(ps)
    for p in out:
        if not 0.0 <= p <= 100.0:
            raise ValueError(f"percentile {p} outside 0..100")
    return out


class Exact:
    """The exact figures a distribution keeps beside its slots: count, loss, sum, min and
    max, and its kind (RTT and one-way never mix)."""

    __slots__ = ("count", "kind", "lost", "max_ns", "min_ns", "sum_ns")

    def __init__(self, kind: Kind) -> None:
        self.kind: Kind = kind
        self.count = 0
        self.lost = 0
        self.min_ns: int | None = None
        self.max_ns: int | None = None
        self.sum_ns = 0

    def _batch(self, values_ns: Iterable[int]) -> list[int]:
        """VALUES_NS as ints, their exact figures taken in (empty: nothing)."""
        vals = [int(v) for v in values_ns]
        if not vals:
            return vals
        lo, hi = min(vals), max(vals)
        if lo < 0:
            raise ValueError(f"negative latency {lo} ns")
        self.count += len(vals)
        self.sum_ns += sum(vals)
        if self.min_ns is None or lo < self.min_ns:
            self.min_ns = lo
        if self.max_ns is None or hi > self.max_ns:
            self.max_ns = hi
        return vals

    def record_lost(self, n: int = 1) -> None:
        self.lost += n


class LatencySketch(Exact):
    """Mergeable latency distribution (ns) with exact count, min, max, sum and loss."""

    __slots__ = ("_hist",)

    def __init__(self, kind: Kind = "rtt") -> None:
        super().__init__(kind)
        self._hist = HdrHistogram(LOWEST_NS, HIGHEST_NS, SIGNIFICANT_DIGITS)

    def record(self, value_ns: int) -> None:
        """Add one sample; values are clamped into the histogram's range, min/max stay exact."""
        v = int(value_ns)
        if v < 0:
            raise ValueError(f"negative latency {v} ns")
        self._hist.record_value(min(max(v, LOWEST_NS), HIGHEST_NS))
        self.count += 1
        self.sum_ns += v
        if self.min_ns is None or v < self.min_ns:
            self.min_ns = v
        if self.max_ns is None or v > self.max_ns:
            self.max_ns = v

    def record_many(self, values_ns: Iterable[int]) -> None:
        """record() of each value, with the exact figures updated once for the batch."""
        put = self._hist.record_value
        for v in self._batch(values_ns):
            put(v if LOWEST_NS <= v <= HIGHEST_NS else min(max(v, LOWEST_NS), HIGHEST_NS))

    def merge(self, other: LatencySketch) -> None:
        """Fold OTHER into this sketch (same kind only: RTT and one-way never mix)."""
        merge_exact(self, other)
        if other.count:
            self._hist.add(other._hist)

    def percentile_ns(self, p: float) -> int | None:
        """Value at percentile P (0-100), clamped into [min, max]; None when empty."""
        return self.percentiles_ns((p,))[0]

    def percentiles_ns(self, ps: Iterable[float]) -> list[int | None]:
        """percentile_ns() of each of PS, as HdrHistogram's get_value_at_percentile
        gives it, but walking only the non-empty slots (it walks all 3,968 in Python,
        and was most of a probe burst's CPU)."""
        ps = checked_percentiles(ps)
        if not self.count:
            return [None] * len(ps)
        assert self.min_ns is not None and self.max_ns is not None
        h = self._hist
        slots, counts = self.slots()
        out: list[int | None] = []
        for p in ps:
            want = max(1, int(p * h.total_count / 100 + 0.5))  # as HdrHistogram rounds
            running, v = 0, 0
            for i, n in zip(slots, counts, strict=True):
                running += n
                if running >= want:
                    at = h.get_value_from_index(i)
                    v = (
                        h.get_highest_equivalent_value(at)
                        if p
                        else h.get_lowest_equivalent_value(at)
                    )
                    break
            out.append(max(self.min_ns, min(int(v), self.max_ns)))
        return out

    def buckets(self) -> list[tuple[int, int]]:
        """(highest equivalent value in ns, count) for every non-empty histogram bucket."""
        out = []
        for item in self._hist.get_recorded_iterator():
            out.append((int(item.value_iterated_to), int(item.count_at_value_iterated_to)))
        return out

    def summary(self) -> LatencySummary:
        p50, p90, p99, p999 = self.percentiles_ns(PERCENTILES)
        return LatencySummary(
            kind=self.kind,
            count=self.count,
            lost=self.lost,
            min_us=_us(self.min_ns),
            p50_us=_us(p50),
            p90_us=_us(p90),
            p99_us=_us(p99),
            p999_us=_us(p999),
            max_us=_us(self.max_ns),
            mean_us=_us(self.sum_ns / self.count) if self.count else None,
        )

    def slots(self) -> tuple[list[int], list[int]]:
        """(indices, counts) of the non-empty histogram slots, indices ascending: the
        sparse form a sketch travels in (fabricprobe/core/sketchwire.py). Only the slots
        between those of min and max are read, not all 3,968."""
        if not self.count:
            return [], []
        assert self.min_ns is not None and self.max_ns is not None
        h = self._hist
        lo = h.get_counts_array_index(min(max(self.min_ns, LOWEST_NS), HIGHEST_NS))
        hi = h.get_counts_array_index(min(max(self.max_ns, LOWEST_NS), HIGHEST_NS))
        counts = memoryview(h.counts).cast("B").cast("Q")[lo : hi + 1].tolist()
        indices = [lo + i for i, n in enumerate(counts) if n]
        return indices, [counts[i - lo] for i in indices]


def _slot_constants() -> tuple[int, int, int, int]:
    """(unit magnitude, sub-bucket half-count magnitude, sub-bucket mask, half count) of
    the histogram every LatencySketch holds, read off one."""
    h = HdrHistogram(LOWEST_NS, HIGHEST_NS, SIGNIFICANT_DIGITS)
    return (
        h.unit_magnitude,
        h.sub_bucket_half_count_magnitude,
        h.sub_bucket_mask,
        h.sub_bucket_half_count,
    )


_UNIT, _HALF_MAG, _MASK, _HALF = _slot_constants()


def slot_of(value_ns: int) -> int:
    """The histogram slot (counts index) a LatencySketch records VALUE_NS in, clamped into
    its range as record() clamps: HdrHistogram's index arithmetic with int.bit_length
    for the leading-zero count."""
    v = min(max(value_ns, LOWEST_NS), HIGHEST_NS)
    bucket = (v | _MASK).bit_length() - _UNIT - (_HALF_MAG + 1)
    return ((bucket + 1) << _HALF_MAG) + (v >> (bucket + _UNIT)) - _HALF


class SlotTally(Exact):
    """A write-only LatencySketch in the sparse form it travels in (slot -> count, with
    the exact count, loss, sum, min and max): what an agent's window builds from its
    bursts and sends. It records and merges as LatencySketch does and `slots()` gives
    the same answer, so core.sketchwire.to_wire encodes both alike; it holds a few
    dict entries where a LatencySketch allocates and zeroes a 31 KiB histogram, which
    a window cost once per path."""

    __slots__ = ("_slots",)

    def __init__(self, kind: Kind = "rtt") -> None:
        super().__init__(kind)
        self._slots: dict[int, int] = {}

    def record_many(self, values_ns: Iterable[int]) -> None:
        """LatencySketch.record_many: each value into its slot, the exact figures once."""
        vals = self._batch(values_ns)
        slots, get = self._slots, self._slots.get
        unit, half_mag, mask, half = _UNIT, _HALF_MAG, _MASK, _HALF
        for v in vals:  # slot_of(v), inline: this runs for every exchange
            if not LOWEST_NS <= v <= HIGHEST_NS:
                v = min(max(v, LOWEST_NS), HIGHEST_NS)
            b = (v | mask).bit_length() - unit - half_mag - 1
            k = ((b + 1) << half_mag) + (v >> (b + unit)) - half
            slots[k] = get(k, 0) + 1

    def merge(self, other: LatencySketch | SlotTally) -> None:
        """Fold OTHER in, as LatencySketch.merge does (same kind only)."""
        merge_exact(self, other)
        slots = self._slots
        for k, n in zip(*other.slots(), strict=True):
            slots[k] = slots.get(k, 0) + n

    def slots(self) -> tuple[list[int], list[int]]:
        """(indices, counts) of the non-empty slots, indices ascending (LatencySketch.slots)."""
        items = sorted(self._slots.items())
        return [k for k, _ in items], [n for _, n in items]


@dataclass(frozen=True)
class LatencySummary:
    """Percentiles in microseconds; `kind` says whether they are RTT or one-way (RTT/2)."""

    kind: Kind
    count: int
    lost: int
    min_us: float | None
    p50_us: float | None
    p90_us: float | None
    p99_us: float | None
    p999_us: float | None
    max_us: float | None
    mean_us: float | None

    @property
    def loss_ratio(self) -> float:
        total = self.count + self.lost
        return self.lost / total if total else 0.0

    def as_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["loss_ratio"] = self.loss_ratio
        return d


def _us(ns: float | None) -> float | None:
    if ns is None or (isinstance(ns, float) and math.isnan(ns)):
        return None
    return round(ns / 1000.0, 3)


def one_way_from_rtt(rtt: LatencySummary) -> LatencySummary:
    """The RTT/2 estimate of one-way latency, labelled as such (kind "one_way")."""
    if rtt.kind != "rtt":
        raise ValueError(f"expected an rtt summary, got {rtt.kind}")

    def half(v: float | None) -> float | None:
        return None if v is None else round(v / 2.0, 3)

    return replace(
        rtt,
        kind="one_way",
        min_us=half(rtt.min_us),
        p50_us=half(rtt.p50_us),
        p90_us=half(rtt.p90_us),
        p99_us=half(rtt.p99_us),
        p999_us=half(rtt.p999_us),
        max_us=half(rtt.max_us),
        mean_us=half(rtt.mean_us),
    )
