"""LatencySketch: percentiles as HdrHistogram gives them, from the non-empty slots."""

from __future__ import annotations

import random

import pytest

from fabricprobe.probes.stats import PERCENTILES, LatencySketch


@pytest.mark.parametrize("seed", range(8))
def test_percentiles_match_hdr_histogram(seed: int) -> None:
    rng = random.Random(seed)
    s = LatencySketch()
    n = rng.choice([1, 2, 7, 100, 5000])
    s.record_many(
        [int(rng.lognormvariate(rng.uniform(6, 16), rng.uniform(0.01, 3))) for _ in range(n)]
    )
    if seed % 2:  # a merged sketch, as the agent's windows are
        other = LatencySketch()
        other.record_many([rng.randrange(1, 10**9) for _ in range(50)])
        s.merge(other)
    ps = [0.0, 0.1, 1.0, *PERCENTILES, 100.0]
    assert s.min_ns is not None and s.max_ns is not None
    want = [max(s.min_ns, min(int(s._hist.get_value_at_percentile(p)), s.max_ns)) for p in ps]
    assert s.percentiles_ns(ps) == want
    assert [s.percentile_ns(p) for p in ps] == want


def test_values_beyond_the_range_and_empty() -> None:
    s = LatencySketch()
    assert s.percentiles_ns((50.0,)) == [None] and s.summary().p50_us is None
    s.record_many([0, 200 * 10**9])  # clamped into the histogram (1 ns..100 s)
    assert (s.min_ns, s.max_ns) == (0, 200 * 10**9)  # exact
    assert s.percentile_ns(0.0) == 1  # the histogram's floor
    top = s.percentile_ns(100.0)
    assert top is not None and 100 * 10**9 <= top < 101 * 10**9  # its ceiling's slot
    with pytest.raises(ValueError, match="outside"):
        s.percentile_ns(101.0)
