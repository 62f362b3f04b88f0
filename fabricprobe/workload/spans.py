"""Workload requests as OpenTelemetry spans, sent with the SDK's OTLP/gRPC exporter.

Each request is one `llm_request` span carrying the `gen_ai.*` attributes vLLM puts on
its own (so the collector reads the workload as it reads vLLM), with one child span per
stage following the stage conventions: the KV transfer's child carries its path
(`fabricprobe.src.host`, `.dst.host`, `.src.device`, `.transport`, `.bytes`), the round
trips its transfer waited for (`fabricprobe.round_trips`) and the transfer's own time
from the call that starts it to its last completion (`fabricprobe.library_seconds`),
which the span's wait holds with the decode side's polling.
"""

from __future__ import annotations

from typing import Any

from fabricprobe.workload.pipeline import STAGE_ORDER, RequestResult


class SpanSender:
    """A TracerProvider with a batch processor and an OTLP exporter to ENDPOINT."""

    def __init__(self, endpoint: str, *, service: str = "fabricprobe-workload") -> None:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        self.provider = TracerProvider(resource=Resource.create({"service.name": service}))
        exporter = OTLPSpanExporter(endpoint=endpoint, insecure=True, timeout=10)
        self.provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
        self.tracer = self.provider.get_tracer("fabricprobe.workload")

    def emit(self, res: RequestResult, model: str) -> None:
        if res.error is not None or "deliver" not in res.stages:
            return
        emit_request(self.tracer, res, model)

    def close(self) -> None:
        self.provider.force_flush(10_000)
        self.provider.shutdown()


def request_attributes(res: RequestResult, model: str) -> dict[str, Any]:
    """vLLM's request span attributes (names as vLLM sends them), from measured times."""
    return {
        "gen_ai.request.id": res.request_id,
        "gen_ai.response.model": model,
        "gen_ai.usage.prompt_tokens": res.prompt_tokens,
        "gen_ai.usage.completion_tokens": res.output_tokens,
        "gen_ai.latency.time_in_queue": res.seconds("queue"),
        "gen_ai.latency.time_to_first_token": res.ttft_s,
        "gen_ai.latency.time_in_model_prefill": res.seconds("prefill"),
        "gen_ai.latency.time_in_model_decode": res.seconds("decode"),
        "gen_ai.latency.e2e": res.e2e_s,
    }


def emit_request(tracer: Any, res: RequestResult, model: str) -> None:
    from opentelemetry import trace

    root = tracer.start_span(
        "llm_request", start_time=res.arrival_ns, attributes=request_attributes(res, model)
    )
    ctx = trace.set_span_in_context(root)
    for stage in STAGE_ORDER:
        start, end = res.stages[stage]
        attrs: dict[str, Any] = {"gen_ai.request.id": res.request_id}
        if stage == "kv_transfer":
            attrs |= {
                "fabricprobe.src.host": res.src.name,
                "fabricprobe.dst.host": res.dst.name,
                "fabricprobe.transport": res.transport,
                "fabricprobe.bytes": res.kv_bytes,
            }
            if res.kv_round_trips:
                attrs["fabricprobe.round_trips"] = res.kv_round_trips
            if res.kv_library_s > 0:
                attrs["fabricprobe.library_seconds"] = res.kv_library_s
            if res.device:
                attrs["fabricprobe.src.device"] = res.device
        span = tracer.start_span(stage, context=ctx, start_time=start, attributes=attrs)
        span.end(end_time=end)
    root.end(end_time=res.end_ns)
