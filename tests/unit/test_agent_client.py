"""The agent's collector client (grpclib): one connection, opened at the first call and
kept across windows, made anew when a kept one died meanwhile; bounds on what a server
may answer, and a gRPC status for every way a call can fail."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import grpc  # type: ignore[import-untyped]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabricprobe.agent.agent import Agent
from fabricprobe.agent.client import MAX_MESSAGE_BYTES, CallError, CollectorClient, Status
from fabricprobe.collector.service import ApiConfig, CollectorServer, ServerConfig
from fabricprobe.core.api import fabricprobe_pb2 as pb
from tests.support.fleet import loopback_agent_config


@pytest.fixture
def server() -> Iterator[CollectorServer]:
    s = CollectorServer(
        ServerConfig(
            listen="127.0.0.1:0", metrics_listen="", api=ApiConfig(trust_local_registration=True)
        )
    )
    s.start()
    yield s
    s.stop(0)


def test_the_channel_opens_on_use_and_closes_on_release(server: CollectorServer) -> None:
    c = CollectorClient(f"127.0.0.1:{server.port}", timeout=5)
    assert not c.connected and c.opened == 0
    assert c.register(pb.HostInfo(host="h1")).report_interval_ms
    assert c.connected and c.opened == 1
    c.register(pb.HostInfo(host="h1"))
    assert c.opened == 1  # kept while in use
    c.release()
    c.release()  # twice is fine
    assert not c.connected
    assert c.assignments("h1", 0) is not None
    assert c.connected and c.opened == 2
    c.close()
    assert not c.connected


def test_an_agent_keeps_one_connection_across_windows(
    server: CollectorServer, tmp_path: Path
) -> None:
    cfg = loopback_agent_config(tmp_path, "127.0.0.31", server.port)
    agent = Agent(cfg)
    agent.start()
    try:
        deadline = time.monotonic() + 20
        while agent.sender.acked < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert agent.sender.acked >= 2, "the agent's windows did not reach the collector"
        assert agent.sender.client.opened == 1 and agent.sender.client.connected
    finally:
        agent.close(flush_timeout=0.5)


def test_a_kept_connection_to_a_collector_that_restarted_is_made_anew() -> None:
    """The collector goes away and comes back on its port between two calls: the second
    call does not fail for the dead connection it kept."""
    cfg = ServerConfig(
        listen="127.0.0.1:0", metrics_listen="", api=ApiConfig(trust_local_registration=True)
    )
    first = CollectorServer(cfg)
    first.start()
    port = first.port
    c = CollectorClient(f"127.0.0.1:{port}", timeout=5)
    second = None
    try:
        c.register(pb.HostInfo(host="h1"))
        first.stop(0)
        second = CollectorServer(replace(cfg, listen=f"127.0.0.1:{port}"))
        second.start()
        t0 = time.monotonic()
        assert c.register(pb.HostInfo(host="h1")).report_interval_ms
        assert time.monotonic() - t0 < 4  # not after a deadline
        second.stop(0)  # and a collector that is gone is UNAVAILABLE
        with pytest.raises(CallError) as e:
            c.register(pb.HostInfo(host="h1"))
        assert e.value.code() == Status.UNAVAILABLE and not c.connected
    finally:
        c.close()
        first.stop(0)
        if second is not None:
            second.stop(0)


def test_a_kept_connection_that_died_unnoticed_is_replaced(server: CollectorServer) -> None:
    """A kept connection whose socket was shut while the client's loop was not running
    (nothing has read the news): the call fails on it, and is made once more anew."""
    c = CollectorClient(f"127.0.0.1:{server.port}", timeout=5)
    try:
        c.register(pb.HostInfo(host="h1"))
        assert c._channel is not None
        sock = c._channel._protocol.connection._transport.get_extra_info("socket")
        with socket.socket(fileno=os.dup(sock.fileno())) as same:
            same.shutdown(socket.SHUT_RDWR)
        t0 = time.monotonic()
        assert c.assignments("h1", 0) is not None
        assert time.monotonic() - t0 < 4
        assert (c.opened, c.stale) == (2, 1)
    finally:
        c.close()


class Hostile:
    """A gRPC server on loopback that answers every call with `reply`'s bytes as they are,
    whatever the method (grpcio's generic handler, no serializer)."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply

        def answer(request: bytes, context: grpc.ServicerContext) -> bytes:
            return self.reply

        handler = grpc.method_handlers_generic_handler(
            "fabricprobe.v1.Collector",
            {
                name: grpc.unary_unary_rpc_method_handler(answer)
                for name in ("Register", "GetAssignments", "ReportWindow", "ReportChecks")
            },
        )
        self.server = grpc.server(ThreadPoolExecutor(2), handlers=[handler])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def close(self) -> None:
        self.server.stop(0)


def test_a_reply_over_the_bound_is_refused_before_it_is_read() -> None:
    big = pb.RegisterResponse(report_interval_ms=1)
    big.assignments.targets.add(dst="x" * (MAX_MESSAGE_BYTES + 1))
    server = Hostile(big.SerializeToString())
    try:
        c = CollectorClient(f"127.0.0.1:{server.port}", timeout=5)
        with pytest.raises(CallError) as e:
            c.register(pb.HostInfo(host="h1"))
        assert e.value.code() == Status.RESOURCE_EXHAUSTED
        assert f"over {MAX_MESSAGE_BYTES}" in e.value.details()
        assert not c.connected  # and the connection is let go
        c.close()
    finally:
        server.close()


def test_a_reply_that_is_not_the_message_is_an_error() -> None:
    server = Hostile(b"\xff" * 64)
    try:
        c = CollectorClient(f"127.0.0.1:{server.port}", timeout=5)
        with pytest.raises(CallError) as e:
            c.register(pb.HostInfo(host="h1"))
        assert e.value.code() == Status.INTERNAL and "not understood" in e.value.details()
        c.close()
    finally:
        server.close()


def test_a_peer_that_closes_or_says_nothing() -> None:
    """Whatever listens there: closing at once is UNAVAILABLE, silence is the deadline,
    and either way the connection is let go."""
    with socket.socket() as closes, socket.socket() as silent:
        for s in (closes, silent):
            s.bind(("127.0.0.1", 0))
            s.listen(4)
        stop = threading.Event()

        def close_each() -> None:
            while not stop.is_set():
                with contextlib.suppress(OSError):
                    conn, _ = closes.accept()
                    conn.close()

        t = threading.Thread(target=close_each, daemon=True)
        closes.settimeout(0.2)
        t.start()
        try:
            c = CollectorClient(f"127.0.0.1:{closes.getsockname()[1]}", timeout=2)
            with pytest.raises(CallError) as e:
                c.assignments("h1", 0)
            assert e.value.code() == Status.UNAVAILABLE and not c.connected
            c.close()
            c = CollectorClient(f"127.0.0.1:{silent.getsockname()[1]}", timeout=0.5)
            t0 = time.monotonic()
            with pytest.raises(CallError) as e:
                c.assignments("h1", 0)
            assert e.value.code() == Status.DEADLINE_EXCEEDED and not c.connected
            assert time.monotonic() - t0 < 5
            c.close()
        finally:
            stop.set()
            t.join()


def test_a_window_over_the_bound_is_not_sent(server: CollectorServer) -> None:
    c = CollectorClient(f"127.0.0.1:{server.port}", timeout=5)
    c.register(pb.HostInfo(host="h1"))
    huge = pb.WindowReport(host="h1", epoch=1, seq=1)
    huge.probes.add(op="x" * (MAX_MESSAGE_BYTES + 1))
    ok = pb.WindowReport(host="h1", epoch=1, seq=2)
    acks, err = c.send([ok, huge, ok])
    assert len(acks) == 1 and err is not None and err.code() == Status.RESOURCE_EXHAUSTED
    c.close()


@pytest.fixture(scope="module")
def hostile() -> Iterator[Hostile]:
    s = Hostile(b"")
    yield s
    s.close()


@settings(max_examples=60, deadline=None)
@given(reply=st.binary(max_size=512))
def test_any_reply_is_a_message_or_a_clear_error(hostile: Hostile, reply: bytes) -> None:
    """Whatever bytes a server answers with, the call returns the message they parse to
    or fails with CallError, and the client is ready for the next call."""
    hostile.reply = reply
    c = CollectorClient(f"127.0.0.1:{hostile.port}", timeout=5)
    try:
        errors: list[CallError | None] = []
        for call in (
            lambda: c.register(pb.HostInfo(host="h1")),
            lambda: c.assignments("h1", 0),
        ):
            try:
                call()
                errors.append(None)
            except CallError as e:
                errors.append(e)
        errors.append(c.send([pb.WindowReport(host="h1", epoch=1, seq=1)])[1])
        for e in errors:
            assert e is None or e.code() == Status.INTERNAL, e
    finally:
        c.close()
