"""The attribution's recent records and running histograms: what is kept, what is
dropped, what a snapshot shows."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from fabricprobe.collector.attribution.histograms import (
    DURATION_BUCKETS_S,
    MAX_PATHS,
    Histogram,
    StageHistograms,
)
from fabricprobe.collector.attribution.records import (
    FUTURE_TOLERANCE_NS,
    MAX_BYTES,
    RecentRecords,
)
from fabricprobe.collector.attribution.stages import STAGES, RequestRecord, StageRecord

S = 1_000_000_000
NOW = 1_000 * S


def stage(rid: str, name: str, end_ns: int, seconds: float = 0.01, **kw: Any) -> StageRecord:
    return StageRecord(rid, name, end_ns - int(seconds * S), end_ns, **kw)


def request(
    rid: str, end_ns: int, ttft: float | None = 0.2, e2e: float | None = 1.0
) -> RequestRecord:
    return RequestRecord(rid, end_ns - S, end_ns, ttft, e2e, output_tokens=5, prompt_tokens=8)


def test_records_out_of_range_are_counted_and_the_rest_kept() -> None:
    rec = RecentRecords()
    stages = [
        stage("ok", "prefill", NOW),
        stage("ahead", "prefill", NOW + FUTURE_TOLERANCE_NS + S),  # past the tolerance
        stage("huge", "kv_transfer", NOW, src="a", dst="b", bytes=MAX_BYTES + 1),
        StageRecord("backwards", "decode", NOW, NOW - S),
    ]
    requests = [request("ok", NOW), request("slow", NOW, ttft=2 * 86_400.0)]
    kept_st, kept_rq = rec.keep(stages, requests, NOW)
    assert [s.request_id for s in kept_st] == ["ok"]
    assert [r.request_id for r in kept_rq] == ["ok"]
    assert rec.dropped_total() == 4


def test_records_are_bounded_newest_kept_and_read_by_end_time() -> None:
    rec = RecentRecords(max_records=3)
    rec.keep([stage(f"r{i}", "queue", NOW - (9 - i) * S) for i in range(10)], [], NOW)
    st, rq = rec.since(0)
    assert [s.request_id for s in st] == ["r7", "r8", "r9"]
    assert rq == []
    st, _ = rec.since(NOW - S)  # ended after it: only the newest
    assert [s.request_id for s in st] == ["r9"]


def test_histogram_buckets_are_cumulative_with_inf_last() -> None:
    h = Histogram()
    for seconds in (0.0001, 0.003, 0.003, 100.0):
        h.observe(seconds)
    got = dict(h.buckets())
    assert got["0.0005"] == 1 and got["0.005"] == 3 and got["60.0"] == 3 and got["+Inf"] == 4
    assert len(got) == len(DURATION_BUCKETS_S) + 1
    assert h.figures().sum == pytest.approx(100.0061)


def test_histograms_count_stages_and_kv_on_known_paths_only() -> None:
    hist = StageHistograms()
    hist.observe(
        [
            stage("r1", "kv_transfer", NOW, 0.02, src="a", dst="b", transport="rdma"),
            stage("r2", "kv_transfer", NOW, 0.03),  # no path: its stage only
            stage("r3", "queue", NOW, 0.001),
        ],
        [request("r1", NOW), request("r2", NOW, ttft=None)],
    )
    snap = hist.snapshot()
    assert [s.stage for s in snap.stages] == list(STAGES)
    counts = {s.stage: dict(s.figures.buckets)["+Inf"] for s in snap.stages}
    assert counts == {"queue": 1, "prefill": 0, "kv_transfer": 2, "decode": 0,
                      "detokenize": 0, "deliver": 0}  # fmt: skip
    assert [(p.src, p.dst, p.transport) for p in snap.kv] == [("a", "b", "rdma")]
    assert snap.kv[0].figures.sum == pytest.approx(0.02)
    assert dict(snap.ttft.buckets)["+Inf"] == 1
    # ITL: (1.0 - 0.2) s over the 4 tokens after the first
    assert snap.itl.sum == pytest.approx(0.2)


def test_kv_paths_beyond_the_bound_are_counted_as_other() -> None:
    hist = StageHistograms()
    extra = [("x", f"y{i}") for i in range(3)]
    pairs = [("h", f"d{i}") for i in range(MAX_PATHS)] + extra
    hist.observe([stage("r", "kv_transfer", NOW, src=a, dst=b) for a, b in pairs], [])
    kv = hist.snapshot().kv
    assert len(kv) == MAX_PATHS + 1
    other = [p for p in kv if p.src == "other"]
    assert [(p.dst, p.transport, dict(p.figures.buckets)["+Inf"]) for p in other] == [
        ("other", "unknown", 3)
    ]


def test_a_snapshot_is_immutable_and_does_not_follow_later_observations() -> None:
    hist = StageHistograms()
    hist.observe([stage("r", "decode", NOW)], [])
    snap = hist.snapshot()
    hist.observe([stage("r2", "decode", NOW)], [request("r2", NOW)])
    decode = next(s for s in snap.stages if s.stage == "decode")
    assert dict(decode.figures.buckets)["+Inf"] == 1
    assert dict(snap.ttft.buckets)["+Inf"] == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.kv = ()  # type: ignore[misc]
    assert isinstance(snap.stages, tuple) and isinstance(decode.figures.buckets, tuple)
