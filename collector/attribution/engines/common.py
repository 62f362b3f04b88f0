"""What every engine's mapping shares: the fragment it makes of a span, and where and
when that span ran."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.trace.v1 import trace_pb2

from fabricprobe.collector.attribution.spanattrs import MAX_NAME, span_times, str_attr, trace_hex

ROLES = frozenset({"prefill", "decode"})
# resource attributes that name where a span ran, most specific first (configurable in
# linking.MatchConfig); span attributes of the same names are used after them
HOST_ATTRIBUTES = ("host.name", "service.instance.id", "k8s.pod.ip", "server.address", "host.ip")
IDENTITY_ATTRIBUTES = (
    "service.instance.id",
    "host.name",
    "k8s.pod.name",
    "k8s.pod.ip",
    "service.name",
)
MAX_KEY = 256


@dataclass(frozen=True)
class StageSpan:
    stage: str  # a collector stage name, or "kv_send" (the prefill side's view of the KV)
    start_ns: int
    end_ns: int
    measured: bool  # its own span (True) or laid out from a latency total (False)


@dataclass(frozen=True)
class Fragment:
    """What one engine span says about one side of one request."""

    engine: str
    kind: str  # "request" (a side's request-level span), "stage", "proxy", "link"
    role: str  # "prefill", "decode" or "" when the span does not say
    trace_id: str
    span_id: str
    parent_id: str
    keys: tuple[str, ...]  # link keys: "rid:<id>", "room:<n>"
    hosts: tuple[tuple[str, str], ...]  # (attribute, value): where it ran, best first
    identity: str  # the sending process (resource), which groups fragments into a side
    start_ns: int
    end_ns: int
    stages: tuple[StageSpan, ...] = ()
    request_id: str = ""
    ttft_s: float | None = None
    e2e_s: float | None = None
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    model: str = ""
    # on a side that turns out to be the decode side: the latency total that holds the
    # wait for remote KV when no span measures it ("" when none does)
    kv_total: str = ""
    kv_total_s: float | None = None
    max_tokens: int | None = None  # 1 on a prefill/decode proxy's prefill call
    peer: str = ""  # the other side's address when the span names it (llm-d)


@dataclass(frozen=True)
class Origin:
    """What every fragment of one span shares: the engine, the span's ids and times, and
    where it ran (its resource's host attributes, then the span's own)."""

    engine: str
    trace_id: str
    span_id: str
    parent_id: str
    hosts: tuple[tuple[str, str], ...]
    identity: str
    start_ns: int
    end_ns: int

    def fragment(self, kind: str, role: str, keys: tuple[str, ...], **figures: Any) -> Fragment:
        """The fragment of this span: its KIND, ROLE, link KEYS and what else it says (an
        Origin's fields are a Fragment's, under the same names)."""
        return Fragment(kind=kind, role=role, keys=keys, **vars(self), **figures)

    def measured(self, stage: str) -> StageSpan:
        """The span itself, as a measurement of STAGE."""
        return StageSpan(stage, self.start_ns, self.end_ns, measured=True)


@dataclass(frozen=True)
class EngineMapping:
    """One engine's reading of its own spans."""

    engine: str
    scope_marks: tuple[str, ...]  # words its tracer's or service's name holds
    claims: Callable[[str, dict[str, Any]], bool]  # (span name, attributes): its span?
    fragment: Callable[[trace_pb2.Span, dict[str, Any], Origin], Fragment]


def resource_hosts(
    resource: dict[str, Any], keys: tuple[str, ...] = HOST_ATTRIBUTES
) -> tuple[tuple[str, str], ...]:
    out = []
    for k in keys:
        v = resource.get(k)
        if isinstance(v, str) and v and len(v) <= MAX_NAME:
            out.append((k, v))
    return tuple(out)


def identity_of(resource: dict[str, Any]) -> str:
    parts = [f"{k}={resource[k]}" for k in IDENTITY_ATTRIBUTES if resource.get(k) not in (None, "")]
    return "|".join(parts)[:MAX_KEY] or "unknown"


def _span_id(raw: bytes) -> str:
    return raw.hex() if len(raw) == 8 and any(raw) else ""


def origin_of(
    span: trace_pb2.Span,
    engine: str,
    resource: dict[str, Any],
    attrs: dict[str, Any],
    host_keys: tuple[str, ...] = HOST_ATTRIBUTES,
) -> Origin:
    """SPAN's origin as ENGINE's; SpanError for times that cannot be taken."""
    start, end = span_times(span)
    return Origin(
        engine=engine,
        trace_id=trace_hex(span),
        span_id=_span_id(span.span_id),
        parent_id=_span_id(span.parent_span_id),
        hosts=resource_hosts(resource, host_keys) + resource_hosts(attrs, host_keys),
        identity=identity_of(resource),
        start_ns=start,
        end_ns=end,
    )


def link_keys(kind: str, value: str) -> tuple[str, ...]:
    """The link key of VALUE as a KIND ("rid", "room"); none for an empty VALUE."""
    return (f"{kind}:{value[:MAX_KEY]}",) if value else ()


def first_id(attrs: dict[str, Any], *keys: str) -> str:
    """The first of the string attributes KEYS that is given, cut to MAX_KEY ("" for none)."""
    for k in keys:
        got = str_attr(attrs, k)[:MAX_KEY]
        if got:
            return got
    return ""
