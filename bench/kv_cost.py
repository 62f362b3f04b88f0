#!/usr/bin/env python3
"""`probe cost` at the collector with 10,000 hosts registered: how long the Query API's
KvCost call takes.

Starts a collector (its gRPC server, gate and Query service as `probe collector` runs
them) on loopback, registers HOSTS hosts in its store with one report each: every host
probes PEERS peers (RTT and throughput windows, as tcp_lat and tcp_bw bring them), so
the store holds HOSTS x PEERS x 2 paths. Then asks KvCost for random probed pairs (and
a share of pairs never probed, answered "unknown") over one channel, one call at a
time, and prints the client-side latency percentiles of the calls and the collector's
own time in kv_price(). Target: p99 of the call at most 10 ms.

    python bench/kv_cost.py                      # 10,000 hosts, 16 peers, 2,000 calls
    python bench/kv_cost.py --hosts 2000 --calls 500
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import grpc  # type: ignore[import-untyped]  # grpcio ships no type hints

from fabricprobe.collector.auth import GateConfig
from fabricprobe.collector.price import kv_price
from fabricprobe.collector.service import CollectorServer, ServerConfig
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.api import fabricprobe_pb2_grpc as pb_grpc
from fabricprobe.core.sketchwire import to_wire
from fabricprobe.core.stats import LatencySketch

S = 10**9


def name(i: int) -> str:
    return f"gpu-{i:05d}"


def fill(server: CollectorServer, hosts: int, peers: int, rng: random.Random) -> int:
    """Register HOSTS hosts and take one report from each; the paths the store holds."""
    store = server.store
    for i in range(hosts):
        store.register(
            pb.HostInfo(
                host=name(i),
                addresses=[f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"],
                topology=f"tor-{i // 32}",
            )
        )
    now = time.time_ns()
    sk = LatencySketch()
    sk.record_many([rng.randrange(20_000, 40_000) for _ in range(50)])
    rtt = to_wire(sk)
    for i in range(hosts):
        r = pb.WindowReport(
            host=name(i), epoch=1, seq=1, window_start_unix_ns=now - S, window_end_unix_ns=now
        )
        for k in range(1, peers + 1):
            dst = name((i + k) % hosts)
            r.probes.add(dst=dst, transport="tcp", op="pingpong", size=64, rtt=rtt)
            r.probes.add(
                dst=dst, transport="tcp", op="stream", size=4096,
                bytes_moved=2_000_000_000, busy_seconds=1.0,
            )  # fmt: skip
        store.take(r)
    return len(store.paths)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=10_000)
    ap.add_argument("--peers", type=int, default=16)
    ap.add_argument("--calls", type=int, default=2_000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    # a scheduler asks once a request: the gate's per-identity rate (reports_per_second,
    # 50 by default) is raised as its operator would for it
    gate = GateConfig(rate=1e6, burst=1e6)
    server = CollectorServer(
        ServerConfig(listen="127.0.0.1:0", metrics_listen="", grace=0.5, gate=gate)
    )
    server.start()
    try:
        t0 = time.monotonic()
        paths = fill(server, args.hosts, args.peers, rng)
        print(
            f"{len(server.store.hosts):,} hosts, {paths:,} paths registered in "
            f"{time.monotonic() - t0:.1f} s"
        )
        pairs = []
        for _ in range(args.calls):
            i = rng.randrange(args.hosts)
            k = rng.randrange(1, args.peers + 1) if rng.random() < 0.9 else args.peers + 7
            pairs.append((name(i), name((i + k) % args.hosts)))
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = pb_grpc.QueryStub(ch)
            stub.KvCost(pb.KvCostRequest(src=pairs[0][0], dst=pairs[0][1], bytes=1), timeout=5)
            took: list[float] = []
            known = 0
            for src, dst in pairs:
                t = time.perf_counter()
                reply = stub.KvCost(pb.KvCostRequest(src=src, dst=dst, bytes=524_288), timeout=5)
                took.append(time.perf_counter() - t)
                known += reply.known
        inside: list[float] = []
        for src, dst in pairs[:500]:
            t = time.perf_counter()
            kv_price(server.store, src, dst, 524_288)
            inside.append(time.perf_counter() - t)
        ms = [x * 1e3 for x in took]
        print(
            f"KvCost over gRPC, {len(ms):,} calls ({known:,} known): p50 {pct(ms, 50):.3f} ms, "
            f"p99 {pct(ms, 99):.3f} ms, max {max(ms):.3f} ms, mean {statistics.mean(ms):.3f} ms"
        )
        us = [x * 1e6 for x in inside]
        print(f"kv_price() in the collector: p50 {pct(us, 50):.1f} µs, p99 {pct(us, 99):.1f} µs")
        verdict = "PASS" if pct(ms, 99) <= 10.0 else "FAIL"
        print(f"{verdict}: p99 {pct(ms, 99):.3f} ms (target <= 10 ms)")
    finally:
        server.stop(0)


if __name__ == "__main__":
    main()
