"""vLLM's spans: `llm_request` (vLLM >= 0.10, read from 0.32.0:
`vllm/v1/engine/output_processor.py`, `vllm/tracing/utils.py`), one span per finished
request that starts at its arrival, and the phase spans of PR 44402 (not in 0.32.0).

The request figures of `llm_request` (its `gen_ai.latency.*` totals laid end to end,
token counts, the served model) are read here for fabricprobe's own stage spans too
(collector/attribution/stages.py), which follow vLLM's names.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.trace.v1 import trace_pb2

from fabricprobe.collector.attribution.engines.common import (
    EngineMapping,
    Fragment,
    Origin,
    StageSpan,
    first_id,
    link_keys,
)
from fabricprobe.collector.attribution.spanattrs import (
    MAX_NAME,
    int_attr,
    seconds_attr,
    str_attr,
)

ENGINE = "vllm"
REQUEST_SPAN = "llm_request"
# PR 44402: child spans of llm_request, one per phase, when the engine sends them
CHILDREN = {
    "vllm_queue": "queue",
    "vllm_async_kv_transfer": "kv_transfer",
    "vllm_prefill": "prefill",
    "vllm_decode": "decode",
}
# llm_request's latency totals, in the order the phases ran
LATENCIES = (
    ("queue", "gen_ai.latency.time_in_queue"),
    ("prefill", "gen_ai.latency.time_in_model_prefill"),
    ("decode", "gen_ai.latency.time_in_model_decode"),
)
# vLLM 0.32: a decode-side request waits for its remote KV in the waiting queue
# (WAITING_FOR_REMOTE_KVS), before it is first scheduled: inside time_in_queue
KV_TOTAL = "gen_ai.latency.time_in_queue"


def laid_out(attrs: dict[str, Any], start_ns: int) -> list[tuple[str, int, int]]:
    """(stage, start, end) of each latency total ATTRS gives, laid end to end from
    START_NS (llm_request starts at the request's arrival)."""
    out = []
    t = start_ns
    for stage, key in LATENCIES:
        seconds = seconds_attr(attrs, key)
        if seconds is None:
            continue
        step = int(seconds * 1e9)
        out.append((stage, t, t + step))
        t += step
    return out


def token_counts(attrs: dict[str, Any]) -> tuple[int | None, int | None]:
    """(output tokens, prompt tokens): the gen_ai.usage names of either generation."""
    out_tokens = int_attr(attrs, "gen_ai.usage.completion_tokens")
    if out_tokens is None:
        out_tokens = int_attr(attrs, "gen_ai.usage.output_tokens")
    in_tokens = int_attr(attrs, "gen_ai.usage.prompt_tokens")
    if in_tokens is None:
        in_tokens = int_attr(attrs, "gen_ai.usage.input_tokens")
    return out_tokens, in_tokens


def served_model(attrs: dict[str, Any]) -> str:
    return str_attr(attrs, "gen_ai.response.model")[:MAX_NAME]


def request_figures(attrs: dict[str, Any]) -> dict[str, Any]:
    """The request's own figures, under the names a RequestRecord and a Fragment give
    them: TTFT and end-to-end latency, the token counts, the served model."""
    out_tokens, in_tokens = token_counts(attrs)
    return {
        "ttft_s": seconds_attr(attrs, "gen_ai.latency.time_to_first_token"),
        "e2e_s": seconds_attr(attrs, "gen_ai.latency.e2e"),
        "output_tokens": out_tokens,
        "prompt_tokens": in_tokens,
        "model": served_model(attrs),
    }


def claims(name: str, attrs: dict[str, Any]) -> bool:
    return name == REQUEST_SPAN or name in CHILDREN


def fragment(span: trace_pb2.Span, attrs: dict[str, Any], origin: Origin) -> Fragment:
    rid = first_id(attrs, "gen_ai.request.id")
    keys = link_keys("rid", rid)
    if span.name in CHILDREN:
        stage = CHILDREN[span.name]
        role = "decode" if stage == "kv_transfer" else ""
        return origin.fragment(
            "stage", role, keys, stages=(origin.measured(stage),), request_id=rid
        )
    stages = tuple(
        StageSpan(s, a, b, measured=False) for s, a, b in laid_out(attrs, origin.start_ns)
    )
    return origin.fragment(
        "request",
        "",
        keys,
        stages=stages,
        request_id=rid,
        **request_figures(attrs),
        kv_total=KV_TOTAL,
        kv_total_s=seconds_attr(attrs, KV_TOTAL),
        max_tokens=int_attr(attrs, "gen_ai.request.max_tokens"),
    )


MAPPING = EngineMapping(ENGINE, ("vllm",), claims, fragment)
