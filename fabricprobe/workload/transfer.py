"""KV-cache transfers between a prefill host and a decode host: the `kv_sink` session.

The decode host's responder (`probe serve`, or the agent) answers `kv_sink` sessions.
One session carries many transfers, so a request's KV transfer pays for moving its
bytes and nothing else (no QP or connection setup per request):

- `rdma`: the sink registers a BUFFER-byte region with remote write access and answers
  `ready` with its RdmaEndpoint; the sender moves each transfer as RDMA WRITEs of one
  chunk each (the pipeline uses one layer's KV cache, as layer-wise transfer engines
  do), `outstanding` in flight, and the transfer ends when the last WRITE has completed
  (on RC that completion means the responder acknowledged the data). The sink's region
  is reused for every chunk: the bytes cross the fabric in full, only the landing place
  repeats.
- `tcp`: the sink accepts one data connection (token-checked, as fabricprobe.probes.tcp does) and
  reads `[8-byte length][payload]` frames, answering one byte per frame once the last
  payload byte is in; the sender's transfer ends at that byte.

Either way the sender times each transfer itself: the figure is what the decode host
waited for.
"""

from __future__ import annotations

import secrets
import socket
import struct
import time
from contextlib import ExitStack
from typing import Any, Protocol

from fabricprobe.core.deadline import Deadline
from fabricprobe.core.errors import PeerError, ProbeError
from fabricprobe.core.hostport import DEFAULT_PORT
from fabricprobe.probes.control import (
    ControlClient,
    Session,
    SessionHandler,
    require_int,
    require_str,
)
from fabricprobe.probes.measure import LinkParams
from fabricprobe.probes.tcp import TOKEN_BYTES, accept_streams, data_listener, open_data_connection

SESSION = "kv_sink"
MAX_CHUNK = 1 << 20
MAX_HOLD_S = 3600.0
SETUP_S = 30.0  # a session's setup (hello -> ready, its data connection or QP) in all
_FRAME = struct.Struct(">Q")
_MAX_TRANSFER = 1 << 40


class KvChannel(Protocol):
    transport: str
    device: str

    def send(self, nbytes: int, chunk: int | None = None) -> float: ...

    def round_trips(self, nbytes: int, chunk: int | None = None) -> int: ...

    def close(self) -> None: ...


# --------------------------------------------------------------------------- sender side


class _KvSession:
    """What both senders share: the kv_sink session and what it holds (on one ExitStack,
    released by close()), and the transfers sent over it."""

    ctl: ControlClient

    def __init__(self) -> None:
        self._stack = ExitStack()
        self.sent = 0

    def _last_words(self) -> None:
        """What the sink is told before `done` (nothing, unless a transport says so)."""

    def close(self) -> None:
        try:
            self._last_words()
            self.ctl.done({"transfers": self.sent}, timeout=10.0)
        except (OSError, ProbeError):
            pass
        finally:
            self._stack.close()


class TcpKvChannel(_KvSession):
    """A kv_sink session over TCP; send() moves N bytes and returns the seconds it took."""

    transport = "tcp"
    device = ""

    def __init__(
        self, peer: str, port: int = DEFAULT_PORT, *, bind: str | None = None, hold_s: float = 600
    ) -> None:
        super().__init__()
        self.ctl = self._stack.enter_context(ControlClient(peer, port, bind=bind, timeout=SETUP_S))
        setup = Deadline(SETUP_S)  # the session and its data connection, together
        try:
            info = self.ctl.open(SESSION, {"transport": "tcp", "hold_s": hold_s}, deadline=setup)
            self.sock = self._stack.enter_context(open_data_connection(self.ctl, info, setup))
        except BaseException:
            self._stack.close()
            raise
        self.sock.settimeout(hold_s)
        self._buf = bytearray(MAX_CHUNK)

    def send(self, nbytes: int, chunk: int | None = None) -> float:
        """Move NBYTES as one frame (CHUNK only matters to RDMA); seconds until acked."""
        if not 0 < nbytes <= _MAX_TRANSFER:
            raise ValueError(f"transfer of {nbytes} bytes")
        view = memoryview(self._buf)
        t0 = time.perf_counter()
        self.sock.sendall(_FRAME.pack(nbytes))
        left = nbytes
        while left:
            n = min(left, MAX_CHUNK)
            self.sock.sendall(view[:n])
            left -= n
        if self.sock.recv(1) != b"\x01":
            raise PeerError("kv_sink closed the data connection mid-transfer")
        seconds = time.perf_counter() - t0
        self.sent += 1
        return seconds

    def round_trips(self, nbytes: int, chunk: int | None = None) -> int:
        """One: the frame streams out whole and the sink's one byte answers it."""
        return 1

    def _last_words(self) -> None:
        self.sock.sendall(_FRAME.pack(0))  # the frame of no bytes: the sink stops reading


def write_round_trips(nbytes: int, chunk: int, outstanding: int) -> int:
    """The round trips a transfer of NBYTES as WRITEs of CHUNK bytes, OUTSTANDING in
    flight, waits for when the wire's delay rather than its bandwidth sets the pace: the
    WRITEs go out a window at a time, and a window's completions come back one RTT after
    it went out."""
    if nbytes < 1 or chunk < 1 or outstanding < 1:
        raise ValueError(f"{nbytes} bytes in chunks of {chunk}, {outstanding} in flight")
    writes = -(-nbytes // chunk)
    return -(-writes // outstanding)


class RdmaKvChannel(_KvSession):
    """A kv_sink session over RC: each transfer is WRITEs of up to CHUNK bytes."""

    transport = "rdma"

    def __init__(
        self,
        peer: str,
        port: int = DEFAULT_PORT,
        *,
        bind: str | None = None,
        buffer: int = MAX_CHUNK,
        outstanding: int = 4,
        hold_s: float = 600,
        step_s: float = 30.0,
        sysfs_root: str = "/sys",
    ) -> None:
        from fabricprobe.probes.rdma.rc import DEPTH, prober_session
        from fabricprobe.probes.rdma.verbs import RcEndpoint

        if not 1 <= buffer <= MAX_CHUNK:
            raise ValueError(f"buffer {buffer} outside 1..{MAX_CHUNK}")
        self.buffer, self.outstanding, self.step_s = buffer, min(outstanding, DEPTH), step_s
        super().__init__()
        session = prober_session(
            SESSION,
            LinkParams(peer, port, bind=bind, sysfs_root=sysfs_root),
            SETUP_S,
            {"transport": "rdma", "chunk": buffer, "hold_s": hold_s},
            lambda dev, gid_index: RcEndpoint(dev, buffer, DEPTH, gid_index),
        )
        try:
            self.ctl, self.ep, self.remote = self._stack.enter_context(session)
            self.ep.connect(self.remote)
        except BaseException:
            self._stack.close()
            raise
        self.device = self.ep.device

    def round_trips(self, nbytes: int, chunk: int | None = None) -> int:
        return write_round_trips(nbytes, min(chunk or self.buffer, self.buffer), self.outstanding)

    def send(self, nbytes: int, chunk: int | None = None) -> float:
        """Move NBYTES as WRITEs of CHUNK bytes (default: the whole buffer); seconds from
        the call until the last one completed."""
        if not 0 < nbytes <= _MAX_TRANSFER:
            raise ValueError(f"transfer of {nbytes} bytes")
        t0 = time.perf_counter()  # the work requests' making is the transfer's own time
        chunk = min(chunk or self.buffer, self.buffer)
        ops, tail = divmod(nbytes, chunk)
        full_wr = self.ep.write_wr(self.remote, chunk, True)
        tail_wr = self.ep.write_wr(self.remote, tail, True) if tail else None
        total = ops + (1 if tail else 0)
        posted = done = 0
        ep, poll, cq = self.ep, self.ep.poll, self.ep.send_cq
        while done < total:
            while posted < total and posted - done < self.outstanding:
                ep.post(full_wr if posted < ops else tail_wr)
                posted += 1
            got = poll(cq, 1, time.monotonic() + self.step_s)
            if not got:
                raise PeerError(
                    f"{posted - done} of {total} WRITEs unfinished after {self.step_s} s"
                )
            done += got
        seconds = time.perf_counter() - t0
        self.sent += 1
        return seconds


def open_channel(transport: str, peer: str, port: int, *, bind: str | None, **kw: Any) -> KvChannel:
    """A kv_sink session of TRANSPORT (`rdma` or `tcp`) to PEER's responder."""
    if transport == "tcp":
        return TcpKvChannel(peer, port, bind=bind)
    if transport == "rdma":
        return RdmaKvChannel(peer, port, bind=bind, **kw)
    raise ValueError(f"transport {transport!r}: rdma or tcp")


# --------------------------------------------------------------------------- sink side


def _read_frames(conn: socket.socket, session: Session) -> tuple[int, int]:
    head = bytearray(_FRAME.size)
    buf = bytearray(MAX_CHUNK)
    view = memoryview(buf)
    transfers = total = 0
    while not session.stopping:
        if conn.recv_into(head, _FRAME.size, socket.MSG_WAITALL) != _FRAME.size:
            break
        (n,) = _FRAME.unpack(head)
        if n == 0:
            break
        if n > _MAX_TRANSFER:
            raise PeerError(f"frame of {n} bytes")
        left = n
        while left:
            got = conn.recv_into(view, min(left, MAX_CHUNK))
            if not got:
                raise PeerError(f"data connection closed with {left} bytes of a frame unread")
            left -= got
        conn.sendall(b"\x01")
        transfers += 1
        total += n
    return transfers, total


def serve_kv_sink(session: Session) -> dict[str, Any]:
    """Take KV transfers until the sender says done (see the module docstring)."""
    p = session.params
    transport = require_str(p, "transport", 8, where="params.")
    hold_s = float(p.get("hold_s", 600))
    if not 1 <= hold_s <= MAX_HOLD_S:
        raise ValueError(f"params.hold_s {hold_s} outside 1..{MAX_HOLD_S}")
    if transport == "tcp":
        session.reserve(MAX_CHUNK, "a KV sink's receive buffer")
        lsock = data_listener(session)
        token = secrets.token_bytes(TOKEN_BYTES)
        session.ready({"data_port": lsock.getsockname()[1], "token": token.hex()})
        (conn,) = accept_streams(session, lsock, token, 1, hold_s)
        transfers, total = _read_frames(conn, session)
        return {"transfers": transfers, "bytes": total}
    if transport != "rdma":
        raise PeerError(f"params.transport must be rdma or tcp, not {transport!r}")
    from fabricprobe.probes.rdma.rc import DEPTH, responder_device
    from fabricprobe.probes.rdma.verbs import RcEndpoint

    chunk = require_int(p, "chunk", 1, MAX_CHUNK, where="params.")
    remote = session.rdma_endpoint()
    session.reserve(2 * chunk, "a KV sink's registered buffer")
    dev, gid_index = responder_device(session)
    ep = session.resources.enter_context(
        RcEndpoint(dev, chunk, DEPTH, gid_index, remote_access=True)
    )
    ep.connect(remote)
    session.ready({"endpoint": ep.endpoint().as_dict()})
    result = session.wait_done(timeout=hold_s)  # the WRITEs need nothing from this side
    return {"transfers": int(result.get("transfers", 0) or 0)}


# Session kind -> handler, for whoever builds a responder that serves KV transfers.
SESSIONS: dict[str, SessionHandler] = {SESSION: serve_kv_sink}
