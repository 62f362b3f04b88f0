"""The HTTP server of every HTTP surface (the collector's OTLP/HTTP and /metrics, the
agent's /metrics), made for clients that mean harm.

Built on aiohttp's low-level server (`aiohttp.web.Server`) on one asyncio event loop in
its own thread: a connection costs a protocol object, never a thread, so idle or slow
sockets cannot use up the workers. aiohttp was chosen over uvicorn or hypercorn because
its server is a plain asyncio protocol we can subclass: admission (connections in all
and per source address) is decided in `connection_made`, before a byte is parsed, and
header deadlines are kept per connection; an ASGI server would hide both behind its own
settings. Handlers are plain functions run on a small bounded thread pool (`Limits.
workers`), so rendering a scrape or decoding a batch never stalls the loop that keeps
the deadlines.

What the server enforces (each bound is a field of `Limits`, with its reason there):
headers within `header_s` of their first byte; a body within `body_s` of its headers;
a keep-alive connection closed after `idle_s` without a request; bodies capped at
`max_body` while they are read (Content-Length and chunked alike) and gzip bodies
inflated as a stream capped at `max_inflated`; at most `body_budget` bytes of bodies
held at once across all connections; at most `max_connections` connections, and
`per_source` from one address. Every refusal is counted by reason (`WebStats`).

Routes are mounted with the role they need; a `Guard` (the caller's authentication
layer, e.g. collector/auth.py) turns the caller's credentials into an identity or a
`Refused` (401, 403...), before the body is read.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import ssl
import threading
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

log = logging.getLogger("fabricprobe.web")

OPEN = "open"  # a route anyone may call (the guard is not asked)

REASONS = (
    "unauthenticated",  # no credential, or a bad one (401)
    "permission",  # a known identity without the route's role (403)
    "busy",  # max_connections reached: the connection is answered 503 and closed
    "source",  # per_source reached for the caller's address (503, closed)
    "memory",  # body_budget spent by bodies in flight (503)
    "too_large",  # a body, or its inflated form, over its limit (413)
    "header_timeout",  # headers did not arrive within header_s (closed)
    "body_timeout",  # the body did not arrive within body_s (closed)
    "bad_request",  # unparsable HTTP, a bad gzip body, a handler's BadBody (400/415)
    "not_found",  # no such route (404) or method (405)
)


@dataclass(frozen=True)
class Limits:
    """The bounds of one server. Defaults suit a collector taking OTLP batches from a
    fleet's engines and scrapes from a few Prometheus servers."""

    # a client has this long from its first byte to the end of its headers (slowloris);
    # real clients send headers in one segment, in well under a second
    header_s: float = 10.0
    # the whole body within this of the headers: 16 MiB at 5 Mbit/s; a held body is
    # memory the server keeps for nothing
    body_s: float = 30.0
    # an idle keep-alive connection (or a fresh one that sends nothing) is closed after
    # this; Prometheus reconnects cheaply and OTLP exporters batch every few seconds
    idle_s: float = 15.0
    max_body: int = 16 << 20  # as sent (compressed or not); OTLP batches are a few MiB
    max_inflated: int = 16 << 20  # a gzip body once inflated (a zip bomb is refused)
    # bytes of bodies held at once across all connections (a finished body counts twice
    # while its pieces are joined): one largest batch, or many of the usual few hundred
    # KiB; 64 connections holding 16 MiB bodies then cost the process well under 100 MiB
    body_budget: int = 32 << 20
    max_connections: int = 512  # in all: a socket costs a few KiB, not a thread
    per_source: int = 32  # from one address: one misbehaving host leaves room for the rest
    workers: int = 4  # threads that run handlers (render, decode): the CPU is the bound

    def __post_init__(self) -> None:
        for name in ("header_s", "body_s", "idle_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        if min(self.max_body, self.max_inflated, self.body_budget) < 1:
            raise ValueError("body limits must be positive")
        if not 1 <= self.per_source <= self.max_connections or self.workers < 1:
            raise ValueError("need 1 <= per_source <= max_connections and workers >= 1")


class Refused(Exception):
    """A request the server or its guard turns away: STATUS, a counted REASON, and a
    message the client is told."""

    def __init__(
        self, status: int, reason: str, message: str, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.reason, self.headers = status, reason, dict(headers or {})


class BadBody(ValueError):
    """A handler's word that the body is not what the route takes (400 with the text);
    raise Reply-shaped errors with `Refused` instead when the status must differ."""


@dataclass(frozen=True)
class Caller:
    """What the guard may judge a request by."""

    source: str  # the connection's source address
    authorization: str  # the Authorization header ("" if none)
    peercert: dict[str, Any] | None  # the TLS client certificate (ssl getpeercert form)


Guard = Callable[[Caller, str], Any]  # (caller, role) -> identity; raises Refused


@dataclass(frozen=True)
class Call:
    """One admitted request as a handler sees it; BODY is read in full and inflated."""

    method: str
    path: str
    query: Mapping[str, str]
    headers: Mapping[str, str]
    body: bytes
    identity: Any


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: Mapping[str, str] = field(default_factory=dict)
    refused: str = ""  # a REASONS entry when this reply turns the request away (counted)


Handler = Callable[[Call], Reply]


@dataclass(frozen=True)
class Route:
    """PATHS served by HANDLER for METHODS, to callers holding ROLE (OPEN: anyone)."""

    paths: tuple[str, ...]
    methods: tuple[str, ...]
    role: str
    handler: Handler


class WebCounts(NamedTuple):
    """A copy of WebStats' figures."""

    refused: dict[str, int]  # reason -> requests or connections
    served: int
    connections: int  # open now


class WebStats:
    """Requests served and refused (by reason), and connections open; thread-safe."""

    def __init__(self, on_refused: Callable[[str], None] | None = None) -> None:
        self.lock = threading.Lock()
        self.refused: dict[str, int] = dict.fromkeys(REASONS, 0)
        self.served = 0
        self.connections = 0
        self.on_refused = on_refused

    def refuse(self, reason: str) -> None:
        with self.lock:
            self.refused[reason] += 1
        if self.on_refused is not None:
            self.on_refused(reason)

    def snapshot(self) -> WebCounts:
        with self.lock:
            return WebCounts(dict(self.refused), self.served, self.connections)


class _Shared:
    """State every connection of one server reads: limits, counts, the body budget."""

    def __init__(self, limits: Limits, stats: WebStats) -> None:
        self.limits, self.stats = limits, stats
        self.open = 0
        self.by_source: dict[str, int] = {}
        self.body_held = 0  # bytes of bodies being read now (event-loop thread only)


def _busy_reply(message: str) -> bytes:
    body = message.encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class _Connection(RequestHandler):
    """aiohttp's protocol with admission and a header deadline. `idle` is True between
    requests; the first byte of a request starts its header clock, the request's
    dispatch stops it."""

    shared: _Shared  # set on the subclass each server makes

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.source = _source(transport)
        self.counted = False
        self.idle = True
        self.header_timer: asyncio.TimerHandle | None = None
        sh = self.shared
        reason = ""
        if sh.open >= sh.limits.max_connections:
            reason, text = "busy", f"{sh.limits.max_connections} connections open"
        elif sh.by_source.get(self.source, 0) >= sh.limits.per_source:
            reason, text = "source", f"{sh.limits.per_source} connections from {self.source}"
        if reason:
            sh.stats.refuse(reason)
            with contextlib.suppress(Exception):
                transport.write(_busy_reply(text))  # type: ignore[attr-defined]
            self.force_close()
            return
        self.counted = True
        sh.open += 1
        sh.by_source[self.source] = sh.by_source.get(self.source, 0) + 1
        with sh.stats.lock:
            sh.stats.connections = sh.open

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_header_clock()
        if self.counted:
            self.counted = False
            sh = self.shared
            sh.open -= 1
            left = sh.by_source.get(self.source, 1) - 1
            if left > 0:
                sh.by_source[self.source] = left
            else:
                sh.by_source.pop(self.source, None)
            with sh.stats.lock:
                sh.stats.connections = sh.open
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if data and self.idle and self.header_timer is None and self.counted:
            loop = asyncio.get_running_loop()
            self.header_timer = loop.call_later(self.shared.limits.header_s, self._headers_late)
        super().data_received(data)

    def _headers_late(self) -> None:
        self.header_timer = None
        if self.idle:
            self.shared.stats.refuse("header_timeout")
            self.force_close()

    def _stop_header_clock(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def request_started(self) -> None:
        self.idle = False
        self._stop_header_clock()

    def request_done(self) -> None:
        self.idle = True


def _source(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and peer:
        return str(peer[0])
    return "?"


class _Budget:
    """The body bytes one request holds against the server's body_budget."""

    def __init__(self, shared: _Shared) -> None:
        self.shared, self.held = shared, 0

    def take(self, n: int) -> bool:
        sh = self.shared
        if sh.body_held + n > sh.limits.body_budget:
            return False
        sh.body_held += n
        self.held += n
        return True

    def release(self) -> None:
        self.shared.body_held -= self.held
        self.held = 0


def inflate(body: bytes, cap: int) -> bytes:
    """BODY's gzip stream inflated piece by piece; Refused(413) once it passes CAP bytes
    (never inflated whole), Refused(400) for a stream that is not gzip."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = bytearray()
    data = body
    try:
        while data:
            out += d.decompress(data, 1 << 20)
            if len(out) > cap:
                raise Refused(413, "too_large", f"body inflates beyond {cap} bytes")
            data = d.unconsumed_tail
        out += d.flush()
    except zlib.error as e:
        raise Refused(400, "bad_request", f"bad gzip body: {e}") from None
    if len(out) > cap:
        raise Refused(413, "too_large", f"body inflates beyond {cap} bytes")
    if not d.eof:
        raise Refused(400, "bad_request", "bad gzip body: truncated stream")
    return bytes(out)


class WebServer:
    """ROUTES on http(s)://HOST:PORT, from its own thread and event loop.

    `start()` binds (OSError if it cannot) and returns; `shutdown()` closes every
    connection and stops the thread; `server_close()` is kept for callers written for
    socketserver (it does nothing more). `server_address` is the bound (host, port)."""

    def __init__(
        self,
        host: str,
        port: int,
        routes: Iterable[Route],
        *,
        guard: Guard | None = None,
        ssl_context: ssl.SSLContext | None = None,
        limits: Limits | None = None,
        stats: WebStats | None = None,
        name: str = "http",
    ) -> None:
        self.host, self.port, self.name = host, port, name
        self.routes: dict[str, Route] = {}
        for r in routes:
            for p in r.paths:
                self.routes[p] = r
        if guard is None and any(r.role != OPEN for r in self.routes.values()):
            raise ValueError("a route needs a role but the server has no guard")
        self.guard = guard
        self.ssl_context = ssl_context
        self.limits = limits or Limits()
        self.stats = stats or WebStats()
        self.server_address: tuple[str, int] = (host, port)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.limits.workers, thread_name_prefix=f"{name}-work"
        )
        self._shared = _Shared(self.limits, self.stats)
        self._closed = False

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> WebServer:
        ready: concurrent.futures.Future[tuple[str, int]] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(ready,), name=self.name)
        self._thread.daemon = True
        self._thread.start()
        self.server_address = ready.result()  # OSError from the bind comes out here
        return self

    def _run(self, ready: concurrent.futures.Future[tuple[str, int]]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            self._server, self._low = loop.run_until_complete(self._bind())
        except BaseException as e:
            ready.set_exception(e)
            loop.close()
            return
        sock = self._server.sockets[0].getsockname()
        ready.set_result((str(sock[0]), int(sock[1])))
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._close())
            loop.close()

    async def _bind(self) -> tuple[asyncio.base_events.Server, web.Server]:
        kwargs: dict[str, Any] = {
            "keepalive_timeout": self.limits.idle_s,
            "lingering_time": 0,  # an unread body is not waited for: the connection closes
            "max_line_size": 8190,
            "max_field_size": 8190,
            "access_log": None,
            # bodies come as sent: inflate() caps what gzip may grow to, aiohttp's would not
            "auto_decompress": False,
        }
        low = web.Server(self._dispatch, **kwargs)
        protocol = type("Connection", (_Connection,), {"shared": self._shared})

        def factory() -> RequestHandler:
            return protocol(low, loop=asyncio.get_running_loop(), **kwargs)

        server = await asyncio.get_running_loop().create_server(
            factory,
            self.host or None,
            self.port,
            ssl=self.ssl_context,
            # a TLS client that never finishes its handshake is dropped like a slow header
            ssl_handshake_timeout=self.limits.header_s if self.ssl_context else None,
            backlog=256,
            reuse_address=True,
        )
        return server, low

    async def _close(self) -> None:
        self._server.close()
        with contextlib.suppress(Exception):
            await self._low.shutdown(0.5)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 1.0)

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        loop = self._loop
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(5.0)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def server_close(self) -> None:
        """Nothing beyond shutdown() (the socket is closed there)."""

    # -- a request --------------------------------------------------------------------

    async def _dispatch(self, request: web.BaseRequest) -> web.StreamResponse:
        conn = request.protocol
        if isinstance(conn, _Connection):
            conn.request_started()
        try:
            return await self._answer(request)
        except Refused as e:
            self.stats.refuse(e.reason)
            resp = web.Response(status=e.status, text=str(e)[:1000], headers=e.headers)
            if e.status in (413, 503) or e.reason == "bad_request":
                resp.force_close()  # the rest of the body is not read
            return resp
        finally:
            if isinstance(conn, _Connection):
                conn.request_done()

    async def _answer(self, request: web.BaseRequest) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        route = self.routes.get(request.path)
        if route is None:
            raise Refused(404, "not_found", f"{request.path[:80]} is not served here")
        if request.method not in route.methods:
            raise Refused(405, "not_found", f"{request.method[:10]}: {', '.join(route.methods)}")
        identity = None
        if route.role != OPEN:
            assert self.guard is not None
            caller = Caller(
                source=_source(request.transport) if request.transport else "?",
                authorization=request.headers.get("Authorization", ""),
                peercert=_peercert(request),
            )
            identity = await loop.run_in_executor(self._pool, self.guard, caller, route.role)
        body = b""
        if request.method in ("POST", "PUT"):
            body = await self._body(request)
        call = Call(request.method, request.path, request.query, request.headers, body, identity)
        try:
            reply = await loop.run_in_executor(self._pool, route.handler, call)
        except BadBody as e:
            raise Refused(400, "bad_request", str(e)) from None
        if reply.refused:
            self.stats.refuse(reply.refused)
        else:
            with self.stats.lock:
                self.stats.served += 1
        return web.Response(
            status=reply.status,
            body=reply.body,
            headers={"Content-Type": reply.content_type, **reply.headers},
        )

    async def _body(self, request: web.BaseRequest) -> bytes:
        lim = self.limits
        length = request.content_length
        if length is not None and length > lim.max_body:
            raise Refused(413, "too_large", f"body of {length} bytes; at most {lim.max_body}")
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("identity", "gzip"):
            raise Refused(415, "bad_request", f"Content-Encoding {encoding[:30]!r}: gzip or none")
        budget = _Budget(self._shared)
        chunks: list[bytes] = []  # a list, not a growing buffer: no reallocation copies
        size = 0
        try:
            try:
                async with asyncio.timeout(lim.body_s):
                    async for chunk in request.content.iter_any():
                        size += len(chunk)
                        if size > lim.max_body:
                            raise Refused(413, "too_large", f"body over {lim.max_body} bytes")
                        if not budget.take(len(chunk)):
                            raise Refused(503, "memory", "too many bodies in flight; retry")
                        chunks.append(chunk)
            except TimeoutError:
                self.stats.refuse("body_timeout")
                if request.transport is not None:
                    request.transport.close()
                raise asyncio.CancelledError from None
            if not budget.take(size):  # the joined copy is held beside the pieces a moment
                raise Refused(503, "memory", "too many bodies in flight; retry")
            body = b"".join(chunks)
            chunks.clear()
            if encoding == "gzip":
                loop = asyncio.get_running_loop()
                return await loop.run_in_executor(self._pool, inflate, body, lim.max_inflated)
            return body
        finally:
            budget.release()


def _peercert(request: web.BaseRequest) -> dict[str, Any] | None:
    if request.transport is None:
        return None
    obj = request.transport.get_extra_info("ssl_object")
    if obj is None:
        return None
    cert = obj.getpeercert()
    return dict(cert) if cert else None


def cert_names(peercert: Mapping[str, Any] | None) -> tuple[set[str], set[str]]:
    """(names, IP addresses) a client certificate holds: its subject's common name and
    its subjectAltName entries (ssl.SSLSocket.getpeercert form)."""
    names: set[str] = set()
    ips: set[str] = set()
    if not peercert:
        return names, ips
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                names.add(str(value))
    for kind, value in peercert.get("subjectAltName", ()):
        if kind == "DNS":
            names.add(str(value))
        elif kind == "IP Address":
            ips.add(str(value).strip())
    return names, ips
