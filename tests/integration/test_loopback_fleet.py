"""Several agents on loopback (127.0.0.x) probing each other over TCP, end to end into
/metrics through a real gRPC collector; and a collector restart under a running agent."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from fabricprobe.agent.agent import Agent
from fabricprobe.agent.config import AgentConfig
from fabricprobe.collector.service import CollectorServer, ServerConfig
from fabricprobe.probes.ethtool import CommandResult
from tests.support.fleet import (
    FIXTURES,
    HOSTS,
    fast_server_config,
    free_port,
    loopback_agent_config,
    scrape,
    wait_for,
)


def server_config(port: int = 0) -> ServerConfig:
    return fast_server_config(port)


def agent_config(tmp: Path, address: str, collector_port: int) -> AgentConfig:
    return loopback_agent_config(tmp, address, collector_port)


@pytest.fixture
def collector() -> Iterator[CollectorServer]:
    server = CollectorServer(server_config())
    server.start()
    yield server
    server.stop(0)


def test_fleet_end_to_end_into_metrics(collector: CollectorServer, tmp_path: Path) -> None:
    # the first host reads counters from a captured mlx5 sysfs tree and `ethtool -S` text
    configs = [agent_config(tmp_path, a, collector.port) for a in HOSTS]
    configs[0].sysfs_root, configs[0].ethtool = str(FIXTURES / "sys" / "mlx5"), True
    ethtool_text = (FIXTURES / "ethtool" / "mlx5_core.txt").read_text()

    def ethtool(argv: Sequence[str], timeout: float) -> CommandResult:
        return CommandResult(0, ethtool_text)

    agents = [Agent(configs[0], ethtool_runner=ethtool)] + [Agent(c) for c in configs[1:]]
    for a in agents:
        a.start()
    try:
        names = [a.cfg.host for a in agents]
        pairs = [(s, d) for s in names for d in names if s != d]

        def all_pairs_seen() -> bool:
            text = scrape(collector)
            return all(
                f'fabricprobe_rtt_seconds_count{{dst="{d}",op="pingpong",size="64",src="{s}",'
                f'transport="tcp"}}' in text
                for s, d in pairs
            )

        wait_for(all_pairs_seen, what="every pair's RTT histogram in /metrics")
        # and each host's reference: its TCP probe of its own responder
        wait_for(
            lambda: all(
                f'fabricprobe_rtt_seconds_count{{dst="{n}",op="pingpong",size="64",src="{n}",'
                f'transport="tcp"}}' in scrape(collector)
                for n in names
            ),
            what="every host's reference in /metrics",
        )
        peers = float(len(names))  # the other hosts, and the host itself (its reference)

        def links_kept() -> bool:  # one kept TCP link to each peer, and one from each
            text = scrape(collector)
            return all(
                f'fabricprobe_agent_probe_links{{src="{n}"}} {peers}' in text
                and f'fabricprobe_agent_probe_sessions{{src="{n}"}} {peers}' in text
                for n in names
            )

        wait_for(links_kept, what="each agent's kept links and answered sessions in /metrics")
        text = scrape(collector)
        for name in names:
            assert f'fabricprobe_host_up{{src="{name}"}} 1.0' in text
            assert f'fabricprobe_agent_resident_memory_bytes{{src="{name}"}}' in text
            assert f'fabricprobe_agent_spool_windows{{src="{name}"}}' in text
        assert 'fabricprobe_collector_rpcs_total{code="OK",method="ReportWindow"}' in text
        first = names[0]
        assert (
            f'fabricprobe_pfc_rx_pause_frames_total{{netdev="ens1f0np0",priority="3",src="{first}"}}'
            in text
        )
        assert (
            'fabricprobe_rdma_port_stat_total{counter="out_of_buffer",device="mlx5_0",port="1",'
            f'src="{first}"}}' in text
        )
        assert (
            f'fabricprobe_netdev_stat_total{{counter="rx_ecn_mark",netdev="ens1f0np0",src="{first}"}}'
            in text
        )
        if shutil.which("promtool"):
            res = subprocess.run(
                ["promtool", "check", "metrics"], input=text.encode(), capture_output=True
            )
            assert res.returncode == 0, res.stderr.decode()
        # no loss on a healthy loopback
        lost = [
            line
            for line in text.splitlines()
            if line.startswith("fabricprobe_probe_lost_total") and not line.endswith(" 0.0")
        ]
        assert not lost, lost
    finally:
        for a in agents:
            a.close()


def test_collector_restart_loses_no_window(tmp_path: Path) -> None:
    first = CollectorServer(server_config())
    first.start()
    port = first.port
    cfg = agent_config(tmp_path, HOSTS[0], port)
    agent = Agent(cfg)
    agent.start()
    second: CollectorServer | None = None
    try:
        wait_for(lambda: agent.sender.acked >= 2, what="first windows acknowledged")
        first.stop(0)
        seq_at_outage = agent.seq
        wait_for(lambda: agent.spool.depth >= 3, what="windows spooling during the outage")
        assert agent.seq >= seq_at_outage + 2
        second = CollectorServer(server_config(port))
        second.start()
        wait_for(
            lambda: agent.spool.depth == 0 and agent.seq > seq_at_outage + 3,
            what="spool replayed to the restarted collector",
        )
    finally:
        agent.close()
        if second is not None:
            time.sleep(0.2)
            taken = first.store.seqs_taken(cfg.host).get(agent.epoch, set()) | (
                second.store.seqs_taken(cfg.host).get(agent.epoch, set())
            )
            second.stop(0)
    missing = set(range(1, agent.seq + 1)) - taken
    assert not missing, f"windows lost across the restart: {sorted(missing)}"
    assert agent.spool.depth == 0


def test_checks_refused_by_a_collector_that_forgot_the_host_make_it_register_again(
    tmp_path: Path,
) -> None:
    """The collector restarts while check verdicts wait to go: its refusal of them (the
    host is not registered there) makes the agent register again, soon, and send them."""
    first = CollectorServer(server_config())
    first.start()
    port = first.port
    cfg = loopback_agent_config(
        tmp_path, HOSTS[0], port, validate_interval_s=3600.0, validate_first_s=0.0
    )
    agent = Agent(cfg)
    agent.start()
    second: CollectorServer | None = None
    try:
        checks = agent.checks
        assert checks is not None
        wait_for(lambda: checks.sent >= 1, 30, "the first verdicts sent")
        first.stop(0)
        second = CollectorServer(server_config(port))
        second.start()
        checks.resend()  # verdicts wait while the new collector has never heard of us
        # the collector holds them before its answer reaches the agent, which then counts
        # them sent
        wait_for(
            lambda: cfg.host in second.drift.hosts and checks.sent >= 2,
            10,
            "the verdicts at the new collector, and its answer at the agent",
        )
    finally:
        agent.close()
        first.stop(0)
        if second is not None:
            second.stop(0)


def test_real_processes_and_sigterm(tmp_path: Path) -> None:
    api, metrics = free_port(), free_port()
    probe = [sys.executable, "-m", "fabricprobe"]
    coll = subprocess.Popen(
        [
            *probe,
            "collector",
            "--listen",
            f"127.0.0.1:{api}",
            "--metrics-listen",
            f"127.0.0.1:{metrics}",
            "--insecure",
            "--trust-loopback",  # the agents on 127.0.0.N call from 127.0.0.1
            "--report-interval",
            "1",
            "--probe-interval",
            "0.5",
        ],
        stderr=subprocess.PIPE,
    )
    agents = []
    try:
        wait_for(lambda: _port_open(api), what="collector listening")
        for addr in HOSTS[:2]:
            name = "proc-" + addr.rsplit(".", 1)[1]
            agents.append(
                subprocess.Popen(
                    [
                        *probe,
                        "agent",
                        "--collector",
                        f"127.0.0.1:{api}",
                        "--insecure",
                        "--host",
                        name,
                        "--listen",
                        f"{addr}:0",
                        "--spool-dir",
                        str(tmp_path / name),
                        "--sysfs",
                        str(tmp_path / "none"),
                        "--no-ethtool",
                    ],
                    stderr=subprocess.PIPE,
                )
            )

        def both_ways() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5) as r:
                text = r.read().decode()
            return text.count("fabricprobe_rtt_seconds_count{") >= 2

        wait_for(both_ways, what="both directions in /metrics")
    finally:
        for p in [*agents, coll]:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    for p in [*agents, coll]:
        assert p.returncode == 0
        assert p.stderr is not None
        lines = p.stderr.read().decode().splitlines()
        assert lines and all(json.loads(line)["msg"] for line in lines)


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_agent_restart_replays_its_spool(tmp_path: Path) -> None:
    dead = free_port()  # no collector here yet
    cfg = agent_config(tmp_path, HOSTS[1], dead)
    first = Agent(cfg)
    first.start()
    for _ in range(3):
        first.cut_window()
    first.close(flush_timeout=0.2)
    old_epoch, old_seq = first.epoch, first.seq
    assert first.spool.depth >= 3
    server = CollectorServer(server_config(dead))
    server.start()
    second = Agent(agent_config(tmp_path, HOSTS[1], dead))
    second.start()
    try:
        wait_for(
            lambda: second.spool.depth == 0 and second.sender.acked >= old_seq,
            what="the previous lifetime's windows replayed",
        )
        taken = server.store.seqs_taken(cfg.host)
        assert taken[old_epoch] == set(range(1, old_seq + 1))
    finally:
        second.close()
        server.stop(0)
