"""The agent API over real gRPC on loopback: register, assignments, reports and acks,
identity checks, clear errors, health and reflection."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc  # type: ignore[import-untyped]
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from fabricprobe.agent.client import CallError, CollectorClient, Status
from fabricprobe.collector.auth import GateConfig, TokenAuth, read_token_file
from fabricprobe.collector.service import ApiConfig, CollectorServer, ServerConfig
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.api import fabricprobe_pb2_grpc as pb_grpc
from fabricprobe.core.sketchwire import to_wire
from fabricprobe.core.stats import LatencySketch

TOKENS = {"h1": "token-for-h1-0123456789", "h2": "token-for-h2-0123456789"}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[CollectorServer]:
    f = tmp_path / "tokens"
    f.write_text("".join(f"{h} {t}\n" for h, t in TOKENS.items()) + "# comment\n")
    s = CollectorServer(
        ServerConfig(
            listen="127.0.0.1:0",
            metrics_listen="",
            gate=GateConfig(burst=8),
            api=ApiConfig(trust_local_registration=True),
        ),
        TokenAuth(read_token_file(f)),
    )
    s.start()
    yield s
    s.stop(0)


def client(server: CollectorServer, host: str) -> CollectorClient:
    return CollectorClient(f"127.0.0.1:{server.port}", token=TOKENS.get(host, "x" * 20))


def info(host: str) -> pb.HostInfo:
    return pb.HostInfo(
        host=host, addresses=["127.0.0.9"], probe_port=4793, probe_kinds=["tcp_lat"], topology="t1"
    )


def window(host: str, seq: int) -> pb.WindowReport:
    sk = LatencySketch()
    sk.record(25_000)
    r = pb.WindowReport(host=host, epoch=1, seq=seq, window_start_unix_ns=0, window_end_unix_ns=seq)
    r.probes.add(dst="h2", transport="tcp", op="pingpong", size=64, rtt=to_wire(sk))
    return r


def test_register_assign_report_ack(server: CollectorServer) -> None:
    c1, c2 = client(server, "h1"), client(server, "h2")
    c2.register(info("h2"))
    resp = c1.register(info("h1"))
    assert resp.report_interval_ms == 10_000
    a = c1.assignments("h1", 0)
    assert [(t.dst, t.kind) for t in a.targets] == [("h2", "tcp_lat")]
    assert a.generation >= 1 and a.targets[0].address == "127.0.0.9"
    acks, err = c1.send([window("h1", 1), window("h1", 2), window("h1", 1)])
    assert err is None
    assert [(x.seq, x.duplicate) for x in acks] == [(1, False), (2, False), (1, True)]
    assert server.store.paths[("h1", "h2", "tcp", "pingpong", 64)].rtt.count == 2
    (one,), err = c1.send([window("h1", 3)])
    assert err is None and (one.seq, one.duplicate) == (3, False)
    # the agent sends each window as a unary call; the Report stream serves other clients
    stub = pb_grpc.CollectorStub(grpc.insecure_channel(f"127.0.0.1:{server.port}"))
    streamed = stub.Report(
        iter([window("h1", 4), window("h1", 3)]),
        timeout=5,
        metadata=(("authorization", f"Bearer {TOKENS['h1']}"),),
    )
    assert [(x.seq, x.duplicate) for x in streamed] == [(4, False), (3, True)]
    codes = server.rpc_stats.snapshot()[2]
    assert codes[("ReportWindow", "OK")] == 4 and codes[("Report", "OK")] == 1


def test_a_host_reports_only_as_itself(server: CollectorServer) -> None:
    c1 = client(server, "h1")
    with pytest.raises(CallError) as e:
        c1.register(info("h2"))
    assert e.value.code() == Status.PERMISSION_DENIED
    assert "only as itself" in e.value.details()
    c1.register(info("h1"))
    acks, err = c1.send([window("h2", 1)])
    assert not acks and err.code() == Status.PERMISSION_DENIED
    bad = CollectorClient(f"127.0.0.1:{server.port}", token="not-a-known-token-xyz")
    with pytest.raises(CallError) as e:
        bad.register(info("h1"))
    assert e.value.code() == Status.UNAUTHENTICATED
    anon = CollectorClient(f"127.0.0.1:{server.port}")
    with pytest.raises(CallError) as e:
        anon.assignments("h1", 0)
    assert e.value.code() == Status.UNAUTHENTICATED
    codes = server.rpc_stats.snapshot()[2]
    assert codes[("Register", "PERMISSION_DENIED")] == 1
    assert codes[("Register", "OK")] == 1 and codes[("GetAssignments", "UNAUTHENTICATED")] == 1


def test_misuse_gets_clear_errors(server: CollectorServer) -> None:
    c1 = client(server, "h1")
    acks, err = c1.send([window("h1", 1)])
    assert err.code() == Status.FAILED_PRECONDITION  # not registered yet
    c1.register(info("h1"))
    broken = window("h1", 1)
    broken.probes[0].rtt.kind = "garbage"
    acks, err = c1.send([window("h1", 1), broken])
    assert len(acks) == 1 and err.code() == Status.INVALID_ARGUMENT
    assert "malformed latency sketch" in err.details()
    with pytest.raises(CallError) as e:
        c1.register(pb.HostInfo(host="h1", addresses=["a"] * 100))
    assert e.value.code() == Status.INVALID_ARGUMENT


def test_report_rate_and_message_size_are_limited(server: CollectorServer) -> None:
    c1 = client(server, "h1")
    c1.register(info("h1"))
    acks, err = c1.send([window("h1", s) for s in range(1, 20)])
    assert err is not None and err.code() == Status.RESOURCE_EXHAUSTED
    assert 6 <= len(acks) <= 10  # a burst of 8 calls and messages, less the Register
    huge = window("h1", 100)
    huge.probes[0].op = "x" * (5 << 20)
    acks, err = c1.send([huge])
    assert err.code() == Status.RESOURCE_EXHAUSTED  # over the 4 MiB message limit


def test_health_and_reflection(server: CollectorServer) -> None:
    ch = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    h = health_pb2_grpc.HealthStub(ch)
    resp = h.Check(health_pb2.HealthCheckRequest(service="fabricprobe.v1.Collector"), timeout=5)
    assert resp.status == health_pb2.HealthCheckResponse.SERVING
    r = reflection_pb2_grpc.ServerReflectionStub(ch)
    ask = [reflection_pb2.ServerReflectionRequest(list_services="")]
    with pytest.raises(grpc.RpcError) as e:  # reflection wants an identity, health does not
        list(r.ServerReflectionInfo(iter(ask), timeout=5))
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    token = (("authorization", f"Bearer {TOKENS['h1']}"),)
    answers = list(r.ServerReflectionInfo(iter(ask), timeout=5, metadata=token))
    names = {s.name for s in answers[0].list_services_response.service}
    assert {"fabricprobe.v1.Collector", "fabricprobe.v1.Query", "grpc.health.v1.Health"} <= names


def test_agent_with_its_token_file(server: CollectorServer, tmp_path: Path) -> None:
    from fabricprobe.agent.agent import Agent
    from fabricprobe.agent.config import AgentConfig

    token = tmp_path / "token"
    token.write_text(TOKENS["h2"] + "\n")
    fleet = tmp_path / "probe-token"
    fleet.write_text("a-fleet-probe-token-of-this-test\n")
    cfg = AgentConfig(
        host="h2",
        collector=f"127.0.0.1:{server.port}",
        probe_listen="127.0.0.7:0",
        spool_dir=str(tmp_path / "spool"),
        sysfs_root=str(tmp_path),
        ethtool=False,
        token_file=str(token),
        probe_token_file=str(fleet),
    )
    agent = Agent(cfg)
    agent.start()
    try:
        agent.cut_window()
        for _ in range(100):
            if agent.sender.acked:
                break
            agent.wait(0.05)
        assert agent.sender.acked >= 1 and server.store.hosts["h2"].reports >= 1
    finally:
        agent.close()


def test_silent_hosts_are_forgotten_and_the_fleet_replanned() -> None:
    from fabricprobe.collector.assign import Planner
    from fabricprobe.collector.service import AgentApi
    from fabricprobe.collector.store import WindowStore

    now = [0]
    store = WindowStore(stale_after=30, forget_after=60, clock=lambda: now[0])
    api = AgentApi(store, Planner(pace=0), ApiConfig())
    for h in ("h1", "h2", "h3"):
        api.register(info(h))
    before = api.assignments("h1")
    assert not before.list_qps  # no fabric file: the agents list no QPs
    assert {t.dst for t in before.targets} == {"h2", "h3"}
    now[0] = 50 * 10**9
    api.report(window("h1", 1))  # h1 keeps reporting; h2 and h3 fall silent
    api.report(window("h2", 1))
    now[0] = 100 * 10**9
    assert api.expire() == ["h3"]
    after = api.assignments("h1")
    assert after.generation > before.generation
    assert {t.dst for t in after.targets} == {"h2"}


def test_a_server_is_wired_before_it_starts(tmp_path: Path) -> None:
    """Its parts exist and know each other at construction: the shard tells the agent API
    the other shards' hosts, the raw windows listen to the store, and /metrics' collectors
    are registered in the order they are written."""
    from fabricprobe.collector.rawstore import RawStoreConfig
    from fabricprobe.collector.shard import ShardConfig

    cfg = ServerConfig(
        listen="127.0.0.1:0",
        metrics_listen="",
        raw=RawStoreConfig(str(tmp_path / "windows")),
        shard=ShardConfig(etcd=(("127.0.0.1", 1),), name="s"),
    )
    server = CollectorServer(cfg)
    assert server.shard is not None and server.raw is not None
    assert server.api.remote == server.shard.remote_hosts
    assert server.api.on_register == server.shard.publish
    assert server.store.listeners == [server.raw]
    names = [m.name for m in server.registry.collect()]
    firsts = [
        names.index(n)
        for n in (
            "fabricprobe_rtt_seconds",
            "fabricprobe_host_check_status",
            "fabricprobe_shard_members",
            "fabricprobe_raw_windows_rows",
        )
    ]
    assert firsts == sorted(firsts)
    bare = CollectorServer(ServerConfig(listen="127.0.0.1:0", metrics_listen=""))
    assert bare.shard is None and bare.raw is None and bare.store.listeners == []
