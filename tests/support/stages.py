"""The workload's own record of each request beside what the collector's request view
made of its spans: one place for the check the loopback and lane tests share."""

from __future__ import annotations

import math
import random
from typing import Any

import pandas as pd
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from fabricprobe.collector.attribution.stages import RequestRecord, StageRecord
from fabricprobe.workload.pipeline import STAGE_ORDER, RequestResult
from fabricprobe.workload.spans import emit_request

# Stage times travel as integer nanoseconds both ways (span start/end, and the
# workload's own (start, end) pairs), so the collector's seconds equal the workload's up
# to float rounding; TTFT travels as a float attribute. A microsecond is far below any
# stage a wrong column would show (the demo's misplaced KV transfer was 0.7 s).
TOLERANCE_S = 1e-6


def sent_row(r: RequestResult) -> dict[str, float]:
    """What the workload measured and sent for R: seconds per stage, TTFT, fabric share."""
    row = {f"{s}_s": r.seconds(s) for s in STAGE_ORDER}
    row["ttft_s"] = r.ttft_s
    row["kv_share_ttft"] = r.seconds("kv_transfer") / r.ttft_s
    return row


def view_mismatches(results: list[RequestResult], view: pd.DataFrame) -> list[str]:
    """Every figure of the collector's request VIEW (request_breakdown's frame, or `probe
    why`'s rows) that differs from what the workload sent, one line each; [] when the
    view is right. The view's own fabric share must also be its kv_transfer_s over its
    ttft_s: the same request's figures, not a sum over others."""
    by_id = view.set_index("request_id")
    out: list[str] = []
    for r in results:
        if r.request_id not in by_id.index:
            out.append(f"{r.request_id}: not in the request view")
            continue
        got = by_id.loc[r.request_id]
        for col, want in sent_row(r).items():
            have = float(got[col])
            tol = TOLERANCE_S if col.endswith("_s") else 1e-6 * max(1.0, abs(want))
            if not abs(have - want) <= tol:  # NaN fails too
                out.append(f"{r.request_id} {col}: sent {want:.9f}, view {have:.9f}")
        kv, ttft, share = (float(got[c]) for c in ("kv_transfer_s", "ttft_s", "kv_share_ttft"))
        if not math.isclose(share, kv / ttft, rel_tol=1e-9):
            out.append(f"{r.request_id}: kv_share_ttft {share} is not {kv} / {ttft}")
        if got["src"] != r.src.name or got["dst"] != r.dst.name:
            out.append(
                f"{r.request_id}: path {got['src']}->{got['dst']}, sent {r.src.name}->{r.dst.name}"
            )
    return out


def recorded_spans(results: list[RequestResult], model: str) -> list[ReadableSpan]:
    """The spans the workload's SpanSender would send for RESULTS, made by the real SDK
    (the same emit_request) but kept in memory, so a test decides how they travel."""
    provider = TracerProvider(resource=Resource.create({"service.name": "fabricprobe-workload"}))
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("fabricprobe.workload")
    for r in results:
        emit_request(tracer, r, model)
    provider.shutdown()
    return list(memory.get_finished_spans())


def scattered_batches(
    spans: list[ReadableSpan], batches: int, seed: int = 7
) -> list[list[ReadableSpan]]:
    """SPANS dealt into BATCHES export batches so that every request's spans are split
    across several of them, each batch in shuffled order (children before or after
    their llm_request parent, requests interleaved)."""
    rng = random.Random(seed)
    dealt: list[list[ReadableSpan]] = [[] for _ in range(batches)]
    for i, span in enumerate(spans):
        dealt[(i + rng.randrange(batches)) % batches].append(span)
    for b in dealt:
        rng.shuffle(b)
    return [b for b in dealt if b]


def export_batches(endpoint: str, batches: list[list[ReadableSpan]], between: Any = None) -> None:
    """Send each batch as one OTLP/gRPC Export with the SDK's exporter; BETWEEN() runs
    after each one (a test looks at the view while a request is still incomplete)."""
    exporter = OTLPSpanExporter(endpoint=endpoint, insecure=True, timeout=10)
    try:
        for batch in batches:
            assert exporter.export(batch) is SpanExportResult.SUCCESS
            if between is not None:
                between()
    finally:
        exporter.shutdown()


def scrambled_requests(
    n: int, seed: int = 3
) -> tuple[list[StageRecord], list[RequestRecord], dict[str, dict[str, float]]]:
    """N requests shaped as the workload's (six measured stages each, a KV transfer on a
    path, and the queue / prefill / decode an llm_request span lays out, which the
    measured ones must beat), with every duration distinct and the records in shuffled
    order: a request breakdown that put a value in another request's or another stage's
    cell cannot match. Returns (stages, requests, {request_id: {stage_s: seconds}})."""
    rng = random.Random(seed)
    stages: list[StageRecord] = []
    requests: list[RequestRecord] = []
    want: dict[str, dict[str, float]] = {}
    t = 1_700_000_000 * 10**9
    for i in range(n):
        rid = f"wl-{seed:04x}-{i}"
        start, row = t, {}
        for stage in STAGE_ORDER:
            # distinct per request and stage; the KV transfer is the long one, as in the demo
            ns = (700_000_000 if stage == "kv_transfer" else 100_000) + 1_000 * (7 * i + len(row))
            path = ("h0", f"h{1 + i % 2}") if stage == "kv_transfer" else ("", "")
            stages.append(StageRecord(rid, stage, t, t + ns, *path, transport="rdma"))
            row[f"{stage}_s"] = ns / 1e9
            t += ns
        ttft = (t - start) / 1e9 - row["detokenize_s"] - row["deliver_s"]
        for stage in ("queue", "prefill", "decode"):
            stages.append(StageRecord(rid, stage, start, start + 10**9, derived=True))
        requests.append(RequestRecord(rid, start, t, ttft, (t - start) / 1e9, 8, 64))
        row["ttft_s"] = ttft
        row["kv_share_ttft"] = row["kv_transfer_s"] / ttft
        want[rid] = row
        t += 50_000_000
    rng.shuffle(stages)
    rng.shuffle(requests)
    return stages, requests, want
