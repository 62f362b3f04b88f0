"""The compiled TCP ping-pong client (fp_tcp_pingpong) on real loopback sockets: against
the compiled echo and the real responder, against echoes that split, lie, close or fall
silent, and across a signal; and the Python loop it falls back to."""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from array import array
from collections.abc import Callable, Iterator
from types import FrameType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fabricprobe.core.errors import NotSupported
from fabricprobe.probes import tcp
from fabricprobe.probes.links import TcpPingLink
from fabricprobe.probes.measure import LinkParams
from fabricprobe.probes.native_loop import (
    TCP_CLOSED,
    TCP_MISMATCH,
    TCP_TIMEOUT,
    tcp_echo,
    tcp_pingpong,
)
from fabricprobe.probes.responder import Responder
from tests.support.silent_peers import SilentPeer

LOOPBACK = "127.0.0.1"
Peer = Callable[[socket.socket], None]


@contextlib.contextmanager
def connected(peer: Peer) -> Iterator[socket.socket]:
    """A TCP connection on loopback whose far end PEER serves in a thread."""
    with socket.create_server((LOOPBACK, 0)) as lsock:
        client = socket.create_connection(lsock.getsockname(), timeout=5)
        conn, _ = lsock.accept()
    client.settimeout(None)
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t = threading.Thread(target=_serve, args=(peer, conn), daemon=True)
    t.start()
    try:
        yield client
    finally:
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_RDWR)
        client.close()
        t.join(5)


def _serve(peer: Peer, conn: socket.socket) -> None:
    with conn, contextlib.suppress(OSError):
        peer(conn)


def native_echo(conn: socket.socket) -> None:
    tcp_echo(conn.fileno(), 64)


def messages(conn: socket.socket, size: int) -> Iterator[bytes]:
    """SIZE-byte messages as they arrive, until the prober closes."""
    conn.settimeout(10)
    while len(msg := conn.recv(size, socket.MSG_WAITALL)) == size:
        yield msg


def run(
    sock: socket.socket, count: int, size: int = 64, step_s: float = 2.0
) -> tuple[int, int, array[int], float]:
    """(done, status, RTTs, seconds taken) of COUNT native ping-pongs."""
    sbuf, rbuf = bytearray(bytes(range(256)) * (size // 256 + 1))[:size], bytearray(size)
    out = array("q", bytes(8 * count))
    t0 = time.monotonic()
    done, status = tcp_pingpong(sock.fileno(), sbuf, rbuf, out, 0, count, step_s)
    return done, status, out, time.monotonic() - t0


def test_the_native_loop_is_built_here() -> None:
    assert tcp.pick_loop().name == "native", tcp.pick_loop().reason


def test_every_exchange_is_timed_against_the_compiled_echo() -> None:
    with connected(native_echo) as sock:
        done, status, out, took = run(sock, 500)
    assert (done, status) == (500, 0)
    assert all(0 < ns < 2e9 for ns in out)
    assert sum(out) <= took * 1e9  # each sample lies inside the call that took them


def test_each_exchange_carries_its_own_first_byte() -> None:
    seen: list[int] = []

    def record(conn: socket.socket) -> None:
        for msg in messages(conn, 8):
            seen.append(msg[0])
            conn.sendall(msg)

    with connected(record) as sock:
        sbuf, rbuf, out = bytearray(8), bytearray(8), array("q", bytes(8 * 300))
        assert tcp_pingpong(sock.fileno(), sbuf, rbuf, out, 0, 300, 2.0) == (300, 0)
    assert seen == [i & 0xFF for i in range(300)]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    size=st.integers(1, 4096),
    cuts=st.lists(st.floats(0.0, 1.0), max_size=4),
    count=st.integers(1, 4),
)
def test_an_echo_in_pieces_is_put_together(size: int, cuts: list[float], count: int) -> None:
    """Whatever the pieces the echo comes in, each exchange reads all of it, verified."""
    points = sorted({int(c * size) for c in cuts} - {0, size})

    def in_pieces(conn: socket.socket) -> None:
        for msg in messages(conn, size):
            for a, b in zip([0, *points], [*points, size], strict=True):
                conn.sendall(msg[a:b])
                time.sleep(0.001)

    with connected(in_pieces) as sock:
        done, status, out, _ = run(sock, count, size)
    assert (done, status) == (count, 0)
    assert all(ns >= len(points) * 1_000_000 for ns in out)  # the pauses are inside


def test_a_wrong_echo_is_caught() -> None:
    def lies_at_the_fourth(conn: socket.socket) -> None:
        for i, msg in enumerate(messages(conn, 64)):
            conn.sendall(msg if i != 3 else msg[:-1] + bytes([msg[-1] ^ 1]))

    with connected(lies_at_the_fourth) as sock:
        done, status, _, _ = run(sock, 10)
    assert (done, status) == (3, TCP_MISMATCH)


def test_a_peer_that_closes_ends_the_loop() -> None:
    def three_then_close(conn: socket.socket) -> None:
        for i, msg in enumerate(messages(conn, 64)):
            if i == 3:
                return
            conn.sendall(msg)

    with connected(three_then_close) as sock:
        done, status, _, _ = run(sock, 10)
    assert (done, status) == (3, TCP_CLOSED)


@pytest.mark.parametrize("half", [False, True], ids=["silent", "half-an-echo"])
def test_a_silent_peer_costs_one_step(half: bool) -> None:
    """No echo, or half of one (the rest is waited for with poll): the deadline holds."""
    stop = threading.Event()

    def goes_silent(conn: socket.socket) -> None:
        for i, msg in enumerate(messages(conn, 64)):
            if i == 2:
                if half:
                    conn.sendall(msg[:32])
                stop.wait(10)
                return
            conn.sendall(msg)

    with connected(goes_silent) as sock:
        done, status, _, took = run(sock, 10, step_s=0.3)
        stop.set()
    assert (done, status) == (2, TCP_TIMEOUT)
    assert 0.29 <= took < 2.0  # one 0.3 s step; generous for a loaded host


def test_a_signal_does_not_cost_an_exchange() -> None:
    """A signal that lands in the loop's wait: the exchange is finished, the handler runs,
    the loop goes on."""
    caught: list[int] = []
    main = threading.main_thread().ident
    assert main is not None and threading.get_ident() == main

    def signals_then_echoes(conn: socket.socket) -> None:
        for i, msg in enumerate(messages(conn, 64)):
            if i in (5, 50):
                time.sleep(0.05)  # the prober is blocked in its recv by now
                signal.pthread_kill(main, signal.SIGUSR1)
                time.sleep(0.02)
            conn.sendall(msg)

    def handler(signum: int, frame: FrameType | None) -> None:
        caught.append(signum)

    old = signal.signal(signal.SIGUSR1, handler)
    try:
        with connected(signals_then_echoes) as sock:
            done, status, out, _ = run(sock, 100)
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert (done, status) == (100, 0)
    assert caught == [signal.SIGUSR1] * 2
    assert out[5] >= 50_000_000 and out[50] >= 50_000_000


@pytest.mark.parametrize(
    "bad",
    [
        {"sbuf": bytearray()},
        {"rbuf": bytearray(3)},
        {"count": -1},
        {"base": 1},  # no room for 8 RTTs from 1 in an array of 8
        {"out": array("d", bytes(64))},
        {"step_s": 0.0},
    ],
)
def test_bad_arguments_fail_before_any_io(bad: dict[str, object]) -> None:
    args: dict[str, object] = {
        "fd": -1,
        "sbuf": bytearray(64),
        "rbuf": bytearray(64),
        "out": array("q", bytes(64)),
        "base": 0,
        "count": 8,
        "step_s": 1.0,
    }
    with pytest.raises(ValueError):
        tcp_pingpong(**{**args, **bad})  # type: ignore[arg-type]


def test_a_closed_descriptor_is_an_error_not_a_crash() -> None:
    s = socket.socket()
    fd = s.fileno()
    s.close()
    done, status = tcp_pingpong(fd, bytearray(8), bytearray(8), array("q", bytes(8)), 0, 1, 1.0)
    assert done == 0 and status < 0


# --------------------------------------------------------------------------- as the probes use it


@pytest.fixture
def responder() -> Iterator[Responder]:
    with Responder(LOOPBACK, 0, idle_timeout=5, grace=0.5, sessions=tcp.SESSIONS, auth=None) as r:
        yield r


@pytest.mark.parametrize("loop", ["native", "python"])
def test_pingpong_names_the_loop_that_timed_it(responder: Responder, loop: str) -> None:
    res = tcp.run_pingpong(LinkParams(LOOPBACK, responder.port), size=64, iters=300, loop=loop)
    assert res.error is None and res.summary.count == 300
    d = res.as_dict()
    assert d["engine"] == loop and d["engine_reason"].startswith(loop)
    assert res.timer_overhead_ns is not None and res.timer_overhead_ns > 0


def test_kept_link_rounds_run_in_the_compiled_loop(responder: Responder) -> None:
    with TcpPingLink(LinkParams(LOOPBACK, responder.port), size=64, keepalive_s=30) as link:
        assert link.loop == "native"
        rounds = [link.round(10) for _ in range(3)]
        assert link.rounds == 3 and responder.active_sessions() == 1  # one session kept
    assert all(r.error is None and len(r.rtt_ns) == 10 and r.lost == 0 for r in rounds)


@pytest.mark.parametrize("loop", ["native", "python"])
def test_silent_responder_ends_a_run_by_its_deadline(loop: str) -> None:
    with SilentPeer("echo_then_silent", echoes=25) as peer:
        t0 = time.monotonic()
        res = tcp.run_pingpong(
            LinkParams(LOOPBACK, peer.port, step_s=0.3), iters=100, warmup=5, loop=loop
        )
        took = time.monotonic() - t0
    assert res.engine == loop
    assert res.summary.count == 20 and res.summary.lost == 80
    assert res.error == "peer did not answer within 0.3 s"
    assert took < 3.0


def test_silent_responder_ends_a_kept_round_by_its_deadline() -> None:
    with SilentPeer("echo_then_silent", echoes=6) as peer:
        link = TcpPingLink(LinkParams(LOOPBACK, peer.port, step_s=0.3), size=64)
        t0 = time.monotonic()
        r = link.round(10)
        took = time.monotonic() - t0
        link.close()
    assert len(r.rtt_ns) == 5 and r.lost == 5  # one warm-up, five measured, then silence
    assert r.error == "after 5 exchanges: peer did not answer within 0.3 s"
    assert took < 3.0


def test_without_the_compiled_loop_python_times_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tcp, "_native_status", lambda: "the native engine is not built")
    chosen = tcp.pick_loop()
    assert chosen.name == "python" and "not built" in chosen.reason
    with pytest.raises(NotSupported):
        tcp.pick_loop("native")
    with pytest.raises(ValueError):
        tcp.pick_loop("fast")
