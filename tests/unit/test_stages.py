"""Span -> stage records: the conventions of the design, vLLM's llm_request as sent."""

from __future__ import annotations

import pytest

from fabricprobe.collector.attribution.spanattrs import SpanError
from fabricprobe.collector.attribution.stages import parse_span
from tests.unit.spanmaker import S, kv_span, span


def test_kv_transfer_span_carries_its_path() -> None:
    (rec,), req = parse_span(kv_span("r1", 10 * S, 0.25, "h0", "h1", 4096))
    assert (rec.stage, rec.request_id, rec.src, rec.dst, rec.transport, rec.bytes) == (
        "kv_transfer", "r1", "h0", "h1", "rdma", 4096,
    )  # fmt: skip
    assert rec.duration_s == pytest.approx(0.25)
    assert req is None


@pytest.mark.parametrize(
    ("key", "field", "value"),
    [("fabricprobe.round_trips", "round_trips", 32),
     ("fabricprobe.library_seconds", "library_s", 0.75)],
)  # fmt: skip
def test_kv_transfer_span_may_say_its_round_trips_and_its_own_time(
    key: str, field: str, value: float
) -> None:
    sp = kv_span("r1", 10 * S, 0.25, "h0", "h1", 4096)
    assert getattr(parse_span(sp)[0][0], field) == 0  # not said
    said = span("kv_transfer", S, 2 * S, **{
        "gen_ai.request.id": "r1", "fabricprobe.src.host": "h0", "fabricprobe.dst.host": "h1",
        key: value,
    })  # fmt: skip
    assert getattr(parse_span(said)[0][0], field) == value


def test_stage_attribute_names_the_stage_and_trace_id_ties_the_request() -> None:
    (rec,), _ = parse_span(span("forward", S, 2 * S, **{"fabricprobe.stage": "decode"}))
    assert rec.stage == "decode"
    assert rec.request_id == bytes(range(1, 17)).hex()


def test_other_spans_are_ignored() -> None:
    assert parse_span(span("http get", S, 2 * S)) == ([], None)


def test_vllm_llm_request_derives_stages_and_request_figures() -> None:
    s = span(
        "llm_request",
        100 * S,
        103 * S,
        **{
            "gen_ai.request.id": "cmpl-1",
            "gen_ai.latency.time_in_queue": 0.5,
            "gen_ai.latency.time_to_first_token": 0.9,
            "gen_ai.latency.time_in_model_prefill": 0.3,
            "gen_ai.latency.time_in_model_decode": 2.0,
            "gen_ai.latency.e2e": 3.0,
            "gen_ai.usage.completion_tokens": 21,
            "gen_ai.usage.prompt_tokens": 512,
        },
    )
    stages, req = parse_span(s)
    assert [(x.stage, x.derived) for x in stages] == [
        ("queue", True), ("prefill", True), ("decode", True),
    ]  # fmt: skip
    assert stages[1].start_ns == stages[0].end_ns == 100 * S + S // 2
    assert req is not None and req.request_id == "cmpl-1"
    assert req.ttft_s == 0.9 and req.output_tokens == 21
    assert req.itl_s == pytest.approx((3.0 - 0.9) / 20)


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (span("kv_transfer", S, 2 * S, **{"gen_ai.request.id": "x"}), "src.host"),
        (span("queue", 2 * S, S), "ends before"),
        (span("queue", 0, S), "start or end"),
        (span("x", S, 2 * S, **{"fabricprobe.stage": "warmup"}), "unknown stage"),
        (span("queue", S, 2 * S, **{"gen_ai.request.id": 7}), "must be a string"),
        (span("llm_request", S, 2 * S, **{"gen_ai.latency.e2e": "slow"}), "must be a number"),
        (span("llm_request", S, 2 * S, **{"gen_ai.latency.e2e": -1.0}), "non-negative"),
        (span("llm_request", S, 2 * S, **{"gen_ai.latency.e2e": 2e5}), "implausible"),
        (
            span("kv_transfer", S, 2 * S, **{
                "fabricprobe.src.host": "a", "fabricprobe.dst.host": "b",
                "fabricprobe.transport": "carrier-pigeon",
            }),
            "rdma or tcp",
        ),
        (span("queue", S, 2 * S, **{"gen_ai.request.id": "x" * 5000}), "longer than"),
        (
            span("kv_transfer", S, 2 * S, **{
                "fabricprobe.src.host": "a", "fabricprobe.dst.host": "b",
                "fabricprobe.round_trips": 1 << 20,
            }),
            "round_trips",
        ),
        (
            span("kv_transfer", S, 2 * S, **{
                "fabricprobe.src.host": "a", "fabricprobe.dst.host": "b",
                "fabricprobe.round_trips": -3,
            }),
            "non-negative",
        ),
        (
            span("kv_transfer", S, 2 * S, **{
                "fabricprobe.src.host": "a", "fabricprobe.dst.host": "b",
                "fabricprobe.library_seconds": 1.5,
            }),
            "longer than its span",
        ),
        (
            span("kv_transfer", S, 2 * S, **{
                "fabricprobe.src.host": "a", "fabricprobe.dst.host": "b",
                "fabricprobe.library_seconds": "fast",
            }),
            "must be a number",
        ),
    ],
)  # fmt: skip
def test_malformed_spans_say_why(bad: object, why: str) -> None:
    with pytest.raises(SpanError, match=why):
        parse_span(bad)  # type: ignore[arg-type]
