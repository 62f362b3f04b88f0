"""OTLP receiver: span-by-span validation, partial success, whole-batch refusals over gRPC."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc  # type: ignore[import-untyped]
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as ts_grpc

from fabricprobe.collector.attribution.otlp import BatchRefused, TraceIngest, add_trace_service
from fabricprobe.collector.attribution.stages import RequestRecord, StageRecord
from tests.unit.spanmaker import S, batch, kv_span, span

Taken = list[tuple[list[StageRecord], list[RequestRecord]]]


@pytest.fixture
def taken() -> Taken:
    return []


@pytest.fixture
def ingest(taken: Taken) -> TraceIngest:
    return TraceIngest(lambda st, rq, _frags: taken.append((st, rq)), max_spans=10)


GOOD = kv_span("r1", 10 * S, 0.1, "h0", "h1", 1024)
BAD = span("queue", 2 * S, S)


def test_good_spans_survive_bad_neighbours(ingest: TraceIngest, taken: Taken) -> None:
    res = ingest.export(batch(BAD, GOOD, span("unrelated", S, 2 * S), BAD))
    assert (res.accepted, res.rejected, res.ignored) == (1, 2, 1)
    assert "ends before it starts" in res.reasons[0]
    assert [r.request_id for r in taken[0][0]] == ["r1"]
    assert (ingest.received_total, ingest.rejected_total) == (4, 2)


def test_wholly_malformed_and_oversized_batches_are_refused(ingest: TraceIngest) -> None:
    with pytest.raises(BatchRefused) as e:
        ingest.export(batch(BAD, BAD))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(BatchRefused) as e:
        ingest.export(batch(*[GOOD] * 11))
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert ingest.batches_refused_total == 2


@pytest.fixture
def stub(ingest: TraceIngest) -> Iterator[ts_grpc.TraceServiceStub]:
    server = grpc.server(futures.ThreadPoolExecutor(2))
    add_trace_service(server, ingest)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        yield ts_grpc.TraceServiceStub(ch)
    server.stop(0)


def test_grpc_partial_success_and_status_codes(stub: ts_grpc.TraceServiceStub) -> None:
    resp = stub.Export(batch(GOOD, BAD), timeout=5)
    assert resp.partial_success.rejected_spans == 1
    assert "1 spans rejected" in resp.partial_success.error_message
    assert not stub.Export(batch(GOOD), timeout=5).HasField("partial_success")
    with pytest.raises(grpc.RpcError) as e:
        stub.Export(batch(BAD), timeout=5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        stub.Export(batch(*[GOOD] * 11), timeout=5)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_the_collector_serves_otlp_and_refuses_a_batch_over_its_message_limit() -> None:
    from fabricprobe.collector.service import MAX_MESSAGE_BYTES, CollectorServer, ServerConfig

    server = CollectorServer(ServerConfig(listen="127.0.0.1:0", metrics_listen=""))
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = ts_grpc.TraceServiceStub(ch)
            assert not stub.Export(batch(GOOD), timeout=5).HasField("partial_success")
            big = span("queue", S, 2 * S, **{"note": "x" * 1000})
            with pytest.raises(grpc.RpcError) as e:
                stub.Export(batch(*[big] * (MAX_MESSAGE_BYTES // 1000 + 10)), timeout=10)
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert server.attribution.ingest.received_total == 1
    finally:
        server.stop(0)


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan"), 1e300])
def test_a_non_finite_or_huge_attribute_costs_only_its_span(
    ingest: TraceIngest, taken: Taken, value: float
) -> None:
    odd = span(
        "llm_request",
        3 * S,
        4 * S,
        **{"gen_ai.request.id": "r9", "gen_ai.usage.prompt_tokens": value},
    )
    res = ingest.export(batch(odd, GOOD))
    assert res.accepted >= 1 and res.rejected <= 1
    assert "r1" in [r.request_id for r in taken[0][0]]
