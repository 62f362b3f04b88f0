"""The agent's end of the collector API: register, poll assignments, send windows.

The client speaks gRPC over grpclib, a pure-Python HTTP/2 client, rather than grpcio:
the agent runs on every GPU host, and with grpcio it held 11 MiB more resident memory
(docs/figures.md). The collector serves with grpcio; both ends speak the same protocol
and messages.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import Any, TypeVar

import h2.exceptions
from google.protobuf.message import DecodeError, Message
from grpclib.client import Channel, Stream
from grpclib.config import Configuration
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError

from fabricprobe.agent.config import AgentConfig
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.hostport import COLLECTOR_PORT, parse_hostport

MAX_MESSAGE_BYTES = 4 << 20  # each way, as the collector's own bound
SERVICE = "/fabricprobe.v1.Collector/"

R = TypeVar("R", bound=Message)
T = TypeVar("T")

__all__ = [
    "MAX_MESSAGE_BYTES",
    "CallError",
    "CollectorClient",
    "Status",
    "build_client",
    "tls_context",
]


class CallError(Exception):
    """A call that did not return: the collector's gRPC status, or the client's own
    (UNAVAILABLE when the connection or TLS failed, DEADLINE_EXCEEDED when the call ran
    past its timeout, RESOURCE_EXHAUSTED for a message over MAX_MESSAGE_BYTES)."""

    def __init__(self, status: Status, details: str) -> None:
        super().__init__(f"{status.name}: {details}")
        self.status, self._details = status, details

    def code(self) -> Status:
        return self.status

    def details(self) -> str:
        return self._details


class _ReplyTooBig(CallError):
    """A reply over the bound, refused from its length prefix."""


# what a connection that is gone raises (ssl.SSLError is an OSError too)
_BROKEN = (OSError, EOFError, StreamTerminatedError, ProtocolError, h2.exceptions.H2Error)


def tls_context(ca_file: str, cert_file: str = "", key_file: str = "") -> ssl.SSLContext:
    """TLS to the collector, trusting CA_FILE alone, with a client certificate when
    CERT_FILE/KEY_FILE are given."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["h2"])
    if cert_file:
        ctx.load_cert_chain(cert_file, key_file or None)
    return ctx


class CollectorClient:
    """The collector's agent API, one call at a time, with a deadline on every call.

    The connection opens at the first call and is kept for the next ones (`release()`
    closes it). Calls run on the client's own event loop, in the calling thread, one at a
    time (a lock orders them); the loop runs only during a call, so nothing of the client
    runs between windows, and a kept connection costs nothing until it is used. Keeping
    it spares the agent and the collector a TCP and TLS handshake a window: 3.5 ms of the
    agent's CPU a window with mutual TLS where a kept connection takes 0.9 ms; an idle
    connection holds about 18 KiB at the collector.

    A kept connection may have died meanwhile (the collector restarted, or closed it while
    the loop was not running to answer it): a call that fails on one with a connection
    error is made once more on a new connection. Every call of the agent API may be made
    twice: a window is taken once by its epoch and sequence number, and registration,
    assignments and check verdicts replace what the collector held.

    A call that does not return raises CallError with its gRPC status.
    """

    def __init__(
        self,
        target: str,
        *,
        tls: ssl.SSLContext | None = None,
        token: str | None = None,
        server_name: str = "",
        timeout: float = 10.0,
    ) -> None:
        self.target = target
        self._host, self._port = parse_hostport(target, COLLECTOR_PORT)
        self._tls = tls
        self._config = Configuration(
            # a reply is read as it comes, so the receive windows bound what is buffered
            http2_connection_window_size=MAX_MESSAGE_BYTES,
            http2_stream_window_size=MAX_MESSAGE_BYTES,
            ssl_target_name_override=server_name or None,
        )
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._channel: Channel | None = None
        self.opened = 0  # connections opened so far
        self.stale = 0  # kept connections found dead at a call, and replaced
        self.metadata = {"authorization": f"Bearer {token}"} if token else {}
        self.timeout = timeout

    @property
    def connected(self) -> bool:
        """Whether a connection is held now."""
        return self._channel is not None

    def _run(self, work: Callable[[Channel], Awaitable[T]]) -> T:
        """Run WORK on the connection, opening one if none is held, within the timeout."""

        async def call() -> T:
            if self._channel is None:
                # the channel binds to the loop that is running when it is made
                self._channel = Channel(self._host, self._port, ssl=self._tls, config=self._config)
                self.opened += 1
            return await asyncio.wait_for(work(self._channel), self.timeout)

        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
            if self._channel is not None:
                try:
                    return self._loop.run_until_complete(call())
                except TimeoutError as e:  # an OSError, but not a broken connection
                    raise self._error(e) from None
                except _BROKEN:
                    self._drop()  # a kept connection that died while idle: once more, anew
                    self.stale += 1
                except Exception as e:
                    raise self._error(e) from None
            try:
                return self._loop.run_until_complete(call())
            except Exception as e:
                raise self._error(e) from None

    def _error(self, e: Exception) -> Exception:
        """The CallError for what a call raised (anything else as it is), with the
        connection let go where it cannot be trusted with the next call."""
        if isinstance(e, _ReplyTooBig):
            self._drop()  # the rest of it may still be on its way
            return CallError(e.status, e.details())
        if isinstance(e, CallError):
            return e
        if isinstance(e, GRPCError):
            return CallError(e.status, e.message or e.status.name)
        if isinstance(e, DecodeError):
            self._drop()  # whatever answers there is not the collector
            return CallError(Status.INTERNAL, f"{self.target}: reply not understood: {e}")
        if isinstance(e, TimeoutError):
            self._drop()  # a connection that hung is not kept for the next call
            return CallError(
                Status.DEADLINE_EXCEEDED, f"no answer from {self.target} in {self.timeout:g} s"
            )
        if isinstance(e, _BROKEN):
            self._drop()
            return CallError(Status.UNAVAILABLE, f"{self.target}: {str(e) or type(e).__name__}")
        return e

    async def _unary(self, channel: Channel, method: str, request: Message, reply: type[R]) -> R:
        if (size := request.ByteSize()) > MAX_MESSAGE_BYTES:
            raise CallError(
                Status.RESOURCE_EXHAUSTED,
                f"{method}: message of {size} bytes over {MAX_MESSAGE_BYTES}",
            )
        stream: Stream[Message, R]
        async with channel.request(
            SERVICE + method,
            Cardinality.UNARY_UNARY,
            type(request),
            reply,
            timeout=self.timeout,
            metadata=self.metadata,
        ) as stream:
            await stream.send_message(request, end=True)
            _bound_replies(stream, method)
            answer = await stream.recv_message()
        if answer is None:
            raise CallError(Status.UNKNOWN, f"{method}: the collector ended the call with no reply")
        return answer

    def _drop(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()
            if self._loop is not None and not self._loop.is_closed():
                # let the transport close its socket
                self._loop.run_until_complete(asyncio.sleep(0))

    def release(self) -> None:
        """Close the connection; the next call opens a new one. Safe to call again."""
        with self._lock:
            self._drop()

    def register(self, info: pb.HostInfo) -> pb.RegisterResponse:
        request = pb.RegisterRequest(host=info)
        return self._run(lambda ch: self._unary(ch, "Register", request, pb.RegisterResponse))

    def assignments(self, host: str, known: int) -> pb.Assignments:
        request = pb.AssignmentsRequest(host=host, known_generation=known)
        return self._run(lambda ch: self._unary(ch, "GetAssignments", request, pb.Assignments))

    def send(self, reports: Iterable[pb.WindowReport]) -> tuple[list[pb.Ack], CallError | None]:
        """Send REPORTS, each as a ReportWindow call on the one connection, in order:
        the acks received, and the error that cut the sending short (None if none did).

        One call per window is the collector's cheapest path, and the calls of a backlog
        follow each other on the open connection."""
        acks: list[pb.Ack] = []
        for report in reports:
            try:
                acks.append(
                    self._run(
                        partial(self._unary, method="ReportWindow", request=report, reply=pb.Ack)
                    )
                )
            except CallError as e:
                return acks, e
        return acks, None

    def report_checks(self, report: pb.CheckReport) -> pb.CheckAck:
        return self._run(lambda ch: self._unary(ch, "ReportChecks", report, pb.CheckAck))

    def close(self) -> None:
        """Release the connection and the event loop; a later call makes new ones."""
        with self._lock:
            self._drop()
            loop, self._loop = self._loop, None
            if loop is not None:
                loop.close()


def _bound_replies(stream: Stream[Any, Any], method: str) -> None:
    """Refuse a reply whose length prefix is over MAX_MESSAGE_BYTES before reading its body
    (grpclib reads the whole length a server announces). A gRPC message is read as a
    5-byte prefix and then exactly its announced length, both through the HTTP/2
    stream's `recv_data`; the bound goes in front of that."""
    inner = stream._stream  # the HTTP/2 stream, there once the request is sent
    recv_data = inner.recv_data

    async def bounded(size: int) -> bytes:
        if size > MAX_MESSAGE_BYTES:
            raise _ReplyTooBig(
                Status.RESOURCE_EXHAUSTED,
                f"{method}: reply of {size} bytes over {MAX_MESSAGE_BYTES}",
            )
        return await recv_data(size)

    inner.recv_data = bounded  # type: ignore[method-assign]


def build_client(cfg: AgentConfig, target: str = "") -> CollectorClient:
    """A client of TARGET (`collector` by default) with the credentials the
    configuration asks for."""
    token = None
    if cfg.token_file:
        with open(cfg.token_file) as f:
            token = f.read().strip()
    tls = None
    if cfg.ca_file:
        tls = tls_context(cfg.ca_file, cfg.cert_file, cfg.key_file)
    return CollectorClient(
        target or cfg.collector, tls=tls, token=token, server_name=cfg.server_name
    )
