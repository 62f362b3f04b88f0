"""One test for each attack on the collector (issue 13): each is refused, bounded or healed.
Real gRPC and HTTP on 127.0.0.1 where the attack comes over the wire."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc  # type: ignore[import-untyped]
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as ts_grpc

from fabricprobe.agent.client import CallError, CollectorClient, Status
from fabricprobe.collector.assign import Planner
from fabricprobe.collector.auth import TokenAuth, read_token_file
from fabricprobe.collector.service import (
    AddressRefused,
    AgentApi,
    ApiConfig,
    CollectorServer,
    ServerConfig,
)
from fabricprobe.collector.store import MAX_PATHS_PER_HOST, ReportError, WindowStore
from fabricprobe.core.api import fabricprobe_pb2 as pb
from tests.unit.spanmaker import batch, kv_span, span

S = 1_000_000_000
TOKENS = {"h1": "token-for-h1-0123456789", "h2": "token-for-h2-0123456789"}


def scrape(server: CollectorServer) -> str:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.status == 200
        return str(r.read().decode())


@pytest.fixture
def insecure() -> Iterator[CollectorServer]:
    s = CollectorServer(
        ServerConfig(listen="127.0.0.1:0", metrics_listen="127.0.0.1:0", metrics_cache_s=0.0)
    )
    s.start()
    yield s
    s.stop(0)


def test_spans_with_absurd_bytes_do_not_break_metrics(insecure: CollectorServer) -> None:
    stub = ts_grpc.TraceServiceStub(grpc.insecure_channel(f"127.0.0.1:{insecure.port}"))
    now = time.time_ns()
    huge = kv_span("r1", now - 2 * S, 0.5, "h0", "h1", 0)
    huge.attributes[-1].value.double_value = 1e300
    decode = span("decode", now - S, now, **{"gen_ai.request.id": "r1", "fabricprobe.bytes": 1e300})
    stub.Export(batch(huge, decode), timeout=10)
    ahead = now + 365 * 86_400 * S  # and the same dated a year ahead
    stub.Export(batch(kv_span("r2", ahead, 0.5, "h0", "h1", 10**6)), timeout=10)
    for _ in range(2):  # every later scrape works, not only the first
        text = scrape(insecure)
        assert "fabricprobe_communication_bound 0.0" in text
    assert insecure.attribution.counts().dropped_values >= 2
    assert "fabricprobe_attribution_dropped_total" in text


def test_a_failing_analysis_serves_the_last_good_one(insecure: CollectorServer) -> None:
    a = insecure.attribution
    scrape(insecure)
    assert a.cache.last_good is not None

    def broken() -> None:
        raise TypeError("'<' not supported between instances of 'int' and 'str'")

    a.view = broken  # type: ignore[method-assign,assignment]
    text = scrape(insecure)
    assert a.counts().analysis_failures == 1
    assert "fabricprobe_attribution_failures_total 1.0" in text
    assert "fabricprobe_communication_bound 0.0" in text  # the last good analysis


def api(**kw: object) -> tuple[AgentApi, WindowStore, list[int]]:
    now = [1_000_000 * S]
    store = WindowStore(clock=lambda: now[0], **kw)  # type: ignore[arg-type]
    a = AgentApi(store, Planner(pace=0), ApiConfig())
    return a, store, now


def test_one_host_cannot_make_100k_paths() -> None:
    a, store, _ = api()
    a.register(pb.HostInfo(host="h1"))
    for chunk in range(100):
        seq = chunk + 1
        r = pb.WindowReport(host="h1", epoch=1, seq=seq, window_end_unix_ns=seq * S)
        for i in range(1000):
            r.probes.add(dst=f"x{chunk}-{i}", transport="tcp", op="pingpong", size=64)
        a.report(r)
    assert len(store.paths) == MAX_PATHS_PER_HOST
    assert store.dropped["path"] == 100_000 - MAX_PATHS_PER_HOST
    assert store.hosts["h1"].paths == MAX_PATHS_PER_HOST


def test_idle_paths_expire_and_free_the_bound() -> None:
    a, store, now = api(forget_after=60, max_paths_per_host=10)
    a.register(pb.HostInfo(host="h1"))
    r = pb.WindowReport(host="h1", epoch=1, seq=1, window_end_unix_ns=now[0])
    for i in range(10):
        r.probes.add(dst=f"old{i}", transport="tcp", op="pingpong", size=64)
    a.report(r)
    now[0] += 50 * S
    a.report(pb.WindowReport(host="h1", epoch=1, seq=2, window_end_unix_ns=now[0]))  # alive
    now[0] += 20 * S
    store.forget_idle()
    assert not store.paths and store.hosts["h1"].paths == 0
    r = pb.WindowReport(host="h1", epoch=1, seq=3, window_end_unix_ns=now[0])
    r.probes.add(dst="new", transport="tcp", op="pingpong", size=64)
    a.report(r)
    assert list(store.paths) == [("h1", "new", "tcp", "pingpong", 64)]


@pytest.mark.parametrize(
    "info",
    [
        pb.HostInfo(host="h1", topology="t" * (3 << 20)),
        pb.HostInfo(host="h1", version="v" * 129),
        pb.HostInfo(host="h1", probe_kinds=["k" * 200]),
        pb.HostInfo(host="h1", devices=[pb.RdmaDevice(name="d" * 200)]),
        pb.HostInfo(
            host="h1",
            devices=[pb.RdmaDevice(name="d", ports=[pb.RdmaPort(gids=[pb.Gid()] * 300)])],
        ),
    ],
)
def test_huge_label_values_are_refused(info: pb.HostInfo) -> None:
    a, store, _ = api()
    with pytest.raises(ReportError):
        a.register(info)
    assert not store.hosts


def test_infinite_nan_and_negative_figures_are_not_exported() -> None:
    a, store, now = api()
    a.register(pb.HostInfo(host="h1"))
    r = pb.WindowReport(host="h1", epoch=1, seq=1, window_end_unix_ns=now[0])
    r.probes.add(dst="h2", transport="tcp", op="stream", size=1, bytes_moved=10, busy_seconds=-1)
    r.probes.add(
        dst="h2", transport="tcp", op="stream", size=2, bytes_moved=10, busy_seconds=float("nan")
    )
    r.probes.add(
        dst="h2", transport="tcp", op="stream", size=3, bytes_moved=10**19, busy_seconds=1e-300
    )
    r.agent.CopyFrom(pb.AgentStats(cpu_seconds=float("inf"), probe_rate=-5.0))
    r.counters.add(kind="rdma", device="d", port=1, name="c", value=2**40, width=32)
    a.report(r)
    from prometheus_client import CollectorRegistry

    from fabricprobe.collector.exporter import FabricCollector
    from fabricprobe.collector.exposition import render

    reg = CollectorRegistry()
    reg.register(FabricCollector(store))
    text = render(reg).decode()
    values = [line.rsplit(" ", 1)[1] for line in text.splitlines() if not line.startswith("#")]
    assert not [v for v in values if v in ("+Inf", "-Inf", "NaN") or v.startswith("-")]
    assert store.dropped["value"] == 5 and store.hosts["h1"].agent is None


def test_a_window_from_an_older_lifetime_is_not_counted_again() -> None:
    a, store, now = api()
    a.register(pb.HostInfo(host="h1"))
    for epoch in range(1, 8):  # seven agent lifetimes, one window each
        a.report(pb.WindowReport(host="h1", epoch=epoch, seq=1, window_end_unix_ns=now[0]))
    taken = store.reports_total
    for _ in range(3):  # the first lifetime's window replayed, again and again
        ack = a.report(pb.WindowReport(host="h1", epoch=1, seq=1, window_end_unix_ns=now[0]))
        assert ack.duplicate
    assert store.reports_total == taken == 7
    assert store.dropped["stale_epoch"] == 3


def test_a_clock_that_steps_back_does_not_defeat_dedup() -> None:
    a, store, now = api()
    a.register(pb.HostInfo(host="h1"))
    for epoch in (400, 300, 200, 100):  # each restart's clock earlier than the last
        a.report(pb.WindowReport(host="h1", epoch=epoch, seq=1, window_end_unix_ns=now[0]))
    a.report(pb.WindowReport(host="h1", epoch=50, seq=1, window_end_unix_ns=now[0]))
    assert a.report(
        pb.WindowReport(host="h1", epoch=50, seq=1, window_end_unix_ns=now[0])
    ).duplicate
    assert store.reports_total == 5


def counter(
    host: str, epoch: int, seq: int, end_ns: int, value: int, width: int = 64
) -> pb.WindowReport:
    r = pb.WindowReport(host=host, epoch=epoch, seq=seq, window_end_unix_ns=end_ns)
    r.counters.add(
        kind="rdma", device="mlx5_0", port=1, name="out_of_buffer", value=value, width=width
    )
    return r


KEY = ("h1", "rdma", "mlx5_0", 1, "", 0, "out_of_buffer")


def test_counters_follow_seq_when_the_clock_steps_back() -> None:
    a, store, now = api()
    a.register(pb.HostInfo(host="h1"))
    t = now[0]
    a.report(counter("h1", 1, 1, t, 100))
    a.report(counter("h1", 1, 2, t + 10 * S, 200))
    a.report(counter("h1", 1, 3, t - 3600 * S, 300))  # the agent's clock stepped back an hour
    a.report(counter("h1", 1, 4, t - 3590 * S, 400))
    track = store.counters[KEY]
    assert track.total == 300 and track.rate == pytest.approx(10.0)
    a.report(counter("h1", 1, 2, t + 10 * S, 200))  # a replay: a duplicate, not a reading
    assert track.total == 300


def test_a_window_dated_a_year_ahead_is_refused_and_freezes_nothing() -> None:
    a, store, now = api()
    a.register(pb.HostInfo(host="h1"))
    a.report(counter("h1", 1, 1, now[0], 100))
    with pytest.raises(ReportError, match="after the collector's clock"):
        a.report(counter("h1", 1, 2, now[0] + 365 * 86_400 * S, 150))
    now[0] += 10 * S
    a.report(counter("h1", 1, 3, now[0], 200))
    assert store.counters[KEY].total == 100  # counting went on
    a.report(counter("h1", 1, 4, now[0] + 60 * S, 210))  # within the tolerance: taken


def test_a_32bit_counter_reset_from_3e9_is_not_a_wrap() -> None:
    a, store, now = api()
    a.register(pb.HostInfo(host="h1"))
    t = now[0]
    a.report(counter("h1", 1, 1, t, 2_900_000_000, 32))
    a.report(counter("h1", 1, 2, t + 10 * S, 3_000_000_000, 32))  # 10 M/s
    a.report(counter("h1", 1, 3, t + 20 * S, 5, 32))  # a wrap would be 1.29e9 in 10 s
    track = store.counters[KEY]
    assert (track.resets, track.wraps) == (1, 0)
    assert track.total == 100_000_000 + 5
    # a real wrap at the counter's pace is still a wrap
    a.report(counter("h1", 1, 4, t + 30 * S, 2**32 - 1000, 32))
    a.report(counter("h1", 1, 5, t + 40 * S, 5_000, 32))
    assert track.wraps == 1 and track.total == 100_000_005 + (2**32 - 1005) + 6_000


def test_registration_cannot_aim_the_fleet(tmp_path: Path) -> None:
    f = tmp_path / "tokens"
    f.write_text("".join(f"{h} {t}\n" for h, t in TOKENS.items()))
    server = CollectorServer(
        ServerConfig(listen="127.0.0.1:0", metrics_listen=""), TokenAuth(read_token_file(f))
    )
    server.start()
    try:
        c = CollectorClient(f"127.0.0.1:{server.port}", token=TOKENS["h1"], timeout=5)
        with pytest.raises(CallError) as e:  # its own token, someone else's address
            c.register(pb.HostInfo(host="h1", addresses=["10.99.99.99"]))
        assert e.value.code() == Status.PERMISSION_DENIED
        assert "10.99.99.99 is not this host's" in e.value.details()
        assert "h1" not in server.store.hosts
        assert c.register(pb.HostInfo(host="h1", addresses=["127.0.0.1"])).report_interval_ms
    finally:
        server.stop(0)


def test_the_planner_sends_probes_only_inside_the_fleet_networks() -> None:
    store = WindowStore()
    a = AgentApi(store, Planner(pace=0), ApiConfig(fleet_networks=("10.1.0.0/16",)))
    with pytest.raises(AddressRefused):  # from a known source, outside the networks
        a.register(pb.HostInfo(host="evil", addresses=["10.99.99.99"]), source="192.0.2.7")
    a.register(pb.HostInfo(host="h1", addresses=["10.1.0.1"], probe_kinds=["tcp_lat"]))
    a.register(pb.HostInfo(host="h2", addresses=["10.1.0.2"], probe_kinds=["tcp_lat"]))
    a.register(pb.HostInfo(host="h3", addresses=["10.99.99.99"], probe_kinds=["tcp_lat"]))
    targets = a.assignments("h1").targets
    assert {t.address for t in targets} == {"10.1.0.2"}
    assert a.targets_dropped == 1


def test_kv_pairs_watched_are_bounded_and_only_between_fleet_hosts() -> None:
    from fabricprobe.collector.attribution.core import Attribution
    from fabricprobe.collector.attribution.fabric import MAX_PAIRS
    from fabricprobe.collector.attribution.stages import StageRecord

    store = WindowStore()
    for i in range(200):
        store.register(pb.HostInfo(host=f"h{i}"))
    a = Attribution(store)
    now = time.time_ns()
    stages = [
        StageRecord("r", "kv_transfer", now - S, now, f"h{i}", f"h{j}", transport="rdma", bytes=1)
        for i in range(200)
        for j in range(i + 1, 200)
    ]  # 19,900 pairs
    stages.append(StageRecord("r", "kv_transfer", now - S, now, "nobody", "stranger", bytes=1))
    a.take(stages, [])
    assert len(a.fabric.history.pairs) == MAX_PAIRS
    assert a.counts().pairs_dropped == 19_900 - MAX_PAIRS
    assert all("stranger" not in p for p in a.fabric.history.pairs)


def test_dedup_sets_are_bounded() -> None:
    from fabricprobe.collector.hosttable import MAX_EPOCHS, MAX_RETIRED

    a, store, now = api()
    a.register(pb.HostInfo(host="h1"))
    for seq in range(2, 10_002, 2):  # every other seq: a gap that never fills
        a.report(pb.WindowReport(host="h1", epoch=1, seq=seq, window_end_unix_ns=now[0]))
    seqs = store.hosts["h1"].seen[1][1]
    assert len(seqs.above) <= seqs.MAX_ABOVE and seqs.floor > 0
    for epoch in range(2, 202):  # 200 more lifetimes
        a.report(pb.WindowReport(host="h1", epoch=epoch, seq=1, window_end_unix_ns=now[0]))
    h = store.hosts["h1"]
    assert len(h.seen) == MAX_EPOCHS and len(h.retired) == MAX_RETIRED
