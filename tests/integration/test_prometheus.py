"""The dashboards and rules against a real Prometheus (Debian's 2.42): it scrapes a real
collector fed by loopback agents (one reading a captured mlx5 sysfs tree and `ethtool -S`
text whose pause counters rise), RDMA probe windows from a fixture host pair, scheduled
check verdicts of a fixture ToR whose one host differs, and stage spans from the
OpenTelemetry SDK. Every panel query, every template variable and every recording rule
must return data, and every rule must evaluate without error: on a server that scrapes
the text form (classic RTT buckets) and on one that scrapes protobuf (native RTT
histograms, --enable-feature=native-histograms).
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from fabricprobe.agent.agent import Agent
from fabricprobe.agent.config import AgentConfig
from fabricprobe.collector.service import CollectorServer
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.sketchwire import to_wire
from fabricprobe.grafana import build
from fabricprobe.probes.ethtool import CommandResult
from fabricprobe.probes.stats import LatencySketch
from tests.support.fleet import (
    FIXTURES,
    HOSTS,
    ROOT,
    free_port,
    loopback_agent_config,
    running_collector,
    scrape,
    wait_for,
)

# each agent's own /metrics, on its own loopback address (free ports, found at import)
# Alerts whose expression is empty on a healthy fleet by design.
QUIET = {"FabricprobeCollectorDown"}


AGENT_METRICS = {h: free_port(h) for h in HOSTS}


class Prom:
    """Prometheus' HTTP API on loopback."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.base}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            doc = json.loads(resp.read())
        assert doc["status"] == "success", doc
        return doc["data"]

    def query(self, expr: str) -> list[Any]:
        return list(self.get("/api/v1/query", query=expr)["result"])


def with_variables(expr: str) -> str:
    return re.sub(r'=~"\$\w+"', '=~".*"', expr)


def agent_config(tmp: Path, address: str, collector_port: int) -> AgentConfig:
    return loopback_agent_config(
        tmp, address, collector_port, metrics_listen=f"{address}:{AGENT_METRICS[address]}"
    )


def rising_ethtool() -> Any:
    """`ethtool -S` text of a real mlx5 port whose PFC pause counters rise on every read."""
    text = (FIXTURES / "ethtool" / "mlx5_core.txt").read_text()
    reads = [0]

    def run(argv: Sequence[str], timeout: float) -> CommandResult:
        reads[0] += 1
        bumped = re.sub(
            r"^(\s*(?:rx|tx)_prio3_pause(?:_duration)?: )(\d+)$",
            lambda m: f"{m.group(1)}{int(m.group(2)) + reads[0] * 200_000}",
            text,
            flags=re.M,
        )
        return CommandResult(0, bumped)

    return run


def fixture_rdma_windows(server: CollectorServer, seq: int) -> None:
    """Windows of a fixture host pair that probes over RDMA (RC SEND, UD, WRITE bandwidth)
    and TCP: the figures loopback cannot measure, sent through the collector's API."""
    now = time.time_ns()
    for src, dst in (("rdma-a", "rdma-b"), ("rdma-b", "rdma-a")):
        report = pb.WindowReport(
            host=src, epoch=7, seq=seq, window_start_unix_ns=now - 10**9, window_end_unix_ns=now
        )
        for transport, op, base in (("rdma", "send", 4_000), ("tcp", "pingpong", 30_000)):
            sk = LatencySketch()
            for i in range(200):
                sk.record(base + 13 * i)
            report.probes.add(dst=dst, transport=transport, op=op, size=64, rtt=to_wire(sk))
        report.probes.add(
            dst=dst,
            transport="rdma",
            op="write",
            size=65536,
            bytes_moved=5 * 2**30 * seq,
            busy_seconds=0.5 * seq,
        )
        server.api.report(report)


def fixture_checks(server: CollectorServer) -> None:
    """Scheduled `probe validate` verdicts of four fixture hosts on one ToR, one with
    MTU 1500 among 9000 (a FAIL, and a difference from its ToR), through the API."""
    for i in range(4):
        host = f"cfg-{i}"
        server.api.register(pb.HostInfo(host=host, addresses=["127.0.0.9"], topology="tor-c"))
        mtu = "1500/1024" if i == 3 else "9000/4096"
        report = pb.CheckReport(host=host, taken_unix_ns=time.time_ns(), policy="p")
        report.checks.add(check="pfc", device="mlx5_0", port=1, status="PASS", value="3")
        report.checks.add(
            check="mtu", device="mlx5_0", port=1, status="FAIL" if i == 3 else "PASS", value=mtu
        )
        server.drift.take(report)


def send_spans(endpoint: str, src: str, dst: str, n: int, batch: int = 0) -> None:
    """Requests as our workload sends them: a vLLM-style request span and stage children,
    the KV transfer naming its path; request ids carry BATCH."""
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "prom-test"}))
    provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True, timeout=10))
    )
    tracer = provider.get_tracer("test")
    first = time.time_ns() - 8 * 10**9  # spread over several probe windows
    for i in range(n):
        t = first + i * (8 * 10**9 // n)
        stages = {
            "queue": 1_000_000,
            "prefill": 20_000_000,
            "kv_transfer": 3_000_000 + i * 50_000,
            "decode": 40_000_000,
            "detokenize": 500_000,
            "deliver": 200_000,
        }
        ttft = sum(list(stages.values())[:3])
        rid = f"req-{batch}-{i}"
        root = tracer.start_span(
            "llm_request",
            start_time=t,
            attributes={
                "gen_ai.request.id": rid,
                "gen_ai.usage.prompt_tokens": 128,
                "gen_ai.usage.completion_tokens": 16,
                "gen_ai.latency.time_to_first_token": ttft / 1e9,
                "gen_ai.latency.e2e": sum(stages.values()) / 1e9,
            },
        )
        ctx = trace.set_span_in_context(root)
        for stage, dur in stages.items():
            attrs: dict[str, Any] = {"gen_ai.request.id": rid}
            if stage == "kv_transfer":
                attrs |= {
                    "fabricprobe.src.host": src,
                    "fabricprobe.dst.host": dst,
                    "fabricprobe.transport": "tcp",
                    "fabricprobe.bytes": 8 << 20,
                }
            span = tracer.start_span(stage, context=ctx, start_time=t, attributes=attrs)
            t += dur
            span.end(end_time=t)
        root.end(end_time=t)
    provider.force_flush(10_000)
    provider.shutdown()


@pytest.fixture
def collector() -> Iterator[CollectorServer]:
    with running_collector() as server:
        yield server


# "classic": a server that scrapes text (RTT as `le` buckets); "native": one started with
# --enable-feature=native-histograms, which scrapes protobuf (RTT as native histograms).
@pytest.fixture(params=["classic", "native"])
def prometheus(
    collector: CollectorServer, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Prom]:
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 3s, evaluation_interval: 1s, scrape_timeout: 3s}\n"
        f"rule_files: [{ROOT / 'grafana' / 'rules.yml'}]\n"
        "scrape_configs:\n"
        "  - job_name: fabricprobe-collector\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{collector.metrics_port}']}}]\n"
        "  - job_name: fabricprobe-agent\n"
        f"    static_configs: [{{targets: {[f'{h}:{p}' for h, p in AGENT_METRICS.items()]}}}]\n"
    )
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1h",
            *(["--enable-feature=native-histograms"] if request.param == "native" else []),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    prom = Prom(port)
    try:
        wait_for(lambda: prom.get("/api/v1/status/buildinfo"), 60, "Prometheus to start")
        yield prom
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_every_dashboard_query_and_rule_returns_data(
    collector: CollectorServer, prometheus: Prom, tmp_path: Path
) -> None:
    configs = [agent_config(tmp_path, a, collector.port) for a in HOSTS]
    configs[0].sysfs_root, configs[0].ethtool = str(FIXTURES / "sys" / "mlx5"), True
    agents = [Agent(configs[0], ethtool_runner=rising_ethtool())]
    agents += [Agent(c) for c in configs[1:]]
    for host in ("rdma-a", "rdma-b"):
        collector.api.register(pb.HostInfo(host=host, addresses=["127.0.0.9"], topology="tor-b"))
    for a in agents:
        a.start()
    stop = threading.Event()
    try:
        fixture_rdma_windows(collector, 1)
        fixture_checks(collector)
        names = [c.host for c in configs]
        wait_for(
            # classic: the _count series; native: the histogram series itself
            lambda: (
                len(prometheus.query("fabricprobe_rtt_seconds_count or fabricprobe_rtt_seconds"))
                >= 6
            ),
            60,
            "every loopback pair's RTT histogram in Prometheus",
        )
        time.sleep(8.0)  # probe windows under the whole span of the requests below

        # A live fleet from here on: requests keep coming and the RDMA pair keeps reporting
        # (request figures cover the analysis window only: a single batch ages out of it).
        def feed() -> None:
            seq = 2
            while not stop.is_set():
                send_spans(f"127.0.0.1:{collector.port}", names[0], names[1], 20, batch=seq)
                fixture_rdma_windows(collector, seq)
                seq += 1
                stop.wait(2.0)

        feeder = threading.Thread(target=feed, name="feed", daemon=True)
        feeder.start()
        time.sleep(8.0)  # counters and bandwidth need two windows; a few scrapes and rules

        def missing() -> list[str]:
            out = []
            for d in build.DASHBOARDS:
                for row in d.rows:
                    for p in row.panels:
                        for expr, _ in p.exprs:
                            if not prometheus.query(with_variables(expr)):
                                out.append(f"{d.uid} / {p.title}: {expr}")
                for name, query in d.variables:
                    metric, label = re.fullmatch(r"label_values\((\w+), (\w+)\)", query).groups()
                    got = prometheus.get(f"/api/v1/label/{label}/values", **{"match[]": metric})
                    if not got:
                        out.append(f"{d.uid} / variable {name}: {query}")
            for r in build.RECORDING:
                if not prometheus.query(r["record"]):
                    out.append(f"recording rule {r['record']}")
            return out

        first = missing()
        try:
            wait_for(lambda: not missing(), 150, "every query to return data")
        except AssertionError:
            targets = [
                (t["scrapeUrl"], t["health"], t["lastError"])
                for t in prometheus.get("/api/v1/targets")["activeTargets"]
            ]
            own = [
                line
                for line in scrape(collector).splitlines()
                if "attribution" in line or "otlp" in line or "dropped" in line
            ]
            raise AssertionError(
                "queries without data at the first look:\n"
                + "\n".join(first)
                + "\nand at the last:\n"
                + "\n".join(missing())
                + f"\ntargets: {targets}\n"
                + "\n".join(own)
            ) from None

        # every target scraped cleanly in this server's form (text or protobuf)
        down = [
            (t["scrapeUrl"], t["lastError"])
            for t in prometheus.get("/api/v1/targets")["activeTargets"]
            if t["health"] != "up"
        ]
        assert not down, down
        groups = prometheus.get("/api/v1/rules")["groups"]
        rules = [r for g in groups for r in g["rules"]]
        assert len(rules) == len(build.RECORDING) + len(build.ALERTS)
        bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
        assert not bad, bad
        for a in build.ALERTS:  # each metric an alert watches is there to watch
            if a["alert"] in QUIET:
                continue
            for metric in set(re.findall(r"\b(fabricprobe[a-z0-9_:]*)", a["expr"])):
                assert prometheus.query(metric), f"{a['alert']}: no {metric} in Prometheus"
        firing = {x["labels"]["alertname"] for x in prometheus.get("/api/v1/alerts")["alerts"]}
        assert "FabricprobeCollectorDown" not in firing and "FabricprobeHostDown" not in firing
    finally:
        stop.set()
        for a in agents:
            a.close()  # its /metrics port too: the next server kind's run takes the same ports
