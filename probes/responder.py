"""The responder: answers probe sessions from peers (`probe serve`, and the agent).

It serves only the fleet, within bounds that no peer can stretch:

- *Authenticated sessions.* With a fleet token (fabricprobe.probes.fleet) every hello is
  answered with a fresh nonce, and only a prober that returns HMAC(token, nonce and this
  connection's addresses and request) gets a session; the token never crosses the wire.
  A shared token, rather than tickets or TLS, because a responder must decide alone,
  at once and cheaply, with the collector possibly down (see fabricprobe.probes.fleet).
  Without a token (`auth=None`) it serves anyone: only when asked (`--insecure`).
- *A hello deadline.* The hello (and the answer to the challenge) must arrive within
  `hello_timeout`; a connection that has not proved itself holds no session slot, and at
  most `max_sessions` such connections (`max_per_source` per address) wait at once:
  beyond that they are closed at once.
- *Session limits.* `max_sessions` sessions at once, `max_per_source` of them per source
  address; kept links ask for a keepalive, granted up to `max_keepalive_s`.
- *A memory budget.* Each session kind reserves what it will hold (buffers, registered
  memory) against `max_memory_bytes`, shared by all sessions; over it the session is
  refused `busy`.
- *RDMA endpoints are the peer's.* An RC or UD hello whose GID is not the control
  connection's address is refused: ACKs and connections go only to who asked.

Every refusal is counted by reason (`refusals`; the agent exports them). The hello, the
challenge and the slots are in fabricprobe.probes.admission.

One listening socket; each accepted control connection gets its own thread, up to
`max_sessions` at once (beyond that a prober is refused with `error busy` at once,
never queued). Each session runs the handler its kind has in the table the responder
was built with (`sessions`: kind -> handler, see fabricprobe.probes.control;
fabricprobe.probes.rdma.sessions has the probes' own); every read has the idle timeout as
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
from collections import Counter

from fabricprobe.core.errors import ParseError, PeerError, ProbeError
from fabricprobe.core.hostport import DEFAULT_PORT, format_hostport
from fabricprobe.probes.admission import Handshake, Slots
from fabricprobe.probes.control import (
    MAX_KEEPALIVE_S,
    Channel,
    MemoryBudget,
    Refused,
    Session,
    SessionTable,
    session_table,
)
from fabricprobe.probes.fleet import FleetToken, canonical_ip
from fabricprobe.probes.measure import check_spin
from fabricprobe.probes.threads import name_os_thread

log = logging.getLogger("fabricprobe.responder")


class Responder:
    """A bounded, deadline-bound session server; see the module docstring."""

    def __init__(
        self,
        host: str = "0.0.0.0",
        port: int = DEFAULT_PORT,
        *,
        sessions: SessionTable,
        auth: FleetToken | None,
        max_sessions: int = 16,
        max_per_source: int = 8,
        max_memory_bytes: int = 64 << 20,
        max_keepalive_s: float = MAX_KEEPALIVE_S,
        hello_timeout: float = 2.0,
        idle_timeout: float = 30.0,
        grace: float = 2.0,
        spin_s: float | None = None,
    ) -> None:
        if max_sessions < 1 or max_per_source < 1:
            raise ValueError("max_sessions and max_per_source must be >= 1")
        if not idle_timeout > 0 or not hello_timeout > 0:
            raise ValueError("idle_timeout and hello_timeout must be positive")
        if not 0 <= max_keepalive_s <= MAX_KEEPALIVE_S:
            raise ValueError(f"max_keepalive_s outside 0..{MAX_KEEPALIVE_S:g}")
        check_spin(spin_s)
        self.spin_s = spin_s  # the compiled answering loops' busy-poll before they sleep
        self.host, self.port = host, port
        self.max_keepalive_s = max_keepalive_s
        self.idle_timeout = idle_timeout
        self.grace = grace
        self.budget = MemoryBudget(max_memory_bytes)
        self.sessions = session_table(sessions)
        self.handshake = Handshake(auth, min(hello_timeout, idle_timeout))
        self.slots = Slots(max_sessions, max_per_source)
        self._listener: socket.socket | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def refusals(self) -> Counter[str]:
        """Probers turned away so far, by reason (REFUSAL_REASONS)."""
        return self.slots.refusals

    @property
    def refused(self) -> int:
        """Probers turned away so far, for any reason."""
        return sum(self.refusals.values())

    @property
    def served(self) -> int:
        return self.slots.served

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
        """Connections being served now: sessions, and those still in their hello."""
        return self.slots.active()

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
        src = canonical_ip(peer[0])
        t = threading.Thread(target=self._run_session, args=(conn, peer, src), name="answer")
        if not self.slots.enter(t, conn, src):
            conn.close()  # a flood of connections that have not said hello: not even a reply
            return
        t.start()

    def _drain(self) -> None:
        for link in self.slots.idle_links():  # links between rounds lose nothing
            link.abort()
        deadline = time.monotonic() + self.grace
        while self.active_sessions() and time.monotonic() < deadline:
            time.sleep(0.02)
        items = self.slots.held()
        for _, session in items:
            if isinstance(session, Session):
                session.abort()
            else:  # still in its hello
                with contextlib.suppress(OSError):
                    session.shutdown(socket.SHUT_RDWR)
        for t, _ in items:
            t.join()

    def _run_session(self, conn: socket.socket, peer: tuple[str, int], src: str) -> None:
        name_os_thread()
        started = time.monotonic()
        me = threading.current_thread()
        channel = Channel(conn, self.idle_timeout)
        try:
            with conn:
                kind, outcome, detail = self._session(channel, peer, src, me)
        finally:
            self.slots.leave(me, src)
        elapsed = time.monotonic() - started
        tail = f" ({detail})" if detail else ""
        who = format_hostport(*peer)
        log.info("session %s from %s: %s in %.3f s%s", kind, who, outcome, elapsed, tail)

    def _session(
        self, channel: Channel, peer: tuple[str, int], src: str, me: threading.Thread
    ) -> tuple[str, str, str]:
        """Run one session on an open control connection; return (kind, outcome, detail)."""
        kind = "?"
        session: Session | None = None
        try:
            channel.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            l_addr = channel.sock.getsockname()
            local = (str(l_addr[0]), int(l_addr[1]))
            kind, params = self.handshake.read(channel, peer, local)
            handler = self.sessions.get(kind)
            if handler is None:
                known = ", ".join(sorted(self.sessions)) or "none"
                raise ProbeError(f"unknown session kind {kind!r} (this responder has {known})")
            self.slots.admit(me, src)
            session = Session(
                channel,
                kind,
                params,
                peer,
                local,
                step_timeout=self.idle_timeout,
                max_keepalive_s=self.max_keepalive_s,
                budget=self.budget,
                spin_s=self.spin_s,
            )
            self.slots.hold(me, session)
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
        except Refused as e:
            self.slots.refuse(e.reason)
            channel.send_error(str(e))
            return kind, f"refused {e.reason}", str(e)
        except ProbeError as e:  # PeerError, ParseError, and refusals of a bad request
            channel.send_error(str(e))
            before_ready = session is None or not session.ready_sent
            bad_request = isinstance(e, ParseError) or not isinstance(e, PeerError)
            return kind, "refused" if before_ready and bad_request else "error", str(e)
        except Exception as e:  # a handler bug must not take the responder down
            log.exception("session %s from %s failed", kind, format_hostport(*peer))
            channel.send_error("internal error in responder")
            return kind, "error", f"internal error: {type(e).__name__}: {e}"
