#!/usr/bin/env python3
"""Collector ingest in one process: reports/s and sketch merges/s, and the share of a core
that 10,000 agents at the default report interval would take.

Each simulated agent reports a window with one RTT sketch per peer (default 16 peers,
10 exchanges each) and counter readings. An mlx5 port exposes ~130 counters
(counters/, hw_counters/, PFC per priority); the agent sends those that moved in the
window (~10-20 on a busy port) and all of them every 6th window: ~35 a report on
average, the default here, every one of them changing (the costlier path).
The first window of every agent creates its paths and counter tracks; it is taken
before the clock starts, so the figures are the steady state (later windows).
Two paths are measured:

* `api`  - serialized reports parsed and handed to the collector's AgentApi (what the
           servicer does after gRPC has read the bytes), single thread;
* `grpc` - the same reports sent over loopback gRPC from client processes, each Report
           call carrying --batch windows (1: an agent in steady state, one window per
           unary ReportWindow call; 64: an agent replaying its spool on a Report
           stream), paced at the fleet's rate (agents / report interval) or, with
           --flood, as fast as the server answers; the figure is the server's CPU.

    python bench/collector_ingest.py                      # both, 10,000 agents
    python bench/collector_ingest.py --agents 2000 --peers 32 --mode api
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import time
from typing import Any

import psutil
from prometheus_client import CollectorRegistry

from fabricprobe.collector.assign import PlanConfig, Planner
from fabricprobe.collector.auth import GateConfig
from fabricprobe.collector.exporter import FabricCollector
from fabricprobe.collector.exposition import render
from fabricprobe.collector.service import AgentApi, ApiConfig, CollectorServer, ServerConfig
from fabricprobe.collector.store import WindowStore
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.sketchwire import to_wire
from fabricprobe.core.stats import LatencySketch

DEFAULT_INTERVAL_S = ApiConfig().report_interval_ms / 1000


def make_reports(agents: int, peers: int, counters: int, windows: int) -> list[bytes]:
    """WINDOWS reports for each of AGENTS hosts, serialized, in arrival order."""
    rng = random.Random(1)
    pool = []
    for _ in range(200):
        s = LatencySketch()
        s.record_many([int(rng.lognormvariate(10.5, 0.3)) for _ in range(10)])
        pool.append(to_wire(s))
    names = [f"host-{i:05d}" for i in range(agents)]
    out = []
    for w in range(1, windows + 1):
        for i, name in enumerate(names):
            r = pb.WindowReport(
                host=name,
                epoch=1,
                seq=w,
                window_start_unix_ns=(w - 1) * 10**10,
                window_end_unix_ns=w * 10**10,
            )
            for j in range(peers):
                r.probes.add(
                    dst=names[(i + j + 1) % agents],
                    transport="tcp",
                    op="pingpong",
                    size=64,
                    rtt=pool[(i * 7 + j + w) % len(pool)],
                )
            for c in range(counters):
                r.counters.add(
                    kind="rdma",
                    device="mlx5_0",
                    port=1,
                    priority=-1,
                    name=f"counter_{c}",
                    value=w * 1000 + c,
                    width=64,
                )
            r.agent.CopyFrom(pb.AgentStats(cpu_seconds=1.0, rss_bytes=40 << 20))
            out.append(r.SerializeToString())
    return out


def infos(agents: int) -> list[pb.HostInfo]:
    return [
        pb.HostInfo(
            host=f"host-{i:05d}",
            addresses=[f"10.0.{i // 256}.{i % 256}"],
            topology=f"tor-{i // 40}",
            probe_port=4793,
            probe_kinds=["tcp_lat"],
        )
        for i in range(agents)
    ]


def warm_up(api: AgentApi, args: argparse.Namespace, first: list[bytes]) -> None:
    """Register every agent and take its first window (paths and counters created)."""
    for info in infos(args.agents):
        api.register(info)
    for blob in first:
        api.report(pb.WindowReport.FromString(blob))


def api_path(args: argparse.Namespace, first: list[bytes], reports: list[bytes]) -> None:
    cfg = ApiConfig()
    api = AgentApi(WindowStore(), Planner(cfg.plan), cfg)
    warm_up(api, args, first)
    merges0 = api.store.merges_total
    t0, c0 = time.perf_counter(), time.process_time()
    for blob in reports:
        api.report(pb.WindowReport.FromString(blob))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    merges = api.store.merges_total - merges0
    summary("api (in process, one thread)", args, len(reports), merges, wall, cpu)
    scrape(api.store)


def scrape(store: WindowStore) -> None:
    """One /metrics scrape of the store as it now is: its cost grows with the paths."""
    registry = CollectorRegistry()
    registry.register(FabricCollector(store))
    t0, c0 = time.perf_counter(), time.process_time()
    text = render(registry)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    series = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
    print(
        f"  one scrape of {len(store.paths):,} paths and {len(store.counters):,} counters: "
        f"{series:,} series, {len(text) / 2**20:,.0f} MiB, {wall:.2f} s wall, {cpu:.2f} s CPU"
    )


def _client(
    port: int,
    reports: list[bytes],
    batch: int,
    rate: float,
    ready: mp.Queue,
    go: Any,
    out: mp.Queue,
) -> None:
    import grpc  # type: ignore[import-untyped]

    from fabricprobe.core.api import fabricprobe_pb2_grpc as pb_grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    grpc.channel_ready_future(channel).result(timeout=30)
    stub = pb_grpc.CollectorStub(channel)
    msgs = [pb.WindowReport.FromString(b) for b in reports]
    ready.put(True)
    go.wait()
    t0 = time.perf_counter()
    acks = late = 0
    for n, i in enumerate(range(0, len(msgs), batch)):
        if rate:  # the n-th call is due n / rate seconds after the start
            wait = t0 + n / rate - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            else:
                late += wait < -0.1
        chunk = msgs[i : i + batch]
        if len(chunk) == 1:  # as an agent does in steady state
            stub.ReportWindow(chunk[0], timeout=60)
            acks += 1
        else:
            acks += sum(1 for _ in stub.Report(iter(chunk), timeout=60))
    out.put((acks, late))


def grpc_path(args: argparse.Namespace, first: list[bytes], reports: list[bytes]) -> None:
    api = ApiConfig(plan=PlanConfig())
    gate = GateConfig(rate=1e9, burst=1e9, streams_per_identity=32)
    server = CollectorServer(
        ServerConfig(listen="127.0.0.1:0", metrics_listen="", api=api, gate=gate)
    )
    server.start()
    warm_up(server.api, args, first)
    merges0 = server.store.merges_total
    me = psutil.Process()
    ctx = mp.get_context("spawn")  # never fork a process that runs a gRPC server
    ready: mp.Queue = ctx.Queue()
    out: mp.Queue = ctx.Queue()
    go = ctx.Event()
    # paced: calls per second of each client, so that together they send what the
    # fleet sends at its report interval; flooded: as fast as the server answers
    rate = 0.0 if args.flood else args.agents / DEFAULT_INTERVAL_S / args.batch / args.clients
    clients = [
        ctx.Process(
            target=_client,
            args=(server.port, reports[i :: args.clients], args.batch, rate, ready, go, out),
        )
        for i in range(args.clients)
    ]
    for c in clients:
        c.start()
    for _ in clients:
        ready.get(timeout=120)
    c0 = sum(me.cpu_times()[:2])
    t0 = time.perf_counter()
    go.set()
    results = [out.get() for _ in clients]
    wall = time.perf_counter() - t0
    cpu = sum(me.cpu_times()[:2]) - c0
    for c in clients:
        c.join()
    server.stop(0)
    acks, late = sum(a for a, _ in results), sum(n for _, n in results)
    assert acks == len(reports), (acks, len(reports))
    how = "flooding" if args.flood else f"paced at {rate * args.clients * args.batch:,.0f}/s"
    summary(
        f"grpc (server process; {args.clients} client processes {how}, {args.batch} per call)",
        args,
        acks,
        server.store.merges_total - merges0,
        wall,
        cpu,
    )
    if not args.flood:
        print(
            f"  server CPU while paced: {100 * cpu / wall:.0f} % of one core "
            f"({late} calls started over 100 ms late)"
        )


def summary(
    label: str, args: argparse.Namespace, n: int, merges: int, wall: float, cpu: float
) -> None:
    need = args.agents / DEFAULT_INTERVAL_S  # reports/s the fleet sends
    per_report = cpu / n
    print(f"{label}:")
    print(f"  {n} reports in {wall:.2f} s wall, {cpu:.2f} s CPU")
    print(f"  {n / cpu:,.0f} reports/s and {merges / cpu:,.0f} sketch merges/s per CPU-second")
    print(
        f"  {args.agents} agents every {DEFAULT_INTERVAL_S:g} s = {need:,.0f} reports/s "
        f"-> {need * per_report:.2f} of a core (target < 1)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=10_000)
    ap.add_argument("--peers", type=int, default=PlanConfig().budget)
    ap.add_argument("--counters", type=int, default=35)
    ap.add_argument("--windows", type=int, default=3, help="per agent, the first unmeasured")
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1, help="windows per call")
    ap.add_argument(
        "--flood", action="store_true", help="send as fast as answered, not at the fleet's pace"
    )
    ap.add_argument("--mode", choices=["api", "grpc", "both"], default="both")
    args = ap.parse_args()
    print(
        f"building {args.agents * args.windows} reports ({args.peers} sketches, "
        f"{args.counters} counters each)..."
    )
    reports = make_reports(args.agents, args.peers, args.counters, args.windows)
    print(f"mean report size {sum(map(len, reports)) / len(reports):,.0f} bytes")
    first, later = reports[: args.agents], reports[args.agents :]
    if args.mode in ("api", "both"):
        api_path(args, first, later)
    if args.mode in ("grpc", "both"):
        grpc_path(args, first, later)


if __name__ == "__main__":
    main()
