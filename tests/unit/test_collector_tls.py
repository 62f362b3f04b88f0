"""Mutual TLS between agent and collector: the client certificate names the host."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc  # type: ignore[import-untyped]
import pytest

from fabricprobe.agent.agent import Agent
from fabricprobe.agent.client import CallError, CollectorClient, Status, tls_context
from fabricprobe.agent.config import AgentConfig
from fabricprobe.collector.auth import MutualTls
from fabricprobe.collector.service import ApiConfig, CollectorServer, ServerConfig
from fabricprobe.core.api import fabricprobe_pb2 as pb
from tests.support.pki import issue, make_ca


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    make_ca(d)
    issue(d, "collector", "/CN=collector", "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for host in ("h1", "h2", "reader"):
        issue(d, host, f"/CN={host}", f"subjectAltName=DNS:{host}\n")
    issue(d, "h3", "/CN=h3", "subjectAltName=DNS:h3,IP:10.20.30.40\n")
    return d


@pytest.fixture
def server(pki: Path) -> Iterator[CollectorServer]:
    auth = MutualTls.from_files(
        str(pki / "collector.pem"),
        str(pki / "collector.key"),
        str(pki / "ca.pem"),
        readers=frozenset({"reader"}),
    )
    s = CollectorServer(
        ServerConfig(
            listen="127.0.0.1:0", metrics_listen="", api=ApiConfig(trust_local_registration=True)
        ),
        auth,
    )
    s.start()
    yield s
    s.stop(0)


def client(pki: Path, server: CollectorServer, cert: str | None) -> CollectorClient:
    tls = tls_context(
        str(pki / "ca.pem"),
        str(pki / f"{cert}.pem") if cert else "",
        str(pki / f"{cert}.key") if cert else "",
    )
    return CollectorClient(f"127.0.0.1:{server.port}", tls=tls, timeout=2)


def test_certificate_names_the_host(pki: Path, server: CollectorServer) -> None:
    c = client(pki, server, "h1")
    assert c.register(pb.HostInfo(host="h1")).report_interval_ms
    with pytest.raises(CallError) as e:
        c.register(pb.HostInfo(host="h2"))
    assert e.value.code() == Status.PERMISSION_DENIED
    assert "h1" in e.value.details()


def test_no_client_certificate_is_refused(pki: Path, server: CollectorServer) -> None:
    with pytest.raises(CallError) as e:
        client(pki, server, None).register(pb.HostInfo(host="h1"))
    assert e.value.code() == Status.UNAVAILABLE  # the TLS handshake fails


def test_plain_text_client_cannot_talk_to_a_tls_collector(server: CollectorServer) -> None:
    with pytest.raises(CallError) as e:
        CollectorClient(f"127.0.0.1:{server.port}", timeout=2).register(pb.HostInfo(host="h1"))
    assert e.value.code() == Status.UNAVAILABLE


def test_agent_over_mutual_tls(pki: Path, server: CollectorServer, tmp_path: Path) -> None:
    fleet = tmp_path / "probe-token"
    fleet.write_text("a-fleet-probe-token-of-this-test\n")
    cfg = AgentConfig(
        host="h2",
        collector=f"127.0.0.1:{server.port}",
        probe_listen="127.0.0.5:0",
        spool_dir=str(tmp_path / "spool"),
        sysfs_root=str(tmp_path),
        ethtool=False,
        ca_file=str(pki / "ca.pem"),
        cert_file=str(pki / "h2.pem"),
        key_file=str(pki / "h2.key"),
        probe_token_file=str(fleet),
        window_s=0.5,
    )
    agent = Agent(cfg)
    agent.start()
    try:
        agent.cut_window()
        deadline = 50
        while agent.sender.acked < 1 and deadline:
            agent.wait(0.1)
            deadline -= 1
        assert agent.sender.acked >= 1 and "h2" in server.store.hosts
    finally:
        agent.close()


def test_why_over_mutual_tls_needs_a_reader_certificate(pki: Path, server: CollectorServer) -> None:
    from click.testing import CliRunner

    from fabricprobe.cli import main

    base = ["why", "--collector", f"127.0.0.1:{server.port}", "--ca-file", str(pki / "ca.pem")]
    reader = ["--cert-file", str(pki / "reader.pem"), "--key-file", str(pki / "reader.key")]
    res = CliRunner().invoke(main, [*base, *reader, "--json"])
    # answered: an empty collector, which says why it has nothing to show (exit 3)
    assert res.exit_code == 3, res.output
    assert '"slowest": []' in res.output and "no spans in the window" in res.output
    res = CliRunner().invoke(
        main, [*base, "--cert-file", str(pki / "h1.pem"), "--key-file", str(pki / "h1.key")]
    )
    assert res.exit_code == 1 and "PERMISSION_DENIED" in res.output  # a host is not a reader
    c = client(pki, server, "reader")
    with pytest.raises(CallError) as e:  # and a reader is not a host
        c.register(pb.HostInfo(host="reader"))
    assert e.value.code() == Status.PERMISSION_DENIED


def test_a_certificate_names_the_addresses_a_host_may_register(
    pki: Path, server: CollectorServer
) -> None:
    c = client(pki, server, "h3")
    assert c.register(pb.HostInfo(host="h3", addresses=["10.20.30.40"])).report_interval_ms
    with pytest.raises(CallError) as e:
        c.register(pb.HostInfo(host="h3", addresses=["10.20.30.41"]))
    assert e.value.code() == Status.PERMISSION_DENIED
    assert "10.20.30.41 is not this host's" in e.value.details()


def test_one_valid_certificate_cannot_freeze_the_fleet(pki: Path, server: CollectorServer) -> None:
    import threading
    import time

    from fabricprobe.core.api import fabricprobe_pb2_grpc as pb_grpc

    stop = threading.Event()

    def nothing() -> Iterator[pb.WindowReport]:
        stop.wait(20)
        yield from ()

    creds = grpc.ssl_channel_credentials(
        root_certificates=(pki / "ca.pem").read_bytes(),
        private_key=(pki / "h1.key").read_bytes(),
        certificate_chain=(pki / "h1.pem").read_bytes(),
    )
    stub = pb_grpc.CollectorStub(grpc.secure_channel(f"127.0.0.1:{server.port}", creds))
    calls = [stub.Report(nothing(), timeout=20) for _ in range(64)]
    try:
        time.sleep(1.0)
        assert client(pki, server, "h2").register(pb.HostInfo(host="h2")).report_interval_ms
        assert server.gate.limits.streams <= 4
    finally:
        stop.set()
    refused = 0
    for call in calls:
        try:
            list(call)
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            refused += 1
    assert refused == 60
