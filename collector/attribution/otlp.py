"""OTLP trace receiver: `opentelemetry.proto.collector.trace.v1.TraceService/Export`.

`TraceIngest` does the work without gRPC: each span is checked on its own (size,
attribute types, stage names, times); good spans are kept even when neighbours in the
same batch are bad, and the bad ones are counted in `partial_success.rejected_spans`
with the first few reasons in its error message. A batch with more spans than
`max_spans` is refused whole (RESOURCE_EXHAUSTED), and so is one whose every span is
malformed (INVALID_ARGUMENT): the sender learns what was wrong either way. Spans that
are not stage spans (other instrumentation in the same process) are ignored, not
rejected.

Spans of inference engines (vLLM, SGLang, Dynamo, llm-d: attribution/engines/) become
fragments, with the host attributes of their resource; an engine's span this receiver
does not map is counted per engine (`unmapped`), never rejected. The same ingest serves
OTLP over gRPC (here) and over HTTP (attribution/otlp_http.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import NamedTuple

import grpc  # type: ignore[import-untyped]  # grpcio ships no type hints
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts_pb
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as ts_grpc

from fabricprobe.collector.attribution.engines import ENGINES, read_engine_span
from fabricprobe.collector.attribution.engines.common import Fragment
from fabricprobe.collector.attribution.spanattrs import MAX_NAME, SpanError, span_attributes
from fabricprobe.collector.attribution.stages import RequestRecord, StageRecord, parse_span
from fabricprobe.core.errors import CallRefused

MAX_SPANS = 20_000  # per Export call
MAX_REASONS = 3


class BatchRefused(CallRefused):
    """A whole batch refused."""


@dataclass(frozen=True)
class IngestResult:
    """What one batch's spans came to: taken, refused as malformed (the first
    MAX_REASONS reasons given), or not of use here."""

    accepted: int
    rejected: int
    ignored: int
    reasons: tuple[str, ...]


class EngineSpans(NamedTuple):
    """Spans counted from one engine."""

    engine: str  # one of engines.ENGINES
    spans: int


@dataclass(frozen=True)
class IngestCounts:
    """The receiver's counters at one moment (what /metrics shows of it)."""

    received: int
    rejected: int  # malformed or oversized
    ignored: int  # other instrumentation, engine spans not mapped
    batches_refused: int
    engine_spans: tuple[EngineSpans, ...]  # spans from each engine, in ENGINES order
    unmapped: tuple[EngineSpans, ...]  # of those, whose name no mapping knows


Sink = Callable[[list[StageRecord], list[RequestRecord], list[Fragment]], None]
# (request) -> (the part kept here, spans sent on to another collector shard)
Router = Callable[[ts_pb.ExportTraceServiceRequest], tuple[ts_pb.ExportTraceServiceRequest, int]]


def resource_attributes(rs: object) -> dict[str, object]:
    """Scalar attributes of a ResourceSpans' resource ({} when they cannot be read)."""
    try:
        return span_attributes(rs.resource)  # type: ignore[attr-defined]
    except SpanError:
        return {}


class TraceIngest:
    """Validate an ExportTraceServiceRequest span by span and hand the good ones on."""

    def __init__(self, sink: Sink, *, max_spans: int = MAX_SPANS) -> None:
        self.sink, self.max_spans = sink, max_spans
        self.router: Router | None = None  # set by a collector shard (collector/shard.py)
        self.lock = threading.Lock()
        self.received_total = 0
        self.rejected_total = 0
        self.ignored_total = 0
        self.batches_refused_total = 0
        self.engine_spans: dict[str, int] = dict.fromkeys(ENGINES, 0)
        self.unmapped: dict[str, int] = dict.fromkeys(ENGINES, 0)

    def export(self, request: ts_pb.ExportTraceServiceRequest) -> IngestResult:
        """Take one batch; raises BatchRefused when nothing in it can be taken."""
        n = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        if n > self.max_spans:
            self._count(n, n, 0, refused=True)
            raise BatchRefused(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"batch of {n} spans; at most {self.max_spans} per Export",
            )
        if self.router is not None:
            request, forwarded = self.router(request)
            if forwarded:
                kept = self.export_local(request)
                return replace(kept, accepted=kept.accepted + forwarded)
        return self.export_local(request)

    def export_local(self, request: ts_pb.ExportTraceServiceRequest) -> IngestResult:
        """Take the spans of REQUEST here (export() without the routing)."""
        spans = [
            (s, rs_i, ss.scope.name)
            for rs_i, rs in enumerate(request.resource_spans)
            for ss in rs.scope_spans
            for s in ss.spans
        ]
        stages: list[StageRecord] = []
        requests: list[RequestRecord] = []
        fragments: list[Fragment] = []
        reasons: list[str] = []
        rejected = ignored = 0
        resources: dict[int, dict[str, object]] = {}
        engines = dict.fromkeys(ENGINES, 0)
        unmapped = dict.fromkeys(ENGINES, 0)
        for span, rs_i, scope in spans:
            try:
                if rs_i not in resources:
                    resources[rs_i] = resource_attributes(request.resource_spans[rs_i])
                if len(span.name) > MAX_NAME:
                    raise SpanError(f"span name of {len(span.name)} characters")
                frag, engine = read_engine_span(span, resources[rs_i], scope)
                if engine is not None:
                    engines[engine] += 1
                    if frag is None:
                        unmapped[engine] += 1
                        ignored += 1
                    else:
                        fragments.append(frag)
                    continue
                got, req = parse_span(span)
            except SpanError as e:
                rejected += 1
                if len(reasons) < MAX_REASONS:
                    reasons.append(f"span {span.name[:40]!r}: {e}")
                continue
            if not got and req is None:
                ignored += 1
            stages.extend(got)
            if req is not None:
                requests.append(req)
        if spans and rejected == len(spans):
            self._count(len(spans), rejected, 0, refused=True)
            raise BatchRefused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"all {rejected} spans malformed; first: {'; '.join(reasons)}",
            )
        self._count(len(spans), rejected, ignored, refused=False)
        with self.lock:
            for k, n in engines.items():
                self.engine_spans[k] += n
            for k, n in unmapped.items():
                self.unmapped[k] += n
        if stages or requests or fragments:
            self.sink(stages, requests, fragments)
        return IngestResult(len(spans) - rejected - ignored, rejected, ignored, tuple(reasons))

    def counts(self) -> IngestCounts:
        with self.lock:
            return IngestCounts(
                received=self.received_total,
                rejected=self.rejected_total,
                ignored=self.ignored_total,
                batches_refused=self.batches_refused_total,
                engine_spans=tuple(EngineSpans(e, n) for e, n in self.engine_spans.items()),
                unmapped=tuple(EngineSpans(e, n) for e, n in self.unmapped.items()),
            )

    def _count(self, n: int, rejected: int, ignored: int, *, refused: bool) -> None:
        with self.lock:
            self.received_total += n
            self.rejected_total += rejected
            self.ignored_total += ignored
            self.batches_refused_total += int(refused)


class TraceServicer(ts_grpc.TraceServiceServicer):
    """gRPC edge of TraceIngest: statuses and partial_success as OTLP specifies them."""

    def __init__(self, ingest: TraceIngest) -> None:
        self.ingest = ingest

    def Export(
        self, request: ts_pb.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> ts_pb.ExportTraceServiceResponse:
        try:
            res = self.ingest.export(request)
        except BatchRefused as e:
            context.abort(e.code, str(e))
            raise AssertionError("context.abort returned") from None  # pragma: no cover
        return export_response(res)


def export_response(res: IngestResult) -> ts_pb.ExportTraceServiceResponse:
    """The answer to a batch taken, over gRPC or HTTP: `partial_success` says how many
    spans were rejected, and the first reasons."""
    resp = ts_pb.ExportTraceServiceResponse()
    if res.rejected:
        resp.partial_success.rejected_spans = res.rejected
        resp.partial_success.error_message = (
            f"{res.rejected} spans rejected: {'; '.join(res.reasons)}"
        )
    return resp


def add_trace_service(server: grpc.Server, ingest: TraceIngest) -> None:
    ts_grpc.add_TraceServiceServicer_to_server(TraceServicer(ingest), server)
