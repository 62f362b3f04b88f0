"""CumulativeSketch: a path's RTT over all windows at the export's resolution. Both of its
exports must equal those of the merged HDR sketch it stands in for, for any windows."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabricprobe.core.cumulative import RTT_BUCKETS_NS, CumulativeSketch
from fabricprobe.core.nativehist import to_native
from fabricprobe.core.sketchwire import MergedSketch, from_wire, to_wire
from fabricprobe.core.stats import LatencySketch

# RTTs from 1 ns to 100 s, lost exchanges beside them
window = st.tuples(st.lists(st.integers(1, 100 * 10**9), max_size=20), st.integers(0, 3))


def wire(values: list[int], lost: int) -> MergedSketch:
    sk = LatencySketch()
    sk.record_many(values)
    for _ in range(lost):
        sk.record_lost()
    return from_wire(to_wire(sk))


@given(st.lists(window, max_size=12))
def test_exports_equal_the_merged_sketchs(windows: list[tuple[list[int], int]]) -> None:
    merged, cum = MergedSketch(), CumulativeSketch()
    for values, lost in windows:
        w = wire(values, lost)
        merged.merge(w)
        cum.merge(w)
    assert cum.cumulative(RTT_BUCKETS_NS) == merged.cumulative(RTT_BUCKETS_NS)
    assert cum.to_native() == to_native(merged)
    exact = ("count", "lost", "sum_ns", "min_ns", "max_ns")
    assert [getattr(cum, f) for f in exact] == [getattr(merged, f) for f in exact]
    assert cum.loss_ratio == merged.loss_ratio
    again = cum.copy()
    cum.merge(wire([5_000], 0))  # a copy is left alone by later merges
    assert again.count == merged.count and again.to_native() == to_native(merged)


def test_it_holds_one_counter_a_native_bucket_between_the_lowest_and_highest_seen() -> None:
    cum = CumulativeSketch()
    cum.merge(wire([30_000], 0))
    cum.merge(wire([10_000_000], 0))  # 30 µs and 10 ms: 8.4 powers of two apart
    cum.merge(wire([1_000], 0))  # below: the array grows at its front
    held = [i for i, _ in cum.buckets()]
    assert len(held) == 3 and len(cum.native) == held[-1] - held[0] + 1
    assert len(cum.native) <= 64 * 14  # schema 6: 64 buckets a power of two


def test_it_serves_only_the_resolution_it_keeps() -> None:
    cum = CumulativeSketch()
    with pytest.raises(ValueError):
        cum.cumulative((1, 2, 3))
    with pytest.raises(ValueError):
        cum.to_native(5)
    with pytest.raises(ValueError):
        cum.merge(MergedSketch(kind="one_way"))
