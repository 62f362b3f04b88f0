"""Dynamo's spans (components' worker handlers, main of 2026): `engine.generate` per
worker call, with its role (`disagg_role`), its request id and TTFT. The wait for remote
KV is not in it: the engine inside the worker (vLLM, SGLang) sends that."""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.trace.v1 import trace_pb2

from fabricprobe.collector.attribution.engines.common import (
    ROLES,
    EngineMapping,
    Fragment,
    Origin,
    first_id,
    link_keys,
)
from fabricprobe.collector.attribution.spanattrs import num_attr, str_attr

ENGINE = "dynamo"
GENERATE = "engine.generate"


def claims(name: str, attrs: dict[str, Any]) -> bool:
    return name == GENERATE


def fragment(span: trace_pb2.Span, attrs: dict[str, Any], origin: Origin) -> Fragment:
    role = str_attr(attrs, "disagg_role").lower()
    role = role if role in ROLES else ""
    rid = first_id(attrs, "x_request_id", "request_id", "gen_ai.request.id")
    ttft_ms = num_attr(attrs, "ttft_ms")
    stage = origin.measured("prefill" if role == "prefill" else "decode")
    return origin.fragment(
        "request",
        role,
        link_keys("rid", rid),
        stages=(stage,) if role else (),
        request_id=rid,
        ttft_s=None if ttft_ms is None else ttft_ms / 1e3,
    )


MAPPING = EngineMapping(ENGINE, ("dynamo",), claims, fragment)
