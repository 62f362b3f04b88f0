"""The responder: answers probe sessions from peers (`probe serve`, and the agent).

One listening socket; each accepted control connection gets its own thread, up to
`max_sessions` at once (beyond that a prober is refused with `error busy` at once,
never queued). Each session runs the handler its kind has in the table the responder
was built with (`sessions`: kind -> handler, see fabricprobe.probes.control;
fabricprobe.probes.sessions has the probes' own); every read has the idle timeout as
its deadline, and whatever the handler acquired is released when the session ends, on
every path. `stop()` is safe from a signal handler: it stops accepting, lets running
sessions finish for a grace period, then aborts the rest (their sockets are shut down,
which wakes any blocked call) and joins every thread. One log line per session says
who, what and how it ended.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time

from fabricprobe.probes.control import (
    DEFAULT_PORT,
    PROTOCOL_VERSION,
    Channel,
    Session,
    SessionTable,
    format_hostport,
    require_dict,
    require_str,
    session_table,
)
from fabricprobe.probes.errors import ParseError, PeerError, ProbeError

log = logging.getLogger("fabricprobe.responder")


class Responder:
    """A bounded, deadline-bound session server; see the module docstring."""

    def __init__(
        self,
        host: str = "0.0.0.0",
        port: int = DEFAULT_PORT,
        *,
        max_sessions: int = 16,
        idle_timeout: float = 30.0,
        grace: float = 2.0,
        sessions: SessionTable,
    ) -> None:
        if max_sessions < 1:
            raise ValueError("max_sessions must be >= 1")
        if not idle_timeout > 0:
            raise ValueError("idle_timeout must be positive")
        self.host, self.port = host, port
        self.max_sessions = max_sessions
        self.idle_timeout = idle_timeout
        self.grace = grace
        self.sessions = session_table(sessions)
        self._listener: socket.socket | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sessions: dict[threading.Thread, Session | socket.socket] = {}
        self._thread: threading.Thread | None = None
        self._refusals: set[threading.Thread] = set()
        self.served = 0
        self.refused = 0  # probers turned away because max_sessions were running

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> tuple[str, int]:
        """Bind and listen; return the address actually bound (port 0 picks one)."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        lsock = socket.socket(family, socket.SOCK_STREAM)
        try:
            lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            lsock.bind((self.host, self.port))
            lsock.listen(64)
        except OSError as e:
            lsock.close()
            raise ProbeError(f"cannot listen on {self.host}:{self.port}: {e.strerror}") from None
        self._listener = lsock
        host, port = lsock.getsockname()[:2]
        self.port = port
        return host, port

    @property
    def address(self) -> tuple[str, int]:
        if self._listener is None:
            raise ProbeError("responder is not listening")
        host, port = self._listener.getsockname()[:2]
        return host, port

    def stop(self) -> None:
        """Ask serve_forever() to drain and return. Safe from signal handlers and threads."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def active_sessions(self) -> int:
        """Sessions running now, refusals in progress included."""
        with self._lock:
            return len(self._sessions) + len(self._refusals)

    def serve_forever(self) -> None:
        """Accept sessions until stop(); then drain, abort, join and close everything."""
        if self._listener is None:
            self.start()
        assert self._listener is not None
        sel = selectors.DefaultSelector()
        try:
            sel.register(self._listener, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            while not self._stop.is_set():
                for key, _ in sel.select():
                    if key.fileobj is self._listener and not self._stop.is_set():
                        self._accept_one()
        finally:
            sel.close()
            self._listener.close()
            self._listener = None
            self._drain()
            self._wake_r.close()
            self._wake_w.close()

    def __enter__(self) -> Responder:
        """Listen and serve in a background thread (tests, the agent)."""
        if self._listener is None:
            self.start()
        self._thread = threading.Thread(target=self.serve_forever, name="responder", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if self._thread is not None:
            self._thread.join()

    # -- sessions ---------------------------------------------------------------------

    def _accept_one(self) -> None:
        assert self._listener is not None
        try:
            conn, addr = self._listener.accept()
        except OSError:
            return  # the prober gave up between select and accept
        peer = (str(addr[0]), int(addr[1]))
        with self._lock:
            if len(self._sessions) < self.max_sessions:
                t = threading.Thread(target=self._run_session, args=(conn, peer))
                self._sessions[t] = conn
            else:
                self.refused += 1
                if len(self._refusals) >= self.max_sessions:  # flooded: not even a reply
                    conn.close()
                    return
                t = threading.Thread(target=self._refuse, args=(conn, peer))
                self._refusals.add(t)
        t.start()

    def _refuse(self, conn: socket.socket, peer: tuple[str, int]) -> None:
        """Say `busy` to a prober over the limit. Its hello is read first: closing a socket
        with unread data sends a reset, which could destroy the error before it is read."""
        try:
            with conn:
                channel = Channel(conn, 1.0)
                with contextlib.suppress(ProbeError):
                    channel.recv()
                channel.send_error(f"busy: {self.max_sessions} sessions running")
        finally:
            with self._lock:
                self._refusals.discard(threading.current_thread())
        log.info("session ? from %s: refused busy", format_hostport(*peer))

    def _drain(self) -> None:
        with self._lock:  # links between rounds lose nothing: let them go at once
            idle = [s for s in self._sessions.values() if isinstance(s, Session) and s.idle]
        for link in idle:
            link.abort()
        deadline = time.monotonic() + self.grace
        while self.active_sessions() and time.monotonic() < deadline:
            time.sleep(0.02)
        with self._lock:
            items = list(self._sessions.items())
            refusals = list(self._refusals)
        for _, session in items:
            if isinstance(session, Session):
                session.abort()
            else:  # still waiting for its hello
                with contextlib.suppress(OSError):
                    session.shutdown(socket.SHUT_RDWR)
        for t in [*(t for t, _ in items), *refusals]:
            t.join()

    def _run_session(self, conn: socket.socket, peer: tuple[str, int]) -> None:
        started = time.monotonic()
        me = threading.current_thread()
        channel = Channel(conn, self.idle_timeout)
        try:
            with conn:
                kind, outcome, detail = self._session(channel, peer, me)
        finally:
            with self._lock:
                self._sessions.pop(me, None)
                self.served += 1
        elapsed = time.monotonic() - started
        tail = f" ({detail})" if detail else ""
        who = format_hostport(*peer)
        log.info("session %s from %s: %s in %.3f s%s", kind, who, outcome, elapsed, tail)

    def _session(
        self, channel: Channel, peer: tuple[str, int], me: threading.Thread
    ) -> tuple[str, str, str]:
        """Run one session on an open control connection; return (kind, outcome, detail)."""
        kind = "?"
        session: Session | None = None
        try:
            channel.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hello = channel.recv(expect="hello")
            kind = require_str(hello.body, "session", 32, where="hello.")
            version = hello.body.get("version")
            if version != PROTOCOL_VERSION:
                raise ProbeError(f"protocol version {version!r} not supported")
            params = require_dict(hello.body, "params", where="hello.")
            handler = self.sessions.get(kind)
            if handler is None:
                known = ", ".join(sorted(self.sessions)) or "none"
                raise ProbeError(f"unknown session kind {kind!r} (this responder has {known})")
            local = channel.sock.getsockname()
            session = Session(
                channel,
                kind,
                params,
                peer,
                (str(local[0]), int(local[1])),
                step_timeout=self.idle_timeout,
            )
            with self._lock:
                self._sessions[me] = session
            if self._stop.is_set():
                raise ProbeError("responder is shutting down")
            with session.resources:
                result = handler(session) or {}
                if not session.ready_sent:
                    raise ProbeError(f"handler for {kind} returned without ready")
                if session.ended_idle is None:
                    session.wait_done()
            figures = " ".join(f"{k}={v}" for k, v in sorted(result.items()))
            if session.ended_idle is not None:  # a link the prober let go: nothing to answer
                return kind, "ok", f"{figures} rounds={session.rounds} ({session.ended_idle})"
            channel.send("done", {"result": result})
            if session.keepalive:
                figures += f" rounds={session.rounds}"
            return kind, "ok", figures
        except ProbeError as e:  # PeerError, ParseError, and refusals of a bad request
            channel.send_error(str(e))
            before_ready = session is None or not session.ready_sent
            bad_request = isinstance(e, ParseError) or not isinstance(e, PeerError)
            return kind, "refused" if before_ready and bad_request else "error", str(e)
        except Exception as e:  # a handler bug must not take the responder down
            log.exception("session %s from %s failed", kind, format_hostport(*peer))
            channel.send_error("internal error in responder")
            return kind, "error", f"internal error: {type(e).__name__}: {e}"
