"""The dashboards and rules against a real Prometheus (Debian's 2.42): it scrapes a real
collector fed by loopback agents (one reading a captured mlx5 sysfs tree and `ethtool -S`
text whose pause counters rise), RDMA probe windows from a fixture host pair, scheduled
check verdicts of a fixture ToR whose one host differs, traced ECMP classes and class
and rail windows of a fixture leaf-spine (tests/support/fabricfeed.py), and stage spans
from the OpenTelemetry SDK. Every panel query, every template variable and every recording rule
must return data, and every rule must evaluate without error: on a server that scrapes
the text form (classic RTT buckets) and on one that scrapes protobuf (native RTT
histograms, --enable-feature=native-histograms).
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabricprobe.agent.agent import Agent
from fabricprobe.agent.config import AgentConfig
from fabricprobe.collector.fabric.localize import LocalizeConfig
from fabricprobe.collector.fabric.service import FabricConfig
from fabricprobe.collector.service import CollectorServer
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.grafana import build
from tests.support.fabricfeed import fabric_feed, fabric_file
from tests.support.feeds import fixture_checks, fixture_rdma_windows, live_feed, rising_ethtool
from tests.support.fleet import (
    FIXTURES,
    HOSTS,
    fast_server_config,
    free_port,
    loopback_agent_config,
    running_collector,
    scrape,
    wait_for,
)
from tests.support.prom import Prom, missing_queries, running_prometheus

# each agent's own /metrics, on its own loopback address (free ports, found at import)
# Alerts whose expression is empty on a healthy fleet by design.
QUIET = {"FabricprobeCollectorDown"}


AGENT_METRICS = {h: free_port(h) for h in HOSTS}


def agent_config(tmp: Path, address: str, collector_port: int) -> AgentConfig:
    return loopback_agent_config(
        tmp, address, collector_port, metrics_listen=f"{address}:{AGENT_METRICS[address]}"
    )


@pytest.fixture
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CollectorServer]:
    # a fabric file: the Links and rails row reads a leaf-spine the loopback has not got
    fabric = FabricConfig(
        str(fabric_file(tmp_path_factory.mktemp("fabric"))), LocalizeConfig(fresh_s=10.0)
    )
    with running_collector(dataclasses.replace(fast_server_config(), fabric=fabric)) as server:
        yield server


# "classic": a server that scrapes text (RTT as `le` buckets); "native": one started with
# --enable-feature=native-histograms, which scrapes protobuf (RTT as native histograms).
@pytest.fixture(params=["classic", "native"])
def prometheus(
    collector: CollectorServer, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Prom]:
    agents = [f"{h}:{p}" for h, p in AGENT_METRICS.items()]
    native = request.param == "native"
    with running_prometheus(
        tmp_path, [f"127.0.0.1:{collector.metrics_port}"], agents, native=native
    ) as prom:
        yield prom


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
        endpoint = f"127.0.0.1:{collector.port}"
        live_feed(stop, lambda: endpoint, collector, names[0], names[1], seq=2)
        fabric_feed(stop, collector)  # traced classes, class and rail windows
        time.sleep(8.0)  # counters and bandwidth need two windows; a few scrapes and rules

        def missing() -> list[str]:
            return missing_queries(prometheus)

        first = missing()
        try:
            wait_for(lambda: not missing(), 150, "every query to return data")
        except AssertionError:
            targets = prometheus.targets()
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
        alerts = prometheus.get("/api/v1/alerts")["alerts"]
        firing = {x["labels"]["alertname"] for x in alerts}
        assert "FabricprobeCollectorDown" not in firing
        # the fixture hosts that only register (cfg-*: check verdicts, no windows) may be
        # called down once the test has run for the alert's 2 minutes; the agents never
        down = {
            x["labels"].get("src")
            for x in alerts
            if x["labels"]["alertname"] == "FabricprobeHostDown"
        }
        assert not down & set(names), f"agents called down: {sorted(down & set(names))}"
    finally:
        stop.set()
        for a in agents:
            a.close()  # its /metrics port too: the next server kind's run takes the same ports
