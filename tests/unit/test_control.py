"""The control protocol: framing, bad input, deadlines, the RDMA endpoint, the registry."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fabricprobe.core.errors import ParseError, PeerError, ProbeError
from fabricprobe.core.hostport import parse_hostport
from fabricprobe.probes.control import (
    MAX_MESSAGE_BYTES,
    PROTOCOL_VERSION,
    Channel,
    ControlClient,
    LinkStale,
    ProtocolError,
    RdmaEndpoint,
    Session,
    encode_message,
    require_float,
    require_int,
    session_table,
)
from fabricprobe.probes.responder import Responder

EP = {
    "qpn": 0x11,
    "psn": 0xABCDE,
    "gid": "::ffff:192.0.2.1",
    "gid_index": 1,
    "lid": 0,
    "rkey": 0x1234,
    "addr": 0x7F0000001000,
    "mtu": 1024,
}


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    with a, b:
        yield a, b


def raw(obj: Any) -> bytes:
    data = json.dumps(obj).encode() if not isinstance(obj, bytes) else obj
    return struct.pack("!I", len(data)) + data


# --------------------------------------------------------------------------- framing


def test_round_trip_and_wire_format(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    Channel(a).send("hello", {"version": 1, "params": {"size": 64}})
    msg = Channel(b).recv(expect="hello")
    assert msg.kind == "hello" and msg.body == {"version": 1, "params": {"size": 64}}
    frame = encode_message("done", {})
    (length,) = struct.unpack("!I", frame[:4])
    assert length == len(frame) - 4 and json.loads(frame[4:]) == {"kind": "done"}


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        (b"not json", "not UTF-8 JSON"),
        (b"\xff\xfe\x00", "not UTF-8 JSON"),
        (b"[1, 2]", "expected an object"),
        (b'"hello"', "expected an object"),
        (b'{"version": 1}', "valid 'kind'"),
        (b'{"kind": 7}', "valid 'kind'"),
        (b'{"kind": "Hello!"}', "valid 'kind'"),
        (b'{"kind": "hello", "x": NaN}', "not UTF-8 JSON"),
        (b"[" * 50_000 + b"]" * 10_000, "not UTF-8 JSON"),
    ],
)
def test_garbage_is_a_protocol_error(
    pair: tuple[socket.socket, socket.socket], payload: bytes, needle: str
) -> None:
    a, b = pair
    a.sendall(raw(payload))
    with pytest.raises(ProtocolError, match=needle) as info:
        Channel(b, 1.0).recv()
    assert isinstance(info.value, PeerError) and isinstance(info.value, ParseError)


@pytest.mark.parametrize("length", [0, MAX_MESSAGE_BYTES + 1, 0xFFFFFFFF])
def test_bad_length_is_refused_before_reading(
    pair: tuple[socket.socket, socket.socket], length: int
) -> None:
    a, b = pair
    a.sendall(struct.pack("!I", length))
    with pytest.raises(ProtocolError, match=f"announced a {length}-byte message"):
        Channel(b, 1.0).recv()


def test_own_oversize_or_bad_message_is_refused() -> None:
    with pytest.raises(ValueError, match="over"):
        encode_message("ready", {"info": "x" * MAX_MESSAGE_BYTES})
    with pytest.raises(ValueError, match="kind"):
        encode_message("Bad Kind", {})
    with pytest.raises(ValueError):
        encode_message("ready", {"x": float("nan")})


def test_silent_peer_hits_the_deadline(pair: tuple[socket.socket, socket.socket]) -> None:
    _, b = pair
    t0 = time.monotonic()
    with pytest.raises(PeerError, match=r"within 0\.2 s"):
        Channel(b).recv(timeout=0.2)
    assert time.monotonic() - t0 < 2.0


def test_slow_drip_cannot_stretch_the_deadline(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    frame = raw({"kind": "done", "pad": "x" * 40})

    def drip() -> None:
        for byte in frame:
            try:
                a.send(bytes([byte]))
            except OSError:
                return
            time.sleep(0.05)

    t = threading.Thread(target=drip, daemon=True)
    t.start()
    t0 = time.monotonic()
    with pytest.raises(PeerError, match=r"within 0\.4 s"):
        Channel(b).recv(timeout=0.4)
    assert time.monotonic() - t0 < 2.0


def test_peer_closing_mid_message(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.sendall(struct.pack("!I", 100) + b'{"kind": ')
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(PeerError, match="mid-message body \\(got 9 of 100 bytes\\)"):
        Channel(b, 1.0).recv()


def test_peer_closing_mid_header(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.sendall(b"\x00\x00")
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(PeerError, match="mid-message header \\(got 2 of 4"):
        Channel(b, 1.0).recv()


def test_peer_closing_between_messages(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(PeerError, match="closed the control connection"):
        Channel(b, 1.0).recv()


def test_error_reply_and_unexpected_kind(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    Channel(a).send("error", {"reason": "busy"})
    with pytest.raises(PeerError, match="peer refused: busy"):
        Channel(b).recv(expect="ready")
    Channel(a).send("done", {})
    with pytest.raises(ProtocolError, match="expected a ready message from peer, got done"):
        Channel(b).recv(expect="ready")


# --------------------------------------------------------------------------- fields


@pytest.mark.parametrize("value", [None, "5", 5.0, True, -1, 11])
def test_require_int_rejects(value: object) -> None:
    with pytest.raises(ProtocolError, match=r"params\.n: expected an integer in 0\.\.10"):
        require_int({"n": value}, "n", 0, 10, where="params.")


def test_require_float() -> None:
    assert require_float({"t": 2}, "t", 0, 5) == 2.0
    for bad in (True, "1", 9.5, None):
        with pytest.raises(ProtocolError):
            require_float({"t": bad}, "t", 0, 5)


def test_rdma_endpoint_round_trip_and_canonical_gid() -> None:
    ep = RdmaEndpoint.from_dict(EP)
    assert ep.gid == "::ffff:c000:201" or ep.gid == "::ffff:192.0.2.1"
    assert ep.gid_bytes[-4:] == bytes([192, 0, 2, 1])
    assert RdmaEndpoint.from_dict(json.loads(json.dumps(ep.as_dict()))) == ep
    full = RdmaEndpoint(**{**EP, "gid": "fe80:0000:0000:0000:0000:0000:0000:0001"})
    assert full.gid == "fe80::1"


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("qpn", 0, "qpn"),
        ("qpn", 1 << 24, "qpn"),
        ("psn", -1, "psn"),
        ("psn", "1", "psn"),
        ("gid", "192.0.2.1", "gid"),
        ("gid", 5, "gid"),
        ("gid_index", 256, "gid_index"),
        ("lid", 0x10000, "lid"),
        ("rkey", 1 << 32, "rkey"),
        ("addr", -5, "addr"),
        ("mtu", 1500, "mtu"),
        ("mtu", True, "mtu"),
    ],
)
def test_rdma_endpoint_rejects(field: str, value: object, needle: str) -> None:
    with pytest.raises(ProtocolError, match=f"endpoint\\.{needle}"):
        RdmaEndpoint.from_dict({**EP, field: value})
    with pytest.raises(ValueError):
        RdmaEndpoint(**{**EP, field: value})


def test_rdma_endpoint_missing_field_and_not_an_object() -> None:
    with pytest.raises(ProtocolError, match=r"endpoint\.rkey"):
        RdmaEndpoint.from_dict({k: v for k, v in EP.items() if k != "rkey"})
    with pytest.raises(ProtocolError, match="expected an object"):
        RdmaEndpoint.from_dict([1, 2])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10.0.0.2", ("10.0.0.2", 4793)),
        ("10.0.0.2:5000", ("10.0.0.2", 5000)),
        ("host-b", ("host-b", 4793)),
        ("[::1]:7", ("::1", 7)),
        ("[fe80::1]", ("fe80::1", 4793)),
        ("fe80::1", ("fe80::1", 4793)),
    ],
)
def test_parse_hostport(text: str, expected: tuple[str, int]) -> None:
    assert parse_hostport(text) == expected


@pytest.mark.parametrize(
    "text", ["", "a:", "a:b", "a:0", "a:70000", "[::1", "[::1]x", "[::1]:", "1:2:3", "a b", "/x"]
)
def test_parse_hostport_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_hostport(text)


def test_parse_hostport_port_zero_only_to_listen() -> None:
    assert parse_hostport("127.0.0.1:0", allow_port_zero=True) == ("127.0.0.1", 0)


def test_session_table_contract() -> None:
    def h(session: Session) -> None:
        return None

    # the same handler from two tables is fine
    table = session_table({"rdma_rc_lat": h}, {"rdma_rc_lat": h})
    with pytest.raises(ValueError, match="already served"):
        session_table(table, {"rdma_rc_lat": lambda s: None})
    with pytest.raises(ValueError, match="bad session kind"):
        session_table({"RDMA lat": h})
    assert sorted(table) == ["rdma_rc_lat"] and table.get("nope") is None
    with pytest.raises(ValueError, match="bad session kind"):
        Responder("127.0.0.1", 0, sessions={"RDMA lat": h}, auth=None)


# --------------------------------------------------------------------------- sessions


def rc_lat_handler(session: Session) -> dict[str, object]:
    """What an RDMA handler looks like: endpoints out of band, resources on the stack."""
    peer = RdmaEndpoint.from_dict(session.params.get("endpoint"), where="params.endpoint")
    released = session.resources.callback(lambda: None)  # stands in for a QP + MR + CQ
    del released
    mine = RdmaEndpoint(**{**EP, "qpn": peer.qpn + 1})
    session.ready({"endpoint": mine.as_dict()})
    got = session.wait_done()
    return {"peer_qpn": peer.qpn, "client_said": got.get("iters")}


def stuck_handler(session: Session) -> None:
    session.ready({})
    while not session.stopping:
        time.sleep(0.01)
    raise PeerError("aborted")


def no_ready_handler(session: Session) -> None:
    return None


@pytest.fixture
def responder() -> Iterator[Responder]:
    reg = {"rdma_rc_lat": rc_lat_handler, "stuck": stuck_handler, "no_ready": no_ready_handler}
    with Responder("127.0.0.1", 0, idle_timeout=0.5, grace=0.1, sessions=reg, auth=None) as r:
        yield r


def client(r: Responder) -> ControlClient:
    return ControlClient(*r.address, timeout=2.0)


def test_rdma_style_session(responder: Responder) -> None:
    with client(responder) as c:
        info = c.open("rdma_rc_lat", {"endpoint": EP})
        theirs = RdmaEndpoint.from_dict(info["endpoint"])
        assert theirs.qpn == EP["qpn"] + 1
        assert c.done({"iters": 10}) == {"peer_qpn": EP["qpn"], "client_said": 10}


def test_bad_params_come_back_as_an_error(responder: Responder) -> None:
    with client(responder) as c, pytest.raises(PeerError, match=r"params\.endpoint\.mtu"):
        c.open("rdma_rc_lat", {"endpoint": {**EP, "mtu": 9000}})


def test_unknown_kind_and_version(responder: Responder) -> None:
    with client(responder) as c, pytest.raises(PeerError, match="unknown session kind 'rdma_ud'"):
        c.open("rdma_ud", {})
    sock = socket.create_connection(responder.address, timeout=2)
    with sock:
        ch = Channel(sock, 2.0)
        ch.send("hello", {"version": PROTOCOL_VERSION + 1, "session": "stuck", "params": {}})
        with pytest.raises(PeerError, match="protocol version 2 not supported"):
            ch.recv(expect="ready")


def test_handler_without_ready(responder: Responder) -> None:
    with client(responder) as c, pytest.raises(PeerError, match="returned without ready"):
        c.open("no_ready", {})


def test_silent_prober_is_dropped_after_idle_timeout(responder: Responder) -> None:
    sock = socket.create_connection(responder.address, timeout=2)
    with sock:
        sock.settimeout(3)
        t0 = time.monotonic()
        data = sock.recv(MAX_MESSAGE_BYTES)  # an error message, then EOF
        assert b"error" in data and time.monotonic() - t0 < 4.0
    _wait_idle(responder)


def test_busy_refusal() -> None:
    reg = {"stuck": stuck_handler}
    with Responder(
        "127.0.0.1", 0, max_sessions=1, idle_timeout=5, grace=0.1, sessions=reg, auth=None
    ) as r:
        first = client(r)
        first.open("stuck", {})
        with client(r) as second, pytest.raises(PeerError, match="busy"):
            second.open("stuck", {})
        assert r.refused == 1
        first.close()


def test_stop_aborts_running_sessions_and_joins() -> None:
    reg = {"stuck": stuck_handler}
    r = Responder("127.0.0.1", 0, idle_timeout=30, grace=0.1, sessions=reg, auth=None)
    r.__enter__()
    c = client(r)
    c.open("stuck", {})
    t0 = time.monotonic()
    r.__exit__(None, None, None)
    assert time.monotonic() - t0 < 5.0
    assert r.active_sessions() == 0
    with pytest.raises(PeerError):
        c.done()
    c.close()
    with pytest.raises(ProbeError):
        _ = r.address


def _wait_idle(r: Responder, limit: float = 3.0) -> None:
    end = time.monotonic() + limit
    while r.active_sessions() and time.monotonic() < end:
        time.sleep(0.01)
    assert r.active_sessions() == 0


def test_stop_does_not_wait_for_a_prober_that_never_said_hello() -> None:
    r = Responder("127.0.0.1", 0, idle_timeout=30, grace=0.1, sessions={}, auth=None)
    r.__enter__()
    sock = socket.create_connection(r.address, timeout=2)
    with sock:
        _wait_until(lambda: r.active_sessions() == 1)
        t0 = time.monotonic()
        r.__exit__(None, None, None)
        assert time.monotonic() - t0 < 5.0


def _wait_until(cond: Callable[[], bool], limit: float = 5.0) -> None:
    end = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.01)


# --------------------------------------------------------------------------- kept links


def rounds_handler(session: Session) -> dict[str, object]:
    """A link-serving handler: one round per `again`, each round's size checked."""
    session.ready({"first": session.params.get("n")})
    served = [session.params.get("n")]
    while (nxt := session.next_round()) is not None:
        served.append(require_int(nxt, "n", 1, 100, where="again.params."))
        session.go({"round": session.rounds})
    return {"served": sum(served)}


@pytest.fixture
def link_responder() -> Iterator[Responder]:
    reg = {"rounds": rounds_handler}
    with Responder("127.0.0.1", 0, idle_timeout=2.0, grace=5.0, sessions=reg, auth=None) as r:
        yield r


def test_a_kept_session_carries_rounds_until_done(
    link_responder: Responder, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", "fabricprobe.responder")
    with client(link_responder) as c:
        assert c.open("rounds", {"n": 1, "keepalive_s": 5}) == {"first": 1}
        assert c.again({"n": 2}) == {"round": 2}
        assert c.again({"n": 3}) == {"round": 3}
        assert c.done() == {"served": 6}
    _wait_idle(link_responder)
    assert "session rounds from" in caplog.text and "served=6 rounds=3" in caplog.text


def test_a_bad_round_is_refused_and_ends_the_session(link_responder: Responder) -> None:
    with client(link_responder) as c:
        c.open("rounds", {"n": 1, "keepalive_s": 5})
        with pytest.raises(LinkStale, match=r"again\.params\.n"):
            c.again({"n": 1000})


def test_without_keepalive_there_is_one_round(link_responder: Responder) -> None:
    with client(link_responder) as c:
        c.open("rounds", {"n": 4})
        with pytest.raises(LinkStale, match="gone"):  # the handler returned after round one
            c.again({"n": 1})


@pytest.mark.parametrize("keepalive", [-1, 601, "30", True])
def test_keepalive_out_of_bounds_is_refused(link_responder: Responder, keepalive: object) -> None:
    with client(link_responder) as c, pytest.raises(PeerError, match="keepalive_s"):
        c.open("rounds", {"n": 1, "keepalive_s": keepalive})


def test_a_link_let_go_ends_quietly_and_the_next_round_is_stale(
    link_responder: Responder, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", "fabricprobe.responder")
    with client(link_responder) as c:
        c.open("rounds", {"n": 1, "keepalive_s": 0.2})
        _wait_idle(link_responder)  # the keepalive ran out: the responder let the link go
        with pytest.raises(LinkStale):
            c.again({"n": 1})
    assert "served=1 rounds=1 (no message header from peer within 0.2 s)" in caplog.text
    with client(link_responder) as c:  # a prober that simply closes its end
        c.open("rounds", {"n": 1, "keepalive_s": 30})
    _wait_idle(link_responder)
    assert "(peer closed the control connection)" in caplog.text


def test_stop_lets_idle_links_go_at_once() -> None:
    reg = {"rounds": rounds_handler}
    r = Responder("127.0.0.1", 0, idle_timeout=30, grace=20.0, sessions=reg, auth=None)
    r.__enter__()
    with client(r) as c:
        c.open("rounds", {"n": 1, "keepalive_s": 60})
        _wait_until(lambda: bool(r.slots.idle_links()))
        t0 = time.monotonic()
        r.__exit__(None, None, None)
        assert time.monotonic() - t0 < 5.0  # not the 20 s grace of a session mid-round
        assert r.active_sessions() == 0


def test_a_datagram_endpoint_has_no_psn_or_buffer() -> None:
    ep = RdmaEndpoint.datagram(0x42, "::ffff:192.0.2.7", 1)
    assert (ep.qpn, ep.psn, ep.rkey, ep.addr, ep.mtu) == (0x42, 0, 0, 0, 1024)
    assert RdmaEndpoint.from_dict(ep.as_dict()) == ep
