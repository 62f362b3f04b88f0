"""OTLP over HTTP: POST /v1/traces with a protobuf or JSON ExportTraceServiceRequest.

The same TraceIngest as the gRPC receiver takes the batch. As the OTLP specification
says: the response has the request's encoding; a partly malformed batch answers 200
with `partial_success`; a batch that cannot be taken answers 400 with a Status message
(not retryable); a body above MAX_BODY is 413. `gzip` request bodies are accepted.
OTLP/JSON writes trace and span ids as hex, not base64, and that is undone before the
protobuf JSON parser reads it.
"""

from __future__ import annotations

import gzip
import json
import socket
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts_pb

from fabricprobe.collector.otlp import BatchRefused, TraceIngest

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
        except RecursionError:  # a body of brackets nests past the decoder's stack
            raise BadRequest("not JSON: nested too deep") from None
        if not isinstance(data, dict):
            raise BadRequest("JSON body is not an object")
        try:
            json_format.ParseDict(_hex_ids(data), req, ignore_unknown_fields=True)
        except json_format.ParseError as e:
            raise BadRequest(f"not an ExportTraceServiceRequest: {str(e)[:200]}") from None
        except RecursionError:  # nested within the decoder's stack but past _hex_ids'
            raise BadRequest("not an ExportTraceServiceRequest: nested too deep") from None
        return req
    try:
        req.ParseFromString(body)
    except DecodeError as e:
        raise BadRequest(f"not an ExportTraceServiceRequest: {e}") from None
    return req


def encode(msg: Any, content_type: str) -> bytes:
    if content_type == JSON:
        return json_format.MessageToJson(msg, indent=None).encode()
    return bytes(msg.SerializeToString())


def _status(message: str, code: int) -> Any:
    from google.rpc import status_pb2  # type: ignore[import-untyped]  # no stubs shipped

    return status_pb2.Status(code=code, message=message[:1000])


class _Handler(BaseHTTPRequestHandler):
    ingest: TraceIngest
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        if self.path.split("?", 1)[0] != PATH:
            self._reply(404, b"only POST /v1/traces is served here", "text/plain")
            return
        ctype = self.headers.get("Content-Type", PROTOBUF).split(";", 1)[0].strip().lower()
        if ctype not in (PROTOBUF, JSON):
            text = f"Content-Type {ctype[:60]!r}: {PROTOBUF} or {JSON}"
            self._reply(415, text.encode(), "text/plain")
            return
        try:
            length = int(self.headers.get("Content-Length", "-1"))
        except ValueError:
            length = -1
        if length < 0:
            self._reply(411, b"Content-Length required", "text/plain")
            return
        if length > MAX_BODY:
            self.close_connection = True
            self._reply(413, f"body of {length} bytes; at most {MAX_BODY}".encode(), "text/plain")
            return
        body = self.rfile.read(length)
        try:
            if self.headers.get("Content-Encoding", "").lower() == "gzip":
                body = _gunzip(body)
            req = decode(body, ctype)
            res = self.ingest.export(req)
        except BadRequest as e:
            self._reply(400, encode(_status(str(e), 3), ctype), ctype)
            return
        except BatchRefused as e:
            self._reply(400, encode(_status(str(e), e.code.value[0]), ctype), ctype)
            return
        resp = ts_pb.ExportTraceServiceResponse()
        if res.rejected:
            resp.partial_success.rejected_spans = res.rejected
            resp.partial_success.error_message = (
                f"{res.rejected} spans rejected: {'; '.join(res.reasons)}"
            )
        self._reply(200, encode(resp, ctype), ctype)

    def _reply(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # intake is counted by the ingest (fabricprobe_otlp_spans_*)


def _gunzip(body: bytes) -> bytes:
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(body, MAX_BODY + 1)
    except (zlib.error, gzip.BadGzipFile) as e:
        raise BadRequest(f"bad gzip body: {e}") from None
    if len(out) > MAX_BODY:
        raise BadRequest(f"body inflates beyond {MAX_BODY} bytes")
    return out


def serve_otlp_http(host: str, port: int, ingest: TraceIngest) -> ThreadingHTTPServer:
    """Serve INGEST at http://HOST:PORT/v1/traces from a daemon thread; the caller shuts
    it down (shutdown() and server_close())."""
    family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)[0][0]
    server_class = type("OtlpHttpServer", (ThreadingHTTPServer,), {"address_family": family})
    handler = type("OtlpHandler", (_Handler,), {"ingest": ingest})
    server = server_class((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="otlp-http", daemon=True).start()
    return server
