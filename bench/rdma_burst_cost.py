#!/usr/bin/env python3
"""CPU an agent spends per RDMA probe burst, on both ends, and what the default schedule
makes of it; the memory its kept links hold.

bench/agent_footprint.py measures the agent on loopback, where only TCP probes run. On
an RDMA host the agent also runs an RC ping-pong and a UD burst to each peer every
interval. Run this in the VM lane (it needs two lane hosts):

    .venv/bin/python bench/rdma_burst_cost.py --reference         # on a real host
    lane/run.sh -- .venv/bin/python bench/rdma_burst_cost.py [--bursts 20] [--links 32] \
        [--host-reference-ms MS]

For each kind (RC SEND and UD, each with both engines) it runs BURSTS bursts of the agent's shape
(10 exchanges of 64 B) from h0 to a `probe serve` on h1, two ways: one session per burst
(verbs resources and control session set up and torn down each time, and a summary
built, as `probe rdma` does) and over one kept link, bare figures (as the agent does).
It prints the CPU per burst of the prober (this process) and of the responder (the
serve process), and the share of one core that the default schedule (every peer, each
RDMA kind, once per 10 s) takes at 16 and 32 peers, probing and answering. Then it holds
LINKS peers' worth of kept links (an RC and a UD link each) open on both ends and prints
the memory they take and the CPU the responder spends while they sit idle.

The lane emulates its CPU (QEMU TCG), so its CPU figures are far above a real host's.
To scale them, a fixed piece of the Python a burst runs is timed in the lane and, with
--reference, on a real host; given that figure (--host-reference-ms), the lane run
prints the ratio and the kept links' share of a core scaled by it. That is an upper
bound: in the lane the CPU also does the NIC's work (soft-RoCE), and busy polling waits
out an emulated RTT a hundred times longer than a real one; so it also prints the share
without the time both ends spin through the round trips (the sum of the RTT samples).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from array import array
from collections.abc import Callable
from functools import partial
from pathlib import Path

import psutil

from fabricprobe.cli.commands.serve import open_serve_argv
from fabricprobe.collector.assign import PlanConfig
from fabricprobe.core.stats import LatencySketch
from fabricprobe.probes.control import decode_payload, encode_message, wait_listening
from fabricprobe.probes.measure import LatencyRound, LinkParams
from fabricprobe.probes.rdma.rc import RcPingLink, rc_latency
from fabricprobe.probes.rdma.ud import UdLink

PORT = 4798
KEEP_S = 120.0


def cpu(proc: psutil.Process) -> float:
    return float(sum(proc.cpu_times()[:2]))


def measure(
    responder: psutil.Process, bursts: int, burst: Callable[[], object]
) -> tuple[float, float, float, float]:
    """(prober CPU, responder CPU, wall, time spent in round trips) per burst over BURSTS
    bursts, in seconds. The last is the sum of the burst's RTT samples (kept-link rounds
    carry them): both ends spin through it, waiting on the fabric."""
    burst()  # first-touch costs (and a kept link's setup) paid outside the figure
    r0 = cpu(responder)
    c0, t0 = time.process_time(), time.perf_counter()
    spin = 0
    for _ in range(bursts):
        out = burst()
        if isinstance(out, LatencyRound):  # UD: the RTTs with the responder's own delay
            spin += sum(out.raw_ns) if out.raw_ns else sum(out.rtt_ns)
    return (
        (time.process_time() - c0) / bursts,
        (cpu(responder) - r0) / bursts,
        (time.perf_counter() - t0) / bursts,
        spin / 1e9 / bursts,
    )


def start_serve(links: int) -> subprocess.Popen[bytes]:
    """A `probe serve` with room for LINKS peers' kept links."""
    return subprocess.Popen(
        open_serve_argv(
            f"0.0.0.0:{PORT}",
            *("--max-sessions", str(3 * links + 8), "--max-per-source", str(3 * links + 8)),
        ),
        stderr=subprocess.DEVNULL,
    )


def python_reference(rounds: int = 3000) -> float:
    """CPU seconds for a fixed piece of the Python a burst runs (control messages framed
    and parsed, a round's samples built and folded into a sketch): the yardstick that
    scales lane figures to a real host."""
    c0 = time.process_time()
    for i in range(rounds):
        msg = encode_message("again", {"params": {"iters": 11, "n": i}})
        decode_payload(msg[4:])
        samples = array("q", bytes(8 * 11))
        for j in range(11):
            samples[j] = 4000 + (i * j) % 997
        sketch = LatencySketch("rtt")
        sketch.record_many(samples.tolist())
    return time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--bursts", type=int, default=20)
    ap.add_argument("--links", type=int, default=32, help="peers whose links are held open")
    ap.add_argument(
        "--reference",
        action="store_true",
        help="only time the Python yardstick: run it on a real host",
    )
    ap.add_argument(
        "--host-reference-ms",
        type=float,
        help="the --reference figure of a real host: scales the lane's CPU figures",
    )
    args = ap.parse_args()
    plan = PlanConfig()
    if args.reference:
        best = min(python_reference() for _ in range(5))
        print(f"Python yardstick: {1e3 * best:.1f} ms CPU (pass --host-reference-ms to the lane)")
        return
    lane = os.environ.get("LANE_FILE")
    if not lane:
        sys.exit("run it in the VM lane: lane/run.sh -- .venv/bin/python bench/rdma_burst_cost.py")
    hosts = json.loads(Path(lane).read_text())["hosts"]
    a, b = hosts[0], hosts[1]
    serve = start_serve(args.links)
    held: list[RcPingLink | UdLink] = []
    try:
        wait_listening(b["ip"], PORT, timeout=600)  # a loaded host starts serve slowly in TCG
        responder = psutil.Process(serve.pid)

        def where(engine: str) -> LinkParams:
            return LinkParams(b["ip"], PORT, bind=a["ip"], engine=engine)

        def rc_link(engine: str) -> RcPingLink:
            link = RcPingLink(where(engine), size=64, keepalive_s=KEEP_S)
            held.append(link)
            return link

        def ud_link(engine: str = "auto") -> UdLink:
            link = UdLink(where(engine), keepalive_s=KEEP_S)
            held.append(link)
            return link

        def rc_once(engine: str) -> Callable[[], object]:
            return lambda: rc_latency(where(engine), op="send", size=64, iters=plan.count, warmup=1)

        def ud_once(engine: str) -> Callable[[], object]:
            def once() -> object:  # a session of its own for one round
                with UdLink(where(engine)) as kept:
                    return kept.run(plan.count)

            return once

        kinds: list[tuple[str, Callable[[], object], Callable[[], object]]] = []
        for engine in ("native", "pyverbs"):
            rc, ud = rc_link(engine), ud_link(engine)
            kinds.append(
                (f"rc send {engine}", rc_once(engine), partial(rc.round, plan.count, warmup=1))
            )
            kinds.append((f"ud {engine}", ud_once(engine), partial(ud.round, plan.count)))
        per: dict[tuple[str, str], tuple[float, float]] = {}
        print(f"{args.bursts} bursts of {plan.count} exchanges, 64 B, h0 -> h1 (QEMU TCG):")
        for name, once, kept_burst in kinds:
            for how, burst in (("one session each", once), ("kept link", kept_burst)):
                prober, answer, wall, spin = measure(responder, args.bursts, burst)
                per[name, how] = (prober + answer, spin)
                spun = f", {1e3 * spin:5.1f} ms of it in round trips" if spin else ""
                print(
                    f"  {name:16s} {how:16s} prober {1e3 * prober:6.1f} ms CPU, responder "
                    f"{1e3 * answer:6.1f} ms CPU, {1e3 * wall:6.1f} ms wall per burst{spun}"
                )
        interval = plan.interval_ms / 1000
        for how in ("one session each", "kept link"):
            both = per["rc send native", how][0] + per["ud native", how][0]  # a peer, a round
            shares = ", ".join(
                f"{peers} peers {100 * peers * both / interval:.1f} %" for peers in (16, 32)
            )
            print(f"  default schedule ({how}; RC + UD native, both ends): {shares} of a core")
        if args.host_reference_ms:
            factor = min(python_reference() for _ in range(5)) / (args.host_reference_ms / 1e3)
            rc_cost, ud_cost = per["rc send native", "kept link"], per["ud native", "kept link"]
            both = rc_cost[0] + ud_cost[0]
            spin = 2 * (rc_cost[1] + ud_cost[1])  # both ends spin through every round trip
            bound = 100 * 32 * both / factor / interval
            rest = 100 * 32 * max(0.0, both - spin) / factor / interval
            print(
                f"  the lane runs the Python yardstick {factor:.1f}x slower than the host. "
                f"Scaled by that, kept links at 32 peers take at most {bound:.2f} % of a real "
                f"core; {rest:.2f} % besides spinning through the lane's round trips (on a "
                f"real fabric that spin is the fabric's RTT, at both ends)"
            )
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
