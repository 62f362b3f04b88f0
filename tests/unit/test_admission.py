"""Who the responder lets in (probes/admission.py): the hello and the fleet token's
challenge over a real socket pair, and the bounded slots of connections and sessions."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from fabricprobe.core.errors import ProbeError
from fabricprobe.probes.admission import Handshake, Slots
from fabricprobe.probes.control import PROTOCOL_VERSION, Channel, Refused, Session
from fabricprobe.probes.fleet import FleetToken

PEER, LOCAL = ("127.0.0.2", 40000), ("127.0.0.1", 4791)
HELLO = {"session": "tcp_lat", "version": PROTOCOL_VERSION, "params": {"size": 64}}


@pytest.fixture
def pair() -> Iterator[tuple[Channel, Channel]]:
    a, b = socket.socketpair()
    with a, b:
        yield Channel(a, 2.0), Channel(b, 2.0)


def test_a_hello_without_a_token(pair: tuple[Channel, Channel]) -> None:
    prober, responder = pair
    prober.send("hello", HELLO)
    assert Handshake(None, 1.0).read(responder, PEER, LOCAL) == ("tcp_lat", {"size": 64})


def test_another_protocol_version_is_refused(pair: tuple[Channel, Channel]) -> None:
    prober, responder = pair
    prober.send("hello", {**HELLO, "version": 999})
    with pytest.raises(ProbeError, match="protocol version 999"):
        Handshake(None, 1.0).read(responder, PEER, LOCAL)


def test_no_hello_within_the_deadline(pair: tuple[Channel, Channel]) -> None:
    with pytest.raises(Refused, match=r"no hello within 0.1 s") as got:
        Handshake(None, 0.1).read(pair[1], PEER, LOCAL)
    assert got.value.reason == "hello"


def challenged(pair: tuple[Channel, Channel], token: FleetToken, answer_with: FleetToken) -> None:
    """Answer the responder's challenge with ANSWER_WITH, from another thread."""
    prober, _ = pair

    def run() -> None:
        prober.send("hello", HELLO)
        nonce = bytes.fromhex(prober.recv(expect="challenge").body["nonce"])
        mac = answer_with.answer(nonce, PEER[0], LOCAL[0], "tcp_lat", {"size": 64})
        prober.send("auth", {"mac": mac})

    t = threading.Thread(target=run)
    t.start()
    try:
        Handshake(token, 2.0).read(pair[1], PEER, LOCAL)
    finally:
        t.join()


def test_a_member_of_the_fleet_answers_the_challenge(pair: tuple[Channel, Channel]) -> None:
    token = FleetToken(b"s" * 32)
    challenged(pair, token, token)


def test_a_stranger_is_refused_unauthenticated(pair: tuple[Channel, Channel]) -> None:
    with pytest.raises(Refused, match="not a member of this fleet") as got:
        challenged(pair, FleetToken(b"s" * 32), FleetToken(b"x" * 32))
    assert got.value.reason == "unauthenticated"


def threads(n: int) -> list[threading.Thread]:
    return [threading.Thread(target=lambda: None) for _ in range(n)]


def test_connections_waiting_for_their_hello_are_bounded() -> None:
    slots = Slots(max_sessions=3, max_per_source=2)
    a, b = socket.socketpair()
    with a, b:
        t = threads(4)
        assert slots.enter(t[0], a, "10.0.0.1") and slots.enter(t[1], a, "10.0.0.1")
        assert not slots.enter(t[2], a, "10.0.0.1")  # the source's share
        assert slots.enter(t[2], a, "10.0.0.2")
        assert not slots.enter(t[3], a, "10.0.0.3")  # three waiting in all
        assert slots.refusals["source"] == 1 and slots.refusals["busy"] == 1
        assert slots.active() == 3
        slots.leave(t[0], "10.0.0.1")
        assert slots.active() == 2 and slots.served == 0  # it never held a session
        assert slots.enter(t[3], a, "10.0.0.1")


def test_sessions_are_bounded_per_source_and_counted_when_done() -> None:
    slots = Slots(max_sessions=2, max_per_source=1)
    a, b = socket.socketpair()
    with a, b:
        t = threads(3)
        assert slots.enter(t[0], a, "10.0.0.1")
        slots.admit(t[0], "10.0.0.1")  # no longer waiting: the source may connect again
        assert slots.enter(t[1], a, "10.0.0.1") and slots.enter(t[2], a, "10.0.0.2")
        with pytest.raises(Refused, match="already holds 1 sessions") as got:
            slots.admit(t[1], "10.0.0.1")
        assert got.value.reason == "source"
        slots.admit(t[2], "10.0.0.2")
        session = Session(Channel(b), "tcp_lat", {}, PEER, LOCAL, step_timeout=1.0)
        slots.hold(t[2], session)
        assert [s for _, s in slots.held()].count(session) == 1
        assert slots.idle_links() == []  # in a round, not idle between rounds
        slots.leave(t[2], "10.0.0.2")
        slots.leave(t[0], "10.0.0.1")
        assert slots.served == 2 and slots.active() == 1
        slots.refuse("memory")
        assert slots.refusals["memory"] == 1
