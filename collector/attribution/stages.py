"""OTLP spans -> stage records, following the stage conventions of docs/design.md.

A stage span is named after its stage (`queue`, `prefill`, `kv_transfer`, `decode`,
`detokenize`, `deliver`) or carries `fabricprobe.stage`. vLLM's `llm_request` span is
taken as vLLM sends it: one span per request whose `gen_ai.latency.*` attributes give
queue, prefill and decode times, TTFT and end-to-end latency; it becomes a RequestRecord
plus derived stage records. Each span is checked on its own, so one bad span costs
only itself (SpanError says what was wrong with it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.trace.v1 import trace_pb2

from fabricprobe.collector.attribution.engines.vllm import (
    REQUEST_SPAN,
    laid_out,
    request_figures,
)
from fabricprobe.collector.attribution.spanattrs import (
    MAX_NAME,
    SpanError,
    int_attr,
    seconds_attr,
    span_attributes,
    span_times,
    str_attr,
    trace_hex,
)

STAGES: tuple[str, ...] = ("queue", "prefill", "kv_transfer", "decode", "detokenize", "deliver")
FABRIC_STAGES = frozenset({"kv_transfer"})
TRANSPORTS = frozenset({"rdma", "tcp"})
# a KV transfer's round trips as its span gives them: one per layer of the deepest model
# a few times over is plenty; more is a bad span
MAX_ROUND_TRIPS = 1 << 16
# how far a transfer's library time may run past its span's end (the two are read from
# different clocks of the same host)
LIBRARY_SLACK_S = 1e-3


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
    round_trips: int = 0  # the transfer protocol's, where the span says (0: not said)
    library_s: float = 0.0  # the transfer library's own time, where the span says (0: not)
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


def _request_id(span: trace_pb2.Span, attrs: dict[str, Any]) -> str:
    rid = str_attr(attrs, "gen_ai.request.id")
    if rid:
        return rid
    tid = trace_hex(span)
    if not tid:
        raise SpanError("no gen_ai.request.id and no valid trace id")
    return tid


def stage_name(span: trace_pb2.Span, attrs: dict[str, Any]) -> str | None:
    """The span's stage, None when the span is not a stage span (those are ignored)."""
    given = str_attr(attrs, "fabricprobe.stage")
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
    if span.name == REQUEST_SPAN:
        return parse_llm_request(span, attrs)
    stage = stage_name(span, attrs)
    if stage is None:
        return [], None
    start, end = span_times(span)
    rid = _request_id(span, attrs)
    path = _path(stage, attrs)
    rec = StageRecord(request_id=rid, stage=stage, start_ns=start, end_ns=end, **path)
    if rec.library_s > rec.duration_s + LIBRARY_SLACK_S:
        raise SpanError(
            f"fabricprobe.library_seconds = {rec.library_s} s, longer than its span "
            f"({rec.duration_s:.6f} s)"
        )
    return [rec], _request_from_attrs(rid, start, end, attrs) if _has_latency(attrs) else None


def _path(stage: str, attrs: dict[str, Any]) -> dict[str, Any]:
    """The fabric path a stage span names (its fabricprobe.* attributes), under the names a
    StageRecord gives them; SpanError for a fabric stage without both hosts."""
    transport = str_attr(attrs, "fabricprobe.transport")
    if transport and transport not in TRANSPORTS:
        raise SpanError(f"transport {transport[:20]!r} is not rdma or tcp")
    src, dst = str_attr(attrs, "fabricprobe.src.host"), str_attr(attrs, "fabricprobe.dst.host")
    if stage in FABRIC_STAGES and not (src and dst):
        raise SpanError(f"{stage} span without fabricprobe.src.host and fabricprobe.dst.host")
    round_trips = int_attr(attrs, "fabricprobe.round_trips") or 0
    if not 0 <= round_trips <= MAX_ROUND_TRIPS:
        raise SpanError(f"fabricprobe.round_trips = {round_trips} outside 0..{MAX_ROUND_TRIPS}")
    return {
        "src": src,
        "dst": dst,
        "src_device": str_attr(attrs, "fabricprobe.src.device"),
        "dst_device": str_attr(attrs, "fabricprobe.dst.device"),
        "transport": transport,
        "bytes": int_attr(attrs, "fabricprobe.bytes") or 0,
        "round_trips": round_trips,
        "library_s": seconds_attr(attrs, "fabricprobe.library_seconds") or 0.0,
    }


def _has_latency(attrs: dict[str, Any]) -> bool:
    return any(k.startswith("gen_ai.latency.") for k in attrs)


def _request_from_attrs(rid: str, start: int, end: int, attrs: dict[str, Any]) -> RequestRecord:
    return RequestRecord(request_id=rid, start_ns=start, end_ns=end, **request_figures(attrs))


def parse_llm_request(span: trace_pb2.Span, attrs: dict[str, Any]) -> Parsed:
    """vLLM's request span: a RequestRecord, and queue / prefill / decode laid end to end
    from the span's start (vLLM starts it at arrival), marked as derived."""
    start, end = span_times(span)
    rid = _request_id(span, attrs)
    req = _request_from_attrs(rid, start, end, attrs)
    stages = [StageRecord(rid, st, a, b, derived=True) for st, a, b in laid_out(attrs, start)]
    return stages, req
