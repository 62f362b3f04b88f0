"""The probe control protocol: one small TCP connection per probe session.

Every probe (TCP or RDMA) starts with a control connection from the prober to the
responder (`probe serve`, default port 4793; 18515 is left to perftest). It carries
length-prefixed JSON messages: a 4-byte big-endian length, then that many bytes of
UTF-8 JSON holding one object with a string `kind`. Messages larger than
MAX_MESSAGE_BYTES are refused before they are read. Every read and write has a
deadline; a peer that is silent, closes early or sends garbage raises PeerError (bad
content raises ProtocolError, which is both a PeerError and a ParseError).

A session:

    prober                                      responder
    hello {version, session, params}   ---->
                                       <----    challenge {nonce}      (with a fleet token)
    auth {mac}                         ---->    (HMAC of the nonce: fabricprobe.probes.fleet)
                                       <----    ready {session, info, keepalive_s}
                                                |  error {reason}
    (session-specific messages and/or a separate data path)
    done {result}                      ---->
                                       <----    done {result}          (then both close)

A prober that probes the same peer again and again keeps the session (a *link*): its
hello asks for `keepalive_s` > 0, and after a round it sends `again {params}` instead of
`done`; the responder answers `go {info}` once it is ready for the next round over the
resources it already holds (an RDMA QP stays connected). Between rounds the responder
waits up to `keepalive_s` (at most MAX_KEEPALIVE_S, and at most what the responder grants:
`ready` says how long) for `again` or `done`; silence or a
closed connection then ends the session quietly and releases what it held, and the
prober's next `again` fails before any round starts (LinkStale: open a new link).

    again {params}                     ---->
                                       <----    go {info}
    (the next round)

Session handlers (responder side)
---------------------------------
A session kind (`tcp_lat`, `tcp_bw`, `rdma_rc_lat`, `rdma_rc_bw`, `rdma_ud`, ...) is a
function; each module that serves sessions exports a table of kind -> handler
(`SESSIONS`), and whoever builds a responder passes the tables it serves::

    def serve_rc_lat(session: Session) -> dict[str, object] | None:
        peer = RdmaEndpoint.from_dict(session.params.get("endpoint"), where="params.endpoint")
        qp = session.resources.enter_context(make_qp(...))    # released on every path
        session.ready({"endpoint": RdmaEndpoint(...).as_dict()})
        session.wait_done()            # keep the QP alive until the prober is finished
        return {"echoed": n}           # optional; sent back in the responder's `done`

    SESSIONS = {"rdma_rc_lat": serve_rc_lat}
    Responder(host, port, sessions=session_table(tcp.SESSIONS, SESSIONS))

The contract:

* The handler is called in its own thread after `hello` was read and its version
  checked; `session.params` is the hello's JSON object, not yet validated: validate it
  with `require_int` / `require_str` / `RdmaEndpoint.from_dict` etc. Any ProbeError
  the handler raises (ParseError, PeerError, NotSupported, ...) goes back to the
  prober as an `error` reply (best effort) and into the session's log line; any other
  exception is logged with its traceback and reported as an internal error.
* Acquire resources through `session.resources` (a contextlib.ExitStack) and register
  every socket with `session.track(sock)`: the responder closes them all when the
  session ends, whatever the path, and shuts tracked sockets down (waking any blocked
  call) when the responder stops or the session is aborted. Check `session.stopping`
  in long loops.
* Before ready, declare the memory the session will hold with `session.reserve(bytes,
  what)` (buffers, registered memory): it counts against the responder's budget until the
  session ends, and over the budget the session is refused `busy`. An RDMA handler checks
  the prober's endpoint with `check_endpoint_peer(endpoint, session.peer[0])` first.
* Call `session.ready(info)` exactly once; `info` is the session-specific reply
  (for RDMA: the responder's RdmaEndpoint as a dict).
* Use `session.channel.send(...)` / `session.channel.recv(...)` for any further
  messages and pass deadlines from `session.step_timeout`; never block without one.
* A handler that serves links runs its rounds in a loop: after a round it calls
  `session.next_round()`, which returns the next `again`'s params (validate them, then
  call `session.go(info)` and run the round) or None when the prober is finished or
  gone; then it returns. Without `keepalive_s` in the hello there is one round. A link
  whose rounds need no `again` (tcp_lat's echo serves whatever arrives) ends in the
  handler's own data path: it sets `session.ended_idle` to why, and nothing is answered.
* Return an optional dict of responder-side figures. If the handler has not called
  `session.wait_done()` itself, the responder waits for the prober's `done` (within
  `step_timeout`) and replies `done` with that dict.

Prober side: `ControlClient(host, port).open(kind, params)` returns the responder's
`ready` info; `client.done(result)` finishes the session and returns the responder's
figures.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import re
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from fabricprobe.core.deadline import Deadline, Timeout, as_deadline
from fabricprobe.core.errors import ParseError, PeerError, ProbeError
from fabricprobe.core.hostport import DEFAULT_PORT, format_hostport
from fabricprobe.probes.fleet import NONCE_BYTES, FleetToken
from fabricprobe.probes.measure import LinkParams

PROTOCOL_VERSION = 1
MAX_MESSAGE_BYTES = 64 * 1024
DEFAULT_TIMEOUT_S = 5.0
MAX_KEEPALIVE_S = 600.0  # the longest a responder holds a link's resources between rounds

_HEADER = struct.Struct("!I")
_KIND_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
CORE_KINDS = frozenset({"hello", "challenge", "auth", "ready", "error", "done"})


class ProtocolError(PeerError, ParseError):
    """The peer sent something that is not a valid control message."""


class Refused(ProbeError):
    """The responder turns a request away for a reason it counts (`reason`: one of
    core.errors.REFUSAL_REASONS): it is full, the source holds its share, the memory
    budget is spent, the prober did not prove it belongs to the fleet, or an RDMA endpoint
    is not the control connection's peer."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class PeerUnreachable(PeerError):
    """Nothing answered the session's setup: the connection was refused or not accepted
    in time, or the peer took it and stayed silent. No other session kind would fare
    better there now, so a caller with several to run may skip the rest."""


class PeerClosed(PeerError):
    """The peer closed the control connection between messages."""


class LinkStale(PeerError):
    """A kept link's responder is gone (restarted, or its keepalive ran out) before the next
    round started: nothing of the round was sent, so a new link may run it."""


# --------------------------------------------------------------------------- deadlines


def _left(deadline: Deadline, what: str) -> float:
    """Seconds left for WHAT; PeerError when none are (settimeout(0) would not block)."""
    left = deadline.remaining()
    if left <= 0:
        raise PeerError(f"no time left for {what}: the {deadline.seconds:g} s deadline passed")
    return left


# --------------------------------------------------------------------------- framing


def _recv_exact(sock: socket.socket, n: int, deadline: Deadline, what: str) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        left = deadline.remaining()
        if left <= 0:
            raise PeerError(f"no {what} from peer within {deadline.seconds:g} s")
        sock.settimeout(left)
        try:
            k = sock.recv_into(view[got:], n - got)
        except TimeoutError:
            raise PeerError(f"no {what} from peer within {deadline.seconds:g} s") from None
        except OSError as e:
            raise PeerError(f"connection to peer failed while reading {what}: {e}") from e
        if k == 0:
            if got == 0 and what == "message header":
                raise PeerClosed("peer closed the control connection")
            raise PeerError(f"peer closed the connection mid-{what} (got {got} of {n} bytes)")
        got += k
    return bytes(buf)


def encode_message(kind: str, body: dict[str, Any]) -> bytes:
    """One framed message; raises ValueError for our own bad or oversize messages."""
    if not _KIND_RE.match(kind):
        raise ValueError(f"bad message kind {kind!r}")
    if "kind" in body:
        raise ValueError("message body must not carry its own 'kind'")
    payload = json.dumps({"kind": kind, **body}, allow_nan=False, separators=(",", ":"))
    data = payload.encode()
    if len(data) > MAX_MESSAGE_BYTES:
        raise ValueError(f"{kind} message is {len(data)} bytes, over {MAX_MESSAGE_BYTES}")
    return _HEADER.pack(len(data)) + data


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def decode_payload(data: bytes) -> Message:
    """Parse one message body (without its length prefix); bad content raises ProtocolError."""
    try:
        obj = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ProtocolError(f"peer sent a message that is not UTF-8 JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"peer sent a JSON {type(obj).__name__}, expected an object")
    kind = obj.pop("kind", None)
    if not isinstance(kind, str) or not _KIND_RE.match(kind):
        raise ProtocolError(f"peer sent a message without a valid 'kind' (got {kind!r})")
    return Message(kind, obj)


@dataclass(frozen=True)
class Message:
    """One control message: its kind and the remaining fields of the JSON object."""

    kind: str
    body: dict[str, Any] = field(default_factory=dict)


class Channel:
    """A framed, deadline-bound message stream over a connected TCP socket."""

    def __init__(self, sock: socket.socket, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.sock = sock
        self.timeout = timeout

    def send(
        self, kind: str, body: dict[str, Any] | None = None, *, timeout: Timeout | None = None
    ) -> None:
        """Send one message; TIMEOUT (a Deadline shares the time with other steps) bounds
        the whole sendall."""
        data = encode_message(kind, body or {})
        deadline = as_deadline(timeout if timeout is not None else self.timeout)
        self.sock.settimeout(_left(deadline, f"the {kind} message"))
        try:
            self.sock.sendall(data)
        except TimeoutError:
            raise PeerError(
                f"peer did not take the {kind} message within {deadline.seconds:g} s"
            ) from None
        except OSError as e:
            raise PeerError(f"connection to peer failed while sending {kind}: {e}") from e

    def recv(self, *, timeout: Timeout | None = None, expect: str | None = None) -> Message:
        """Read one message within TIMEOUT (a Deadline shares the time with other steps);
        with EXPECT, anything else (or `error`) raises."""
        deadline = as_deadline(timeout if timeout is not None else self.timeout)
        (length,) = _HEADER.unpack(_recv_exact(self.sock, _HEADER.size, deadline, "message header"))
        if length == 0 or length > MAX_MESSAGE_BYTES:
            raise ProtocolError(
                f"peer announced a {length}-byte message (allowed 1..{MAX_MESSAGE_BYTES})"
            )
        msg = decode_payload(_recv_exact(self.sock, length, deadline, "message body"))
        if expect is not None and msg.kind != expect:
            if msg.kind == "error":
                raise PeerError(f"peer refused: {_reason(msg)}")
            raise ProtocolError(f"expected a {expect} message from peer, got {msg.kind}")
        return msg

    def send_error(self, reason: str) -> None:
        """Best effort: tell the peer why we give up; a dead peer is not an error here."""
        with contextlib.suppress(PeerError, ValueError):
            self.send("error", {"reason": reason[:1000]}, timeout=min(self.timeout, 1.0))


def _reason(msg: Message) -> str:
    reason = msg.body.get("reason")
    return reason if isinstance(reason, str) and reason else "no reason given"


# --------------------------------------------------------------------------- field checks


def require_int(obj: dict[str, Any], name: str, lo: int, hi: int, *, where: str = "") -> int:
    """OBJ[NAME] as an int in LO..HI; anything else raises ProtocolError naming the field."""
    v = obj.get(name)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ProtocolError(f"{where}{name}: expected an integer in {lo}..{hi}, got {v!r}")
    return v


def optional_int(
    obj: dict[str, Any], name: str, lo: int, hi: int, default: int, *, where: str = ""
) -> int:
    return default if obj.get(name) is None else require_int(obj, name, lo, hi, where=where)


def require_float(
    obj: dict[str, Any], name: str, lo: float, hi: float, *, where: str = ""
) -> float:
    """OBJ[NAME] as a finite number in LO..HI (ints accepted)."""
    v = obj.get(name)
    if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
        raise ProtocolError(f"{where}{name}: expected a number in {lo:g}..{hi:g}, got {v!r}")
    return float(v)


def optional_float(
    obj: dict[str, Any], name: str, lo: float, hi: float, default: float, *, where: str = ""
) -> float:
    return default if obj.get(name) is None else require_float(obj, name, lo, hi, where=where)


def require_str(obj: dict[str, Any], name: str, max_len: int = 256, *, where: str = "") -> str:
    v = obj.get(name)
    if not isinstance(v, str) or not 0 < len(v) <= max_len:
        raise ProtocolError(f"{where}{name}: expected a string of 1..{max_len} chars, got {v!r}")
    return v


def require_dict(obj: dict[str, Any], name: str, *, where: str = "") -> dict[str, Any]:
    v = obj.get(name)
    if not isinstance(v, dict):
        raise ProtocolError(f"{where}{name}: expected an object, got {type(v).__name__}")
    return v


# --------------------------------------------------------------------------- RDMA endpoint

IB_MTUS = (256, 512, 1024, 2048, 4096)
_U24 = (1 << 24) - 1
_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1


@dataclass(frozen=True)
class RdmaEndpoint:
    """What one side of an RDMA session must tell the other out of band.

    `gid` is the 16-byte GID in IPv6 notation (RoCE v2 GIDs of IPv4 addresses are
    IPv4-mapped, ::ffff:a.b.c.d); `lid` is 0 on RoCE; `rkey`/`addr` describe the
    remote-writable buffer (0/0 for sessions that never use RDMA WRITE).
    """

    qpn: int  # 24-bit queue pair number
    psn: int  # 24-bit initial packet sequence number
    gid: str
    gid_index: int
    lid: int
    rkey: int
    addr: int
    mtu: int  # path MTU in bytes (one of IB_MTUS)

    def __post_init__(self) -> None:
        _check_range("qpn", self.qpn, 1, _U24)
        _check_range("psn", self.psn, 0, _U24)
        _check_range("gid_index", self.gid_index, 0, 255)
        _check_range("lid", self.lid, 0, 0xFFFF)
        _check_range("rkey", self.rkey, 0, _U32)
        _check_range("addr", self.addr, 0, _U64)
        if self.mtu not in IB_MTUS:
            raise ValueError(f"mtu: expected one of {IB_MTUS}, got {self.mtu!r}")
        try:
            if not isinstance(self.gid, str):
                raise TypeError("not a string")
            canonical = str(ipaddress.IPv6Address(self.gid))
        except (ipaddress.AddressValueError, TypeError) as e:
            raise ValueError(f"gid: not a 16-byte GID in IPv6 notation: {self.gid!r}") from e
        object.__setattr__(self, "gid", canonical)

    @classmethod
    def datagram(cls, qpn: int, gid: str, gid_index: int) -> RdmaEndpoint:
        """A UD QP's address: no PSN, no remote buffer; its messages fit any path MTU."""
        return cls(qpn=qpn, psn=0, gid=gid, gid_index=gid_index, lid=0, rkey=0, addr=0, mtu=1024)

    @property
    def gid_bytes(self) -> bytes:
        return ipaddress.IPv6Address(self.gid).packed

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, obj: object, *, where: str = "endpoint") -> RdmaEndpoint:
        """Build from a peer's JSON object; anything malformed raises ProtocolError."""
        if not isinstance(obj, dict):
            raise ProtocolError(f"{where}: expected an object, got {type(obj).__name__}")
        w = f"{where}."
        try:
            return cls(
                qpn=require_int(obj, "qpn", 1, _U24, where=w),
                psn=require_int(obj, "psn", 0, _U24, where=w),
                gid=require_str(obj, "gid", 64, where=w),
                gid_index=require_int(obj, "gid_index", 0, 255, where=w),
                lid=require_int(obj, "lid", 0, 0xFFFF, where=w),
                rkey=require_int(obj, "rkey", 0, _U32, where=w),
                addr=require_int(obj, "addr", 0, _U64, where=w),
                mtu=require_int(obj, "mtu", 256, 4096, where=w),
            )
        except ValueError as e:
            raise ProtocolError(f"{w}{e}") from None


def _check_range(name: str, v: object, lo: int, hi: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{name}: expected an integer in {lo}..{hi}, got {v!r}")


# --------------------------------------------------------------------------- connections


def wait_listening(host: str, port: int, timeout: float) -> None:
    """Wait until something accepts TCP connections on HOST:PORT (a responder that is
    still starting); ProbeError after TIMEOUT seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise ProbeError(f"nothing listens on {host}:{port} after {timeout:g} s") from None
            time.sleep(0.2)


def connect(
    host: str, port: int, *, bind: str | None = None, timeout: Timeout = DEFAULT_TIMEOUT_S
) -> socket.socket:
    """A TCP connection to HOST:PORT from source address BIND, within TIMEOUT (all the
    addresses HOST resolves to share it).

    The source address picks the path when several hosts are addresses on one machine.
    Refused or unreachable peers raise PeerError at once; a peer that drops the SYN (no
    route, a full listen backlog) raises it at the deadline; the socket is never leaked.
    """
    deadline = as_deadline(timeout)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise PeerUnreachable(f"cannot resolve {host}: {e.strerror}") from None
    last: Exception | None = None
    for family, stype, proto, _, sockaddr in infos:
        sock = socket.socket(family, stype, proto)
        try:
            if bind:
                sock.bind((bind, 0))
            sock.settimeout(_left(deadline, f"connecting to {host}:{port}"))
            sock.connect(sockaddr)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except (OSError, PeerError) as e:
            sock.close()
            last = e
    if isinstance(last, TimeoutError | PeerError):
        raise PeerUnreachable(
            f"{host}:{port} did not accept the connection within {deadline.seconds:g} s"
        )
    where = f" from {bind}" if bind else ""
    raise PeerUnreachable(f"cannot connect to {host}:{port}{where}: {_os_reason(last)}")


def _os_reason(e: Exception | None) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) if e else "no address"


# --------------------------------------------------------------------------- prober side


class ControlClient:
    """The prober's end of one control session; a context manager that always closes."""

    def __init__(
        self,
        host: str,
        port: int = DEFAULT_PORT,
        *,
        bind: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        token: FleetToken | None = None,
    ) -> None:
        self.host, self.port, self.bind, self.timeout = host, port, bind, timeout
        self.token = token
        self.keepalive_s = 0.0  # what the responder granted a kept session
        self._sock: socket.socket | None = None
        self.channel: Channel | None = None

    @classmethod
    def to(cls, link: LinkParams, timeout: float) -> ControlClient:
        """The control client of LINK's responder (its peer, port, source address and
        fleet token), TIMEOUT bounding its setup."""
        return cls(link.peer, link.port, bind=link.bind, timeout=timeout, token=link.token)

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(
        self, session: str, params: dict[str, Any], *, deadline: Deadline | None = None
    ) -> dict[str, Any]:
        """Connect, send hello (answer the responder's challenge with the fleet token)
        and return the responder's `ready` info, all within DEADLINE (default: the
        client's timeout from now). Pass the same DEADLINE on to the rest of the
        session's setup (its data connections) so that the whole setup fits in it."""
        deadline = deadline or Deadline(self.timeout)
        self._sock = connect(self.host, self.port, bind=self.bind, timeout=deadline)
        self.channel = Channel(self._sock, self.timeout)
        self.channel.send(
            "hello",
            {"version": PROTOCOL_VERSION, "session": session, "params": params},
            timeout=deadline,
        )
        msg = self._reply(deadline, "the hello")
        if msg.kind == "challenge":
            msg = self._answer(msg, session, params, deadline)
        if msg.kind == "error":
            raise PeerError(f"peer refused: {_reason(msg)}")
        if msg.kind != "ready":
            raise ProtocolError(f"expected a ready message from peer, got {msg.kind}")
        if msg.body.get("session") != session:
            raise ProtocolError(f"peer answered for session {msg.body.get('session')!r}")
        granted = msg.body.get("keepalive_s", params.get("keepalive_s", 0.0))
        self.keepalive_s = float(granted) if isinstance(granted, int | float) else 0.0
        return require_dict(msg.body, "info", where="ready.")

    def _reply(self, deadline: Deadline, to: str) -> Message:
        """The responder's answer TO a setup message; a silent peer raises PeerError
        naming what it did not answer."""
        assert self.channel is not None
        try:
            return self.channel.recv(timeout=deadline)
        except PeerError as e:
            if not deadline.expired or isinstance(e, PeerClosed | ProtocolError):
                raise
            raise PeerUnreachable(
                f"{format_hostport(self.host, self.port)} took the connection but did not "
                f"answer {to} within {deadline.seconds:g} s (is `probe serve` running there?)"
            ) from None

    def _answer(
        self, challenge: Message, session: str, params: dict[str, Any], deadline: Deadline
    ) -> Message:
        """Prove we hold the fleet token: HMAC of the nonce for this connection."""
        assert self.channel is not None and self._sock is not None
        if self.token is None:
            raise PeerError(
                f"{self.host} asks for the fleet token: give it (--token-file) to probe it"
            )
        try:
            nonce = bytes.fromhex(require_str(challenge.body, "nonce", 2 * NONCE_BYTES))
        except ValueError:
            raise ProtocolError("challenge.nonce: not hex") from None
        mine, theirs = self._sock.getsockname()[0], self._sock.getpeername()[0]
        mac = self.token.answer(nonce, str(mine), str(theirs), session, params)
        self.channel.send("auth", {"mac": mac}, timeout=deadline)
        return self._reply(deadline, "the fleet-token answer (auth)")

    @property
    def local_address(self) -> str:
        if self._sock is None:
            raise ProbeError("control session is not open")
        return str(self._sock.getsockname()[0])

    def done(
        self, result: dict[str, Any] | None = None, *, timeout: Timeout | None = None
    ) -> dict[str, Any]:
        """Tell the responder we are finished; return the figures it sends back. The
        exchange (both messages) fits in TIMEOUT (default: the client's timeout)."""
        if self.channel is None:
            raise ProbeError("control session is not open")
        deadline = as_deadline(timeout if timeout is not None else self.timeout)
        self.channel.send("done", {"result": result or {}}, timeout=deadline)
        msg = self.channel.recv(expect="done", timeout=deadline)
        res = msg.body.get("result", {})
        return res if isinstance(res, dict) else {}

    def again(self, params: dict[str, Any]) -> dict[str, Any]:
        """Ask a kept session for its next round; the responder's `go` info. A responder
        that is gone (or refuses) raises LinkStale: the round did not start."""
        if self.channel is None:
            raise ProbeError("control session is not open")
        deadline = Deadline(self.timeout)  # a round's setup: one timeout for both
        try:
            self.channel.send("again", {"params": params}, timeout=deadline)
            msg = self.channel.recv(expect="go", timeout=deadline)
        except PeerError as e:
            raise LinkStale(f"kept session to {self.host} is gone: {e}") from e
        info = msg.body.get("info", {})
        return info if isinstance(info, dict) else {}

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            self.channel = None


# --------------------------------------------------------------------------- responder side


class Session:
    """One responder-side session as a handler sees it (see the module docstring)."""

    def __init__(
        self,
        channel: Channel,
        kind: str,
        params: dict[str, Any],
        peer: tuple[str, int],
        local: tuple[str, int],
        *,
        step_timeout: float,
        max_keepalive_s: float = MAX_KEEPALIVE_S,
        budget: MemoryBudget | None = None,
        spin_s: float | None = None,
    ) -> None:
        self.channel = channel
        self.spin_s = spin_s  # how long the compiled loops busy-poll (None: their own)
        self.kind = kind
        self.params = params
        self.peer = peer
        self.local = local
        self.step_timeout = step_timeout
        self.resources = contextlib.ExitStack()
        self.ready_sent = False
        self.done_result: dict[str, Any] | None = None
        self.budget = budget
        # what the prober asked for, bounded by what this responder grants (ready says it)
        self.keepalive = min(
            optional_float(params, "keepalive_s", 0.0, MAX_KEEPALIVE_S, 0.0, where="params."),
            max_keepalive_s,
        )
        self.rounds = 1
        self.idle = False  # between rounds of a link: nothing is lost by aborting it now
        self.ended_idle: str | None = None  # why a link ended between rounds
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []

    @property
    def stopping(self) -> bool:
        """True once the responder is shutting down or the session was aborted."""
        return self._stop.is_set()

    def track(self, sock: socket.socket) -> socket.socket:
        """Close SOCK when the session ends; shut it down on abort to wake blocked calls."""
        with self._lock:
            self._sockets.append(sock)
        self.resources.callback(self._untrack, sock)
        return sock

    def _untrack(self, sock: socket.socket) -> None:
        with self._lock:
            if sock in self._sockets:
                self._sockets.remove(sock)
        sock.close()

    def reserve(self, nbytes: int, what: str) -> None:
        """Count NBYTES (what WHAT will hold) against the responder's memory budget until
        the session ends; over the budget the session is refused `busy` (Refused)."""
        if self.budget is None or nbytes <= 0:
            return
        if not self.budget.take(nbytes):
            raise Refused(
                f"busy: {what} needs {nbytes / 2**20:.1f} MiB, "
                f"{self.budget.free / 2**20:.1f} of {self.budget.total / 2**20:.1f} MiB free",
                "memory",
            )
        self.resources.callback(self.budget.give, nbytes)

    def rdma_endpoint(self) -> RdmaEndpoint:
        """The prober's RdmaEndpoint, `params.endpoint` of its hello; refused (reason
        `address`) unless it is the control connection's peer (check_endpoint_peer)."""
        remote = RdmaEndpoint.from_dict(
            require_dict(self.params, "endpoint", where="params."), where="params.endpoint"
        )
        check_endpoint_peer(remote, self.peer[0])
        return remote

    def ready(self, info: dict[str, Any]) -> None:
        if self.ready_sent:
            raise ProbeError("ready was already sent for this session")
        self.channel.send(
            "ready", {"session": self.kind, "info": info, "keepalive_s": self.keepalive}
        )
        self.ready_sent = True

    def next_round(self) -> dict[str, Any] | None:
        """Wait for the prober's next round on a link: the `again` params, or None when
        it said `done`, went away, stayed silent past its keepalive, or we are stopping."""
        if self.keepalive <= 0 or self.stopping:
            return None
        self.idle = True
        try:
            msg = self.channel.recv(timeout=self.keepalive)
        except PeerError as e:
            self.ended_idle = str(e)
            return None
        finally:
            self.idle = False
        if msg.kind == "done":
            res = msg.body.get("result", {})
            self.done_result = res if isinstance(res, dict) else {}
            return None
        if msg.kind != "again":
            raise ProtocolError(f"expected again or done from peer, got {msg.kind}")
        self.rounds += 1
        return require_dict(msg.body, "params", where="again.")

    def go(self, info: dict[str, Any] | None = None) -> None:
        """Tell the prober the next round may start."""
        self.channel.send("go", {"info": info or {}})

    def wait_done(self, timeout: float | None = None) -> dict[str, Any]:
        """Block until the prober's `done` (or raise PeerError after TIMEOUT)."""
        if self.done_result is None:
            msg = self.channel.recv(expect="done", timeout=timeout or self.step_timeout)
            res = msg.body.get("result", {})
            self.done_result = res if isinstance(res, dict) else {}
        return self.done_result

    def abort(self) -> None:
        """Wake every blocked call on the session's sockets (called from another thread)."""
        self._stop.set()
        with self._lock:
            socks = [*self._sockets, self.channel.sock]
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


SessionHandler = Callable[[Session], "dict[str, Any] | None"]


class MemoryBudget:
    """Bytes that the sessions of one responder may hold at once (buffers, registered
    memory), shared by every session; each session kind reserves what it will hold."""

    def __init__(self, total: int) -> None:
        if total < 1:
            raise ValueError("a memory budget must be at least 1 byte")
        self.total = total
        self.used = 0
        self._lock = threading.Lock()

    @property
    def free(self) -> int:
        return self.total - self.used

    def take(self, n: int) -> bool:
        with self._lock:
            if self.used + n > self.total:
                return False
            self.used += n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.used = max(0, self.used - n)


def check_endpoint_peer(endpoint: RdmaEndpoint, peer_ip: str) -> None:
    """Refuse (reason `address`) an RDMA endpoint whose GID is not the control
    connection's peer: a responder sends RDMA traffic (UD ACKs, RC connections) only to
    the address that asked. RoCE v2 GIDs of IPv4 addresses are IPv4-mapped IPv6."""
    gid = ipaddress.IPv6Address(endpoint.gid)
    try:
        peer = ipaddress.ip_address(peer_ip.split("%", 1)[0])
    except ValueError:
        raise Refused(f"control peer {peer_ip!r} is not an IP address", "address") from None
    if isinstance(peer, ipaddress.IPv6Address) and peer.ipv4_mapped is not None:
        peer = peer.ipv4_mapped
    mapped = gid.ipv4_mapped
    same = mapped == peer if isinstance(peer, ipaddress.IPv4Address) else gid == peer
    if not same:
        shown = str(mapped) if mapped is not None else str(gid)
        raise Refused(
            f"endpoint GID {endpoint.gid} ({shown}) is not the address that asked ({peer})",
            "address",
        )


SessionTable = Mapping[str, SessionHandler]


def session_table(*tables: SessionTable) -> dict[str, SessionHandler]:
    """One kind -> handler table out of TABLES (each module that serves sessions exports
    its own, and whoever builds a responder picks the ones it serves). A badly named
    kind, or one that two tables give to different handlers, raises ValueError."""
    out: dict[str, SessionHandler] = {}
    for table in tables:
        for kind, handler in table.items():
            if not _KIND_RE.match(kind):
                raise ValueError(f"bad session kind {kind!r}: use lower-case letters, digits, _")
            if out.get(kind, handler) is not handler:
                raise ValueError(f"session kind {kind!r} is already served by another handler")
            out[kind] = handler
    return out
