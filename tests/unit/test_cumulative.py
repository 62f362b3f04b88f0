"""CumulativeSketch: a path's RTT over all windows at the export's resolution. Both of its
exports must equal those of the merged HDR sketch it stands in for, for any windows."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabricprobe.core.cumulative import RTT_BUCKETS_NS, CumulativeSketch, bucket_upper_ns
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


HALF_BUCKET = 2.0 ** (2.0**-6 / 2)  # half a native bucket at schema 6: 0.54 %


@given(st.lists(window, min_size=1, max_size=12))
def test_percentiles_lie_within_half_a_bucket_of_the_merged_sketchs(
    windows: list[tuple[list[int], int]],
) -> None:
    merged, cum = MergedSketch(), CumulativeSketch()
    for values, lost in windows:
        w = wire(values, lost)
        merged.merge(w)
        cum.merge(w)
    ps = (0.0, 50.0, 90.0, 99.0, 99.9, 100.0)
    got, want = cum.percentiles_ns(ps), merged.percentiles_ns(ps)
    if not merged.count:
        assert got == [None] * len(ps)
        return
    for p, g, w in zip(ps, got, want, strict=True):
        assert g is not None and w is not None
        assert w / HALF_BUCKET <= g <= w * HALF_BUCKET, (p, g, w)
        assert cum.min_ns is not None and cum.max_ns is not None
        assert cum.min_ns <= g <= cum.max_ns


def test_percentiles_of_a_spread_against_the_recorded_values() -> None:
    # 10,000 RTTs spread from 20 µs to 2 ms: each percentile within 1 % of the values'
    values = [round(20_000 * 100 ** (i / 9_999)) for i in range(10_000)]
    cum = CumulativeSketch()
    for i in range(0, len(values), 100):
        cum.merge(wire(values[i : i + 100], 0))
    ps = (50.0, 90.0, 99.0, 99.9)
    for p, g in zip(ps, cum.percentiles_ns(ps), strict=True):
        true = values[max(0, round(p / 100 * len(values)) - 1)]
        assert g is not None and abs(g / true - 1) < 0.01, (p, g, true)
    assert cum.percentiles_ns((100.0,)) == [2_000_000.0]  # clamped to the exact max
    with pytest.raises(ValueError):
        cum.percentiles_ns((101.0,))


def test_cdf_buckets_coarsen_to_the_bound_and_keep_every_count() -> None:
    values = [round(1_000 * 2 ** (i / 50)) for i in range(1_000)]  # 20 powers of two
    cum = CumulativeSketch()
    cum.merge(wire(values, 0))
    schema, full, zero = cum.cdf_buckets(10_000)
    assert schema == 6 and full == list(cum.buckets()) and zero == 0
    schema, few, _ = cum.cdf_buckets(100)
    assert schema == 2 and len(few) <= 100  # 4 buckets a power of two: 80
    assert sum(n for _, n in few) == sum(n for _, n in full) == cum.count
    # each coarse bucket holds exactly the fine buckets below its bound
    fine_upper = {i: bucket_upper_ns(i, 6) for i, _ in full}
    for j, n in few:
        upper, lower = bucket_upper_ns(j, schema), bucket_upper_ns(j - 1, schema)
        held = sum(c for i, c in full if lower < fine_upper[i] <= upper * (1 + 1e-12))
        assert held == n
    with pytest.raises(ValueError):
        cum.cdf_buckets(0)
