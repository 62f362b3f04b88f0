"""Native histograms in a real Prometheus (Debian's 2.42, --enable-feature=native-histograms):
it scrapes a real collector fed windows of known RTTs, and an agent's own /metrics, over
the protobuf exposition. The RTT families arrive as native histograms (no `_bucket`
series), histogram_quantile() over them lands within the conversion's resolution of the
recorded latencies, and the recording rules (`native or classic`) return data.
The classic (text) scrape is tests/integration/test_prometheus.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabricprobe.agent.exporter import MetricsServer as AgentMetricsServer
from fabricprobe.collector.service import CollectorServer
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.sketchwire import from_wire, to_wire
from fabricprobe.core.stats import LatencySketch
from fabricprobe.grafana import build
from tests.support.agentview import agent_view
from tests.support.fleet import running_collector, wait_for
from tests.support.prom import Prom, running_prometheus

# A RoCE-like path: 2-5 µs, all inside one classic bucket (2e-6, 5e-6].
FABRIC_NS = [2_000 + 15 * i for i in range(200)]
# A TCP path: tens of µs.
TCP_NS = [30_000 + 97 * i for i in range(200)]
# the sketch's slot, then one native bucket at schema 6 (nativehist's module note)
RESOLUTION = 2.0 ** (1 / 64) * (1 + 1 / 128)


def window(src: str, dst: str, seq: int) -> pb.WindowReport:
    now = time.time_ns()
    report = pb.WindowReport(
        host=src, epoch=3, seq=seq, window_start_unix_ns=now - 10**9, window_end_unix_ns=now
    )
    for transport, op, values in (("rdma", "send", FABRIC_NS), ("tcp", "pingpong", TCP_NS)):
        sk = LatencySketch()
        for v in values:
            sk.record(v)
        report.probes.add(dst=dst, transport=transport, op=op, size=64, rtt=to_wire(sk))
    return report


def median_s(values: list[int]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2 - 1] / 1e9


@pytest.fixture
def collector() -> Iterator[CollectorServer]:
    with running_collector() as server:
        yield server


@pytest.fixture
def agent_metrics() -> Iterator[AgentMetricsServer]:
    view = agent_view()
    server = AgentMetricsServer(view, "127.0.0.1", 0)  # type: ignore[arg-type]
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def prometheus(
    collector: CollectorServer, agent_metrics: AgentMetricsServer, tmp_path: Path
) -> Iterator[Prom]:
    collectors, agents = (
        [f"127.0.0.1:{collector.metrics_port}"],
        [f"127.0.0.1:{agent_metrics.port}"],
    )
    with running_prometheus(tmp_path, collectors, agents, interval_s=1.0, native=True) as prom:
        yield prom
    log = (tmp_path / "prometheus.log").read_text().splitlines()
    errors = [ln for ln in log if "level=error" in ln]
    assert not errors, "\n".join(errors[:5])


def numbers(prom: Prom, expr: str) -> bool:
    """EXPR returns samples and none is NaN (a rate() needs two scrapes that moved)."""
    got = prom.query(expr)
    return bool(got) and not any(r["value"][1] == "NaN" for r in got)


def value(result: list[dict[str, object]]) -> float:
    assert len(result) == 1, result
    sample = result[0]["value"]
    assert isinstance(sample, list)
    return float(sample[1])


def test_native_histograms_are_ingested_and_resolve_a_few_microseconds(
    collector: CollectorServer, agent_metrics: AgentMetricsServer, prometheus: Prom
) -> None:
    for host in ("nat-a", "nat-b"):
        collector.api.register(pb.HostInfo(host=host, addresses=["127.0.0.9"], topology="tor-n"))
    stop = threading.Event()

    def feed() -> None:  # a window a second, as a live fleet sends them
        seq = 1
        while not stop.is_set() and seq < 200:
            w = window("nat-a", "nat-b", seq)
            collector.api.report(w)
            agent_metrics.take(w)
            seq += 1
            stop.wait(1.0)

    feeder = threading.Thread(target=feed, name="feed", daemon=True)
    feeder.start()
    try:
        fabric = 'transport="rdma"'
        q50 = f"histogram_quantile(0.5, rate(fabricprobe_rtt_seconds{{{fabric}}}[1m]))"
        wait_for(lambda: numbers(prometheus, q50), 60, "a quantile of the native RTT histogram")
        # native ingested: one series per path, no classic `_bucket` series at all
        assert not prometheus.query("fabricprobe_rtt_seconds_bucket")
        assert len(prometheus.query("fabricprobe_rtt_seconds")) == 2

        for sel, values in ((fabric, FABRIC_NS), ('transport="tcp"', TCP_NS)):
            for q in (0.5, 0.99):
                got = value(
                    prometheus.query(
                        f"histogram_quantile({q}, rate(fabricprobe_rtt_seconds{{{sel}}}[1m]))"
                    )
                )
                ordered = sorted(values)
                want = ordered[max(0, int(q * len(ordered) + 0.5) - 1)] / 1e9
                print(
                    f"{sel} p{q * 100:g}: native {got * 1e6:.3f} µs, recorded {want * 1e6:.3f} µs"
                )
                assert want / RESOLUTION <= got <= want * RESOLUTION, (sel, q, got, want)
        # the sketch's own median, for the record: the same figure the classic form blurs
        sk = from_wire(window("x", "y", 1).probes[0].rtt)
        assert sk.percentile_ns(50.0) == pytest.approx(median_s(FABRIC_NS) * 1e9, rel=0.01)

        # the agent's own /metrics: its native histogram too
        agent_q = (
            'histogram_quantile(0.5, rate(fabricprobe_agent_rtt_seconds{transport="rdma"}[1m]))'
        )
        wait_for(lambda: numbers(prometheus, agent_q), 30, "the agent's native RTT histogram")
        got = value(prometheus.query(agent_q))
        assert median_s(FABRIC_NS) / RESOLUTION <= got <= median_s(FABRIC_NS) * RESOLUTION

        # the recording rules read the native half of `native or classic`
        for r in build.RECORDING:
            wait_for(lambda r=r: numbers(prometheus, r["record"]), 30, f"rule {r['record']}")
        p50 = prometheus.query(f"fabricprobe:rtt_seconds:p50{{{fabric}}}")
        assert median_s(FABRIC_NS) / RESOLUTION <= value(p50) <= median_s(FABRIC_NS) * RESOLUTION
        groups = prometheus.get("/api/v1/rules")["groups"]
        bad = [
            (r["name"], r.get("lastError"))
            for g in groups
            for r in g["rules"]
            if r["health"] != "ok"
        ]
        assert not bad, bad
        # the fabric dashboard's RTT panels return data from the native form
        for d in build.DASHBOARDS:
            for row in d.rows:
                for p in row.panels:
                    for expr, _ in p.exprs:
                        if "rtt_seconds" in expr:
                            e = expr.replace('=~"$src"', '=~".*"').replace('=~"$dst"', '=~".*"')
                            e = e.replace('=~"$transport"', '=~".*"')
                            assert prometheus.query(e), f"{p.title}: {expr}"
    finally:
        stop.set()
        feeder.join(timeout=5)
