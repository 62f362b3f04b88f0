"""The one authentication layer: every service on the port, streams limited per identity,
strangers refused before they hold a worker. Real gRPC on 127.0.0.1."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts_pb
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as ts_grpc

from fabricprobe.agent.client import CallError, CollectorClient, Status
from fabricprobe.collector.auth import GateConfig, Limits, TokenAuth, read_token_file
from fabricprobe.collector.service import ApiConfig, CollectorServer, ServerConfig
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.api import fabricprobe_pb2_grpc as pb_grpc

TOKENS = {
    "h1": ("token-for-h1-0123456789", ""),
    "h2": ("token-for-h2-0123456789", ""),
    "vllm": ("token-for-ingest-01234", "ingest"),
    "grafana": ("token-for-reader-01234", "reader"),
}


def bearer(name: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {TOKENS[name][0]}"),)


def start(tmp_path: Path, **gate: Any) -> CollectorServer:
    f = tmp_path / "tokens"
    f.write_text("".join(f"{n} {t} {r}\n" for n, (t, r) in TOKENS.items()))
    s = CollectorServer(
        ServerConfig(
            listen="127.0.0.1:0",
            metrics_listen="",
            gate=GateConfig(**gate),
            api=ApiConfig(trust_local_registration=True),
        ),
        TokenAuth(read_token_file(f)),
    )
    s.start()
    return s


@pytest.fixture
def server(tmp_path: Path) -> Iterator[CollectorServer]:
    s = start(tmp_path)
    yield s
    s.stop(0)


def info(host: str) -> pb.HostInfo:
    return pb.HostInfo(host=host, addresses=["127.0.0.9"], probe_port=4793, probe_kinds=["tcp_lat"])


def silent_streams(port: int, n: int, metadata: Any, stop: threading.Event) -> list[Any]:
    """N Report streams that send nothing until STOP is set."""

    def nothing() -> Iterator[pb.WindowReport]:
        stop.wait(20)
        yield from ()

    ch = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = pb_grpc.CollectorStub(ch)
    return [stub.Report(nothing(), metadata=metadata, timeout=20) for _ in range(n)]


def codes(calls: list[Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in calls:
        try:
            list(c)
            name = "OK"
        except grpc.RpcError as e:
            name = e.code().name
        out[name] = out.get(name, 0) + 1
    return out


def test_64_silent_unauthenticated_streams_do_not_stall_register(server: CollectorServer) -> None:
    stop = threading.Event()
    calls = silent_streams(server.port, 64, (), stop)
    try:
        time.sleep(0.5)  # every stream reached the server
        agent = CollectorClient(f"127.0.0.1:{server.port}", token=TOKENS["h1"][0], timeout=3)
        t0 = time.monotonic()
        assert agent.register(info("h1")).report_interval_ms
        assert time.monotonic() - t0 < 2.0
        assert server.gate.limits.streams == 0  # none of them holds a worker
    finally:
        stop.set()
    assert codes(calls) == {"UNAUTHENTICATED": 64}
    assert server.gate.limits.snapshot()[0]["unauthenticated"] == 64


def test_64_silent_streams_of_one_valid_host_hold_only_its_share(tmp_path: Path) -> None:
    server = start(tmp_path, streams_per_identity=2)
    stop = threading.Event()
    try:
        calls = silent_streams(server.port, 64, bearer("h1"), stop)
        time.sleep(0.5)
        agent = CollectorClient(f"127.0.0.1:{server.port}", token=TOKENS["h2"][0], timeout=3)
        assert agent.register(info("h2")).report_interval_ms
        r = pb.WindowReport(host="h2", epoch=1, seq=1, window_end_unix_ns=time.time_ns())
        (ack,), err = agent.send([r])
        assert err is None and not ack.duplicate
        assert server.gate.limits.streams == 2
        stop.set()
        got = codes(calls)
        assert got == {"RESOURCE_EXHAUSTED": 62, "OK": 2}, got
    finally:
        stop.set()
        server.stop(0)


def test_an_idle_stream_is_cancelled(tmp_path: Path) -> None:
    server = start(tmp_path, stream_idle_s=0.2)
    stop = threading.Event()
    try:
        (call,) = silent_streams(server.port, 1, bearer("h1"), stop)
        time.sleep(0.5)
        assert server.gate.cancel_idle() == 1
        assert codes([call]) == {"CANCELLED": 1}
        deadline = time.monotonic() + 10  # the stream's slot is let go as its handler ends
        while server.gate.limits.streams and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.gate.limits.streams == 0
    finally:
        stop.set()
        server.stop(0)


def test_otlp_needs_an_ingest_identity(server: CollectorServer) -> None:
    stub = ts_grpc.TraceServiceStub(grpc.insecure_channel(f"127.0.0.1:{server.port}"))
    empty = ts_pb.ExportTraceServiceRequest()
    for metadata, want in (
        ((), grpc.StatusCode.UNAUTHENTICATED),
        ((("authorization", "Bearer not-a-known-token-xyz"),), grpc.StatusCode.UNAUTHENTICATED),
        (bearer("h1"), grpc.StatusCode.PERMISSION_DENIED),  # a host token is not an ingest one
        (bearer("grafana"), grpc.StatusCode.PERMISSION_DENIED),
    ):
        with pytest.raises(grpc.RpcError) as e:
            stub.Export(empty, metadata=metadata, timeout=3)
        assert e.value.code() == want
    stub.Export(empty, metadata=bearer("vllm"), timeout=3)


def test_why_needs_a_reader_identity(server: CollectorServer) -> None:
    stub = pb_grpc.QueryStub(grpc.insecure_channel(f"127.0.0.1:{server.port}"))
    for metadata, want in (
        ((), grpc.StatusCode.UNAUTHENTICATED),
        (bearer("h1"), grpc.StatusCode.PERMISSION_DENIED),
        (bearer("vllm"), grpc.StatusCode.PERMISSION_DENIED),
    ):
        with pytest.raises(grpc.RpcError) as e:
            stub.Why(pb.WhyRequest(), metadata=metadata, timeout=5)
        assert e.value.code() == want
    reply = stub.Why(pb.WhyRequest(slowest=3), metadata=bearer("grafana"), timeout=10)
    assert list(reply.slowest) == []
    with pytest.raises(grpc.RpcError) as e:
        stub.Why(pb.WhyRequest(by="nonsense"), metadata=bearer("grafana"), timeout=5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_reader_or_ingest_token_speaks_for_no_host(server: CollectorServer) -> None:
    for name in ("vllm", "grafana"):
        c = CollectorClient(f"127.0.0.1:{server.port}", token=TOKENS[name][0], timeout=3)
        with pytest.raises(CallError) as e:
            c.register(info(name))
        assert e.value.code() == Status.PERMISSION_DENIED


def test_the_limits_table_is_bounded_and_counts_evictions() -> None:
    now = [0.0]
    lim = Limits(GateConfig(rate=1, burst=2, max_identities=3), clock=lambda: now[0])
    assert lim.open_stream("keep") is None  # an identity holding a stream is never evicted
    for i in range(10):
        assert lim.take(f"id{i}")
    held = lim.snapshot()
    assert held[2] == 3 and held[1] == 8 and "keep" in lim.table
    assert lim.take("id9") and not lim.take("id9")  # a burst of 2, then refused
    now[0] = 1.0
    assert lim.take("id9")  # one a second
    assert lim.snapshot()[0]["rate"] == 1


def test_token_file_roles_are_checked(tmp_path: Path) -> None:
    f = tmp_path / "t"
    f.write_text("grafana token-for-reader-01234 admin\n")
    with pytest.raises(ValueError, match="roles are"):
        read_token_file(f)
    f.write_text("a token-for-a-0123456789\nb token-for-a-0123456789\n")
    with pytest.raises(ValueError, match="twice"):
        read_token_file(f)


def test_probe_why_sends_its_reader_token(server: CollectorServer, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from fabricprobe.cli import main

    token = tmp_path / "reader.token"
    token.write_text(TOKENS["grafana"][0] + "\n")
    base = ["why", "--collector", f"127.0.0.1:{server.port}"]
    res = CliRunner().invoke(main, [*base, "--insecure", "--token-file", str(token), "--json"])
    assert res.exit_code == 3 and "no spans" in res.output, res.output  # answered, empty
    res = CliRunner().invoke(main, [*base, "--insecure"])
    assert res.exit_code == 1 and "UNAUTHENTICATED" in res.output
    res = CliRunner().invoke(main, base)  # no TLS and no --insecure: refused before calling
    assert res.exit_code == 2 and "--insecure" in res.output
    res = CliRunner().invoke(main, [*base, "--insecure", "--cert-file", str(token)])
    assert res.exit_code == 2 and "--key-file" in res.output
