"""The soft-RoCE lane's hosts, with agents on them probing into a collector in this
process: what the lane benchmarks (lane_route.py, lane_kv_parts.py) stand on."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from argparse import Namespace
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fabricprobe.agent.agent import Agent
from fabricprobe.agent.config import AgentConfig
from fabricprobe.collector.assign import PlanConfig
from fabricprobe.collector.service import ApiConfig, CollectorServer, ServerConfig
from fabricprobe.core.models import ModelShape
from fabricprobe.workload.pipeline import Host, WorkloadConfig


def lane_hosts(n: int = 3) -> list[dict[str, str]]:
    """The first N hosts of $LANE_FILE (lane/run.sh writes it), or exit saying why."""
    path = os.environ.get("LANE_FILE")
    if not path or not Path(path).is_file():
        sys.exit(f"no soft-RoCE lane: run this through lane/run.sh --hosts {n}")
    hosts = json.loads(Path(path).read_text())["hosts"]
    if len(hosts) < n:
        sys.exit(f"the lane must have at least {n} hosts, it has {len(hosts)}")
    return [{k: str(v) for k, v in h.items()} for h in hosts[:n]]


def kv_workload(model: ModelShape, args: Namespace, port: int, *, seed: int) -> WorkloadConfig:
    """The benchmarks' workload: ARGS.requests requests of ARGS.prompt_tokens moved over
    RDMA to the responder on PORT, ARGS.outstanding WRITEs in flight, prefill and decode
    all but free (the KV transfer is what is measured)."""
    return WorkloadConfig(
        model=model,
        prompt_tokens=args.prompt_tokens,
        output_tokens=2,
        prefill_s_per_token=0.0,
        decode_step_s=0.001,
        requests=args.requests,
        transport="rdma",
        outstanding=args.outstanding,
        port=port,
        seed=seed,
    )


def workload_host(h: dict[str, str]) -> Host:
    return Host(h["name"], h["ip"])


@contextmanager
def probing_fleet(hosts: list[dict[str, str]], plan: PlanConfig) -> Iterator[CollectorServer]:
    """A collector (plain text on loopback, /metrics off) planning PLAN over HOSTS, and an
    agent on each host; everything stopped on the way out."""
    server = CollectorServer(
        ServerConfig(
            listen="127.0.0.1:0",
            metrics_listen="",
            grace=0.5,
            # the lane's hosts call from 127.0.0.1
            api=ApiConfig(trust_local_registration=True, report_interval_ms=2000, plan=plan),
        )
    )
    server.start()
    spool = tempfile.mkdtemp(prefix="lane-fleet-")
    agents = [
        Agent(
            AgentConfig(
                host=h["name"],
                collector=f"127.0.0.1:{server.port}",
                probe_listen=f"{h['ip']}:0",
                addresses=[h["ip"]],
                devices=[h["device"]],
                spool_dir=f"{spool}/{h['name']}",
                insecure=True,
                window_s=2.0,
                probe_timeout=2.0,
                # the agents share one emulated machine: each would count the others'
                # CPU as its own and throttle
                cpu_budget=4.0,
                pressure_limit=1.0,
            )
        )
        for h in hosts
    ]
    try:
        for a in agents:
            a.start()
        yield server
    finally:
        for a in agents:
            a.close()
        server.stop(0)
