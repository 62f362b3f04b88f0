"""OTLP spans -> stage records, following the stage conventions of docs/design.md.

A stage span is named after its stage (`queue`, `prefill`, `kv_transfer`, `decode`,
`detokenize`, `deliver`) or carries `fabricprobe.stage`. vLLM's `llm_request` span is
taken as vLLM sends it: one span per request whose `gen_ai.latency.*` attributes give
queue, prefill and decode times, TTFT and end-to-end latency; it becomes a RequestRecord
plus derived stage records. Each span is checked on its own, so one bad span costs
only itself (SpanError says what was wrong with it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

STAGES: tuple[str, ...] = ("queue", "prefill", "kv_transfer", "decode", "detokenize", "deliver")
FABRIC_STAGES = frozenset({"kv_transfer"})
TRANSPORTS = frozenset({"rdma", "tcp"})
VLLM_SPAN = "llm_request"

MAX_ATTRIBUTES = 128
MAX_STRING = 1024
MAX_NAME = 256
MAX_SPAN_SECONDS = 24 * 3600.0


class SpanError(ValueError):
    """One span that cannot be taken; the message says why."""


@dataclass(frozen=True)
class StageRecord:
    """One stage of one request, with the path it crossed if it crossed the fabric."""

    request_id: str
    stage: str
    start_ns: int
    end_ns: int
    src: str = ""
    dst: str = ""
    src_device: str = ""
    dst_device: str = ""
    transport: str = ""
    bytes: int = 0
    derived: bool = False  # computed from an llm_request span, not measured as a span

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


@dataclass(frozen=True)
class RequestRecord:
    """Request-level figures: vLLM's llm_request span, or the workload's equivalent."""

    request_id: str
    start_ns: int
    end_ns: int
    ttft_s: float | None
    e2e_s: float | None
    output_tokens: int | None
    prompt_tokens: int | None
    model: str = ""

    @property
    def itl_s(self) -> float | None:
        """Mean inter-token latency: time after the first token over the tokens after it."""
        if self.ttft_s is None or self.e2e_s is None or not self.output_tokens:
            return None
        if self.output_tokens < 2:
            return None
        return max(0.0, self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


def _value(v: common_pb2.AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind in ("array_value", "kvlist_value", "bytes_value"):
        return _Unsupported(kind)
    return getattr(v, kind)


class _Unsupported:
    def __init__(self, kind: str) -> None:
        self.kind = kind


def span_attributes(span: trace_pb2.Span) -> dict[str, Any]:
    """Scalar attributes of SPAN; SpanError for too many, too long or duplicated ones."""
    if len(span.attributes) > MAX_ATTRIBUTES:
        raise SpanError(f"{len(span.attributes)} attributes (at most {MAX_ATTRIBUTES})")
    out: dict[str, Any] = {}
    for kv in span.attributes:
        if not kv.key or len(kv.key) > MAX_NAME:
            raise SpanError(f"attribute key of {len(kv.key)} characters")
        value = _value(kv.value)
        if isinstance(value, str) and len(value) > MAX_STRING:
            raise SpanError(f"attribute {kv.key} longer than {MAX_STRING} characters")
        out[kv.key] = value
    return out


def _str(attrs: dict[str, Any], key: str) -> str:
    v = attrs.get(key)
    if v is None:
        return ""
    if not isinstance(v, str):
        raise SpanError(f"attribute {key} must be a string, not {type(v).__name__}")
    return v


def _num(attrs: dict[str, Any], key: str) -> float | None:
    v = attrs.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise SpanError(f"attribute {key} must be a number, not {type(v).__name__}")
    if not math.isfinite(v) or v < 0:  # inf would overflow int() and NaN compares false
        raise SpanError(f"attribute {key} = {v} is not a finite non-negative number")
    return float(v)


def _int(attrs: dict[str, Any], key: str) -> int | None:
    v = _num(attrs, key)
    return None if v is None else int(v)


def _request_id(span: trace_pb2.Span, attrs: dict[str, Any]) -> str:
    rid = _str(attrs, "gen_ai.request.id")
    if rid:
        return rid
    if len(span.trace_id) != 16 or not any(span.trace_id):
        raise SpanError("no gen_ai.request.id and no valid trace id")
    return span.trace_id.hex()


def _times(span: trace_pb2.Span) -> tuple[int, int]:
    start, end = int(span.start_time_unix_nano), int(span.end_time_unix_nano)
    if not start or not end:
        raise SpanError("span without start or end time")
    if end < start:
        raise SpanError("span ends before it starts")
    if (end - start) / 1e9 > MAX_SPAN_SECONDS:
        raise SpanError(f"span longer than {MAX_SPAN_SECONDS:.0f} s")
    return start, end


def stage_name(span: trace_pb2.Span, attrs: dict[str, Any]) -> str | None:
    """The span's stage, None when the span is not a stage span (those are ignored)."""
    given = _str(attrs, "fabricprobe.stage")
    if given:
        if given not in STAGES:
            raise SpanError(f"unknown stage {given[:40]!r} (stages: {', '.join(STAGES)})")
        return given
    return span.name if span.name in STAGES else None


Parsed = tuple[list[StageRecord], RequestRecord | None]


def parse_span(span: trace_pb2.Span) -> Parsed:
    """Stage records and request record of one span; ([], None) for a span of no interest."""
    if len(span.name) > MAX_NAME:
        raise SpanError(f"span name of {len(span.name)} characters")
    attrs = span_attributes(span)
    if span.name == VLLM_SPAN:
        return parse_llm_request(span, attrs)
    stage = stage_name(span, attrs)
    if stage is None:
        return [], None
    start, end = _times(span)
    rid = _request_id(span, attrs)
    transport = _str(attrs, "fabricprobe.transport")
    if transport and transport not in TRANSPORTS:
        raise SpanError(f"transport {transport[:20]!r} is not rdma or tcp")
    src, dst = _str(attrs, "fabricprobe.src.host"), _str(attrs, "fabricprobe.dst.host")
    if stage in FABRIC_STAGES and not (src and dst):
        raise SpanError(f"{stage} span without fabricprobe.src.host and fabricprobe.dst.host")
    rec = StageRecord(
        request_id=rid,
        stage=stage,
        start_ns=start,
        end_ns=end,
        src=src,
        dst=dst,
        src_device=_str(attrs, "fabricprobe.src.device"),
        dst_device=_str(attrs, "fabricprobe.dst.device"),
        transport=transport,
        bytes=_int(attrs, "fabricprobe.bytes") or 0,
    )
    return [rec], _request_from_attrs(rid, start, end, attrs) if _has_latency(attrs) else None


def _has_latency(attrs: dict[str, Any]) -> bool:
    return any(k.startswith("gen_ai.latency.") for k in attrs)


def _request_from_attrs(rid: str, start: int, end: int, attrs: dict[str, Any]) -> RequestRecord:
    out_tokens = _int(attrs, "gen_ai.usage.completion_tokens")
    if out_tokens is None:
        out_tokens = _int(attrs, "gen_ai.usage.output_tokens")
    in_tokens = _int(attrs, "gen_ai.usage.prompt_tokens")
    if in_tokens is None:
        in_tokens = _int(attrs, "gen_ai.usage.input_tokens")
    return RequestRecord(
        request_id=rid,
        start_ns=start,
        end_ns=end,
        ttft_s=_num(attrs, "gen_ai.latency.time_to_first_token"),
        e2e_s=_num(attrs, "gen_ai.latency.e2e"),
        output_tokens=out_tokens,
        prompt_tokens=in_tokens,
        model=_str(attrs, "gen_ai.response.model")[:MAX_NAME],
    )


def parse_llm_request(span: trace_pb2.Span, attrs: dict[str, Any]) -> Parsed:
    """vLLM's request span: a RequestRecord, and queue / prefill / decode laid end to end
    from the span's start (vLLM starts it at arrival), marked as derived."""
    start, end = _times(span)
    rid = _request_id(span, attrs)
    req = _request_from_attrs(rid, start, end, attrs)
    stages: list[StageRecord] = []
    t = start
    for stage, key in (
        ("queue", "gen_ai.latency.time_in_queue"),
        ("prefill", "gen_ai.latency.time_in_model_prefill"),
        ("decode", "gen_ai.latency.time_in_model_decode"),
    ):
        seconds = _num(attrs, key)
        if seconds is None:
            continue
        if seconds > MAX_SPAN_SECONDS:
            raise SpanError(f"{key} = {seconds} s is implausible")
        step = int(seconds * 1e9)
        stages.append(StageRecord(rid, stage, t, t + step, derived=True))
        t += step
    return stages, req
