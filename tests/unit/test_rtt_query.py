"""The Rtt query (collector/rttquery.py) over a real WindowStore: each path's whole
distribution at the sketches' resolution, host references apart, within its bounds."""

from __future__ import annotations

import random

import pytest

from fabricprobe.cli.commands.why import reply_dict
from fabricprobe.collector.rttquery import (
    MAX_BUCKETS,
    MAX_CDF_PATHS,
    MAX_PATHS,
    RttAsk,
    check_rtt,
    ranked_rtt,
    rtt_reply,
)
from fabricprobe.collector.store import WindowStore
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.sketchwire import MergedSketch, from_wire, to_wire
from fabricprobe.core.stats import LatencySketch

S = 1_000_000_000
HALF_BUCKET = 2.0 ** (2.0**-6 / 2)  # half a native bucket at schema 6: 0.54 %


def sketch(rtts_ns: list[int], lost: int = 0) -> pb.Sketch:
    s = LatencySketch("rtt")
    s.record_many(rtts_ns)
    s.record_lost(lost)
    return to_wire(s)


class Fleet:
    """A store fed windows, and the merged sketch of every path beside it."""

    def __init__(self) -> None:
        self.now = 1_000 * S
        self.store = WindowStore(stale_after=30, clock=lambda: self.now)
        self.merged: dict[tuple[str, str], MergedSketch] = {}
        self.seq: dict[str, int] = {}
        for h in ("a", "b", "c"):
            self.store.register(pb.HostInfo(host=h))

    def window(self, src: str, dst: str, rtts_ns: list[int], lost: int = 0) -> None:
        seq = self.seq[src] = self.seq.get(src, 0) + 1
        self.now += S
        r = pb.WindowReport(host=src, epoch=1, seq=seq, window_end_unix_ns=self.now)
        wire = sketch(rtts_ns, lost)
        r.probes.add(dst=dst, transport="tcp", op="pingpong", size=64, rtt=wire)
        self.store.take(r)
        self.merged.setdefault((src, dst), MergedSketch()).merge(from_wire(wire))


@pytest.fixture
def fleet() -> Fleet:
    f = Fleet()
    rng = random.Random(7)
    for _ in range(20):
        f.window("a", "b", [int(rng.lognormvariate(11, 0.5)) for _ in range(50)])  # ~60 µs
        f.window("a", "c", [int(rng.lognormvariate(10, 0.3)) for _ in range(50)])  # ~22 µs
        f.window("a", "a", [int(rng.lognormvariate(9.5, 0.4)) for _ in range(50)])
        f.window("b", "b", [int(rng.lognormvariate(9.3, 0.4)) for _ in range(50)])
        f.window("b", "c", [], lost=5)  # every exchange lost
    return f


def test_each_paths_figures_are_its_merged_sketchs_within_half_a_bucket(fleet: Fleet) -> None:
    reply = rtt_reply(fleet.store, RttAsk(cdf_paths=10))
    assert [(m.src, m.dst) for m in reply.paths] == [("b", "c"), ("a", "b"), ("a", "c")]
    assert [(m.src, m.dst) for m in reply.host_references] == [("a", "a"), ("b", "b")]
    assert all(m.host_reference for m in reply.host_references)
    assert not any(m.host_reference for m in reply.paths)
    assert (reply.paths_total, reply.host_references_total) == (3, 2)
    lost = reply.paths[0]
    assert lost.count == 0 and lost.lost == 100 and not lost.HasField("p50_s")
    for m in [*reply.paths[1:], *reply.host_references]:
        merged = fleet.merged[(m.src, m.dst)]
        assert merged.min_ns is not None and merged.max_ns is not None
        assert m.count == merged.count == 1000
        assert (m.min_s, m.max_s) == (merged.min_ns / 1e9, merged.max_ns / 1e9)  # exact
        assert m.mean_s == pytest.approx(merged.sum_ns / merged.count / 1e9)
        want = merged.percentiles_ns((50.0, 90.0, 99.0, 99.9))
        got = (m.p50_s, m.p90_s, m.p99_s, m.p999_s)
        for g, w in zip(got, want, strict=True):
            assert w is not None and w / HALF_BUCKET <= g * 1e9 <= w * HALF_BUCKET
        # the CDF: native buckets at schema 6 that hold every RTT
        assert m.schema == 6 and sum(m.counts) + m.zero_count == m.count
        assert list(m.buckets) == sorted(m.buckets) and len(m.buckets) == len(m.counts)
        # windows came one a second, a->b first: since its first window, up to its newest
        first = {("a", "b"): 1_001, ("a", "c"): 1_002, ("a", "a"): 1_003, ("b", "b"): 1_004}
        assert m.since_unix_ns == first[(m.src, m.dst)] * S
        assert m.newest_unix_ns == (first[(m.src, m.dst)] + 19 * 5) * S


def test_bounds_filters_and_coarser_cdfs(fleet: Fleet) -> None:
    one = rtt_reply(fleet.store, RttAsk(max_paths=1, cdf_paths=1, max_buckets=16))
    assert len(one.paths) == 1 and one.paths_total == 3 and len(one.host_references) == 1
    ref = one.host_references[0]
    assert len(ref.buckets) <= 16 and ref.schema < 6  # merged to a coarser schema
    assert sum(ref.counts) == ref.count
    none = rtt_reply(fleet.store, RttAsk())  # no CDF asked: the figures only
    assert not any(m.buckets or m.HasField("schema") for m in none.paths)
    only = rtt_reply(fleet.store, RttAsk(src="a", dst="c"))
    assert [(m.src, m.dst) for m in only.paths] == [("a", "c")] and not only.host_references


def test_bad_requests_say_what_is_out_of_range() -> None:
    assert check_rtt(pb.RttRequest()) == RttAsk()
    for bad in (
        pb.RttRequest(max_paths=MAX_PATHS + 1),
        pb.RttRequest(cdf_paths=MAX_CDF_PATHS + 1),
        pb.RttRequest(max_buckets=8),
        pb.RttRequest(max_buckets=5000),
        pb.RttRequest(src="x" * 300),
        pb.RttRequest(dst="a b"),
    ):
        with pytest.raises(ValueError):
            check_rtt(bad)
    assert check_rtt(pb.RttRequest(max_paths=5, cdf_paths=50)).cdf_paths == 5


def test_a_why_replys_ranked_paths_carry_their_distribution(fleet: Fleet) -> None:
    ranked = [pb.PathRank(rank=1, src="a", dst="b", transport="tcp")]
    reply = pb.WhyReply(paths=ranked)
    reply.rtt.extend(ranked_rtt(fleet.store, reply.paths))
    doc = reply_dict(reply)
    (rtt,) = doc["rtt"]
    merged = fleet.merged[("a", "b")]
    p99 = merged.percentile_ns(99.0)
    assert p99 is not None and rtt["src"] == "a" and rtt["dst"] == "b" and rtt["op"] == "pingpong"
    assert abs(rtt["p99_s"] * 1e9 / p99 - 1) < 0.0055 and "buckets" not in rtt


def test_a_reply_at_every_bound_fits_grpcs_default_message() -> None:
    # the longest names a report can carry (host 253, peer 128, op 32), counts of 2^40
    reply = pb.RttReply(paths_total=2**32 - 1, host_references_total=2**32 - 1, now_ns=2**62)
    for listed in (reply.paths, reply.host_references):
        for i in range(MAX_PATHS):
            m = listed.add(src="s" * 253, dst="d" * 128, transport="rdma", op="o" * 32,
                           size=2**32 - 1, count=2**40, lost=2**40, min_s=1e-6, p50_s=1e-5,
                           p90_s=1e-5, p99_s=1e-5, p999_s=1e-5, max_s=1.0, mean_s=1e-3,
                           since_unix_ns=2**62, newest_unix_ns=2**62)  # fmt: skip
            if i < MAX_CDF_PATHS:
                m.schema = 6
                m.buckets.extend(range(-1500, -1500 + MAX_BUCKETS))
                m.counts.extend([2**40] * MAX_BUCKETS)
    assert reply.ByteSize() < 4 << 20
