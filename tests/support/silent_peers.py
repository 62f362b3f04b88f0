"""Peers that stop answering, on loopback, for the deadline tests: each is a small
scripted imitation of `probe serve` (the real framing, fabricprobe.probes.control) that
falls silent at one chosen point and holds its sockets open until the test ends."""

from __future__ import annotations

import contextlib
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType

from fabricprobe.probes.control import Channel, Message

LOOPBACK = "127.0.0.1"
MODES = ("hang", "challenge", "trickle", "echo_then_silent", "no_done", "stop_reading")


class SilentPeer:
    """A control port on 127.0.0.1 that behaves as MODE says:

    - `hang`: takes the connection, never reads or answers;
    - `challenge`: answers the hello with a fleet-token challenge, then nothing;
    - `trickle`: answers each setup step DELAY s late (challenge, then ready), each one
      inside a per-step timeout but not inside one deadline for the whole setup;
    - `echo_then_silent`: a full tcp_lat session that echoes ECHOES messages, then stops;
    - `no_done`: a tcp_lat session that echoes everything and never answers `done`;
    - `stop_reading`: a tcp_bw session whose data stream stops being read after
      READ_BYTES (the sender's socket buffers fill up).
    """

    def __init__(
        self, mode: str, *, delay: float = 0.0, echoes: int = 0, read_bytes: int = 0
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        self.mode, self.delay, self.echoes, self.read_bytes = mode, delay, echoes, read_bytes
        self._stop = threading.Event()
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener = self._keep(socket.create_server((LOOPBACK, 0)))
        self.port = int(self._listener.getsockname()[1])
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def __enter__(self) -> SilentPeer:
        self._thread.start()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        with self._lock:
            socks = list(self._socks)
        for s in socks:  # shutdown wakes a thread blocked on the socket, close alone may not
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        self._thread.join(5)

    def _keep(self, s: socket.socket) -> socket.socket:
        with self._lock:
            self._socks.append(s)
        return s

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self._keep(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _hold(self) -> None:
        self._stop.wait(60)

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(Exception):  # the prober hangs up whenever it likes
            if self.mode == "hang":
                return self._hold()
            ch = Channel(conn, 30.0)
            hello = ch.recv(expect="hello")
            if self.mode in ("challenge", "trickle"):
                time.sleep(self.delay)
                ch.send("challenge", {"nonce": secrets.token_hex(32)})
                if self.mode == "challenge":
                    return self._hold()
                ch.recv(expect="auth")
                time.sleep(self.delay)
            self._session(ch, hello)

    def _session(self, ch: Channel, hello: Message) -> None:
        kind = hello.body["session"]
        data = self._keep(socket.create_server((LOOPBACK, 0)))
        token = secrets.token_bytes(16)
        info = {"data_port": data.getsockname()[1], "token": token.hex()}
        ch.send("ready", {"session": kind, "info": info, "keepalive_s": 0.0})
        if self.mode == "trickle":
            return self._hold()  # the data connection is never taken
        conn, _ = data.accept()
        self._keep(conn)
        if conn.recv(16, socket.MSG_WAITALL) != token:
            return None
        if self.mode == "stop_reading":
            got = 0
            while got < self.read_bytes:
                got += len(conn.recv(65536)) or self.read_bytes
            return self._hold()
        size = int(hello.body["params"]["size"])
        echoed = 0
        while self.mode == "no_done" or echoed < self.echoes:
            msg = conn.recv(size, socket.MSG_WAITALL)
            if len(msg) < size:
                break
            conn.sendall(msg)
            echoed += 1
        return self._hold()  # no more echoes, and no answer to `done`


@contextmanager
def refusing_port() -> Iterator[str]:
    """A port bound but not listening: a connection is refused (RST) at once."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        yield f"{LOOPBACK}:{s.getsockname()[1]}"


@contextmanager
def full_backlog() -> Iterator[str]:
    """A listener whose accept queue is full: the kernel drops new SYNs, so a connect
    neither succeeds nor fails until the client's own deadline."""
    with contextlib.ExitStack() as stack:
        listener = stack.enter_context(socket.socket())
        listener.bind((LOOPBACK, 0))
        listener.listen(0)
        address = listener.getsockname()
        for _ in range(3):  # more than the queue holds (backlog 0 takes one)
            c = stack.enter_context(socket.socket())
            c.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                c.connect(address)
        time.sleep(0.1)  # let the handshakes that can complete, complete
        yield f"{LOOPBACK}:{address[1]}"
