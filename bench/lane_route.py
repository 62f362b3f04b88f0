#!/usr/bin/env python3
"""TTFT when the fabric's price chooses the decode host, against decode hosts in turn.

One prefill host (h0) and two decode hosts (h1, h2) of the soft-RoCE lane; `tc netem`
delays everything h0 sends to h2 by --delay. Agents on the three hosts probe each other
(RC latency and RC bandwidth) into a collector in this process, so the collector can
price a KV transfer on each path (collector/price.py). Once both paths are priced,
rounds of the same workload (the real pipeline: KV caches moved by RDMA WRITE) alternate
`round-robin` and `fabric` routing (fabricprobe/workload/route.py, asking the collector's
KvCost over gRPC as `probe workload --route fabric` does), and TTFT p50 and p99 per route
are printed side by side, with where each route sent its requests.

Runs in the lane (the delay needs the lane's netdevs; figures are emulation, so only
the ratio of the two routes, measured side by side in one run, means anything):

    lane/run.sh --hosts 3 -- .venv/bin/python bench/lane_route.py
    lane/run.sh --hosts 3 -- .venv/bin/python bench/lane_route.py --delay 3ms --rounds 6
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections import Counter
from contextlib import closing

from lanefleet import kv_workload, lane_hosts, probing_fleet, workload_host

from fabricprobe.cli import netem
from fabricprobe.cli.sessions import served_sessions
from fabricprobe.collector.assign import PlanConfig
from fabricprobe.core.models import PRESETS
from fabricprobe.probes.responder import Responder
from fabricprobe.workload.pipeline import RequestResult, run_pipeline
from fabricprobe.workload.price import PriceClient
from fabricprobe.workload.route import FabricRouter, RoundRobin


def quantile(values: list[float], q: float) -> float:
    """The q-quantile by linear interpolation (numpy's default), of a few dozen values."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def wait_priced(
    client: PriceClient, src: str, dsts: list[str], nbytes: int, limit_s: float
) -> None:
    """Block until the collector prices every path SRC -> DST, or exit after LIMIT_S."""
    deadline = time.monotonic() + limit_s
    while True:
        costs = {d: client.cost(src, d, nbytes) for d in dsts}
        if all(c.known for c in costs.values()):
            return
        if time.monotonic() > deadline:
            why = "; ".join(f"{d}: {c.reason}" for d, c in costs.items() if not c.known)
            sys.exit(f"no price after {limit_s:.0f} s: {why}")
        time.sleep(2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--delay", default="3ms", help="netem delay on h0 -> h2")
    ap.add_argument("--rounds", type=int, default=4, help="rounds of each route, alternating")
    ap.add_argument("--requests", type=int, default=12, help="requests a round")
    ap.add_argument("--prompt-tokens", type=int, default=1, help="128 KiB of KV a token")
    ap.add_argument("--outstanding", type=int, default=1, help="KV WRITEs (layers) in flight")
    ap.add_argument("--warmup-s", type=float, default=600.0, help="longest wait for prices")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    lane = lane_hosts(3)
    h0, h1, h2 = (workload_host(h) for h in lane)
    # a burst per target every 2 s: the price's RTT and bandwidth stay fresh while the
    # probes leave the emulated machine to the workload
    plan = PlanConfig(interval_ms=2000, count=10, budget=8, kinds=("rdma_rc_lat", "rdma_rc_bw"))
    model = PRESETS["Llama-3.1-8B"]
    nbytes = model.kv_bytes(args.prompt_tokens)
    rows: dict[str, list[RequestResult]] = {"round-robin": [], "fabric": []}
    prices: list[str] = []
    netem.impair(lane[0]["netdev"], h2.address, delay=args.delay)
    try:
        with (
            probing_fleet(lane, plan) as server,
            closing(PriceClient(f"127.0.0.1:{server.port}", insecure=True, timeout_s=5.0)) as pc,
            Responder("0.0.0.0", 0, sessions=served_sessions(), auth=None) as responder,
        ):
            t0 = time.monotonic()
            wait_priced(pc, h0.name, [h1.name, h2.name], nbytes, args.warmup_s)
            print(f"priced after {time.monotonic() - t0:.0f} s")
            paths = [(h0, h1), (h0, h2)]
            for r in range(args.rounds):
                for route in ("round-robin", "fabric"):
                    costs = {d.name: pc.cost(h0.name, d.name, nbytes) for _, d in paths}
                    prices.append(
                        f"round {r + 1} {route:11}: "
                        + ", ".join(
                            f"{d} p99 {c.p99_s * 1e3:.2f} ms"
                            if c.known and c.p99_s is not None
                            else f"{d} unknown ({c.reason})"
                            for d, c in costs.items()
                        )
                    )
                    router = FabricRouter(pc.cost) if route == "fabric" else RoundRobin()
                    cfg = kv_workload(model, args, responder.port, seed=r)
                    rows[route] += run_pipeline(paths, cfg, router=router)
    finally:
        netem.clear(lane[0]["netdev"])

    print("\n".join(prices))
    print(
        f"\n{model.name}, {args.prompt_tokens} prompt tokens ({nbytes / 2**20:.2f} MiB of KV a"
        f" request), {args.outstanding} WRITEs in flight; {args.delay} on {h0.name}->{h2.name}"
    )
    print(f"{'route':12} {'requests':>8} {'failed':>6} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12}"
          f"  decode hosts")  # fmt: skip
    p99 = {}
    for route, results in rows.items():
        ok = [r for r in results if not r.error]
        ttft = [r.ttft_s * 1e3 for r in ok]
        where = Counter(r.dst.name for r in ok)
        p99[route] = quantile(ttft, 0.99)
        print(
            f"{route:12} {len(results):8d} {len(results) - len(ok):6d}"
            f" {quantile(ttft, 0.5):12.2f} {p99[route]:12.2f}  "
            + ", ".join(f"{h} {n}" for h, n in sorted(where.items()))
        )
    print(f"\nTTFT p99, fabric over round-robin: {p99['fabric'] / p99['round-robin']:.2f}")
    print("(emulated soft-RoCE under QEMU's software CPU: the ratio is the figure, not the ms)")


if __name__ == "__main__":
    main()
