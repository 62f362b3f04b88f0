#!/usr/bin/env python3
"""How long does planning take for a large fleet, and how many probes does each host run?

Builds N hosts under ToRs of a given size, plans peers (ToR mesh plus sampled inter-ToR
pairs within the budget) and expands them into probe targets, as the collector does
when hosts join or leave. Target: 10,000 hosts planned in under 1 s; the plan's cost
at 100,000 hosts is printed too (one fleet-wide plan, whatever the collector shards).

    python bench/assign_plan.py                    # 10,000 then 100,000 hosts, 40 per ToR
    python bench/assign_plan.py --hosts 50000 --per-tor 32 --budget 24
"""

from __future__ import annotations

import argparse
import statistics
import time

import psutil

from fabricprobe.collector.assign import HostSpec, PlanConfig, Planner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="10000,100000", help="fleet sizes, comma-separated")
    ap.add_argument("--per-tor", type=int, default=40)
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    for n in (int(x) for x in args.hosts.split(",")):
        run(n, args)


def run(n_hosts: int, args: argparse.Namespace) -> None:
    cfg = PlanConfig(budget=args.budget)
    hosts = [
        HostSpec(
            name=f"host-{i:06d}",
            topology=f"tor-{i // args.per_tor:05d}",
            address=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
            port=4793,
            kinds=frozenset({"tcp_lat", "rdma_rc_lat", "rdma_ud"}),
            device="mlx5_0",
            gid="fe80::1",
        )
        for i in range(n_hosts)
    ]
    times = []
    planner = Planner(cfg, pace=0)  # replan on every change: its cost is the figure
    for _ in range(args.repeat):
        planner = Planner(cfg, pace=0)  # replan on every change: its cost is the figure
        for h in hosts:
            planner.upsert(h)
        t0 = time.perf_counter()
        planner.assignments(hosts[0].name)  # the first request after a change replans
        times.append(time.perf_counter() - t0)
    # one host leaves: the cost of a rebalance
    planner.remove([hosts[len(hosts) // 2].name])
    t0 = time.perf_counter()
    planner.assignments(hosts[0].name)
    rebalance = time.perf_counter() - t0

    peers = []
    probes = []
    tor_of = {h.name: h.topology for h in hosts}
    inter = 0
    for h in hosts[: min(len(hosts), 2000)]:
        _, targets = planner.assignments(h.name)
        dsts = {t.dst for t in targets}
        peers.append(len(dsts))
        probes.append(len(targets))
        inter += sum(1 for d in dsts if tor_of[d] != h.topology)
    rss = psutil.Process().memory_info().rss
    print(f"hosts: {n_hosts:,}  ToRs: {len({h.topology for h in hosts})}  budget: {args.budget}")
    print(
        f"plan time (peers of every host): best {min(times):.3f} s, "
        f"median {statistics.median(times):.3f} s  (target < 1 s)"
    )
    t0 = time.perf_counter()
    for h in hosts:
        planner.assignments(h.name)
    print(
        f"expanding every host's probe targets (as all agents fetch): "
        f"{time.perf_counter() - t0:.3f} s"
    )
    print(f"rebalance after one host left: {rebalance:.3f} s")
    print(
        f"peers per host: mean {statistics.mean(peers):.1f}, max {max(peers)}; "
        f"inter-ToR share {inter / max(1, sum(peers)):.0%}"
    )
    print(f"probe targets per host (3 kinds x 1 size): mean {statistics.mean(probes):.1f}")
    bursts = statistics.mean(probes) / (cfg.interval_ms / 1000)
    print(f"probe bursts per host per second at the default schedule: {bursts:.2f}")
    print(f"planner process resident memory: {rss / 2**20:,.0f} MiB\n")


if __name__ == "__main__":
    main()
