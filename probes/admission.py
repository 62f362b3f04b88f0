"""Who the responder (probes/responder.py) lets in: a prober's hello within its deadline,
its answer to the fleet token's challenge, and the bounded slots every connection and
session takes.

`Handshake` reads the hello on an open control connection and, with a fleet token,
checks the HMAC of a fresh nonce (fabricprobe.probes.fleet); a prober that does not
prove itself is refused with the reason counted. `Slots` holds each connection's thread
from accept to close: at most `max_sessions` connections still in their hello and as
many sessions (`max_per_source` of each per source address); beyond them a connection is
closed at once, or its session refused `busy` or `source`.
"""

from __future__ import annotations

import secrets
import socket
import threading
import time
from collections import Counter
from typing import Any

from fabricprobe.core.errors import REFUSAL_REASONS, ParseError, PeerError, ProbeError
from fabricprobe.probes.control import (
    PROTOCOL_VERSION,
    Channel,
    Message,
    PeerClosed,
    Refused,
    Session,
    require_dict,
    require_str,
)
from fabricprobe.probes.fleet import NONCE_BYTES, FleetToken


class Handshake:
    """A session's start: the hello (and, with a fleet token, the answer to our
    challenge), all within HELLO_TIMEOUT seconds."""

    def __init__(self, auth: FleetToken | None, hello_timeout: float) -> None:
        self.auth = auth
        self.hello_timeout = hello_timeout

    def read(
        self, channel: Channel, peer: tuple[str, int], local: tuple[str, int]
    ) -> tuple[str, dict[str, Any]]:
        """The session kind and its params; Refused when the prober is late or not of the
        fleet, PeerError or ParseError when what it sent is not a hello."""
        end = time.monotonic() + self.hello_timeout

        def left() -> float:
            return max(0.001, end - time.monotonic())

        try:
            hello = channel.recv(expect="hello", timeout=left())
        except PeerError as e:
            if isinstance(e, ParseError | PeerClosed):  # garbage, or a port check
                raise
            raise Refused(f"no hello within {self.hello_timeout:g} s ({e})", "hello") from None
        kind = require_str(hello.body, "session", 32, where="hello.")
        version = hello.body.get("version")
        if version != PROTOCOL_VERSION:
            raise ProbeError(f"protocol version {version!r} not supported")
        params = require_dict(hello.body, "params", where="hello.")
        if self.auth is not None:
            nonce = secrets.token_bytes(NONCE_BYTES)
            channel.send("challenge", {"nonce": nonce.hex(), "mac": "hmac-sha256"})
            try:
                answer = channel.recv(timeout=left())
            except PeerError as e:
                if isinstance(e, ParseError):
                    raise
                raise Refused(
                    f"unauthenticated: no answer to the challenge ({e})", "hello"
                ) from None
            if not self.verified(answer, nonce, peer, local, kind, params):
                raise Refused("unauthenticated: not a member of this fleet", "unauthenticated")
        return kind, params

    def verified(
        self,
        answer: Message,
        nonce: bytes,
        peer: tuple[str, int],
        local: tuple[str, int],
        kind: str,
        params: dict[str, Any],
    ) -> bool:
        """Whether ANSWER is the HMAC of NONCE, both addresses and the request."""
        mac = answer.body.get("mac")
        if answer.kind != "auth" or not isinstance(mac, str) or len(mac) != 64:
            return False
        assert self.auth is not None
        return self.auth.verify(mac, nonce, peer[0], local[0], kind, params)


class Slots:
    """Every connection's thread from accept to close, and the session it holds once
    admitted, within the bounds; refusals counted by reason. Thread-safe."""

    def __init__(self, max_sessions: int, max_per_source: int) -> None:
        self.max_sessions, self.max_per_source = max_sessions, max_per_source
        self.lock = threading.Lock()
        # every connection's thread: a Session once it has one, else its socket
        self.threads: dict[threading.Thread, Session | socket.socket] = {}
        self._admitted: set[threading.Thread] = set()  # those holding a session slot
        self._pending_by_src: Counter[str] = Counter()
        self._sessions_by_src: Counter[str] = Counter()
        self.served = 0
        self.refusals: Counter[str] = Counter({r: 0 for r in REFUSAL_REASONS})

    def enter(self, thread: threading.Thread, conn: socket.socket, src: str) -> bool:
        """Hold THREAD for a new connection from SRC while it says hello; False (the
        refusal counted) when as many connections are waiting as the bounds allow."""
        with self.lock:
            pending = len(self.threads) - len(self._admitted)
            if pending >= self.max_sessions or self._pending_by_src[src] >= self.max_per_source:
                self.refusals["busy" if pending >= self.max_sessions else "source"] += 1
                return False
            self.threads[thread] = conn
            self._pending_by_src[src] += 1
            return True

    def admit(self, thread: threading.Thread, src: str) -> None:
        """Take a session slot for THREAD, or refuse: the responder or the source is full."""
        with self.lock:
            if len(self._admitted) >= self.max_sessions:
                raise Refused(f"busy: {self.max_sessions} sessions running", "busy")
            if self._sessions_by_src[src] >= self.max_per_source:
                raise Refused(f"busy: {src} already holds {self.max_per_source} sessions", "source")
            self._admitted.add(thread)
            self._pending_by_src[src] -= 1
            self._sessions_by_src[src] += 1

    def hold(self, thread: threading.Thread, session: Session) -> None:
        """THREAD's connection runs SESSION now (drain and abort reach it through it)."""
        with self.lock:
            self.threads[thread] = session

    def leave(self, thread: threading.Thread, src: str) -> None:
        """THREAD's connection from SRC is closed: its slot is free."""
        with self.lock:
            self.threads.pop(thread, None)
            if thread in self._admitted:
                self._admitted.discard(thread)
                self._sessions_by_src[src] -= 1
                self.served += 1
            else:
                self._pending_by_src[src] -= 1

    def refuse(self, reason: str) -> None:
        with self.lock:
            self.refusals[reason] += 1

    def active(self) -> int:
        """Connections being served now: sessions, and those still in their hello."""
        with self.lock:
            return len(self.threads)

    def idle_links(self) -> list[Session]:
        """Kept links between rounds (they lose nothing when let go at once)."""
        with self.lock:
            return [s for s in self.threads.values() if isinstance(s, Session) and s.idle]

    def held(self) -> list[tuple[threading.Thread, Session | socket.socket]]:
        with self.lock:
            return list(self.threads.items())
