"""OTLP trace receiver: `opentelemetry.proto.collector.trace.v1.TraceService/Export`.

`TraceIngest` does the work without gRPC: each span is checked on its own (size,
attribute types, stage names, times); good spans are kept even when neighbours in the
same batch are bad, and the bad ones are counted in `partial_success.rejected_spans`
with the first few reasons in its error message. A batch with more spans than
`max_spans` is refused whole (RESOURCE_EXHAUSTED), and so is one whose every span is
malformed (INVALID_ARGUMENT): the sender learns what was wrong either way. Spans that
are not stage spans (other instrumentation in the same process) are ignored, not
rejected.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import grpc  # type: ignore[import-untyped]  # grpcio ships no type hints
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts_pb
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as ts_grpc

from fabricprobe.collector.stages import RequestRecord, SpanError, StageRecord, parse_span

MAX_SPANS = 20_000  # per Export call
MAX_REASONS = 3


class BatchRefused(Exception):
    """A whole batch refused; `code` is the gRPC status to answer with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class IngestResult:
    accepted: int
    rejected: int
    ignored: int
    reasons: tuple[str, ...]


Sink = Callable[[list[StageRecord], list[RequestRecord]], None]


class TraceIngest:
    """Validate an ExportTraceServiceRequest span by span and hand the good ones on."""

    def __init__(self, sink: Sink, *, max_spans: int = MAX_SPANS) -> None:
        self.sink, self.max_spans = sink, max_spans
        self.lock = threading.Lock()
        self.received_total = 0
        self.rejected_total = 0
        self.ignored_total = 0
        self.batches_refused_total = 0

    def export(self, request: ts_pb.ExportTraceServiceRequest) -> IngestResult:
        """Take one batch; raises BatchRefused when nothing in it can be taken."""
        spans = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
        if len(spans) > self.max_spans:
            self._count(len(spans), len(spans), 0, refused=True)
            raise BatchRefused(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"batch of {len(spans)} spans; at most {self.max_spans} per Export",
            )
        stages: list[StageRecord] = []
        requests: list[RequestRecord] = []
        reasons: list[str] = []
        rejected = ignored = 0
        for span in spans:
            try:
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
        if stages or requests:
            self.sink(stages, requests)
        return IngestResult(len(spans) - rejected - ignored, rejected, ignored, tuple(reasons))

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
        resp = ts_pb.ExportTraceServiceResponse()
        if res.rejected:
            resp.partial_success.rejected_spans = res.rejected
            resp.partial_success.error_message = (
                f"{res.rejected} spans rejected: {'; '.join(res.reasons)}"
            )
        return resp


def add_trace_service(server: grpc.Server, ingest: TraceIngest) -> None:
    ts_grpc.add_TraceServiceServicer_to_server(TraceServicer(ingest), server)
