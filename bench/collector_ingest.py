#!/usr/bin/env python3
"""Collector ingest in one process: reports/s and sketch merges/s, and the share of a core
that 10,000 agents at the default report interval would take.

Each simulated agent reports a window with one RTT sketch per peer (default 16 peers,
10 exchanges each) and counter readings. An mlx5 port exposes ~130 counters
(counters/, hw_counters/, PFC per priority); the agent sends those that moved in the
window (~10-20 on a busy port) and all of them every 6th window: ~35 a report on
average, the default here, every one of them changing (the costlier path).
Two paths are measured:

* `api`  - serialized reports parsed and handed to the collector's AgentApi (what the
           servicer does after gRPC has read the bytes), single thread;
* `grpc` - the same reports sent over loopback gRPC from client processes, each Report
           call carrying --batch windows (1: an agent in steady state, one window per
           unary ReportWindow call; 64: an agent replaying its spool on a Report
           stream); the figure is the server's CPU.

    python bench/collector_ingest.py                      # both, 10,000 agents
    python bench/collector_ingest.py --agents 2000 --peers 32 --mode api
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import time

import psutil

from collector.api import fabricprobe_pb2 as pb
from collector.assign import PlanConfig, Planner
from collector.service import AgentApi, ApiConfig, CollectorServer, ServerConfig
from collector.sketchwire import to_wire
from collector.store import WindowStore
from probes.stats import LatencySketch

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


def api_path(args: argparse.Namespace, reports: list[bytes]) -> None:
    cfg = ApiConfig(reports_per_second=1e9, report_burst=1e9)
    api = AgentApi(WindowStore(), Planner(cfg.plan), cfg)
    for info in infos(args.agents):
        api.store.register(info)
    t0, c0 = time.perf_counter(), time.process_time()
    for blob in reports:
        api.report(pb.WindowReport.FromString(blob))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    summary("api (in process, one thread)", args, len(reports), api.store.merges_total, wall, cpu)


def _client(port: int, reports: list[bytes], batch: int, out: mp.Queue) -> None:
    import grpc  # type: ignore[import-untyped]

    from collector.api import fabricprobe_pb2_grpc as pb_grpc

    stub = pb_grpc.CollectorStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
    acks = 0
    for i in range(0, len(reports), batch):
        msgs = [pb.WindowReport.FromString(b) for b in reports[i : i + batch]]
        if len(msgs) == 1:  # as an agent does in steady state
            stub.ReportWindow(msgs[0], timeout=60)
            acks += 1
        else:
            acks += sum(1 for _ in stub.Report(iter(msgs), timeout=60))
    out.put(acks)


def grpc_path(args: argparse.Namespace, reports: list[bytes]) -> None:
    api = ApiConfig(reports_per_second=1e9, report_burst=1e9, plan=PlanConfig())
    server = CollectorServer(ServerConfig(listen="127.0.0.1:0", metrics_listen="", api=api))
    server.start()
    for info in infos(args.agents):
        server.api.register(info)
    me = psutil.Process()
    ctx = mp.get_context("spawn")  # never fork a process that runs a gRPC server
    q: mp.Queue = ctx.Queue()
    clients = [
        ctx.Process(target=_client, args=(server.port, reports[i :: args.clients], args.batch, q))
        for i in range(args.clients)
    ]
    c0 = sum(me.cpu_times()[:2])
    t0 = time.perf_counter()
    for c in clients:
        c.start()
    acks = sum(q.get() for _ in clients)
    for c in clients:
        c.join()
    wall = time.perf_counter() - t0
    cpu = sum(me.cpu_times()[:2]) - c0
    server.stop(0)
    assert acks == len(reports), (acks, len(reports))
    summary(
        f"grpc (server process; {args.clients} client processes, {args.batch} per call)",
        args,
        acks,
        server.store.merges_total,
        wall,
        cpu,
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
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1, help="windows per call")
    ap.add_argument("--mode", choices=["api", "grpc", "both"], default="both")
    args = ap.parse_args()
    print(
        f"building {args.agents * args.windows} reports ({args.peers} sketches, "
        f"{args.counters} counters each)..."
    )
    reports = make_reports(args.agents, args.peers, args.counters, args.windows)
    print(f"mean report size {sum(map(len, reports)) / len(reports):,.0f} bytes")
    if args.mode in ("api", "both"):
        api_path(args, reports)
    if args.mode in ("grpc", "both"):
        grpc_path(args, reports)


if __name__ == "__main__":
    main()
