"""LatencySketch: percentiles as HdrHistogram gives them, from the non-empty slots."""

from __future__ import annotations

import random

import pytest

from fabricprobe.core.sketchwire import to_wire
from fabricprobe.core.stats import (
    HIGHEST_NS,
    LOWEST_NS,
    PERCENTILES,
    LatencySketch,
    SlotTally,
    slot_of,
)


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


def test_slot_of_is_the_histograms_index() -> None:
    h = LatencySketch()._hist
    edges = [1 << k for k in range(38)]
    values = {0, 1, 2, 127, 128, 255, 256, 257, 10**11 - 1, 10**11, 10**12, 2**40}
    values |= {e + d for e in edges for d in (-1, 0, 1)}
    values |= {random.Random(3).randrange(1, 10**11) for _ in range(2000)}
    for v in sorted(values):
        clamped = min(max(v, LOWEST_NS), HIGHEST_NS)
        assert slot_of(v) == h.get_counts_array_index(clamped), v


@pytest.mark.parametrize("seed", range(6))
def test_slot_tally_encodes_as_the_sketch_does(seed: int) -> None:
    """The agent's window tallies (SlotTally) go out byte for byte as LatencySketches of
    the same bursts would: records, clamped values, losses and merged RDMA sketches."""
    rng = random.Random(seed)
    sketch, tally = LatencySketch("rtt"), SlotTally("rtt")
    for _ in range(rng.randrange(1, 6)):
        burst = [int(rng.lognormvariate(rng.uniform(3, 20), 1.5)) for _ in range(rng.randrange(11))]
        burst += rng.choice([[], [0], [10**12]])
        sketch.record_many(burst)
        tally.record_many(burst)
        lost = rng.randrange(3)
        sketch.record_lost(lost)
        tally.record_lost(lost)
        if rng.random() < 0.5:
            other = LatencySketch("rtt")
            other.record_many([rng.randrange(1, 10**9) for _ in range(rng.randrange(5))])
            other.record_lost(rng.randrange(2))
            sketch.merge(other)
            tally.merge(other)
    assert tally.slots() == sketch.slots()
    assert to_wire(tally).SerializeToString() == to_wire(sketch).SerializeToString()
    with pytest.raises(ValueError, match="negative"):
        tally.record_many([5, -1])
    with pytest.raises(ValueError, match="cannot merge"):
        tally.merge(LatencySketch("delay"))
