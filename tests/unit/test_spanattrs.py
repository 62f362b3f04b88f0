"""Reading one span's attributes and times: typed values, or SpanError saying why not;
and which engine a span belongs to, told by its name, attributes or tracer."""

from __future__ import annotations

import math
from typing import Any

import pytest

from fabricprobe.collector.attribution.engines import engine_of, engine_of_scope, read_engine_span
from fabricprobe.collector.attribution.spanattrs import (
    MAX_SPAN_SECONDS,
    SpanError,
    int_attr,
    num_attr,
    seconds_attr,
    span_times,
    str_attr,
    trace_hex,
)
from tests.unit.spanmaker import S, span

ATTRS: dict[str, Any] = {"s": "text", "i": 3, "f": 2.5, "b": True, "neg": -1.0,
                         "inf": math.inf, "nan": math.nan, "big": 2 * MAX_SPAN_SECONDS}  # fmt: skip


@pytest.mark.parametrize(
    ("read", "key", "want"),
    [
        (str_attr, "s", "text"),
        (str_attr, "absent", ""),
        (num_attr, "i", 3.0),
        (num_attr, "f", 2.5),
        (num_attr, "absent", None),
        (int_attr, "f", 2),
        (seconds_attr, "f", 2.5),
    ],
)
def test_attributes_read_as_their_type(read: Any, key: str, want: object) -> None:
    assert read(ATTRS, key) == want


@pytest.mark.parametrize(
    ("read", "key", "says"),
    [
        (str_attr, "i", "must be a string, not int"),
        (num_attr, "s", "must be a number, not str"),
        (num_attr, "b", "must be a number, not bool"),
        (num_attr, "neg", "not a finite non-negative number"),
        (num_attr, "inf", "not a finite non-negative number"),
        (int_attr, "nan", "not a finite non-negative number"),
        (seconds_attr, "big", "is implausible"),
    ],
)
def test_bad_attributes_say_what_is_wrong(read: Any, key: str, says: str) -> None:
    with pytest.raises(SpanError, match=says):
        read(ATTRS, key)


@pytest.mark.parametrize(
    ("start", "end", "says"),
    [
        (0, S, "without start or end"),
        (2 * S, S, "ends before it starts"),
        (S, S + int(MAX_SPAN_SECONDS + 1) * S, "span longer than"),
    ],
)
def test_span_times_must_be_given_ordered_and_bounded(start: int, end: int, says: str) -> None:
    with pytest.raises(SpanError, match=says):
        span_times(span("queue", start, end))


def test_times_and_trace_id_of_a_good_span() -> None:
    s = span("queue", S, 2 * S)
    assert span_times(s) == (S, 2 * S)
    assert trace_hex(s) == bytes(range(1, 17)).hex()
    s.trace_id = bytes(16)
    assert trace_hex(s) == ""


@pytest.mark.parametrize(
    ("name", "attrs", "engine"),
    [
        ("llm_request", {}, "vllm"),
        ("vllm_async_kv_transfer", {}, "vllm"),
        ("llm_d.pd_proxy.POST /v1/completions", {}, "llm-d"),
        ("forward_request", {}, "llm-d"),
        ("prefill", {"llm_d.pd_proxy.request_id": "x"}, "llm-d"),
        ("prefill", {}, None),  # a bare stage name: fabricprobe's own, not an engine's
        ("engine.generate", {}, "dynamo"),
        ("decode_transferred", {}, "sglang"),
        ("Bootstrap Room 0x1f", {}, "sglang"),
        ("Req 1a2b3c4d", {"rid": "1a2b3c4d"}, "sglang"),
        ("Req 1a2b3c4d", {}, None),
        ("GET /health", {}, None),
    ],
)
def test_an_engine_is_told_by_its_span_names(
    name: str, attrs: dict[str, Any], engine: str | None
) -> None:
    assert engine_of(name, attrs) == engine


def test_an_unmapped_span_goes_to_the_engine_its_tracer_or_service_names() -> None:
    assert engine_of_scope("sglang.srt", {}) == "sglang"
    assert engine_of_scope("", {"service.name": "vllm-decode"}) == "vllm"  # holds "llm-d"
    assert engine_of_scope("", {"service.name": "llm_d-sidecar"}) == "llm-d"
    assert engine_of_scope("opentelemetry.instrumentation.grpc", {}) is None
    unmapped = span("prefill_new_stage", S, 2 * S)
    assert read_engine_span(unmapped, {}, "sglang") == (None, "sglang")
    ours = span("llm_request", S, 2 * S, **{"fabricprobe.stage": "queue"})
    assert read_engine_span(ours, {}, "vllm") == (None, None)  # fabricprobe's own
    frag, engine = read_engine_span(span("engine.generate", S, 2 * S), {"host.name": "h"}, "")
    assert engine == "dynamo" and frag is not None and frag.hosts == (("host.name", "h"),)
