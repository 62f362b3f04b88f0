#!/usr/bin/env python3
"""CPU an agent spends per RDMA probe burst, on both ends, and what the default schedule
makes of it.

bench/agent_footprint.py measures the agent on loopback, where only TCP probes run. On
an RDMA host the agent also runs an RC ping-pong and a UD burst to each peer every
interval, and each burst sets up its own verbs resources and control session. Run this
in the VM lane (it needs two lane hosts):

    lane/run.sh -- .venv/bin/python bench/rdma_burst_cost.py [--bursts 20]

For each kind (RC SEND with each engine, UD) it runs BURSTS bursts of the agent's shape
(10 exchanges of 64 B) from h0 to a `probe serve` on h1 and prints the CPU per burst of
the prober (this process) and of the responder (the serve process), then the share of
one core that the default schedule (every peer, each RDMA kind, once per 10 s) would
take at 16 and 32 peers. The lane emulates its CPU (QEMU TCG): Python runs about 15
times slower there than natively, so these are upper bounds for a real host.
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
from probes.rdma.rc import rc_latency
from probes.rdma.ud import ud_probe

PORT = 4798


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bursts", type=int, default=20)
    args = ap.parse_args()
    lane = os.environ.get("LANE_FILE")
    if not lane:
        sys.exit("run it in the VM lane: lane/run.sh -- .venv/bin/python bench/rdma_burst_cost.py")
    hosts = json.loads(Path(lane).read_text())["hosts"]
    a, b = hosts[0], hosts[1]
    plan = PlanConfig()
    serve = subprocess.Popen(
        [sys.executable, "-m", "fabricprobe", "serve", "--listen", f"0.0.0.0:{PORT}"],
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(b["ip"], PORT, timeout=120)
        responder = psutil.Process(serve.pid)
        shape: dict[str, Any] = {"port": PORT, "bind": a["ip"]}

        def rc(engine: str) -> Callable[[], object]:
            return lambda: rc_latency(
                b["ip"], op="send", size=64, iters=plan.count, warmup=1, engine=engine, **shape
            )

        kinds: list[tuple[str, Callable[[], object]]] = [
            ("rc send native", rc("native")),
            ("rc send pyverbs", rc("pyverbs")),
            ("ud", lambda: ud_probe(b["ip"], probes=plan.count, **shape)),
        ]
        per: dict[str, float] = {}
        print(f"{args.bursts} bursts of {plan.count} exchanges, 64 B, h0 -> h1 (QEMU TCG):")
        for name, burst in kinds:
            burst()  # first-touch costs paid outside the figure
            r0 = sum(responder.cpu_times()[:2])
            c0, t0 = time.process_time(), time.perf_counter()
            for _ in range(args.bursts):
                burst()
            prober = (time.process_time() - c0) / args.bursts
            answer = (sum(responder.cpu_times()[:2]) - r0) / args.bursts
            wall = (time.perf_counter() - t0) / args.bursts
            per[name] = prober + answer
            print(
                f"  {name:16s} prober {1e3 * prober:6.1f} ms CPU, responder "
                f"{1e3 * answer:6.1f} ms CPU, {1e3 * wall:6.1f} ms wall per burst"
            )
        both = per["rc send native"] + per["ud"]  # what one peer costs a host per interval
        for peers in (16, 32):
            share = 100 * peers * both / (plan.interval_ms / 1000)
            print(
                f"  default schedule, {peers} peers (RC native + UD each, probing and "
                f"answering): {share:.1f} % of one emulated core"
            )
    finally:
        serve.terminate()
        serve.wait(timeout=20)


if __name__ == "__main__":
    main()
