"""Where the report's data comes from: a collector's /metrics and Why query, and
optionally a Prometheus HTTP API. Every call has a deadline and a size bound.

Credentials mean what they mean to an agent: TLS with the collector's CA (and a client
certificate), a bearer token, or plain text only when asked for (`insecure`).
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]  # grpcio ships no type hints

from fabricprobe.agent.client import channel_credentials
from fabricprobe.collector.attribution import WHY_METHOD
from fabricprobe.core.errors import ConfigError

MAX_BODY = 64 << 20  # bytes read from one HTTP answer
MAX_MESSAGE = 16 << 20  # bytes of one gRPC reply


class SourceError(Exception):
    """A source that could not be read; the message names it and says why."""


@dataclass(frozen=True)
class ClientAuth:
    """How a client command reaches a secured collector."""

    insecure: bool = False
    token_file: str = ""
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    server_name: str = ""  # TLS name to expect, if not the address

    def validate(self) -> None:
        if not (self.insecure or self.token_file or self.ca_file):
            raise ConfigError(
                "no credentials: give --token-file or --ca-file (TLS), or --insecure for plain text"
            )
        if bool(self.cert_file) != bool(self.key_file):
            raise ConfigError("--cert-file and --key-file go together")
        if self.cert_file and not self.ca_file:
            raise ConfigError("--cert-file needs --ca-file: a client certificate is sent over TLS")

    def token(self) -> str | None:
        if not self.token_file:
            return None
        try:
            text = Path(self.token_file).read_text().strip()
        except OSError as e:
            raise ConfigError(f"{self.token_file}: {e.strerror}") from None
        if not text or any(c.isspace() for c in text):
            raise ConfigError(f"{self.token_file}: expected one token")
        return text

    def metadata(self) -> tuple[tuple[str, str], ...]:
        token = self.token()
        return (("authorization", f"Bearer {token}"),) if token else ()

    def channel(self, target: str) -> grpc.Channel:
        opts: list[tuple[str, object]] = [("grpc.max_receive_message_length", MAX_MESSAGE)]
        if self.server_name:
            opts.append(("grpc.ssl_target_name_override", self.server_name))
        if not self.ca_file:
            return grpc.insecure_channel(target, options=opts)
        try:
            creds = channel_credentials(self.ca_file, self.cert_file, self.key_file)
        except OSError as e:
            raise ConfigError(f"{e.filename}: {e.strerror}") from None
        return grpc.secure_channel(target, creds, options=opts)

    def ssl_context(self) -> ssl.SSLContext:
        """For https URLs: the CA given (else the system's), the client certificate if any."""
        ctx = ssl.create_default_context(cafile=self.ca_file or None)
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx


def query_why(
    auth: ClientAuth, target: str, *, slowest: int, window_s: float | None, timeout: float
) -> dict[str, Any]:
    """The collector's Why report: the slowest requests of the window with their paths'
    fabric figures, as one dict ({"slowest": [flat dict per request], "paths": ...})."""
    with auth.channel(target) as channel:
        call = channel.unary_unary(
            WHY_METHOD,
            request_serializer=lambda o: json.dumps(o).encode(),
            response_deserializer=json.loads,
        )
        body = {"slowest": slowest, "window_s": window_s, "by": "e2e_s"}
        try:
            reply = call(body, timeout=timeout, metadata=auth.metadata())
        except grpc.RpcError as e:
            raise SourceError(f"collector {target}: {e.code().name}: {e.details()}") from None
        except ValueError as e:  # not JSON
            raise SourceError(f"collector {target}: unreadable Why reply: {e}") from None
    if not isinstance(reply, dict):
        raise SourceError(f"collector {target}: the Why reply is not an object")
    return reply


def http_get(
    url: str, auth: ClientAuth, *, timeout: float, token: bool = True, accept: str = "*/*"
) -> bytes:
    """GET URL (http or https) with a deadline, at most MAX_BODY bytes."""
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in ("http", "https"):
        raise SourceError(f"{url}: only http and https URLs are read")
    req = urllib.request.Request(url, headers={"Accept": accept})
    bearer = auth.token() if token else None
    if bearer:
        req.add_header("Authorization", f"Bearer {bearer}")
    ctx = auth.ssl_context() if scheme == "https" else None
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as resp:
            body: bytes = resp.read(MAX_BODY + 1)
    except urllib.error.HTTPError as e:
        raise SourceError(f"{url}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise SourceError(f"{url}: {reason}") from None
    if len(body) > MAX_BODY:
        raise SourceError(f"{url}: answer larger than {MAX_BODY} bytes")
    return body


def fetch_metrics(url: str, auth: ClientAuth, *, timeout: float) -> str:
    body = http_get(url, auth, timeout=timeout, accept="text/plain;version=0.0.4")
    return body.decode("utf-8", errors="replace")


def prometheus_range(
    base: str,
    query: str,
    *,
    start: float,
    end: float,
    step: float,
    auth: ClientAuth,
    timeout: float,
) -> list[Any]:
    """One /api/v1/query_range answer's result (a matrix). The collector's token is not
    sent: Prometheus is another service."""
    args = urllib.parse.urlencode(
        {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
    )
    url = f"{base.rstrip('/')}/api/v1/query_range?{args}"
    body = http_get(url, auth, timeout=timeout, token=False, accept="application/json")
    try:
        doc = json.loads(body)
    except ValueError:
        raise SourceError(f"{base}: the answer is not JSON") from None
    if not isinstance(doc, dict) or doc.get("status") != "success":
        err = doc.get("error") if isinstance(doc, dict) else None
        raise SourceError(f"{base}: query failed: {str(err)[:200]}")
    data = doc.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "matrix":
        raise SourceError(f"{base}: expected a matrix result")
    result = data.get("result")
    return result if isinstance(result, list) else []
