"""Inference engines' own spans -> fragments of a request, one engine side at a time.

Real engines send no `fabricprobe.*` attribute. Each span they do send is mapped to a
`Fragment` (engines/common.py): which engine and role sent it, the keys that link it to
the other side of the same request (trace id, request id, SGLang's bootstrap room),
where it ran (the resource's host attributes), the stages it measured and what it says
about the wait for remote KV. collector/attribution/linking.py groups fragments into
requests and finds their path.

One module per engine (vllm, sglang, dynamo, llmd) knows that engine's span names and
attributes, with the version they were read from; collector/README.md lists them
("Engine spans"). A span of a known engine whose name is not mapped is reported as
`None` (counted by the receiver as unmapped, never an error).
"""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.trace.v1 import trace_pb2

from fabricprobe.collector.attribution.engines import dynamo, llmd, sglang, vllm
from fabricprobe.collector.attribution.engines.common import (
    HOST_ATTRIBUTES,
    EngineMapping,
    Fragment,
    origin_of,
)
from fabricprobe.collector.attribution.spanattrs import span_attributes

ENGINES = (vllm.ENGINE, sglang.ENGINE, dynamo.ENGINE, llmd.ENGINE)
# the order a span's name is tried in: vLLM's and llm-d's names are exact or prefixed,
# SGLang's last (its request spans are told by a pattern)
_BY_NAME: tuple[EngineMapping, ...] = (vllm.MAPPING, llmd.MAPPING, dynamo.MAPPING, sglang.MAPPING)
# the order a tracer's or service's name is tried in: vLLM before llm-d, since
# "vllm-decode" holds "llm-d"
_BY_SCOPE: tuple[EngineMapping, ...] = (
    sglang.MAPPING,
    vllm.MAPPING,
    dynamo.MAPPING,
    llmd.MAPPING,
)
_MAPPINGS = {m.engine: m for m in _BY_NAME}


def engine_of(name: str, attrs: dict[str, Any]) -> str | None:
    """Which engine's span this is, by its name (and the attributes only that engine sets)."""
    for m in _BY_NAME:
        if m.claims(name, attrs):
            return m.engine
    return None


def engine_of_scope(scope: str, resource: dict[str, Any]) -> str | None:
    """The engine whose tracer (instrumentation scope) or service sent a span the
    mappings do not know: such spans are counted as that engine's unmapped ones."""
    text = (scope + " " + str(resource.get("service.name", ""))).lower()
    for m in _BY_SCOPE:
        if any(mark in text for mark in m.scope_marks):
            return m.engine
    return None


def parse_fragment(
    span: trace_pb2.Span,
    attrs: dict[str, Any],
    resource: dict[str, Any],
    host_keys: tuple[str, ...] = HOST_ATTRIBUTES,
) -> Fragment | None:
    """The fragment of an engine span; None when the span is no engine's (or is an
    engine's span this receiver does not map). SpanError for a malformed one."""
    engine = engine_of(span.name, attrs)
    if engine is None:
        return None
    origin = origin_of(span, engine, resource, attrs, host_keys)
    return _MAPPINGS[engine].fragment(span, attrs, origin)


def read_engine_span(
    span: trace_pb2.Span, resource: dict[str, Any], scope: str
) -> tuple[Fragment | None, str | None]:
    """(fragment, engine) of an engine's span; (None, engine) for one not mapped, the
    engine told by its tracer or service; (None, None) for a span that is no engine's,
    fabricprobe's own spans included (the workload's keep their meaning). SpanError for
    a malformed one."""
    attrs = span_attributes(span)
    if any(k.startswith("fabricprobe.") for k in attrs):
        return None, None
    engine = engine_of(span.name, attrs)
    if engine is None:
        return None, engine_of_scope(scope, resource)
    return parse_fragment(span, attrs, resource), engine
