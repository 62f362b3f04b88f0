"""Inference engines' own spans -> fragments of a request, one engine side at a time.

Real engines send no `fabricprobe.*` attribute. Each span they do send is mapped here to
a `Fragment`: which engine and role sent it, the keys that link it to the other side of
the same request (trace id, request id, SGLang's bootstrap room), where it ran (the
resource's host attributes), the stages it measured and what it says about the wait for
remote KV. collector/linking.py groups fragments into requests and finds their path.

The span names and attributes, with the engine version they were read from, are listed
in collector/README.md ("Engine spans"). A span of a known engine whose name is not
mapped is reported as `None` (counted by the receiver as unmapped, never an error).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.trace.v1 import trace_pb2

from fabricprobe.collector.attribution.stages import (
    MAX_NAME,
    MAX_SPAN_SECONDS,
    SpanError,
    _int,
    _num,
    _str,
)

ENGINES = ("vllm", "sglang", "dynamo", "llm-d")
ROLES = frozenset({"prefill", "decode"})

# vLLM >= 0.10 (read from 0.32.0): one `llm_request` span per finished request.
VLLM_REQUEST = "llm_request"
# vLLM PR 44402: child spans of llm_request, one per phase, when the engine sends them.
VLLM_CHILDREN = {
    "vllm_queue": "queue",
    "vllm_async_kv_transfer": "kv_transfer",
    "vllm_prefill": "prefill",
    "vllm_decode": "decode",
}
# SGLang (python/sglang/srt/tracing/trace.py, main of 2026): slices are named after the
# request stage (managers/req_time_stats RequestStage); the prefill side's and decode
# side's disaggregation stages carry their role in the name.
SGLANG_SLICES = {
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
SGLANG_REQ = re.compile(r"^(?:(prefill|decode|\w*)\s+)?Req [0-9A-Za-z_-]{1,64}$")
SGLANG_ROOM = re.compile(r"^Bootstrap Room (0x[0-9a-fA-F]{1,32})$")
SGLANG_THREAD = re.compile(r"\(host:[0-9a-fA-F]{0,32} \| pid:\d+\)$")
# Dynamo (components' handlers, main of 2026): `engine.generate` per worker call
DYNAMO_GENERATE = "engine.generate"
# llm-d routing sidecar (pkg/sidecar/proxy, llm-d-inference-scheduler main of 2026)
LLMD_PREFIX = "llm_d.pd_proxy."
LLMD_FORWARD = "forward_request"
LLMD_CHILDREN = {"prefill": "prefill", "decode": "decode"}

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


def resource_hosts(resource: dict[str, Any], keys: tuple[str, ...] = HOST_ATTRIBUTES) -> tuple:
    out = []
    for k in keys:
        v = resource.get(k)
        if isinstance(v, str) and v and len(v) <= MAX_NAME:
            out.append((k, v))
    return tuple(out)


def identity_of(resource: dict[str, Any]) -> str:
    parts = [f"{k}={resource[k]}" for k in IDENTITY_ATTRIBUTES if resource.get(k) not in (None, "")]
    return "|".join(parts)[:MAX_KEY] or "unknown"


def engine_of(name: str, resource: dict[str, Any], attrs: dict[str, Any]) -> str | None:
    """Which engine's span this is, by its name (and the attributes only that engine sets)."""
    if name == VLLM_REQUEST or name in VLLM_CHILDREN:
        return "vllm"
    if name.startswith(LLMD_PREFIX) or name == LLMD_FORWARD:
        return "llm-d"
    if name in LLMD_CHILDREN and any(k.startswith(LLMD_PREFIX) for k in attrs):
        return "llm-d"
    if name == DYNAMO_GENERATE:
        return "dynamo"
    if name in SGLANG_SLICES or SGLANG_ROOM.match(name) or SGLANG_THREAD.search(name):
        return "sglang"
    if "Req " in name and SGLANG_REQ.match(name) and "rid" in attrs:
        return "sglang"
    return None


def engine_of_scope(scope: str, resource: dict[str, Any]) -> str | None:
    """The engine whose tracer (instrumentation scope) or service sent a span the
    mappings do not know: such spans are counted as that engine's unmapped ones."""
    text = (scope + " " + str(resource.get("service.name", ""))).lower()
    # vLLM before llm-d: "vllm-decode" holds "llm-d"
    for engine, marks in (
        ("sglang", ("sglang",)),
        ("vllm", ("vllm",)),
        ("dynamo", ("dynamo",)),
        ("llm-d", ("llm-d", "llm_d")),
    ):
        if any(m in text for m in marks):
            return engine
    return None


def _trace(span: trace_pb2.Span) -> str:
    if len(span.trace_id) != 16 or not any(span.trace_id):
        return ""
    return span.trace_id.hex()


def _sid(raw: bytes) -> str:
    return raw.hex() if len(raw) == 8 and any(raw) else ""


def _times(span: trace_pb2.Span) -> tuple[int, int]:
    start, end = int(span.start_time_unix_nano), int(span.end_time_unix_nano)
    if not start or not end:
        raise SpanError("span without start or end time")
    if end < start:
        raise SpanError("span ends before it starts")
    if (end - start) / 1e9 > MAX_SPAN_SECONDS:
        raise SpanError(f"span longer than {MAX_SPAN_SECONDS:.0f} s")
    return start, end


def _key(kind: str, value: str) -> str:
    return f"{kind}:{value[:MAX_KEY]}"


def _secs(attrs: dict[str, Any], key: str) -> float | None:
    v = _num(attrs, key)
    if v is not None and v > MAX_SPAN_SECONDS:
        raise SpanError(f"{key} = {v} s is implausible")
    return v


def parse_fragment(
    span: trace_pb2.Span,
    attrs: dict[str, Any],
    resource: dict[str, Any],
    host_keys: tuple[str, ...] = HOST_ATTRIBUTES,
) -> Fragment | None:
    """The fragment of an engine span; None when the span is no engine's (or is an
    engine's span this receiver does not map). SpanError for a malformed one."""
    engine = engine_of(span.name, resource, attrs)
    if engine is None:
        return None
    start, end = _times(span)
    hosts = resource_hosts(resource, host_keys) + resource_hosts(attrs, host_keys)
    base = {
        "engine": engine,
        "trace_id": _trace(span),
        "span_id": _sid(span.span_id),
        "parent_id": _sid(span.parent_span_id),
        "hosts": hosts,
        "identity": identity_of(resource),
        "start_ns": start,
        "end_ns": end,
    }
    if engine == "vllm":
        return _vllm(span, attrs, base)
    if engine == "sglang":
        return _sglang(span, attrs, base)
    if engine == "dynamo":
        return _dynamo(attrs, base)
    return _llmd(span, attrs, base)


def _vllm(span: trace_pb2.Span, attrs: dict[str, Any], base: dict[str, Any]) -> Fragment:
    rid = _str(attrs, "gen_ai.request.id")[:MAX_KEY]
    keys = (_key("rid", rid),) if rid else ()
    start = base["start_ns"]
    if span.name in VLLM_CHILDREN:
        stage = VLLM_CHILDREN[span.name]
        st = StageSpan(stage, start, base["end_ns"], measured=True)
        role = "decode" if stage == "kv_transfer" else ""
        return Fragment(**base, kind="stage", role=role, keys=keys, stages=(st,), request_id=rid)
    # llm_request starts at the request's arrival; its latency totals laid end to end
    stages = []
    t = start
    for stage, key in (
        ("queue", "gen_ai.latency.time_in_queue"),
        ("prefill", "gen_ai.latency.time_in_model_prefill"),
        ("decode", "gen_ai.latency.time_in_model_decode"),
    ):
        seconds = _secs(attrs, key)
        if seconds is None:
            continue
        step = int(seconds * 1e9)
        stages.append(StageSpan(stage, t, t + step, measured=False))
        t += step
    out_tokens = _int(attrs, "gen_ai.usage.completion_tokens")
    if out_tokens is None:
        out_tokens = _int(attrs, "gen_ai.usage.output_tokens")
    in_tokens = _int(attrs, "gen_ai.usage.prompt_tokens")
    if in_tokens is None:
        in_tokens = _int(attrs, "gen_ai.usage.input_tokens")
    return Fragment(
        **base,
        kind="request",
        role="",
        keys=keys,
        stages=tuple(stages),
        request_id=rid,
        ttft_s=_secs(attrs, "gen_ai.latency.time_to_first_token"),
        e2e_s=_secs(attrs, "gen_ai.latency.e2e"),
        output_tokens=out_tokens,
        prompt_tokens=in_tokens,
        model=_str(attrs, "gen_ai.response.model")[:MAX_NAME],
        # vLLM 0.32: a decode-side request waits for its remote KV in the waiting queue
        # (WAITING_FOR_REMOTE_KVS), before it is first scheduled: inside time_in_queue
        kv_total="gen_ai.latency.time_in_queue",
        kv_total_s=_secs(attrs, "gen_ai.latency.time_in_queue"),
        max_tokens=_int(attrs, "gen_ai.request.max_tokens"),
    )


def _room(value: Any) -> str:
    """SGLang's bootstrap room (an int, sent as hex text or a number); "" for none or 0."""
    if isinstance(value, bool) or value is None:
        return ""
    try:
        n = int(value, 0) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        raise SpanError(f"bootstrap_room {str(value)[:40]!r} is not a number") from None
    return str(n) if n > 0 else ""


def _sglang(span: trace_pb2.Span, attrs: dict[str, Any], base: dict[str, Any]) -> Fragment:
    name = span.name
    if name in SGLANG_SLICES:
        stage = SGLANG_SLICES[name]
        role = "prefill" if name.startswith("prefill_") else ""
        role = "decode" if name.startswith("decode_") else role
        st = StageSpan(stage, base["start_ns"], base["end_ns"], measured=True)
        return Fragment(**base, kind="stage", role=role, keys=(), stages=(st,))
    m = SGLANG_ROOM.match(name)
    if m:
        room = _room(attrs.get("bootstrap_room", m.group(1)))
        keys: tuple[str, ...] = (_key("room", room),) if room else ()
        return Fragment(**base, kind="link", role="", keys=keys)
    if SGLANG_THREAD.search(name):
        host_id = _str(attrs, "host_id")[:MAX_NAME]
        hosts = base.pop("hosts") + ((("host_id", host_id),) if host_id else ())
        return Fragment(**base, kind="link", role="", keys=(), hosts=hosts)
    # "<role> Req <rid8>": the request on one side; rid is the full request id (SGLang
    # prefixes a worker id with "_" in multi-tokenizer mode and drops it in the name)
    m2 = SGLANG_REQ.match(name)
    role = (m2.group(1) or "").lower() if m2 else ""
    rid = _str(attrs, "rid").split("_")[-1][:MAX_KEY]
    keys = (_key("rid", rid),) if rid else ()
    room = _room(attrs.get("bootstrap_room"))
    if room:
        keys = (*keys, _key("room", room))
    return Fragment(
        **base,
        kind="request",
        role=role if role in ROLES else "",
        keys=keys,
        request_id=rid,
    )


def _dynamo(attrs: dict[str, Any], base: dict[str, Any]) -> Fragment:
    role = _str(attrs, "disagg_role").lower()
    role = role if role in ROLES else ""
    rid = ""
    for k in ("x_request_id", "request_id", "gen_ai.request.id"):
        rid = _str(attrs, k)[:MAX_KEY]
        if rid:
            break
    ttft_ms = _num(attrs, "ttft_ms")
    stage = "prefill" if role == "prefill" else "decode"
    st = StageSpan(stage, base["start_ns"], base["end_ns"], measured=True)
    return Fragment(
        **base,
        kind="request",
        role=role,
        keys=(_key("rid", rid),) if rid else (),
        stages=(st,) if role else (),
        request_id=rid,
        ttft_s=None if ttft_ms is None else ttft_ms / 1e3,
    )


def _llmd(span: trace_pb2.Span, attrs: dict[str, Any], base: dict[str, Any]) -> Fragment:
    rid = _str(attrs, "llm_d.pd_proxy.request_id")[:MAX_KEY]
    keys = (_key("rid", rid),) if rid else ()
    target = _str(attrs, "llm_d.pd_proxy.prefill_target")[:MAX_NAME]
    stage = LLMD_CHILDREN.get(span.name.removeprefix(LLMD_PREFIX), "")
    stages = (StageSpan(stage, base["start_ns"], base["end_ns"], measured=True),) if stage else ()
    # the routing sidecar runs beside the decode instance: its host is the decode side's
    return Fragment(
        **base, kind="proxy", role="", keys=keys, stages=stages, request_id=rid, peer=target
    )
