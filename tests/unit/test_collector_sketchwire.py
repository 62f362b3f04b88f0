"""The collector's reading of Sketch messages agrees with LatencySketch exactly."""

from __future__ import annotations

import random

import pytest

from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.errors import ParseError
from fabricprobe.core.sketchwire import (
    MAX_SLOTS,
    MergedSketch,
    from_wire,
    merged,
    slot_value_ns,
    to_wire,
)
from fabricprobe.core.stats import LatencySketch


def random_sketch(rng: random.Random, kind: str = "rtt") -> LatencySketch:
    s = LatencySketch(kind)  # type: ignore[arg-type]
    n = rng.choice([1, 3, 10, 200, 3000])
    s.record_many([int(rng.lognormvariate(10, 3)) for _ in range(n)])
    s.record_lost(rng.randint(0, 4))
    return s


def wire(s: LatencySketch) -> pb.Sketch:
    """Through serialization, as the collector receives it."""
    return pb.Sketch.FromString(to_wire(s).SerializeToString())


def test_slots_and_percentiles_match_latency_sketch() -> None:
    rng = random.Random(7)
    total = LatencySketch()
    acc = MergedSketch()
    for _ in range(60):
        s = random_sketch(rng)
        w = from_wire(wire(s))
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
    ps = (0.1, 50.0, 90.0, 99.0, 99.9, 100.0)
    for p in ps:
        assert acc.percentile_ns(p) == total.percentile_ns(p), p
    assert acc.percentiles_ns(ps) == [total.percentile_ns(p) for p in ps]
    assert acc.count == total.count and acc.lost == total.lost


def test_empty_and_loss_only_sketches() -> None:
    s = LatencySketch()
    s.record_lost(5)
    m = merged(from_wire(wire(s)))
    assert m.count == 0 and m.loss_ratio == 1.0 and m.percentile_ns(50) is None
    assert m.percentiles_ns((50.0, 99.0)) == [None, None]


def test_kinds_do_not_mix() -> None:
    one_way = from_wire(wire(random_sketch(random.Random(1), "one_way")))
    with pytest.raises(ValueError, match="cannot merge"):
        MergedSketch().merge(one_way)


def _sketch(**kw: object) -> pb.Sketch:
    base: dict[str, object] = dict(
        kind="rtt", count=3, min_ns=5, max_ns=9, sum_ns=20, slots=[5, 9], counts=[2, 1]
    )
    base.update(kw)
    return pb.Sketch(**base)  # type: ignore[arg-type]


def test_a_well_formed_message_reads() -> None:
    sk = from_wire(_sketch())
    assert sk.slots == {5: 2, 9: 1} and sk.percentile_ns(100.0) == 9


@pytest.mark.parametrize(
    ("kw", "why"),
    [
        ({"kind": "xyz"}, "unknown kind"),
        ({"kind": ""}, "unknown kind"),
        ({"counts": [2]}, "2 slots but 1 counts"),
        ({"count": 4}, "do not add up"),
        ({"counts": [3, 0]}, "do not add up"),
        ({"slots": [5, 5]}, "do not add up"),
        ({"slots": [9, 5], "counts": [1, 2]}, "not ascending"),
        ({"slots": [5, MAX_SLOTS]}, "beyond"),
        ({"min_ns": 10}, "min above max"),
        ({"count": 0, "sum_ns": 0}, "zero count"),
        ({"count": 0, "slots": [], "counts": [], "max_ns": 0}, "zero count"),
    ],
)
def test_inconsistent_messages_raise_parse_error(kw: dict[str, object], why: str) -> None:
    with pytest.raises(ParseError, match=why):
        from_wire(_sketch(**kw))
