"""fabricprobe.core.web: limits kept while reading (Content-Length and chunked), gzip
inflated with a cap, roles asked of the guard before the body is read, refusals counted.
Real HTTP on 127.0.0.1."""

from __future__ import annotations

import gzip
import http.client
import socket
import time
import zlib
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabricprobe.core.web import (
    OPEN,
    Call,
    Caller,
    Limits,
    Refused,
    Reply,
    Route,
    WebServer,
    cert_names,
    inflate,
)


def echo(call: Call) -> Reply:
    return Reply(200, str(len(call.body)).encode() + b" " + str(call.identity).encode())


def guard(caller: Caller, role: str) -> str:
    if caller.authorization != "Bearer good":
        raise Refused(401, "unauthenticated", "who are you")
    if role != "ingest":
        raise Refused(403, "permission", "not yours")
    return "good"


@pytest.fixture
def server() -> Iterator[WebServer]:
    limits = Limits(max_body=1000, max_inflated=4000, body_s=0.5, header_s=0.5, idle_s=1.0)
    s = WebServer(
        "127.0.0.1",
        0,
        [
            Route(("/in",), ("POST",), "ingest", echo),
            Route(("/read",), ("GET",), "reader", echo),
            Route(("/open",), ("GET", "POST"), OPEN, echo),
        ],
        guard=guard,
        limits=limits,
    ).start()
    yield s
    s.shutdown()


def request(
    s: WebServer, method: str, path: str, body: bytes | None = None, **headers: str
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", s.server_address[1], timeout=5)
    try:
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def test_roles_come_before_the_body(server: WebServer) -> None:
    assert request(server, "POST", "/in", b"x" * 10)[0] == 401
    assert request(server, "POST", "/in", b"x" * 10, Authorization="Bearer bad")[0] == 401
    assert request(server, "GET", "/read", Authorization="Bearer good")[0] == 403
    assert request(server, "POST", "/in", b"x" * 10, Authorization="Bearer good") == (
        200,
        b"10 good",
    )
    assert request(server, "GET", "/open") == (200, b"0 None")
    assert request(server, "GET", "/nowhere")[0] == 404
    assert request(server, "DELETE", "/open")[0] == 405
    got = server.stats.snapshot()[0]
    assert got["unauthenticated"] == 2 and got["permission"] == 1 and got["not_found"] == 2


def test_body_limits_with_content_length_chunked_and_gzip(server: WebServer) -> None:
    assert request(server, "POST", "/open", b"x" * 1000)[0] == 200
    assert request(server, "POST", "/open", b"x" * 1001)[0] == 413

    def chunks(n: int) -> Iterator[bytes]:
        for _ in range(n):
            yield b"y" * 100

    # http.client sends an iterator chunked (no Content-Length)
    assert request(server, "POST", "/open", chunks(10)) == (200, b"1000 None")  # type: ignore[arg-type]
    assert request(server, "POST", "/open", chunks(11))[0] == 413  # type: ignore[arg-type]
    small = gzip.compress(b"z" * 4000)
    assert request(server, "POST", "/open", small, **{"Content-Encoding": "gzip"}) == (
        200,
        b"4000 None",
    )
    bomb = gzip.compress(b"z" * 4001)  # 40 bytes that inflate past the cap
    assert request(server, "POST", "/open", bomb, **{"Content-Encoding": "gzip"})[0] == 413
    assert request(server, "POST", "/open", b"not gzip", **{"Content-Encoding": "gzip"})[0] == 400
    assert request(server, "POST", "/open", b"x", **{"Content-Encoding": "br"})[0] == 415
    assert server.stats.snapshot()[0]["too_large"] == 3


def test_a_body_that_does_not_arrive_is_closed_at_its_deadline(server: WebServer) -> None:
    with socket.create_connection(server.server_address, timeout=5) as s:
        s.sendall(b"POST /open HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n" + b"x" * 10)
        t0 = time.monotonic()
        assert s.recv(100) == b""
        took = time.monotonic() - t0
    assert 0.4 < took < 1.5, took
    assert server.stats.snapshot()[0]["body_timeout"] == 1


def test_connections_per_source_are_capped() -> None:
    s = WebServer(
        "127.0.0.1",
        0,
        [Route(("/open",), ("GET",), OPEN, echo)],
        limits=Limits(per_source=3, max_connections=5),
    ).start()
    try:
        held = [
            socket.create_connection(s.server_address, source_address=("127.0.0.2", 0))
            for _ in range(3)
        ]
        extra = socket.create_connection(s.server_address, source_address=("127.0.0.2", 0))
        extra.settimeout(5)
        assert extra.recv(100).startswith(b"HTTP/1.1 503")
        assert request(s, "GET", "/open")[0] == 200  # another source is still served
        more = [
            socket.create_connection(s.server_address, source_address=("127.0.0.3", 0))
            for _ in range(3)
        ]  # the fifth and sixth in all: over max_connections
        time.sleep(0.2)
        got = s.stats.snapshot()[0]
        assert got["source"] == 1 and got["busy"] >= 1
        for sock in [*held, extra, *more]:
            sock.close()
    finally:
        s.shutdown()


def test_a_route_with_a_role_needs_a_guard() -> None:
    with pytest.raises(ValueError, match="guard"):
        WebServer("127.0.0.1", 0, [Route(("/x",), ("GET",), "reader", echo)])


def test_a_port_in_use_fails_at_start() -> None:
    a = WebServer("127.0.0.1", 0, [Route(("/x",), ("GET",), OPEN, echo)]).start()
    try:
        with pytest.raises(OSError):
            WebServer("127.0.0.1", a.server_address[1], []).start()
    finally:
        a.shutdown()


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=5000), cap=st.integers(min_value=0, max_value=6000))
def test_inflate_never_passes_its_cap(data: bytes, cap: int) -> None:
    packed = gzip.compress(data)
    if len(data) <= cap:
        assert inflate(packed, cap) == data
    else:
        with pytest.raises(Refused) as e:
            inflate(packed, cap)
        assert e.value.status == 413


@given(junk=st.binary(max_size=200))
def test_inflate_refuses_what_is_not_gzip(junk: bytes) -> None:
    try:
        out = inflate(junk, 1 << 20)
    except Refused as e:
        assert e.status == 400
    else:  # a junk string that happens to be a whole gzip stream
        assert out == zlib.decompress(junk, 16 + zlib.MAX_WBITS)


def test_cert_names_from_a_peer_certificate() -> None:
    cert = {
        "subject": ((("commonName", "otel-gw"),),),
        "subjectAltName": (("DNS", "otel-gw.example"), ("IP Address", "10.0.0.7")),
    }
    assert cert_names(cert) == ({"otel-gw", "otel-gw.example"}, {"10.0.0.7"})
    assert cert_names(None) == (set(), set())
