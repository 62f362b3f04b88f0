"""The dashboards and rules against a real VictoriaMetrics (Debian's 1.79), in both setups
docs/victoriametrics.md gives: VictoriaMetrics scraping a sharded collector (two shards on
a real etcd) and its loopback agents itself, with vmalert evaluating the rules; and a
real Prometheus scraping them and sending everything on with remote_write. Every panel
query, template variable and recording rule must return data from VictoriaMetrics, and
every rule must evaluate without error.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from fabricprobe.agent.agent import Agent
from fabricprobe.collector.service import CollectorServer
from fabricprobe.collector.shard import ShardConfig
from fabricprobe.core.shards import owner_of
from fabricprobe.grafana import build
from tests.support.etcd import running_etcd
from tests.support.feeds import fixture_checks, live_feed, rising_ethtool
from tests.support.fleet import (
    FIXTURES,
    HOSTS,
    fast_server_config,
    free_port,
    loopback_agent_config,
    wait_for,
)
from tests.support.prom import FABRIC_ROWS, Prom, missing_queries, running_prometheus
from tests.support.victoria import (
    doc_block,
    running_victoria,
    running_vmalert,
    with_targets,
)

AGENT_METRICS = {h: free_port(h) for h in HOSTS}
SCRAPE_S = 2.0
QUIET = {"FabricprobeCollectorDown"}  # empty on a healthy fleet by design


class Fleet:
    """Two collector shards on etcd and one agent per loopback address, each agent
    reporting to the shard that owns its host."""

    def __init__(self, stack: ExitStack, tmp: Path) -> None:
        etcd = stack.enter_context(running_etcd(tmp))
        self.shards = [
            CollectorServer(
                fast_server_config(
                    shard=ShardConfig(
                        etcd=(("127.0.0.1", etcd),), name=f"shard-{i}", ttl_s=3, refresh_s=0.25
                    )
                )
            )
            for i in range(2)
        ]
        for s in self.shards:
            s.start()
            stack.callback(s.stop, 0)
        wait_for(lambda: len(self.members()) == 2, 30, "two shards in etcd")
        configs = [
            loopback_agent_config(
                tmp,
                a,
                0,
                metrics_listen=f"{a}:{AGENT_METRICS[a]}",
                etcd=f"127.0.0.1:{etcd}",
                etcd_refresh_s=0.25,
                collector="127.0.0.1:1",  # never used: etcd names the shard
            )
            for a in HOSTS
        ]
        configs[0].sysfs_root, configs[0].ethtool = str(FIXTURES / "sys" / "mlx5"), True
        self.names = [c.host for c in configs]
        self.agents = [Agent(configs[0], ethtool_runner=rising_ethtool())]
        self.agents += [Agent(c) for c in configs[1:]]

    def members(self) -> list[object]:
        view = self.shards[0].shard
        assert view is not None
        view.sync()
        return list(view.current_members())

    def owner(self, host: str) -> CollectorServer:
        view = self.shards[0].shard
        assert view is not None
        m = owner_of(host, view.current_members())
        assert m is not None
        return next(s for s in self.shards if s.shard is not None and s.shard.member.name == m.name)

    @property
    def collector_targets(self) -> list[str]:
        return [f"127.0.0.1:{s.metrics_port}" for s in self.shards]

    @property
    def agent_targets(self) -> list[str]:
        return [f"{h}:{p}" for h, p in AGENT_METRICS.items()]

    def run(self, stack: ExitStack) -> None:
        """Start the agents and a live feed of spans, RDMA windows and check verdicts."""
        for a in self.agents:
            a.start()
        stack.callback(lambda: [a.close(flush_timeout=0.0) for a in self.agents])
        fixture_checks(self.shards[0])
        stop = threading.Event()
        stack.callback(stop.set)
        spans_to = self.owner(self.names[0])  # any shard relays; the owner joins at once
        live_feed(
            stop, lambda: f"127.0.0.1:{spans_to.port}", self.owner, self.names[0], self.names[1]
        )


def every_query_answers(store: Prom) -> None:
    """Wait until every dashboard query, variable and recording rule has data in STORE."""
    first = missing_queries(store, FABRIC_ROWS)
    try:
        wait_for(lambda: not missing_queries(store, FABRIC_ROWS), 150, "every query to return data")
    except AssertionError:
        raise AssertionError(
            "queries without data at the first look:\n"
            + "\n".join(first)
            + "\nand at the last:\n"
            + "\n".join(missing_queries(store, FABRIC_ROWS))
        ) from None


def alerts_watch_what_is_there(store: Prom) -> None:
    for a in build.ALERTS:
        if a["alert"] in QUIET:
            continue
        for metric in set(re.findall(r"\b(fabricprobe[a-z0-9_:]*)", a["expr"])):
            assert store.query(metric), f"{a['alert']}: no {metric} in VictoriaMetrics"


def rules_healthy(rules: Callable[[], list[dict[str, object]]]) -> None:
    got = rules()
    assert len(got) == len(build.RECORDING) + len(build.ALERTS)
    bad = [(r["name"], r.get("lastError")) for r in got if r["health"] != "ok"]
    assert not bad, bad


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as s:
        yield s


def test_victoriametrics_scraping_the_fleet_answers_every_query(
    stack: ExitStack, tmp_path: Path
) -> None:
    fleet = Fleet(stack, tmp_path)
    scrape = with_targets(
        doc_block("vm-scrape"), fleet.collector_targets, fleet.agent_targets, SCRAPE_S
    )
    vm = stack.enter_context(running_victoria(tmp_path, scrape))
    vmalert = stack.enter_context(running_vmalert(tmp_path, vm))
    fleet.run(stack)
    every_query_answers(vm)
    targets = vm.get("/api/v1/targets")["activeTargets"]
    down = [(t["scrapeUrl"], t["lastError"]) for t in targets if t["health"] != "up"]
    assert len(targets) == len(fleet.collector_targets) + len(fleet.agent_targets)
    assert not down, down
    rules_healthy(vmalert.rules)
    alerts_watch_what_is_there(vm)
    # the RTT histograms reach it as classic buckets (1.79 has no native histograms)
    assert vm.query('fabricprobe_rtt_seconds_bucket{le="+Inf"}')


def test_prometheus_remote_writing_into_victoriametrics_answers_every_query(
    stack: ExitStack, tmp_path: Path
) -> None:
    fleet = Fleet(stack, tmp_path)
    vm = stack.enter_context(running_victoria(tmp_path))
    (entry,) = doc_block("vm-remote-write")["remote_write"]
    entry["url"] = f"{vm.base}/api/v1/write"
    prom = stack.enter_context(
        running_prometheus(
            tmp_path,
            fleet.collector_targets,
            fleet.agent_targets,
            interval_s=SCRAPE_S,
            remote_write=entry,
        )
    )
    fleet.run(stack)
    every_query_answers(vm)  # the recorded series too: Prometheus' rules, sent on
    groups = prom.get("/api/v1/rules")["groups"]
    rules_healthy(lambda: [r for g in groups for r in g["rules"]])
    alerts_watch_what_is_there(vm)
    assert vm.query('fabricprobe_rtt_seconds_bucket{le="+Inf"}')
