"""The soft-RoCE lane's hosts, with agents on them probing into a collector in this
process: what the lane benchmarks (lane_route.py, lane_kv_parts.py) stand on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
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
    all but free (the KV transfer is what is measured); back to back, or ARGS.rate a
    second, and the decode side polling its transfers every ARGS.kv_poll_ms, where the
    script has those options."""
    return WorkloadConfig(
        model=model,
        prompt_tokens=args.prompt_tokens,
        output_tokens=2,
        prefill_s_per_token=0.0,
        decode_step_s=0.001,
        requests=args.requests,
        rate=getattr(args, "rate", 0.0),
        transport="rdma",
        outstanding=args.outstanding,
        kv_poll_s=getattr(args, "kv_poll_ms", 0.0) / 1e3,
        port=port,
        seed=seed,
    )


def workload_host(h: dict[str, str]) -> Host:
    return Host(h["name"], h["ip"])


@contextmanager
def probing_fleet(
    hosts: list[dict[str, str]], plan: PlanConfig, *, processes: bool = True, spin_us: int = -1
) -> Iterator[CollectorServer]:
    """A collector (plain text on loopback, /metrics off) planning PLAN over HOSTS, and an
    agent on each host, each a `probe agent` process of its own as on a real host
    (PROCESSES false: in this process, sharing its interpreter with the workload);
    everything stopped on the way out."""
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
    configs = [
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
            probe_spin_us=spin_us,  # the agent's --probe-spin-us
        )
        for h in hosts
    ]
    agents: list[Agent] = []
    procs: list[subprocess.Popen[bytes]] = []
    try:
        if processes:
            procs = [subprocess.Popen(agent_argv(c), stdout=subprocess.DEVNULL) for c in configs]
            wait_registered(server, {c.host for c in configs}, procs)
        else:
            agents = [Agent(c) for c in configs]
            for a in agents:
                a.start()
        yield server
    finally:
        for a in agents:
            a.close()
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        server.stop(0)


def agent_argv(c: AgentConfig) -> list[str]:
    """`probe agent` with C's settings (the port is the agent's to choose: port 0)."""
    return [
        str(Path(sys.executable).with_name("probe")), "agent", "--host", c.host,
        "--collector", c.collector, "--listen", c.probe_listen,
        *(a for addr in c.addresses for a in ("--address", addr)),
        *(a for dev in c.devices for a in ("--device", dev)),
        "--spool-dir", c.spool_dir, "--insecure", "--window", str(c.window_s),
        "--probe-timeout", str(c.probe_timeout), "--cpu-budget", str(c.cpu_budget),
        "--pressure-limit", str(c.pressure_limit), "--probe-spin-us", str(c.probe_spin_us),
    ]  # fmt: skip


def wait_registered(
    server: CollectorServer, names: set[str], procs: list[subprocess.Popen[bytes]]
) -> None:
    """Until every agent of NAMES has registered with SERVER (at most 120 s)."""
    deadline = time.monotonic() + 120
    while not names <= set(server.store.hosts):
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            sys.exit(f"agents did not register: {sorted(names - set(server.store.hosts))}")
        time.sleep(0.5)
