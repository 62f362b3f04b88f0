"""OTLP over HTTP: POST /v1/traces with a protobuf or JSON ExportTraceServiceRequest.

The same TraceIngest as the gRPC receiver takes the batch. As the OTLP specification
says: the response has the request's encoding; a partly malformed batch answers 200
with `partial_success`; a batch that cannot be taken answers 400 with a Status message
(not retryable); a body above MAX_BODY is 413. `gzip` request bodies are accepted.
The server (fabricprobe.core.web) reads and inflates the body within its limits and
asks the collector's authentication layer for the `ingest` role first; any JSON the
decoder cannot take (a nesting bomb included) is a 400 that says why.
OTLP/JSON writes trace and span ids as hex, not base64, and that is undone before the
protobuf JSON parser reads it.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Sequence
from functools import partial
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts_pb

from fabricprobe.collector.attribution.otlp import BatchRefused, TraceIngest, export_response
from fabricprobe.collector.auth import INGEST
from fabricprobe.core.web import OPEN, Call, Guard, Limits, Reply, Route, WebServer, WebStats

MAX_BODY = 16 << 20  # compressed or not; a larger batch is refused (413)
PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
_ID_FIELDS = {"traceId": 16, "spanId": 8, "parentSpanId": 8}


class BadRequest(ValueError):
    """A body that is no ExportTraceServiceRequest."""


def _hex_ids(obj: Any) -> Any:
    """OTLP/JSON's hex trace and span ids -> the base64 protobuf's JSON mapping expects."""
    import base64

    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k in _ID_FIELDS and isinstance(v, str):
                try:
                    raw = bytes.fromhex(v) if v else b""
                except ValueError:
                    raise BadRequest(f"{k} {v[:40]!r} is not hex") from None
                if raw and len(raw) != _ID_FIELDS[k]:
                    raise BadRequest(f"{k} of {len(raw)} bytes")
                out[k] = base64.b64encode(raw).decode()
            else:
                out[k] = _hex_ids(v)
        return out
    if isinstance(obj, list):
        return [_hex_ids(v) for v in obj]
    return obj


def decode(body: bytes, content_type: str) -> ts_pb.ExportTraceServiceRequest:
    req = ts_pb.ExportTraceServiceRequest()
    if content_type == JSON:
        try:
            data = json.loads(body or b"{}")
        except (ValueError, UnicodeDecodeError) as e:
            raise BadRequest(f"not JSON: {e}") from None
        except RecursionError:
            raise BadRequest("not JSON this decoder takes: nested too deeply") from None
        if not isinstance(data, dict):
            raise BadRequest("JSON body is not an object")
        try:
            json_format.ParseDict(_hex_ids(data), req, ignore_unknown_fields=True)
        except RecursionError:
            raise BadRequest("not an ExportTraceServiceRequest: nested too deeply") from None
        except json_format.ParseError as e:
            raise BadRequest(f"not an ExportTraceServiceRequest: {str(e)[:200]}") from None
        return req
    try:
        req.ParseFromString(body)
    except (DecodeError, RecursionError) as e:
        raise BadRequest(f"not an ExportTraceServiceRequest: {e}") from None
    return req


def encode(msg: Any, content_type: str) -> bytes:
    if content_type == JSON:
        return json_format.MessageToJson(msg, indent=None).encode()
    return bytes(msg.SerializeToString())


def _status(message: str, code: int) -> Any:
    from google.rpc import status_pb2  # type: ignore[import-untyped]  # no stubs shipped

    return status_pb2.Status(code=code, message=message[:1000])


def handle(ingest: TraceIngest, call: Call) -> Reply:
    """One POST /v1/traces, its body already read within the server's limits (and
    inflated if it came as gzip)."""
    ctype = call.headers.get("Content-Type", PROTOBUF).split(";", 1)[0].strip().lower()
    if ctype not in (PROTOBUF, JSON):
        text = f"Content-Type {ctype[:60]!r}: {PROTOBUF} or {JSON}"
        return Reply(415, text.encode(), refused="bad_request")
    try:
        req = decode(call.body, ctype)
        res = ingest.export(req)
    except BadRequest as e:
        return Reply(400, encode(_status(str(e), 3), ctype), ctype, refused="bad_request")
    except BatchRefused as e:
        return Reply(400, encode(_status(str(e), e.code.value[0]), ctype), ctype)
    return Reply(200, encode(export_response(res), ctype), ctype)


def serve_otlp_http(
    host: str,
    port: int,
    ingest: TraceIngest,
    *,
    guard: Guard | None = None,
    ssl_context: ssl.SSLContext | None = None,
    limits: Limits | None = None,
    stats: WebStats | None = None,
    routes: Sequence[Route] = (),
) -> WebServer:
    """Serve INGEST at http(s)://HOST:PORT/v1/traces to callers GUARD gives the `ingest`
    role (anyone without a guard), and ROUTES beside it; the caller stops it
    (shutdown())."""
    route = Route(
        (PATH,), ("POST",), INGEST if guard is not None else OPEN, partial(handle, ingest)
    )
    lim = limits or Limits(max_body=MAX_BODY, max_inflated=MAX_BODY)
    server = WebServer(
        host,
        port,
        [route, *routes],
        guard=guard,
        ssl_context=ssl_context,
        limits=lim,
        stats=stats,
        name="otlp-http",
    )
    return server.start()
