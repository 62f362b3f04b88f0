"""One OTLP span read with care: its scalar attributes, typed, and its times.

Every reader of spans (stage spans, the engines' mappings, the shards' routing) takes a
span's attributes and times through these functions, so that one malformed span raises
SpanError with what was wrong, whoever reads it.
"""

from __future__ import annotations

import math
from typing import Any

from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

MAX_ATTRIBUTES = 128
MAX_STRING = 1024
MAX_NAME = 256
MAX_SPAN_SECONDS = 24 * 3600.0


class SpanError(ValueError):
    """One span that cannot be taken; the message says why."""


class _Unsupported:
    def __init__(self, kind: str) -> None:
        self.kind = kind


def _value(v: common_pb2.AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind in ("array_value", "kvlist_value", "bytes_value"):
        return _Unsupported(kind)
    return getattr(v, kind)


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


def str_attr(attrs: dict[str, Any], key: str) -> str:
    """The string attribute KEY, "" when absent; SpanError when it is not a string."""
    v = attrs.get(key)
    if v is None:
        return ""
    if not isinstance(v, str):
        raise SpanError(f"attribute {key} must be a string, not {type(v).__name__}")
    return v


def num_attr(attrs: dict[str, Any], key: str) -> float | None:
    """The number attribute KEY, None when absent; SpanError unless finite and >= 0."""
    v = attrs.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise SpanError(f"attribute {key} must be a number, not {type(v).__name__}")
    if not math.isfinite(v) or v < 0:  # inf would overflow int() and NaN compares false
        raise SpanError(f"attribute {key} = {v} is not a finite non-negative number")
    return float(v)


def int_attr(attrs: dict[str, Any], key: str) -> int | None:
    """num_attr() as a whole number (a count of tokens, of bytes)."""
    v = num_attr(attrs, key)
    return None if v is None else int(v)


def seconds_attr(attrs: dict[str, Any], key: str) -> float | None:
    """num_attr() of a duration in seconds, at most MAX_SPAN_SECONDS."""
    v = num_attr(attrs, key)
    if v is not None and v > MAX_SPAN_SECONDS:
        raise SpanError(f"{key} = {v} s is implausible")
    return v


def span_times(span: trace_pb2.Span) -> tuple[int, int]:
    """(start, end) of SPAN in ns since the epoch: both given, in order, at most a day apart."""
    start, end = int(span.start_time_unix_nano), int(span.end_time_unix_nano)
    if not start or not end:
        raise SpanError("span without start or end time")
    if end < start:
        raise SpanError("span ends before it starts")
    if (end - start) / 1e9 > MAX_SPAN_SECONDS:
        raise SpanError(f"span longer than {MAX_SPAN_SECONDS:.0f} s")
    return start, end


def trace_hex(span: trace_pb2.Span) -> str:
    """SPAN's trace id in hex; "" when it has none that is valid (16 bytes, not all 0)."""
    if len(span.trace_id) != 16 or not any(span.trace_id):
        return ""
    return span.trace_id.hex()
