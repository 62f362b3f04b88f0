#!/usr/bin/env python3
"""The probe cost of covering every leaf-spine link of a 2-tier fabric with K ECMP
classes (collector/fabric/plan.py), and a check of the exact figure by simulation.

For each leaf, the classes leaving it must put K on each of its S uplinks. With ports
the driver picks from QP numbers, the switches hash each class onto a spine at random:
the least C per leaf for which every uplink gets K with probability P is exact (the
occupancy recursion), and a Monte-Carlo of the same throw checks it. With ports picked
after tracing (the UDP way chooses them), K x S per leaf is enough. The answers' way
back crosses the peer leaf's uplinks too, so the figures, which count only the way
out, are an upper bound. Printed: classes per leaf and per host, and probes per second
per host and fabric-wide at PROBES probes per class per window of WINDOW seconds.

    python bench/link_cover.py                   # 10,000 hosts, 64 spines, 32 per leaf
    python bench/link_cover.py --hosts 2048 --spines 16 --hosts-per-leaf 16
"""

from __future__ import annotations

import argparse
import random
import time

from fabricprobe.collector.fabric.plan import cover_cost, cover_probabilities


def simulate(classes: int, spines: int, k: int, trials: int, rng: random.Random) -> float:
    ok = 0
    for _ in range(trials):
        counts = [0] * spines
        for _ in range(classes):
            counts[rng.randrange(spines)] += 1
        ok += min(counts) >= k
    return ok / trials


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=10_000)
    ap.add_argument("--spines", type=int, default=64)
    ap.add_argument("--hosts-per-leaf", type=int, default=32)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--p", type=float, default=0.99)
    ap.add_argument("--probes", type=int, default=100, help="Probes per class per window.")
    ap.add_argument("--window", type=float, default=10.0, help="Window seconds.")
    ap.add_argument("--trials", type=int, default=2000, help="Monte-Carlo throws.")
    a = ap.parse_args()
    t0 = time.perf_counter()
    cost = cover_cost(a.hosts, a.spines, a.hosts_per_leaf, a.k, a.p, a.probes, a.window)
    exact_s = time.perf_counter() - t0
    c = cost.random_per_leaf
    sim = simulate(c, a.spines, a.k, a.trials, random.Random(1))
    below = simulate(c - 1, a.spines, a.k, a.trials, random.Random(2))
    q = cover_probabilities(c, a.spines, a.k)
    print(
        f"fabric: {a.hosts:,} hosts, {cost.leaves:,} leaves of {a.hosts_per_leaf}, "
        f"{a.spines} spines; every uplink crossed by >= {a.k} classes"
    )
    print(
        f"random ports : {c:,} classes per leaf for P >= {a.p} (exact P {q[c]:.4f}, "
        f"simulated {sim:.4f} over {a.trials:,}; with {c - 1:,}: exact {q[c - 1]:.4f}, "
        f"simulated {below:.4f}); computed in {exact_s:.2f} s"
    )
    print(f"chosen ports : {cost.chosen_per_leaf:,} classes per leaf (K x S)")
    for name, per_leaf in (("random", c), ("chosen", cost.chosen_per_leaf)):
        host = cost.per_host(per_leaf)
        print(
            f"  {name}: {host:,.1f} classes per host, {host * a.probes / a.window:,.0f} "
            f"probes/s per host, {cost.rate(per_leaf):,.0f} probes/s fabric-wide"
        )


if __name__ == "__main__":
    main()
