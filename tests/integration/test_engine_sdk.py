"""Spans shaped as SGLang, Dynamo and llm-d emit them (names, attributes, parentage and
resources as their tracing code builds them), sent by the real OpenTelemetry SDK over
OTLP/gRPC and OTLP/HTTP, linked prefill -> decode and joined with the agents' hosts."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from fabricprobe.collector.service import CollectorServer, ServerConfig
from fabricprobe.core.api import fabricprobe_pb2 as pb

MS = 1_000_000


@pytest.fixture
def collector() -> Iterator[CollectorServer]:
    server = CollectorServer(
        ServerConfig(listen="127.0.0.1:0", metrics_listen="", otlp_http_listen="127.0.0.1:0")
    )
    server.start()
    for name, addr in [
        ("sg-prefill", "127.0.0.2"),
        ("sg-decode", "127.0.0.3"),
        ("dyn-prefill", "127.0.0.4"),
        ("dyn-decode", "127.0.0.5"),
        ("llmd-prefill", "127.0.0.6"),
        ("llmd-decode", "127.0.0.7"),
    ]:
        server.api.register(pb.HostInfo(host=name, addresses=[addr]))
    yield server
    server.stop(0)


def provider(server: CollectorServer, host: str, service: str, http: bool) -> TracerProvider:
    """A process's tracer provider as the engines set one up: OTLP exporter, resource
    from OTEL-style attributes."""
    if http:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter: Any = OTLPSpanExporter(
            endpoint=f"http://127.0.0.1:{server.otlp_http_port}/v1/traces"
        )
    else:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        exporter = GrpcExporter(endpoint=f"127.0.0.1:{server.port}", insecure=True)
    p = TracerProvider(resource=Resource.create({"service.name": service, "host.name": host}))
    p.add_span_processor(SimpleSpanProcessor(exporter))
    return p


def span(tracer: Any, name: str, ctx: Any, start: int, ms: float, **attrs: Any) -> Any:
    s = tracer.start_span(name, context=ctx, start_time=start, attributes=attrs)
    s.end(end_time=start + int(ms * MS))
    return trace.set_span_in_context(s)


def sglang_request(pre: TracerProvider, dec: TracerProvider, t: int, rid: str, room: int) -> None:
    """srt/tracing/trace.py: a bootstrap-room span, "<role> Req <rid8>" under it, a
    thread span per scheduler thread, stage slices under the thread span; the decode
    side continues the prefill side's room context (propagated with the request)."""
    tp, td = pre.get_tracer("sglang server"), dec.get_tracer("sglang server")
    room_ctx = span(tp, f"Bootstrap Room {hex(room)}", None, t, 40, bootstrap_room=hex(room))
    req = span(tp, f"prefill Req {rid[:8]}", room_ctx, t, 30, rid=rid)
    th = span(
        tp, "Scheduler [TP 0] (host:ab12cd34 | pid:4242)", req, t, 30,
        host_id="ab12cd34ef", pid=4242, thread_label="Scheduler", tp_rank=0,
    )  # fmt: skip
    for name, off, ms in [
        ("prefill_bootstrap", 0, 2),
        ("prefill_waiting", 2, 1),
        ("prefill_forward", 3, 12),
        ("prefill_transfer_kv_cache", 15, 9),
    ]:
        span(tp, name, th, t + off * MS, ms)
    dreq = span(td, f"decode Req {rid[:8]}", room_ctx, t + MS, 60, rid=rid)
    dth = span(
        td, "Scheduler [TP 0] (host:ef56ab78 | pid:777)", dreq, t + MS, 60,
        host_id="ef56ab78cd", pid=777, thread_label="Scheduler", tp_rank=0,
    )  # fmt: skip
    for name, off, ms in [
        ("decode_prepare", 1, 1),
        ("decode_bootstrap", 2, 3),
        ("decode_transferred", 5, 21),
        ("decode_waiting", 26, 1),
        ("decode_forward", 27, 30),
    ]:
        span(td, name, dth, t + off * MS, ms)


def dynamo_request(
    front: TracerProvider, pre: TracerProvider, dec: TracerProvider, t: int, rid: str
) -> None:
    """Dynamo: the frontend's request, each worker's `engine.generate` under it with its
    disaggregation role; the decode worker reports TTFT in ms."""
    root = span(front.get_tracer("dynamo"), "http-request", None, t, 80, x_request_id=rid)
    span(pre.get_tracer("dynamo.worker"), "engine.generate", root, t + MS, 20,
         disagg_role="prefill", x_request_id=rid)  # fmt: skip
    span(dec.get_tracer("dynamo.worker"), "engine.generate", root, t + 22 * MS, 55,
         disagg_role="decode", x_request_id=rid, ttft_ms=31.5)  # fmt: skip


def llmd_request(
    side: TracerProvider, pre: TracerProvider, dec: TracerProvider, t: int, rid: str
) -> None:
    """llm-d's routing sidecar (beside the decode vLLM): its server span, forward_request,
    prefill (naming the prefill target) then decode; the vLLM instances behind it send
    llm_request in the same trace."""
    ts = side.get_tracer("llm-d-pd-proxy")
    conn = {"llm_d.pd_proxy.connector": "nixlv2"}
    top = span(ts, "llm_d.pd_proxy.POST /v1/chat/completions", None, t, 100)
    path = {"llm_d.pd_proxy.request_path": "/v1/chat/completions"}
    fwd = span(ts, "forward_request", top, t, 100, **conn, **path)
    target = {"llm_d.pd_proxy.prefill_target": "127.0.0.6:8000"}
    span(ts, "prefill", fwd, t + MS, 30, **conn, **target)
    dctx = span(ts, "decode", fwd, t + 32 * MS, 65, **conn)
    vllm = {
        "gen_ai.request.id": rid,
        "gen_ai.latency.time_in_model_prefill": 0.02,
        "gen_ai.latency.time_to_first_token": 0.025,
        "gen_ai.usage.prompt_tokens": 100,
    }
    p_side = {
        "gen_ai.latency.time_in_queue": 0.002,
        "gen_ai.latency.e2e": 0.027,
        "gen_ai.latency.time_in_model_decode": 0.0,
        "gen_ai.usage.completion_tokens": 1,
    }
    d_side = {
        "gen_ai.latency.time_in_queue": 0.012,
        "gen_ai.latency.e2e": 0.06,
        "gen_ai.latency.time_in_model_decode": 0.03,
        "gen_ai.usage.completion_tokens": 9,
    }
    span(pre.get_tracer("vllm.api_server"), "llm_request", fwd, t + 2 * MS, 27, **vllm, **p_side)
    span(dec.get_tracer("vllm.api_server"), "llm_request", dctx, t + 33 * MS, 60, **vllm, **d_side)


def test_sglang_dynamo_llmd_spans_through_the_sdk_are_linked(collector: CollectorServer) -> None:
    now = time.time_ns() - 2_000 * MS
    # prefill sides export over gRPC, decode sides over HTTP
    sg = (
        provider(collector, "sg-prefill", "sglang", False),
        provider(collector, "sg-decode", "sglang", True),
    )
    dy = (
        provider(collector, "dyn-frontend", "dynamo-frontend", False),
        provider(collector, "dyn-prefill", "dynamo-worker-prefill", False),
        provider(collector, "dyn-decode", "dynamo-worker-decode", True),
    )
    ld = (
        provider(collector, "llmd-decode", "llm-d-pd-proxy", True),
        provider(collector, "llmd-prefill", "vllm-prefill", False),
        provider(collector, "llmd-decode", "vllm-decode", True),
    )
    for i in range(3):
        t = now + i * 200 * MS
        sglang_request(*sg, t, f"sgl{i:05d}aaaa", 0x1F00 + i)
        dynamo_request(*dy, t, f"dyn-{i}")
        llmd_request(*ld, t, f"llmd-{i}")
    for p in (*sg, *dy, *ld):
        p.shutdown()
    att = collector.attribution
    res = att.analyse(window_s=600)
    req = res.requests.set_index("request_id")
    for i in range(3):
        sgr = req.loc[f"sgl{i:05d}aaaa"]
        assert sgr["path"] == "sg-prefill->sg-decode"
        assert sgr["kv_transfer_s"] == pytest.approx(0.021)  # decode_transferred
        assert sgr["prefill_s"] == pytest.approx(0.012)
        d = req.loc[f"dyn-{i}"]
        assert d["path"] == "dyn-prefill->dyn-decode"
        # from the prefill worker's start to the decode worker's first token
        assert d["ttft_s"] == pytest.approx(0.021 + 0.0315)
        assert str(d["kv_source"] or "") == ""  # Dynamo's spans carry no KV time
        assert d["fabric_share_ttft"] != d["fabric_share_ttft"]  # NaN: not known, not 0
        ll = req.loc[f"llmd-{i}"]
        assert ll["path"] == "llmd-prefill->llmd-decode"
        assert ll["kv_transfer_s"] == pytest.approx(0.012)  # decode vLLM's time_in_queue
    assert att.ingest.engine_spans["sglang"] == 3 * 14
    assert att.ingest.engine_spans["dynamo"] == 9
    assert att.ingest.unmapped["dynamo"] == 3  # the frontend's own span: counted, not used
    assert att.ingest.engine_spans["llm-d"] == 3 * 4
    assert att.ingest.rejected_total == 0
    att.clock = lambda: time.time_ns() + 10_000 * MS
    att.sync()
    assert att.linker.path_known_total == 9
    assert sum(att.linker.path_unknown_total.values()) == 0
