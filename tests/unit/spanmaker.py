"""Small OTLP span builders for the attribution tests (protobufs as a sender would fill them)."""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts_pb
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

S = 1_000_000_000


def attr(key: str, value: Any) -> common_pb2.KeyValue:
    v = common_pb2.AnyValue()
    if isinstance(value, bool):
        v.bool_value = value
    elif isinstance(value, int):
        v.int_value = value
    elif isinstance(value, float):
        v.double_value = value
    elif isinstance(value, bytes):
        v.bytes_value = value
    else:
        v.string_value = value
    return common_pb2.KeyValue(key=key, value=v)


def span(name: str, start_ns: int, end_ns: int, **attrs: Any) -> trace_pb2.Span:
    return trace_pb2.Span(
        trace_id=bytes(range(1, 17)),
        span_id=bytes(range(1, 9)),
        name=name,
        start_time_unix_nano=start_ns,
        end_time_unix_nano=end_ns,
        attributes=[attr(k.replace("__", "."), v) for k, v in attrs.items()],
    )


def kv_span(
    rid: str, start_ns: int, seconds: float, src: str, dst: str, nbytes: int
) -> trace_pb2.Span:
    return span(
        "kv_transfer",
        start_ns,
        start_ns + int(seconds * S),
        **{
            "gen_ai.request.id": rid,
            "fabricprobe.src.host": src,
            "fabricprobe.dst.host": dst,
            "fabricprobe.transport": "rdma",
            "fabricprobe.bytes": nbytes,
        },
    )


def batch(*spans: trace_pb2.Span) -> ts_pb.ExportTraceServiceRequest:
    req = ts_pb.ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    ss = rs.scope_spans.add()
    ss.spans.extend(spans)
    return req
