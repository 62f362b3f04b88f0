"""The collector's own reading of sketch wire bytes agrees with LatencySketch exactly."""

from __future__ import annotations

import base64
import random

import pytest
from hdrh.histogram import HdrHistogram

from collector.sketchwire import MergedSketch, merged, parse_sketch, slot_value_ns
from probes.errors import ParseError
from probes.stats import LatencySketch


def random_sketch(rng: random.Random, kind: str = "rtt") -> LatencySketch:
    s = LatencySketch(kind)  # type: ignore[arg-type]
    n = rng.choice([1, 3, 10, 200, 3000])
    s.record_many([int(rng.lognormvariate(10, 3)) for _ in range(n)])
    s.record_lost(rng.randint(0, 4))
    return s


def test_slots_and_percentiles_match_latency_sketch() -> None:
    rng = random.Random(7)
    total = LatencySketch()
    acc = MergedSketch()
    for _ in range(60):
        s = random_sketch(rng)
        w = parse_sketch(s.encode())
        assert (w.count, w.lost, w.min_ns, w.max_ns, w.sum_ns) == (
            s.count,
            s.lost,
            s.min_ns,
            s.max_ns,
            s.sum_ns,
        )
        assert sorted((slot_value_ns(i), c) for i, c in w.slots.items()) == s.buckets()
        total.merge(s)
        acc.merge(w)
    for p in (0.1, 50.0, 90.0, 99.0, 99.9, 100.0):
        assert acc.percentile_ns(p) == total.percentile_ns(p), p
    assert acc.count == total.count and acc.lost == total.lost


def test_empty_and_loss_only_sketches() -> None:
    s = LatencySketch()
    s.record_lost(5)
    m = merged(parse_sketch(s.encode()))
    assert m.count == 0 and m.loss_ratio == 1.0 and m.percentile_ns(50) is None


def test_kinds_do_not_mix() -> None:
    one_way = parse_sketch(random_sketch(random.Random(1), "one_way").encode())
    with pytest.raises(ValueError, match="cannot merge"):
        MergedSketch().merge(one_way)


def _other_settings_blob() -> bytes:
    h = HdrHistogram(1, 1_000_000, 3)
    h.record_value(5)
    return b"rtt|1|0|5|5|5|" + h.encode()


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"rtt|1|0",
        b"xyz|1|0|5|5|5|",
        b"rtt|-1|0|||0|",
        b"rtt|1|0|5|5|5|not-base64!!",
        b"rtt|1|0|5|5|5|" + base64.b64encode(b"\x00" * 12),
        b"rtt|0|0|||0|" + base64.b64encode(b"junk"),
        b"rtt|2|0|5|5|10|" + LatencySketch().encode().split(b"|")[-1],
        _other_settings_blob(),
    ],
)
def test_malformed_blobs_raise_parse_error(blob: bytes) -> None:
    with pytest.raises(ParseError):
        parse_sketch(blob)


def test_count_must_match_histogram() -> None:
    s = LatencySketch()
    s.record_many([100, 200])
    _head, hist = s.encode().rsplit(b"|", 1)
    forged = b"rtt|3|0|100|200|300|" + hist
    with pytest.raises(ParseError, match="does not match"):
        parse_sketch(forged)
