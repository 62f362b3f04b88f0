#!/usr/bin/env python3
"""CPU an agent spends per RDMA probe burst, on both ends, and what the default schedule
makes of it; the memory its kept links hold.

bench/agent_footprint.py measures the agent on loopback, where only TCP probes run. On
an RDMA host the agent also runs an RC ping-pong and a UD burst to each peer every
interval. Run this in the VM lane (it needs two lane hosts):

    lane/run.sh -- .venv/bin/python bench/rdma_burst_cost.py [--bursts 20] [--links 32]

For each kind (RC SEND with each engine, UD) it runs BURSTS bursts of the agent's shape
(10 exchanges of 64 B) from h0 to a `probe serve` on h1, two ways: one session per burst
(verbs resources and control session set up and torn down each time, as `probe rdma`
does) and over one kept link (as the agent does). It prints the CPU per burst of the
prober (this process) and of the responder (the serve process), and the share of one
core that the default schedule (every peer, each RDMA kind, once per 10 s) takes at 16
and 32 peers, probing and answering. Then it holds LINKS peers' worth of kept links (an
RC and a UD link each) open on both ends and prints the memory they take and the CPU
the responder spends while they sit idle. The lane emulates its CPU (QEMU TCG): Python
runs about 15 times slower there than natively, so CPU figures are upper bounds for a
real host.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from collector.assign import PlanConfig
from probes.control import wait_listening
from probes.rdma.rc import RcPingLink, rc_latency
from probes.rdma.ud import UdLink, ud_probe

PORT = 4798
KEEP_S = 120.0


def cpu(proc: psutil.Process) -> float:
    return float(sum(proc.cpu_times()[:2]))


def measure(
    responder: psutil.Process, bursts: int, burst: Callable[[], object]
) -> tuple[float, float, float]:
    """(prober CPU, responder CPU, wall) per burst over BURSTS bursts, in seconds."""
    burst()  # first-touch costs (and a kept link's setup) paid outside the figure
    r0 = cpu(responder)
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(bursts):
        burst()
    return (
        (time.process_time() - c0) / bursts,
        (cpu(responder) - r0) / bursts,
        (time.perf_counter() - t0) / bursts,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--bursts", type=int, default=20)
    ap.add_argument("--links", type=int, default=32, help="peers whose links are held open")
    args = ap.parse_args()
    lane = os.environ.get("LANE_FILE")
    if not lane:
        sys.exit("run it in the VM lane: lane/run.sh -- .venv/bin/python bench/rdma_burst_cost.py")
    hosts = json.loads(Path(lane).read_text())["hosts"]
    a, b = hosts[0], hosts[1]
    plan = PlanConfig()
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fabricprobe",
            "serve",
            "--listen",
            f"0.0.0.0:{PORT}",
            "--max-sessions",
            str(2 * args.links + 8),
        ],
        stderr=subprocess.DEVNULL,
    )
    held: list[RcPingLink | UdLink] = []
    try:
        wait_listening(b["ip"], PORT, timeout=120)
        responder = psutil.Process(serve.pid)
        where: dict[str, Any] = {"port": PORT, "bind": a["ip"]}

        def rc_link(engine: str) -> RcPingLink:
            link = RcPingLink(b["ip"], size=64, engine=engine, keepalive_s=KEEP_S, **where)
            held.append(link)
            return link

        def ud_link() -> UdLink:
            link = UdLink(b["ip"], keepalive_s=KEEP_S, **where)
            held.append(link)
            return link

        def rc_once(engine: str) -> Callable[[], object]:
            return lambda: rc_latency(
                b["ip"], op="send", size=64, iters=plan.count, warmup=1, engine=engine, **where
            )

        kinds: list[tuple[str, Callable[[], object], Callable[[], object]]] = []
        for engine in ("native", "pyverbs"):
            kept = rc_link(engine)
            kinds.append(
                (f"rc send {engine}", rc_once(engine), lambda k=kept: k.run(plan.count, warmup=1))
            )
        kept_ud = ud_link()
        kinds.append(
            (
                "ud",
                lambda: ud_probe(b["ip"], probes=plan.count, **where),
                lambda: kept_ud.run(plan.count),
            )
        )
        per: dict[tuple[str, str], float] = {}
        print(f"{args.bursts} bursts of {plan.count} exchanges, 64 B, h0 -> h1 (QEMU TCG):")
        for name, once, kept_burst in kinds:
            for how, burst in (("one session each", once), ("kept link", kept_burst)):
                prober, answer, wall = measure(responder, args.bursts, burst)
                per[name, how] = prober + answer
                print(
                    f"  {name:16s} {how:16s} prober {1e3 * prober:6.1f} ms CPU, responder "
                    f"{1e3 * answer:6.1f} ms CPU, {1e3 * wall:6.1f} ms wall per burst"
                )
        for how in ("one session each", "kept link"):
            both = per["rc send native", how] + per["ud", how]  # one peer, one interval
            shares = ", ".join(
                f"{peers} peers {100 * peers * both / (plan.interval_ms / 1000):.1f} %"
                for peers in (16, 32)
            )
            print(f"  default schedule ({how}; RC native + UD, both ends): {shares} of a core")
        for link in held:
            link.close()
        held.clear()
        time.sleep(2)
        rss0, mine0 = responder.memory_info().rss, psutil.Process().memory_info().rss
        for _ in range(args.links):
            rc_link("native").run(1)
            ud_link().run(1)
        time.sleep(1)
        rss1, mine1 = responder.memory_info().rss, psutil.Process().memory_info().rss
        r0, t0 = cpu(responder), time.monotonic()
        time.sleep(10)
        idle = (cpu(responder) - r0) / (time.monotonic() - t0)
        print(
            f"  {args.links} peers' links held ({2 * args.links} QPs a side): responder RSS "
            f"+{(rss1 - rss0) / 2**20:.1f} MiB (now {rss1 / 2**20:.0f} MiB), prober RSS "
            f"+{(mine1 - mine0) / 2**20:.1f} MiB (now {mine1 / 2**20:.0f} MiB); responder "
            f"CPU while they idle {100 * idle:.2f} % of a core"
        )
    finally:
        for link in held:
            link.close()
        serve.terminate()
        serve.wait(timeout=20)


if __name__ == "__main__":
    main()
