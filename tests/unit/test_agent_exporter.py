"""The agent's own /metrics: this host's counters under the kernel's names, its probes'
newest figures and its health, over HTTP from a running agent; promtool-clean; within
the per-host series budget at the default plan."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
import tomllib
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from fabricprobe.agent.agent import Agent
from fabricprobe.agent.config import AgentConfig
from fabricprobe.agent.counters import CounterSampler, netdevs_of
from fabricprobe.agent.exporter import AgentCollector, metrics_route
from fabricprobe.agent.identity import discover_devices
from fabricprobe.collector.service import ApiConfig, CollectorServer, ServerConfig
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.promproto import CONTENT_TYPE_PROTOBUF, decode
from fabricprobe.core.sketchwire import to_wire
from fabricprobe.core.stats import LatencySketch
from fabricprobe.core.web import Call
from fabricprobe.probes.ethtool import CommandResult
from tests.support.agentview import agent_view

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
BUDGET = 300  # series per agent endpoint at the default plan


def ethtool(argv: Sequence[str], timeout: float) -> CommandResult:
    return CommandResult(0, (FIXTURES / "ethtool" / "mlx5_core.txt").read_text())


def get(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return resp.read().decode()


def test_a_running_agent_serves_its_host_figures(tmp_path: Path) -> None:
    collector = CollectorServer(
        ServerConfig(
            listen="127.0.0.1:0", metrics_listen="", api=ApiConfig(trust_local_registration=True)
        )
    )
    collector.start()
    cfg = AgentConfig(
        host="gpu-1",
        collector=f"127.0.0.1:{collector.port}",
        probe_listen="127.0.0.2:0",
        metrics_listen="127.0.0.1:0",
        spool_dir=str(tmp_path / "spool"),
        sysfs_root=str(FIXTURES / "sys" / "mlx5"),
        insecure=True,
        window_s=0.5,
    )
    agent = Agent(cfg, ethtool_runner=ethtool)
    agent.start()
    try:
        assert agent.metrics is not None
        deadline = time.monotonic() + 20
        while not agent.sender.acked and time.monotonic() < deadline:
            time.sleep(0.1)
        text = get(agent.metrics.port)
    finally:
        agent.close()
        collector.stop(0)
    assert 'fabricprobe_rdma_port_xmit_data_total{device="mlx5_0",port="1"}' in text
    assert 'fabricprobe_pfc_rx_pause_frames_total{netdev="' in text
    assert "fabricprobe_agent_registered 1.0" in text
    assert 'fabricprobe_agent_http_refused_total{reason="header_timeout"} 0.0' in text
    assert "fabricprobe_agent_resident_memory_bytes" in text
    for part in AgentCollector.PARTS:
        assert f'fabricprobe_agent_scrape_part_success{{part="{part}"}} 1.0' in text
    assert "lifespan" not in text
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: scripts/setup.sh installs it"
    res = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stdout + res.stderr


def fleet_report(peers: int = 16) -> pb.WindowReport:
    report = pb.WindowReport(host="gpu-1", agent=pb.AgentStats(rss_bytes=1, cpu_seconds=1))
    sk = LatencySketch()
    for v in range(3_000, 9_000, 7):
        sk.record(v)
    for i in range(peers):
        for transport, op in (("tcp", "pingpong"), ("rdma", "send"), ("rdma", "ud")):
            report.probes.add(dst=f"peer-{i}", transport=transport, op=op, size=64, rtt=to_wire(sk))
    return report


def test_series_stay_within_the_per_host_budget() -> None:
    devices = discover_devices(str(FIXTURES / "sys" / "mlx5"))
    readings = CounterSampler(
        str(FIXTURES / "sys" / "mlx5"), devices, netdevs_of(devices), ethtool
    ).sample()
    view = agent_view(
        last_report=fleet_report(16),
        latest_counters=readings,
        acked=3,
        last_ack_unix_s=1.0,
    )
    reg = CollectorRegistry()
    reg.register(AgentCollector(view))  # type: ignore[arg-type]
    text = generate_latest(reg).decode()
    series = [line for line in text.splitlines() if line and not line.startswith("#")]
    print(f"agent /metrics at 16 peers x 3 kinds on an mlx5 port: {len(series)} series")
    assert len(series) <= BUDGET, len(series)
    assert sum("agent_path_rtt_seconds{" in s for s in series) == 16 * 3 * 2
    # a protobuf scrape: one native histogram series per path in place of the gauges
    reply = metrics_route(reg).handler(
        Call("GET", "/metrics", {}, {"Accept": CONTENT_TYPE_PROTOBUF}, b"", None)
    )
    assert reply.status == 200 and reply.content_type == CONTENT_TYPE_PROTOBUF
    body = reply.body
    fams = {f.name: len(f.metric) for f in decode(body)}
    print(f"the same in protobuf: {sum(fams.values())} series")
    assert sum(fams.values()) <= BUDGET, sum(fams.values())
    assert fams["fabricprobe_agent_rtt_seconds"] == 16 * 3
    assert "fabricprobe_agent_path_rtt_seconds" not in fams
    # every family is in the catalogue (kernel-named families by their pattern)
    rows = tomllib.loads((ROOT / "collector" / "metrics.toml").read_text())["agent_metric"]
    patterns = [
        re.compile("^" + r["name"].replace("{counter}", "[a-zA-Z0-9_]+") + "$") for r in rows
    ]
    for fam in reg.collect():
        name = fam.name + ("_total" if fam.type == "counter" else "")
        assert any(p.match(name) for p in patterns), f"{name} is not in the agent catalogue"


def test_a_bad_part_never_fails_the_scrape() -> None:
    view = agent_view(
        last_report=fleet_report(1),
        latest_counters=[object()],  # not a reading: the counters part fails
        registered=False,
        tools_missing={"ethtool"},
    )
    reg = CollectorRegistry()
    reg.register(AgentCollector(view))  # type: ignore[arg-type]
    text = generate_latest(reg).decode()
    assert 'fabricprobe_agent_scrape_part_success{part="counters"} 0.0' in text
    assert 'fabricprobe_agent_scrape_part_success{part="probes"} 1.0' in text
    assert "fabricprobe_agent_path_rtt_seconds" in text


@pytest.mark.parametrize("name", ["bad name", "x" * 300, "1abc"])
def test_counter_names_that_cannot_be_metric_names_are_skipped(name: str) -> None:
    view = agent_view(
        latest_counters=[pb.CounterReading(kind="rdma", device="d", port=1, name=name, value=1)],
        registered=False,
        tools_missing={"ethtool"},
    )
    reg = CollectorRegistry()
    reg.register(AgentCollector(view))  # type: ignore[arg-type]
    assert "fabricprobe_rdma_" not in generate_latest(reg).decode()


def test_a_missing_ethtool_is_loud_and_heals(caplog: pytest.LogCaptureFixture) -> None:
    devices = discover_devices(str(FIXTURES / "sys" / "mlx5"))
    installed = [False]

    def runner(argv: Sequence[str], timeout: float) -> CommandResult:
        if not installed[0]:
            raise FileNotFoundError(2, "No such file or directory", "ethtool")
        return ethtool(argv, timeout)

    sampler = CounterSampler(str(FIXTURES / "sys" / "mlx5"), devices, netdevs_of(devices), runner)
    with caplog.at_level("ERROR", logger="fabricprobe.agent"):
        first = sampler.sample()
        sampler.sample()
    assert sampler.tools_missing == {"ethtool"}
    assert not [r for r in first if r.kind in ("pfc", "netdev")]
    loud = [r for r in caplog.records if "ethtool is not installed" in r.getMessage()]
    assert len(loud) == 1 and "pause-storm alert cannot fire" in loud[0].getMessage()
    view = agent_view(
        latest_counters=first,
        tools_missing=sampler.tools_missing,
    )
    reg = CollectorRegistry()
    reg.register(AgentCollector(view))  # type: ignore[arg-type]
    assert 'fabricprobe_agent_tool_missing{tool="ethtool"} 1.0' in generate_latest(reg).decode()
    installed[0] = True
    healed = sampler.sample()
    assert sampler.tools_missing == set() and [r for r in healed if r.kind == "pfc"]


def test_spool_faults_and_thread_failures_on_the_agents_metrics() -> None:
    report = fleet_report(1)
    report.agent.spool_write_failures = 4
    report.agent.spool_quarantined = 2
    report.agent.spool_memory_windows = 3
    report.agent.thread_failures = 1
    view = agent_view(
        last_report=report,
    )
    reg = CollectorRegistry()
    reg.register(AgentCollector(view))  # type: ignore[arg-type]
    assert reg.get_sample_value("fabricprobe_agent_spool_write_failures_total") == 4
    assert reg.get_sample_value("fabricprobe_agent_spool_quarantined_total") == 2
    assert reg.get_sample_value("fabricprobe_agent_spool_memory_windows") == 3
    assert reg.get_sample_value("fabricprobe_agent_thread_failures_total") == 1


def test_probe_pace_pressure_and_refusals_by_reason_on_the_agents_metrics() -> None:
    report = fleet_report(1)
    report.agent.probes = 12
    report.agent.probe_rate = 0.3
    report.agent.spool_bytes = 900
    report.agent.cpu_pressure = 0.25
    report.agent.sessions_refused_by_reason["source"] = 2
    report.agent.sessions_refused_by_reason["x" * 300] = 9  # not a reason: no new label
    view = agent_view(
        last_report=report,
    )
    reg = CollectorRegistry()
    reg.register(AgentCollector(view))  # type: ignore[arg-type]
    assert reg.get_sample_value("fabricprobe_agent_probes_total") == 12
    assert reg.get_sample_value("fabricprobe_agent_probe_rate") == pytest.approx(0.3)
    assert reg.get_sample_value("fabricprobe_agent_spool_bytes") == 900
    assert reg.get_sample_value("fabricprobe_host_cpu_pressure_ratio") == 0.25
    by = "fabricprobe_agent_probe_sessions_refused_by_reason_total"
    assert reg.get_sample_value(by, {"reason": "source"}) == 2
    assert reg.get_sample_value(by, {"reason": "busy"}) == 0
    assert reg.get_sample_value(by, {"reason": "x" * 300}) is None
    report.agent.cpu_pressure = -1.0  # the kernel has no PSI: absent, not zero
    assert reg.get_sample_value("fabricprobe_host_cpu_pressure_ratio") is None
