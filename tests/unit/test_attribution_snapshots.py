"""What the attribution's exporter reads: typed snapshots from the receiver, the
attribution and the window store, each taken under its owner's lock and immutable."""

from __future__ import annotations

import dataclasses

import pytest

from fabricprobe.collector.attribution.core import Attribution
from fabricprobe.collector.attribution.engines import ENGINES
from fabricprobe.collector.attribution.linking import REASONS
from fabricprobe.collector.attribution.otlp import EngineSpans, TraceIngest
from fabricprobe.collector.attribution.stages import StageRecord
from fabricprobe.collector.store import NixlTotal, WindowStore
from fabricprobe.core.api import fabricprobe_pb2 as pb
from tests.unit.spanmaker import S, batch, span
from tests.unit.test_engines import DEC, export, vllm_request

NOW = 1_000 * S


def test_the_receivers_counts_name_every_engine_and_stay_as_taken() -> None:
    ingest = TraceIngest(lambda st, rq, fr: None)
    ingest.export(export((DEC, [vllm_request(NOW - S, "r", 7, queue=0.01, e2e=0.2, out=3)])))
    ingest.export(
        batch(span("queue", NOW - S, NOW), span("queue", 2 * S, S), span("other", S, 2 * S))
    )
    got = ingest.counts()
    assert (got.received, got.rejected, got.ignored, got.batches_refused) == (4, 1, 1, 0)
    assert [e.engine for e in got.engine_spans] == list(ENGINES)
    assert EngineSpans("vllm", 1) in got.engine_spans
    assert all(e.spans == 0 for e in got.unmapped)
    ingest.export(batch(span("queue", NOW - S, NOW)))
    assert got.received == 4 and ingest.counts().received == 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.received = 0  # type: ignore[misc]


def test_nixl_totals_are_named_records_of_nixl_counters_only() -> None:
    store = WindowStore(clock=lambda: NOW)
    store.register(pb.HostInfo(host="h1"))
    r = pb.WindowReport(
        host="h1", epoch=1, seq=1, window_start_unix_ns=NOW - S, window_end_unix_ns=NOW
    )
    r.counters.add(kind="nixl", device="127.0.0.1:8000", name="bytes", value=4096, width=64)
    r.counters.add(kind="rdma", device="mlx5_0", port=1, name="port_rcv_data", value=7, width=64)
    store.take(r)
    r2 = pb.WindowReport(
        host="h1", epoch=1, seq=2, window_start_unix_ns=NOW, window_end_unix_ns=NOW + S
    )
    r2.counters.add(kind="nixl", device="127.0.0.1:8000", name="bytes", value=6144, width=64)
    store.take(r2)
    assert store.nixl_counter_totals() == [NixlTotal("h1", "127.0.0.1:8000", "bytes", 2048)]


def test_the_attributions_counts_gather_its_parts() -> None:
    store = WindowStore(clock=lambda: NOW)
    store.register(pb.HostInfo(host="a"))
    a = Attribution(store, clock=lambda: NOW)
    a.take(
        [
            StageRecord("r1", "kv_transfer", NOW - S, NOW, "a", "b"),
            StageRecord("r2", "queue", NOW, NOW - S),  # ends before it starts: dropped
        ],
        [],
    )
    got = a.counts()
    assert (got.dropped_values, got.pairs_dropped, got.history_dropped) == (1, 0, 0)
    assert (got.analysis_failures, got.path_known) == (0, 0)
    assert [r.reason for r in got.path_unknown] == list(REASONS)
    assert a.fabric.pairs() == [("a", "b")]
