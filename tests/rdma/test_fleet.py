"""Agents on the hosts of the soft-RoCE VM lane probing each other over RDMA (RC ping-pong,
one-sided RC READs, UD) and TCP, end to end into /metrics (runs in the lane: `make lane-test`)."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

from fabricprobe.agent.agent import Agent
from fabricprobe.agent.config import AgentConfig
from fabricprobe.collector.assign import PlanConfig
from fabricprobe.collector.service import ApiConfig, CollectorServer, ServerConfig


def test_lane_hosts_rdma_and_tcp_into_metrics(lane_hosts, tmp_path: Path) -> None:
    hosts = [vars(h) for h in lane_hosts]
    server = CollectorServer(
        ServerConfig(
            listen="127.0.0.1:0",
            metrics_listen="127.0.0.1:0",
            grace=0.5,
            api=ApiConfig(
                trust_local_registration=True,  # the lane's hosts call from 127.0.0.1
                report_interval_ms=2000,
                plan=PlanConfig(
                    interval_ms=1000,
                    count=20,
                    budget=8,
                    kinds=("tcp_lat", "rdma_rc_lat", "rdma_rc_read", "rdma_ud"),
                ),
            ),
        )
    )
    server.start()
    agents = [
        Agent(
            AgentConfig(
                host=h["name"],
                collector=f"127.0.0.1:{server.port}",
                probe_listen=f"{h['ip']}:0",
                addresses=[h["ip"]],
                devices=[h["device"]],
                spool_dir=str(tmp_path / h["name"]),
                insecure=True,
                window_s=2.0,
                probe_timeout=2.0,
            )
        )
        for h in hosts
    ]
    for a in agents:
        a.start()
        kinds = {"rdma_rc_lat", "rdma_rc_read", "rdma_ud"}
        assert kinds <= set(a.probe_kinds()), "RDMA runners did not load"
    try:
        names = [h["name"] for h in hosts]
        want = [
            f'fabricprobe_rtt_seconds_count{{dst="{d}",op="{op}",size="64",src="{s}",'
            f'transport="{tr}"}}'
            for s in names
            for d in names
            if s != d
            for tr, op in (("rdma", "send"), ("rdma", "read"), ("rdma", "ud"), ("tcp", "pingpong"))
        ]
        url = f"http://127.0.0.1:{server.metrics_port}/metrics"
        # three agents, their responders and the collector share one emulated machine:
        # a scrape can take seconds, and the first windows need a few report intervals
        deadline = time.monotonic() + 300
        text = ""
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=60) as r:
                    text = r.read().decode()
            except TimeoutError:
                continue
            if all(w in text for w in want):
                break
            time.sleep(1)
        missing = [w for w in want if w not in text]
        assert not missing, missing
        assert "fabricprobe_rdma_tcp_rtt_ratio{" in text
        for h in hosts:
            assert (
                f'fabricprobe_rdma_port_stat_total{{counter="rcvd_pkts",device="{h["device"]}"'
                in text
            )
    finally:
        for a in agents:
            a.close()
        server.stop(0)
