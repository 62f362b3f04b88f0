"""The responder serves only the fleet, within bounds no peer can stretch: one test per
attack on it (silent connections, hellos asking for long keepalives, tcp_bw's memory,
an RDMA endpoint that is not the asker's), and the fleet token's challenge. Attackers
connect from 127.0.0.2, the real prober from 127.0.0.1: both loopback."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from fabricprobe.core.errors import PeerError
from fabricprobe.probes import tcp
from fabricprobe.probes.control import (
    ControlClient,
    ProtocolError,
    RdmaEndpoint,
    Refused,
    Session,
    check_endpoint_peer,
    session_table,
)
from fabricprobe.probes.fleet import FleetToken
from fabricprobe.probes.measure import LinkParams
from fabricprobe.probes.responder import Responder

PROBER, STRANGER = "127.0.0.1", "127.0.0.2"
TOKEN = FleetToken(b"the-fleet-token-of-these-tests")


def rounds_handler(session: Session) -> dict[str, object]:
    """A kept-link handler: one round per `again`, the link let go after its keepalive."""
    session.ready({})
    while session.next_round() is not None:
        session.go()
    return {}


SESSIONS = session_table(tcp.SESSIONS, {"rounds": rounds_handler})


def _wait_until(cond: Callable[[], bool], limit: float = 5.0) -> None:
    end = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.01)


def ping(r: Responder, token: FleetToken | None = None) -> None:
    """A real prober's ping-pong from PROBER: it must be served, in full."""
    res = tcp.run_pingpong(
        LinkParams(PROBER, r.port, bind=PROBER, timeout=3, token=token), iters=20, warmup=1
    )
    assert res.error is None and res.summary.count == 20


def guarded(
    idle_timeout: float = 5.0, hello_timeout: float = 3.0, max_keepalive_s: float = 0.5
) -> Responder:
    """A responder with small bounds, on 127.0.0.1 (strangers come from 127.0.0.2)."""
    return Responder(
        PROBER,
        0,
        sessions=SESSIONS,
        auth=None,
        max_sessions=16,
        max_per_source=4,
        max_memory_bytes=8 << 20,
        max_keepalive_s=max_keepalive_s,
        hello_timeout=hello_timeout,
        idle_timeout=idle_timeout,
        grace=0.2,
    )


@pytest.fixture
def responder() -> Iterator[Responder]:
    with guarded() as r:
        yield r


def stranger(r: Responder) -> socket.socket:
    s = socket.socket()
    s.bind((STRANGER, 0))
    s.settimeout(3)
    s.connect((PROBER, r.port))
    return s


def test_300_silent_connections_hold_no_session() -> None:
    # a hello deadline longer than the test: the four the source may hold stay held
    with guarded(idle_timeout=60.0, hello_timeout=60.0) as responder:
        _silent_connections(responder)


def _silent_connections(responder: Responder) -> None:
    with ExitStack() as stack:
        for _ in range(300):
            stack.enter_context(stranger(responder))
        _wait_until(lambda: responder.refusals["source"] >= 296, limit=30.0)
        ping(responder)  # while all 300 are still open
        assert responder.active_sessions() <= 4 + 1
    _wait_until(lambda: responder.active_sessions() == 0, limit=30.0)


def test_a_silent_connection_is_let_go_at_the_hello_deadline() -> None:
    with Responder(
        PROBER, 0, sessions=SESSIONS, auth=None, hello_timeout=0.2, idle_timeout=30, grace=0.1
    ) as r:
        with stranger(r) as s:
            t0 = time.monotonic()
            assert b"no hello within" in s.recv(4096)
            assert time.monotonic() - t0 < 3.0  # not the 30 s idle timeout
        _wait_until(lambda: r.refusals["hello"] == 1 and r.active_sessions() == 0)


def test_hellos_asking_for_600_s_keepalives_cannot_lock_probers_out() -> None:
    # a bound longer than the test, so that no link lapses while the 224 hellos arrive
    with guarded(max_keepalive_s=30.0) as responder, ExitStack() as stack:
        granted, refused = [], []
        for _ in range(224):
            c = stack.enter_context(ControlClient(PROBER, responder.port, bind=STRANGER))
            try:
                c.open("rounds", {"keepalive_s": 600})
                granted.append(c.keepalive_s)
            except PeerError as e:
                refused.append(str(e))
        # a source holds its share, each link for the responder's bound, not 600 s
        assert granted == [30.0] * 4 and len(refused) == 220
        assert all("already holds 4 sessions" in e for e in refused)
        ping(responder)
        assert responder.refusals["source"] == 220


def test_a_kept_link_is_let_go_at_the_responders_bound(responder: Responder) -> None:
    with ControlClient(PROBER, responder.port, bind=STRANGER) as c:
        c.open("rounds", {"keepalive_s": 600})
        assert c.keepalive_s == 0.5
        # let go at 0.5 s, whatever it asked for (generous for a loaded host)
        _wait_until(lambda: responder.active_sessions() == 0, limit=10.0)


def test_tcp_bw_sessions_are_held_to_the_memory_budget() -> None:
    with guarded(idle_timeout=1.0) as responder:
        _tcp_bw_within_budget(responder)


def _tcp_bw_within_budget(responder: Responder) -> None:
    with ControlClient(PROBER, responder.port, bind=STRANGER) as c:
        with pytest.raises(PeerError, match="busy: tcp_bw's 64 stream buffers need"):
            c.open("tcp_bw", {"streams": 64, "chunk_size": 1 << 20})
    with ExitStack() as stack:
        first = stack.enter_context(ControlClient(PROBER, responder.port, bind=STRANGER))
        first.open("tcp_bw", {"streams": 6, "chunk_size": 1 << 20})  # 6 of 8 MiB, held
        second = stack.enter_context(ControlClient(PROBER, responder.port, bind=STRANGER))
        with pytest.raises(PeerError, match="MiB free"):
            second.open("tcp_bw", {"streams": 4, "chunk_size": 1 << 20})
        assert responder.budget.used == 6 << 20
        ping(responder)  # a ping-pong's buffer still fits
    _wait_until(lambda: responder.budget.used == 0)
    assert responder.refusals["memory"] == 2


def test_only_the_fleet_is_served() -> None:
    with Responder(PROBER, 0, sessions=SESSIONS, auth=TOKEN, grace=0.1) as r:
        with pytest.raises(PeerError, match="asks for the fleet token"):
            ping(r)
        with pytest.raises(PeerError, match="unauthenticated"):
            ping(r, FleetToken(b"not-the-fleet-token-at-all"))
        ping(r, TOKEN)
        _wait_until(lambda: r.refusals["unauthenticated"] == 1)


def test_an_answer_is_bound_to_its_connection_and_request() -> None:
    nonce = bytes(32)
    mac = TOKEN.answer(nonce, "127.0.0.1", "127.0.0.9", "tcp_lat", {"size": 8})
    assert TOKEN.verify(mac, nonce, "::ffff:127.0.0.1", "127.0.0.9", "tcp_lat", {"size": 8})
    for other in (
        (bytes(31) + b"\x01", "127.0.0.1", "127.0.0.9", "tcp_lat", {"size": 8}),
        (nonce, "127.0.0.2", "127.0.0.9", "tcp_lat", {"size": 8}),
        (nonce, "127.0.0.1", "127.0.0.9", "tcp_bw", {"size": 8}),
        (nonce, "127.0.0.1", "127.0.0.9", "tcp_lat", {"size": 9}),
    ):
        assert not TOKEN.verify(mac, *other)
    with pytest.raises(ValueError):
        FleetToken(b"short")


def test_an_rdma_endpoint_must_be_the_control_peer() -> None:
    ep = RdmaEndpoint.datagram(0x42, "::ffff:192.0.2.3", 1)
    check_endpoint_peer(ep, "192.0.2.3")
    check_endpoint_peer(ep, "::ffff:192.0.2.3")  # a dual-stack listener's view
    for third in ("192.0.2.1", "::1", "nonsense"):
        with pytest.raises(Refused) as e:
            check_endpoint_peer(ep, third)
        assert e.value.reason == "address"
    v6 = RdmaEndpoint.datagram(0x42, "fe80::1", 0)
    check_endpoint_peer(v6, "fe80::1")
    with pytest.raises(Refused):
        check_endpoint_peer(v6, "192.0.2.3")


def test_a_session_takes_the_rdma_endpoint_of_its_hello_from_its_peer_only() -> None:
    ep = RdmaEndpoint.datagram(0x42, "::ffff:192.0.2.3", 1)

    def session(params: dict[str, object], peer: str = "192.0.2.3") -> Session:
        channel: Any = None  # rdma_endpoint() reads only the hello's params and the peer
        return Session(
            channel, "rdma_ud", params, (peer, 5000), ("192.0.2.9", 4793), step_timeout=1
        )

    assert session({"endpoint": ep.as_dict()}).rdma_endpoint() == ep
    with pytest.raises(Refused) as e:
        session({"endpoint": ep.as_dict()}, peer="192.0.2.4").rdma_endpoint()
    assert e.value.reason == "address"
    with pytest.raises(ProtocolError, match=r"params\.endpoint: expected an object"):
        session({"endpoint": "nowhere"}).rdma_endpoint()
    with pytest.raises(ProtocolError, match=r"params\.endpoint"):
        session({"endpoint": {"qpn": 1}}).rdma_endpoint()


def test_a_responder_answers_with_the_probers_engine_where_it_has_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fabricprobe.probes.rdma import native
    from fabricprobe.probes.rdma.links import responder_engine

    monkeypatch.setattr(native, "load", lambda: object())  # built here
    assert [responder_engine(w) for w in ("native", "pyverbs", "auto", None, 7)] == [
        "native",
        "pyverbs",
        "pyverbs",
        "pyverbs",
        "pyverbs",
    ]

    def not_built() -> None:
        raise native.NativeError("not built")

    monkeypatch.setattr(native, "load", not_built)
    assert responder_engine("native") == "pyverbs"


@pytest.mark.parametrize("kind", ["rdma_ud", "rdma_rc_lat"])
def test_rdma_sessions_naming_a_third_address_are_refused(kind: str) -> None:
    """Before any verbs resource: a UD reflector or an RC connection to a third host."""
    from fabricprobe.probes.rdma.sessions import rdma_sessions

    third = RdmaEndpoint(0x42, 7, "::ffff:192.0.2.99", 1, 0, 0, 0, 1024).as_dict()
    params: dict[str, object] = {"probes": 100, "endpoint": third}
    if kind == "rdma_rc_lat":
        params = {"op": "send", "size": 2, "iters": 10, "endpoint": third}
    with Responder(PROBER, 0, sessions=rdma_sessions(), auth=None, grace=0.1) as r:
        with ControlClient(PROBER, r.port) as c:
            with pytest.raises(PeerError, match="is not the address that asked"):
                c.open(kind, params)
        _wait_until(lambda: r.refusals["address"] == 1)
