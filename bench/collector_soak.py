#!/usr/bin/env python3
"""A long run of --agents simulated agents against one collector process: its RSS every
minute, and the agents' report latency (p50, p99, max) per minute.

The collector is a real CollectorServer in its own process, with real gRPC on loopback
and its /metrics scraped every --scrape-s seconds as Prometheus would. The agents are
split over --clients processes. Each registers over gRPC as an agent does (an address in
the fleet's network 10.0.0.0/8, its ToR), takes the assignments the plan gives it, and
then sends one window per report interval on the unary ReportWindow call, with one RTT
sketch per assigned target and --counters counter readings, spread over the interval.
The report latency is the call's time at the client.

With --trace the collector runs tracemalloc and prints, every --trace-every minutes, the
ten source lines whose allocations grew most since the first minute: where the memory
that keeps growing is held.

    python bench/collector_soak.py                          # 1,000 agents for 30 minutes
    python bench/collector_soak.py --agents 200 --minutes 5 --trace
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import statistics
import time
import urllib.request
from typing import Any

import psutil

INTERVAL_MS = 10_000  # the collector's default report interval


def _collector(args: argparse.Namespace, ready: Any, stop: Any, traced: Any) -> None:
    from fabricprobe.collector.auth import GateConfig
    from fabricprobe.collector.service import ApiConfig, CollectorServer, ServerConfig

    if args.trace:
        import tracemalloc

        tracemalloc.start(5)
    api = ApiConfig(report_interval_ms=INTERVAL_MS, fleet_networks=("10.0.0.0/8",))
    # every simulated agent calls from 127.0.0.1: the per-identity rate limit, which a
    # fleet meets once per host, is lifted
    gate = GateConfig(rate=1e9, burst=1e9)
    server = CollectorServer(
        ServerConfig(
            listen="127.0.0.1:0", metrics_listen="127.0.0.1:0", api=api, gate=gate, grace=1.0
        )
    )
    server.start()
    ready.put((server.port, server.metrics_port))
    first = None
    every = args.trace_every * 60
    next_at = time.monotonic() + 60
    while not stop.wait(1.0):
        if args.trace and time.monotonic() >= next_at:
            import tracemalloc

            snap = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(False, tracemalloc.__file__)]
            )
            if first is None:
                first = snap
            else:
                traced.put([str(s) for s in snap.compare_to(first, "lineno")[:10]])
            next_at = time.monotonic() + every
    server.stop(0)


def _agents(
    args: argparse.Namespace, index: int, port: int, ready: Any, go: Any, stop: Any, out: Any
) -> None:
    from fabricprobe.agent.client import CollectorClient
    from fabricprobe.core.api import fabricprobe_pb2 as pb
    from fabricprobe.core.sketchwire import to_wire
    from fabricprobe.core.stats import LatencySketch

    rng = random.Random(index)
    names = [f"host-{i:05d}" for i in range(index, args.agents, args.clients)]
    client = CollectorClient(f"127.0.0.1:{port}", timeout=30.0)
    targets: dict[str, list[pb.ProbeTarget]] = {}
    for name in names:
        i = int(name[5:])
        info = pb.HostInfo(
            host=name,
            addresses=[f"10.{i // 65536}.{i // 256 % 256}.{i % 256}"],
            topology=f"tor-{i // args.per_tor:04d}",
            probe_port=4793,
            probe_kinds=["tcp_lat"],
        )
        targets[name] = list(client.register(info).assignments.targets)
    # later registrations changed the plan: each host asks once for its current targets
    for name in names:
        targets[name] = list(client.assignments(name, 0).targets)
    ready.put(sum(len(t) for t in targets.values()))
    go.wait()
    epoch = time.time_ns()
    interval = INTERVAL_MS / 1000
    t0 = time.monotonic()
    offsets = {name: rng.uniform(0, interval) for name in names}  # agents are not in step
    seq = 0
    minute_lat: list[float] = []
    minute = 0
    while not stop.is_set():
        seq += 1
        for name in names:
            due = t0 + (seq - 1) * interval + offsets[name]
            wait = due - time.monotonic()
            if wait > 0 and stop.wait(wait):
                break
            now = time.time_ns()
            report = pb.WindowReport(
                host=name,
                epoch=epoch,
                seq=seq,
                window_start_unix_ns=now - INTERVAL_MS * 1_000_000,
                window_end_unix_ns=now,
            )
            for t in targets[name]:
                sk = LatencySketch()
                sk.record_many([int(rng.lognormvariate(10.5, 0.3)) for _ in range(10)])
                report.probes.add(
                    dst=t.dst, transport="tcp", op="pingpong", size=64, rtt=to_wire(sk)
                )
            for c in range(args.counters):
                report.counters.add(
                    kind="netdev",
                    device="",
                    netdev="eth0",
                    name=f"rx_counter_{c}",
                    value=seq * 1000 + c,
                    width=64,
                )
            report.agent.cpu_seconds = seq * 0.01
            t_call = time.perf_counter()
            _, err = client.send([report])
            minute_lat.append(time.perf_counter() - t_call)
            if err is not None:
                out.put(("error", index, str(err.code())))
            elapsed_min = int((time.monotonic() - t0) // 60)
            if elapsed_min > minute:
                out.put(("latency", index, minute, minute_lat))
                minute_lat, minute = [], elapsed_min
    out.put(("latency", index, minute, minute_lat))
    client.close()


def scrape(port: int) -> float:
    t0 = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        resp.read()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--clients", type=int, default=4, help="agent processes")
    ap.add_argument("--counters", type=int, default=35, help="counter readings a report")
    ap.add_argument("--per-tor", type=int, default=32, help="hosts a ToR")
    ap.add_argument("--scrape-s", type=float, default=15.0)
    ap.add_argument("--trace", action="store_true", help="tracemalloc in the collector")
    ap.add_argument("--trace-every", type=float, default=5.0, help="minutes between dumps")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")  # never fork a process that runs a gRPC server
    ready, out, traced = ctx.Queue(), ctx.Queue(), ctx.Queue()
    stop, go = ctx.Event(), ctx.Event()
    coll = ctx.Process(target=_collector, args=(args, ready, stop, traced))
    coll.start()
    port, metrics_port = ready.get(timeout=120)
    proc = psutil.Process(coll.pid)
    rss0 = proc.memory_info().rss
    clients = [
        ctx.Process(target=_agents, args=(args, i, port, ready, go, stop, out))
        for i in range(args.clients)
    ]
    for c in clients:
        c.start()
    windows = sum(ready.get(timeout=600) for _ in clients)
    print(
        f"{args.agents:,} agents registered ({windows:,} probe targets in all; report"
        f" interval {INTERVAL_MS / 1000:g} s); collector RSS {rss0 / 2**20:,.0f} MiB before"
    )
    print("minute  RSS MiB  reports  p50 ms  p99 ms  max ms  scrape s  errors")
    go.set()
    t0 = time.monotonic()
    lat: dict[int, list[float]] = {}
    errors: dict[int, int] = {}
    scrapes: list[float] = []
    next_scrape = t0
    minute = 0
    rss_by_minute: list[float] = []
    while minute < args.minutes:
        now = time.monotonic()
        if now >= next_scrape:
            scrapes.append(scrape(metrics_port))
            next_scrape += args.scrape_s
        while not out.empty():
            kind, _i, *rest = out.get()
            if kind == "latency":
                lat.setdefault(rest[0], []).extend(rest[1])
            else:
                errors[int((now - t0) // 60)] = errors.get(int((now - t0) // 60), 0) + 1
        while not traced.empty():
            print("  tracemalloc, growth since minute 1:")
            for line in traced.get():
                print("   ", line)
        if now - t0 >= (minute + 1) * 60:
            time.sleep(2.0)  # the clients' numbers for the minute arrive
            while not out.empty():
                kind, _i, *rest = out.get()
                if kind == "latency":
                    lat.setdefault(rest[0], []).extend(rest[1])
            got = sorted(lat.get(minute, []))
            rss = proc.memory_info().rss / 2**20
            rss_by_minute.append(rss)
            if got:
                p50 = statistics.median(got) * 1e3
                p99 = got[min(len(got) - 1, int(0.99 * len(got)))] * 1e3
                print(
                    f"{minute + 1:6d}  {rss:7,.0f}  {len(got):7,d}  {p50:6.1f}  {p99:6.1f}"
                    f"  {got[-1] * 1e3:6.1f}  {max(scrapes[-4:]):8.2f}  {errors.get(minute, 0):6d}"
                )
            minute += 1
        time.sleep(0.2)
    stop.set()
    for c in clients:
        c.join(timeout=60)
    coll.join(timeout=60)
    tail = (
        rss_by_minute[-20:]
        if len(rss_by_minute) >= 20
        else rss_by_minute[len(rss_by_minute) // 3 :]
    )
    if tail:
        spread = (max(tail) - min(tail)) / min(tail)
        print(
            f"RSS over the last {len(tail)} minutes: {min(tail):,.0f}-{max(tail):,.0f} MiB"
            f" ({100 * spread:.1f} % apart)"
        )
    all_lat = sorted(x for m, v in lat.items() if m >= 1 for x in v)
    if all_lat:
        print(
            f"report latency after the first minute: p50"
            f" {statistics.median(all_lat) * 1e3:.1f} ms, p99"
            f" {all_lat[int(0.99 * (len(all_lat) - 1))] * 1e3:.1f} ms over {len(all_lat):,} reports"
        )


if __name__ == "__main__":
    main()
