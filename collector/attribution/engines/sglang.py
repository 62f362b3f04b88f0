"""SGLang's spans (python/sglang/srt/tracing/trace.py, main of 2026): a bootstrap room's
span, a request span per side, thread spans that name the host, and slices named after
the request's stage (managers/req_time_stats RequestStage); the prefill side's and
decode side's disaggregation stages carry their role in the name."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from opentelemetry.proto.trace.v1 import trace_pb2

from fabricprobe.collector.attribution.engines.common import (
    MAX_KEY,
    ROLES,
    EngineMapping,
    Fragment,
    Origin,
    link_keys,
)
from fabricprobe.collector.attribution.spanattrs import MAX_NAME, SpanError, str_attr

ENGINE = "sglang"
SLICES = {
    "tokenize": "queue",
    "api_server_dispatch": "queue",
    "prefill_waiting": "queue",
    "prefill_prepare": "queue",
    "prefill_bootstrap": "queue",
    "prefill_forward": "prefill",
    "chunked_prefill": "prefill",
    # the prefill side's send: from its transfer queue to the transfer's end
    "prefill_transfer_kv_cache": "kv_send",
    "decode_prepare": "queue",
    "decode_bootstrap": "queue",
    # the decode side's wait for the KV: from its transfer queue to the waiting queue
    "decode_transferred": "kv_transfer",
    "decode_waiting": "queue",
    "fake_output": "decode",
    "decode_forward": "decode",
    "decode_loop": "decode",
}
REQUEST = re.compile(r"^(?:(prefill|decode|\w*)\s+)?Req [0-9A-Za-z_-]{1,64}$")
ROOM = re.compile(r"^Bootstrap Room (0x[0-9a-fA-F]{1,32})$")
THREAD = re.compile(r"\(host:[0-9a-fA-F]{0,32} \| pid:\d+\)$")


def claims(name: str, attrs: dict[str, Any]) -> bool:
    if name in SLICES or ROOM.match(name) or THREAD.search(name):
        return True
    return "Req " in name and bool(REQUEST.match(name)) and "rid" in attrs


def _room(value: Any) -> str:
    """SGLang's bootstrap room (an int, sent as hex text or a number); "" for none or 0."""
    if isinstance(value, bool) or value is None:
        return ""
    try:
        n = int(value, 0) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        raise SpanError(f"bootstrap_room {str(value)[:40]!r} is not a number") from None
    return str(n) if n > 0 else ""


def fragment(span: trace_pb2.Span, attrs: dict[str, Any], origin: Origin) -> Fragment:
    name = span.name
    if name in SLICES:
        role = "prefill" if name.startswith("prefill_") else ""
        role = "decode" if name.startswith("decode_") else role
        return origin.fragment("stage", role, (), stages=(origin.measured(SLICES[name]),))
    m = ROOM.match(name)
    if m:
        return origin.fragment(
            "link", "", link_keys("room", _room(attrs.get("bootstrap_room", m.group(1))))
        )
    if THREAD.search(name):
        host_id = str_attr(attrs, "host_id")[:MAX_NAME]
        hosts = origin.hosts + ((("host_id", host_id),) if host_id else ())
        return replace(origin, hosts=hosts).fragment("link", "", ())
    # "<role> Req <rid8>": the request on one side; rid is the full request id (SGLang
    # prefixes a worker id with "_" in multi-tokenizer mode and drops it in the name)
    m2 = REQUEST.match(name)
    role = (m2.group(1) or "").lower() if m2 else ""
    rid = str_attr(attrs, "rid").split("_")[-1][:MAX_KEY]
    keys = link_keys("rid", rid) + link_keys("room", _room(attrs.get("bootstrap_room")))
    return origin.fragment("request", role if role in ROLES else "", keys, request_id=rid)


MAPPING = EngineMapping(ENGINE, ("sglang",), claims, fragment)
