"""llm-d's spans (the routing sidecar, pkg/sidecar/proxy of llm-d-inference-scheduler,
main of 2026): `llm_d.pd_proxy.<METHOD> <path>`, `forward_request` and the prefill and
decode calls it makes. The sidecar runs beside the decode instance and names the
prefill target; the vLLM spans behind it carry the wait for remote KV."""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.trace.v1 import trace_pb2

from fabricprobe.collector.attribution.engines.common import (
    EngineMapping,
    Fragment,
    Origin,
    first_id,
    link_keys,
)
from fabricprobe.collector.attribution.spanattrs import MAX_NAME, str_attr

ENGINE = "llm-d"
PREFIX = "llm_d.pd_proxy."
FORWARD = "forward_request"
CHILDREN = {"prefill": "prefill", "decode": "decode"}


def claims(name: str, attrs: dict[str, Any]) -> bool:
    if name.startswith(PREFIX) or name == FORWARD:
        return True
    return name in CHILDREN and any(k.startswith(PREFIX) for k in attrs)


def fragment(span: trace_pb2.Span, attrs: dict[str, Any], origin: Origin) -> Fragment:
    rid = first_id(attrs, "llm_d.pd_proxy.request_id")
    target = str_attr(attrs, "llm_d.pd_proxy.prefill_target")[:MAX_NAME]
    stage = CHILDREN.get(span.name.removeprefix(PREFIX), "")
    stages = (origin.measured(stage),) if stage else ()
    # the routing sidecar runs beside the decode instance: its host is the decode side's
    return origin.fragment(
        "proxy", "", link_keys("rid", rid), stages=stages, request_id=rid, peer=target
    )


MAPPING = EngineMapping(ENGINE, ("llm-d", "llm_d"), claims, fragment)
