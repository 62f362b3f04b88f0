"""Where the report's data comes from over HTTP: a collector's /metrics and, optionally,
a Prometheus HTTP API. Every call has a deadline and a size bound. (The Why and Rtt
queries are gRPC calls the command makes with the collector credentials every client
shares, and hands to build.gather(); `rtt_dict()` turns the Rtt reply into plain data.)
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fabricprobe.core.deadline import Deadline, Timeout, as_deadline
from fabricprobe.core.errors import ConfigError

MAX_BODY = 64 << 20  # bytes read from one HTTP answer


class SourceError(Exception):
    """A source that could not be read; the message names it and says why."""


@dataclass(frozen=True)
class HttpAuth:
    """How the report reads /metrics and Prometheus: TLS checked against CA_FILE (else the
    system's CAs), a client certificate if given, and HTTP basic auth for the collector's
    /metrics (its web config's basic_auth_users), only over https."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    basic_file: str = ""  # one line: USER:PASSWORD

    def ssl_context(self) -> ssl.SSLContext:
        try:
            ctx = ssl.create_default_context(cafile=self.ca_file or None)
            if self.cert_file:
                ctx.load_cert_chain(self.cert_file, self.key_file)
        except OSError as e:
            raise ConfigError(f"{e.filename or self.ca_file}: {e.strerror}") from None
        return ctx

    def basic(self) -> str | None:
        """The Authorization header value of BASIC_FILE, None without one."""
        if not self.basic_file:
            return None
        try:
            text = Path(self.basic_file).read_text().strip()
        except OSError as e:
            raise ConfigError(f"{self.basic_file}: {e.strerror}") from None
        user, sep, password = text.partition(":")
        if not sep or not user or "\n" in text:
            raise ConfigError(f"{self.basic_file}: expected one line USER:PASSWORD")
        return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")


def http_get(
    url: str, auth: HttpAuth, *, timeout: Timeout, basic: bool = False, accept: str = "*/*"
) -> bytes:
    """GET URL (http or https) with a deadline, at most MAX_BODY bytes; with BASIC, the
    basic-auth header (https only: a password never goes out in clear). TIMEOUT bounds
    the whole request, body included (a Deadline shares it with the other sources)."""
    deadline = as_deadline(timeout)
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in ("http", "https"):
        raise SourceError(f"{url}: only http and https URLs are read")
    req = urllib.request.Request(url, headers={"Accept": accept})
    header = auth.basic() if basic else None
    if header:
        if scheme != "https":
            raise ConfigError(f"{url}: basic auth only over https")
        req.add_header("Authorization", header)
    ctx = auth.ssl_context() if scheme == "https" else None
    late = SourceError(f"{url}: no complete answer within {deadline.seconds:g} s")
    try:
        left = deadline.remaining()
        if left <= 0:
            raise late
        with urllib.request.urlopen(req, timeout=left, context=ctx) as resp:
            body = _read_body(resp, deadline, late)
    except TimeoutError:
        raise late from None
    except urllib.error.HTTPError as e:
        raise SourceError(f"{url}: HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        if isinstance(e.reason, TimeoutError):  # connect (or TLS handshake) at the deadline
            raise late from None
        raise SourceError(f"{url}: {e.reason}") from None
    except OSError as e:
        reason = getattr(e, "reason", e)
        raise SourceError(f"{url}: {reason}") from None
    if len(body) > MAX_BODY:
        raise SourceError(f"{url}: answer larger than {MAX_BODY} bytes")
    return body


def _read_body(resp: Any, deadline: Deadline, late: SourceError) -> bytes:
    """Up to MAX_BODY + 1 bytes of RESP, all by DEADLINE: urlopen's timeout bounds each
    socket read, so a server that trickles its answer would otherwise hold us forever."""
    # the socket under http.client's buffered reader; without it each read keeps the
    # timeout urlopen set (at most what was left when the request went out)
    sock = getattr(getattr(resp.fp, "raw", None), "_sock", None)
    chunks: list[bytes] = []
    got = 0
    while got <= MAX_BODY:
        left = deadline.remaining()
        if left <= 0:
            raise late
        if isinstance(sock, socket.socket):
            sock.settimeout(left)
        chunk = resp.read1(min(1 << 16, MAX_BODY + 1 - got))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def fetch_metrics(url: str, auth: HttpAuth, *, timeout: Timeout) -> str:
    body = http_get(url, auth, timeout=timeout, basic=True, accept="text/plain;version=0.0.4")
    return body.decode("utf-8", errors="replace")


def prometheus_range(
    base: str,
    query: str,
    *,
    start: float,
    end: float,
    step: float,
    auth: HttpAuth,
    timeout: Timeout,
) -> list[Any]:
    """One /api/v1/query_range answer's result (a matrix). The collector's password is
    not sent: Prometheus is another service."""
    args = urllib.parse.urlencode(
        {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
    )
    url = f"{base.rstrip('/')}/api/v1/query_range?{args}"
    body = http_get(url, auth, timeout=timeout, accept="application/json")
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: nested past the decoder's stack
        raise SourceError(f"{base}: the answer is not JSON") from None
    if not isinstance(doc, dict) or doc.get("status") != "success":
        err = doc.get("error") if isinstance(doc, dict) else None
        raise SourceError(f"{base}: query failed: {str(err)[:200]}")
    data = doc.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "matrix":
        raise SourceError(f"{base}: expected a matrix result")
    result = data.get("result")
    return result if isinstance(result, list) else []


def rtt_dict(reply: Any) -> dict[str, Any]:
    """An RttReply as plain data: each path and host reference a dict of the fields it
    carries (repeated ones as lists), and the totals."""

    def fields(msg: Any) -> dict[str, Any]:
        return {
            fd.name: v if isinstance(v, str | bytes | int | float | bool) else list(v)
            for fd, v in msg.ListFields()
        }

    return {
        "paths": [fields(m) for m in reply.paths],
        "host_references": [fields(m) for m in reply.host_references],
        "paths_total": reply.paths_total,
        "host_references_total": reply.host_references_total,
        "now_ns": reply.now_ns,
    }
