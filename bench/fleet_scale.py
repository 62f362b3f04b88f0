#!/usr/bin/env python3
"""A fleet of --hosts simulated agents against --shards collector processes on this machine:
series, scrape cost, memory and ingest CPU per shard, and the series of one agent endpoint.

One fleet-wide plan (collector/assign.py, ToR mesh plus sampled inter-ToR peers) gives
every host its peers; hosts are split across the shards by rendezvous hashing of the host
name over the shard names (`owner()`), as a shard-ownership function would. Each shard is
its own process running a real CollectorServer on loopback, whose planner also holds the
fleet's hosts (the shared plan), so ToR labels of peers on other shards are known.

The agents are simulated by direct API calls inside each shard process: every report is
built as an agent builds it (one RTT sketch per target, 10 exchanges, counter readings,
agent stats), serialized, parsed again and handed to the AgentApi, as the gRPC servicer
does after reading the bytes (bench/collector_ingest.py measures the gRPC edge itself).
The first window of every host is taken before the clock starts. Then, one shard after
the other (so that its windows are fresh when it is scraped and the shards do not
share the two cores while measured), the shard takes its next window of every host and
the parent GETs its /metrics over loopback HTTP twice (the second is the steady state:
hold times in place), reading the shard's CPU time around each GET.

    python bench/fleet_scale.py                          # 10,000 hosts, 4 shards
    python bench/fleet_scale.py --hosts 2000 --shards 2
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
import random
import time
import urllib.request
from typing import Any

import psutil

from fabricprobe.collector.assign import DEFAULT_KINDS, HostSpec, PlanConfig, plan_peers

KIND_WIRE = {  # plan kind -> (transport, op) of its windows (agent/probing.py)
    "tcp_lat": ("tcp", "pingpong"),
    "rdma_rc_lat": ("rdma", "send"),
    "rdma_rc_read": ("rdma", "read"),
    "rdma_ud": ("rdma", "ud"),
}


def owner(host: str, shards: int) -> int:
    """The shard that owns HOST: the highest hash of (shard, host) wins, so a shard that
    leaves moves only its own hosts."""
    best, who = -1, 0
    for s in range(shards):
        h = int.from_bytes(hashlib.blake2b(f"shard-{s}/{host}".encode(), digest_size=8).digest())
        if h > best:
            best, who = h, s
    return who


def fleet(hosts: int, per_tor: int) -> list[HostSpec]:
    return [
        HostSpec(
            name=f"host-{i:05d}",
            topology=f"tor-{i // per_tor:04d}",
            address=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
            port=4793,
            kinds=frozenset(DEFAULT_KINDS),
            device="mlx5_0",
            gid="fe80::1",
        )
        for i in range(hosts)
    ]


def _shard(
    index: int, args: argparse.Namespace, ready: Any, go: Any, results: Any, done: Any
) -> None:
    from fabricprobe.collector.service import CollectorServer, ServerConfig
    from fabricprobe.core.api import fabricprobe_pb2 as pb
    from fabricprobe.core.sketchwire import to_wire
    from fabricprobe.core.stats import LatencySketch

    me = psutil.Process()
    specs = fleet(args.hosts, args.per_tor)
    plan = plan_peers(specs, PlanConfig(budget=args.peers))
    mine = [h for h in specs if owner(h.name, args.shards) == index]
    server = CollectorServer(
        ServerConfig(listen="127.0.0.1:0", metrics_listen="127.0.0.1:0", metrics_cache_s=0.0)
    )
    server.start()
    for h in specs:  # the fleet-wide plan: ToR labels of peers owned elsewhere
        server.planner.upsert(h)
    for h in mine:
        server.api.register(
            pb.HostInfo(
                host=h.name,
                addresses=[h.address],
                topology=h.topology,
                probe_port=h.port,
                probe_kinds=sorted(h.kinds),
            )
        )
    rng = random.Random(index)
    pool = []
    for _ in range(256):
        s = LatencySketch()
        s.record_many([int(rng.lognormvariate(9.0, 0.4)) for _ in range(10)])  # ~8 µs
        if rng.random() < 0.02:
            s.record_lost(1)
        pool.append(to_wire(s))
    kinds = [KIND_WIRE[k] for k in DEFAULT_KINDS]
    now = time.time_ns()
    steady: list[bytes] = []
    c0 = me.cpu_times()
    t_build = time.perf_counter()
    for w in range(1, args.windows + 1):
        end = now - (args.windows - w) * 10**10
        blobs = []
        for i, h in enumerate(mine):
            r = pb.WindowReport(
                host=h.name,
                epoch=1,
                seq=w,
                window_start_unix_ns=end - 10**10,
                window_end_unix_ns=end,
            )
            for j, peer in enumerate(plan[h.name]):
                for transport, op in kinds:
                    r.probes.add(
                        dst=peer,
                        transport=transport,
                        op=op,
                        size=64,
                        rtt=pool[(i * 31 + j * 7 + w) % len(pool)],
                    )
            for c in range(args.counters):
                r.counters.add(
                    kind="rdma",
                    device="mlx5_0",
                    port=1,
                    priority=-1,
                    name=f"counter_{c}",
                    value=w * 1000 + c,
                    width=64,
                )
            r.agent.CopyFrom(pb.AgentStats(cpu_seconds=1.0, rss_bytes=40 << 20, probes=48))
            blobs.append(r.SerializeToString())
        if w == 1:
            for b in blobs:  # paths and counter tracks created: not the steady state
                server.api.report(pb.WindowReport.FromString(b))
        else:
            steady += blobs
    build_s = time.perf_counter() - t_build
    ready.put(index)
    go[index].wait()
    c1 = me.cpu_times()
    t0 = time.perf_counter()
    for b in steady:
        server.api.report(pb.WindowReport.FromString(b))
    ingest_wall = time.perf_counter() - t0
    c2 = me.cpu_times()
    ingest_cpu = (c2.user + c2.system) - (c1.user + c1.system)
    results.put(
        {
            "shard": index,
            "hosts": len(mine),
            "paths": len(server.store.paths),
            "reports": len(steady),
            "ingest_cpu": ingest_cpu,
            "ingest_wall": ingest_wall,
            "setup_cpu": (c1.user + c1.system) - (c0.user + c0.system),
            "build_s": build_s,
            "metrics_port": server.metrics_port,
            "pid": me.pid,
        }
    )
    done.wait()
    server.stop(0)


def idle_rate(pid: int, seconds: float = 3.0) -> float:
    """CPU seconds per second the shard spends with nothing asked of it (its reaper, the
    attribution's sync, gRPC's threads): taken off a scrape's CPU."""
    proc = psutil.Process(pid)
    c0 = sum(proc.cpu_times()[:2])
    time.sleep(seconds)
    return (sum(proc.cpu_times()[:2]) - c0) / seconds


def scrape(port: int, pid: int) -> tuple[float, float, int, int]:
    """(wall s, the shard's CPU s, bytes, series) of one GET of /metrics."""
    proc = psutil.Process(pid)
    c0 = sum(proc.cpu_times()[:2])
    t0 = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=120) as resp:
        body = resp.read()
    wall = time.perf_counter() - t0
    cpu = sum(proc.cpu_times()[:2]) - c0
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    return wall, cpu, len(body), series


def agent_endpoint_series(peers: int) -> int:
    """Series of one agent's own /metrics at PEERS peers x 3 kinds on the captured mlx5
    port (the figure tests/unit/test_agent_exporter.py holds to 300)."""
    from pathlib import Path
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry, generate_latest

    from fabricprobe.agent.counters import CounterSampler, netdevs_of
    from fabricprobe.agent.exporter import AgentCollector
    from fabricprobe.agent.identity import discover_devices
    from fabricprobe.core.api import fabricprobe_pb2 as pb
    from fabricprobe.core.sketchwire import to_wire
    from fabricprobe.core.stats import LatencySketch
    from fabricprobe.probes.ethtool import CommandResult

    fixtures = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
    text = (fixtures / "ethtool" / "mlx5_core.txt").read_text()
    sysfs = str(fixtures / "sys" / "mlx5")
    devices = discover_devices(sysfs)
    readings = CounterSampler(
        sysfs, devices, netdevs_of(devices), lambda argv, timeout: CommandResult(0, text)
    ).sample()
    report = pb.WindowReport(host="gpu-1", agent=pb.AgentStats(rss_bytes=1, cpu_seconds=1))
    sk = LatencySketch()
    sk.record_many(list(range(3_000, 9_000, 7)))
    for i in range(peers):
        for transport, op in KIND_WIRE.values():
            report.probes.add(dst=f"p{i}", transport=transport, op=op, size=64, rtt=to_wire(sk))
    view = SimpleNamespace(
        last_report=report,
        latest_counters=readings,
        acked=1,
        last_ack_unix_s=1.0,
        registered=True,
        handoffs=0,
        replayed=0,
        tools_missing=set(),
        inputs_skipped={},
    )
    reg = CollectorRegistry()
    reg.register(AgentCollector(view))
    body = generate_latest(reg)
    return sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=10_000)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--per-tor", type=int, default=40)
    ap.add_argument("--peers", type=int, default=PlanConfig().budget)
    ap.add_argument("--counters", type=int, default=35, help="readings per report")
    ap.add_argument("--windows", type=int, default=2, help="per host, the first unmeasured")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")  # never fork a process that runs a gRPC server
    ready: mp.Queue = ctx.Queue()
    results: mp.Queue = ctx.Queue()
    go, done = [ctx.Event() for _ in range(args.shards)], ctx.Event()
    procs = [
        ctx.Process(target=_shard, args=(i, args, ready, go, results, done))
        for i in range(args.shards)
    ]
    print(
        f"{args.hosts:,} hosts ({args.per_tor} per ToR), {args.peers} peers x "
        f"{len(DEFAULT_KINDS)} kinds, {args.shards} collector shards (processes); agents "
        "simulated by direct API calls in each shard (serialized reports parsed and taken, "
        "no gRPC)"
    )
    for p in procs:
        p.start()
    try:
        for _ in procs:
            ready.get(timeout=1800)
        total_series = total_bytes = 0
        worst_cpu = worst_wall = 0.0
        print(
            f"{'shard':>5} {'hosts':>6} {'paths':>8} {'ingest CPU/window':>18} "
            f"{'scrape wall':>11} {'scrape CPU':>10} {'MiB':>6} {'series':>8} {'RSS MiB':>8}"
        )
        print(
            "  (scrape CPU: the shard process's CPU during the GET, less its idle rate "
            "over the GET's wall time; the raw figure in brackets)"
        )
        got = []
        for i in range(args.shards):
            go[i].set()
            r = results.get(timeout=1800)
            got.append(r)
            scrape(r["metrics_port"], r["pid"])  # the first: hold times start
            idle = idle_rate(r["pid"])
            wall, raw, size, series = scrape(r["metrics_port"], r["pid"])
            cpu = max(0.0, raw - idle * wall)
            rss = psutil.Process(r["pid"]).memory_info().rss
            total_series += series
            total_bytes += size
            worst_cpu, worst_wall = max(worst_cpu, cpu), max(worst_wall, wall)
            per_window = r["ingest_cpu"] / max(1, args.windows - 1)
            print(
                f"{r['shard']:>5} {r['hosts']:>6,} {r['paths']:>8,} {per_window:>16.2f} s "
                f"{wall:>9.2f} s {cpu:>8.2f} s {size / 2**20:>6.1f} {series:>8,} "
                f"{rss / 2**20:>8.0f}   [{raw:.2f} s; idle {idle:.2f} CPU-s/s]"
            )
        reports = sum(r["reports"] for r in got)
        cpu = sum(r["ingest_cpu"] for r in got)
        print(
            f"ingest: {reports:,} reports in {cpu:.1f} CPU-s = {reports / cpu:,.0f} reports/s "
            f"per core; the fleet's {args.hosts / 10:,.0f} reports/s need "
            f"{args.hosts / 10 * cpu / reports:.2f} of a core in all"
        )
        print(
            f"all shards: {total_series:,} series (budget 200,000), "
            f"{total_bytes / 2**20:.1f} MiB per round of scrapes; "
            f"slowest scrape {worst_wall:.2f} s wall, {worst_cpu:.2f} CPU-s (budget 1)"
        )
        print(
            f"one agent endpoint at {args.peers} peers x 3 kinds on an mlx5 port: "
            f"{agent_endpoint_series(args.peers)} series (budget 300)"
        )
    finally:
        done.set()
        for p in procs:
            p.join(timeout=60)


if __name__ == "__main__":
    main()
