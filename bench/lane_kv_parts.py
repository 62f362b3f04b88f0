#!/usr/bin/env python3
"""A KV wait's three parts against a known delay: with `tc netem` delaying the KV path by
d, a request's fabric_s must rise by d times the round trips its transfer waited for,
and its engine wait must not.

Agents on h0 and h1 of the soft-RoCE lane, each a `probe agent` process of its own
(`--inline-agents`: in this process), probe each other into a collector in this process:
one-sided RC READs of 64 B for the RTT (`rdma_rc_read`, which the join takes before any
ping-pong: the peer's NIC answers them, as it answers the transfers' WRITEs) and 64 KiB
RC WRITE streams for the bandwidth (`--kinds`). The workload (the real pipeline: KV
caches moved by RDMA WRITE, `--outstanding` layers in flight) sends its requests
h0 -> h1 with their spans to the same collector over OTLP, each KV transfer's span
saying the round trips it waited for (`fabricprobe.round_trips`). Rounds take d = 0,
1 ms and 3 ms in turn, on h0's netdev towards h1, so the probes and the transfers cross
the same delay. Each transfer's span gives its own time from the call that starts it
to its last completion (`fabricprobe.library_seconds`), and the decode side learns of
its KV at its next scheduler step (`--kv-poll-ms`), as an engine that polls its
transfers does: the wait holds the transfer and that polling. After each round the
collector's Why (the Query API that `probe why` reads) gives every request's
kv_wait_s, fabric_s, transfer_stack_s and engine_wait_s; per d the script prints their
medians, with the transfer's own time and the transferring thread's wait for a CPU
during it and during the poll after it (schedstat), and, against d = 0, the rise of
fabric_s beside the rise d explains (round trips x d), the rise the delay really gave
(round trips x the rise of 200 lone 64 B READs' RTT p50, measured on the path at each
delay before the transfers: netem under emulation adds more than d) and the rises of
transfer_stack_s, engine_wait_s and the two CPU waits.

The agents' probe loops busy-poll as they do by default (`--probe-spin-us -1`: 5 ms,
then a poll every 50 us). A READ has no loop on the peer, so one prober's poll is all
the CPU a probe takes. A loop asleep on completion events (`--probe-spin-us 0`) counts
its wake-up into every RTT that netem held, and into none at d = 0, where the READ
completes before the loop would sleep. With the two-sided ping-pong
(`--kinds rdma_rc_lat,rdma_rc_bw`), busy-polling loops at both ends of both directions
fought for the lane's two CPUs and lifted some windows' RTT p50 to 2-3x d before any
transfer ran (`--windows` prints them); sleeping loops were the better choice there.

Runs in the lane (the delay needs the lane's netdevs; the milliseconds are emulation,
the rises against a known delay are the figure):

    lane/run.sh --hosts 3 -- .venv/bin/python bench/lane_kv_parts.py
    lane/run.sh --hosts 3 -- .venv/bin/python bench/lane_kv_parts.py --rounds 3 --delays 0,1ms,3ms
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import grpc  # type: ignore[import-untyped]  # grpcio ships no type hints
from lanefleet import kv_workload, lane_hosts, probing_fleet, workload_host

from fabricprobe.cli import netem
from fabricprobe.cli.sessions import served_sessions
from fabricprobe.collector.assign import PlanConfig
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.api import fabricprobe_pb2_grpc as pb_grpc
from fabricprobe.core.models import PRESETS
from fabricprobe.probes.measure import LinkParams
from fabricprobe.probes.rdma import rc
from fabricprobe.probes.responder import Responder
from fabricprobe.workload.pipeline import Host, RequestResult, run_pipeline
from fabricprobe.workload.spans import SpanSender

PARTS = (
    "kv_wait_s",
    "fabric_s",
    "transfer_stack_s",
    "engine_wait_s",
    "library_s",
    "cpu_wait_s",
    "poll_cpu_wait_s",
    "rtt_p50_s",
    "lone_rtt_s",
)


@dataclass
class Row:
    """One request as the collector split it, with what its transfer waited for."""

    delay_s: float
    round_trips: int
    kv_wait_s: float
    fabric_s: float
    transfer_stack_s: float  # the transfer's own time beyond fabric_s (NaN: none given)
    engine_wait_s: float
    library_s: float  # the transfer's own time, its call to its last completion
    cpu_wait_s: float  # the transferring thread's wait for a CPU during it (NaN: unknown)
    poll_cpu_wait_s: float  # its wait for a CPU in the decode side's poll after it
    rtt_p50_s: float  # the path's, as the join matched it
    fabric_source: str
    lone_rtt_s: float  # 200 lone RDMA READs' RTT p50 on the path at this delay


def delay_seconds(spec: str) -> float:
    units = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
    for unit in ("us", "ms", "s"):
        if spec.endswith(unit):
            return float(spec[: -len(unit)]) * units[unit]
    return float(spec)


def lone_rtt(src: Host, dst: Host, port: int) -> float:
    """The path's RTT p50 from 200 lone one-sided RDMA READs of 64 B: what the delay
    really adds under emulation, beside what it is set to."""
    link = LinkParams(dst.address, port, bind=src.address)
    res = rc.rc_latency(link, op="read", size=64, iters=200, warmup=20)
    if res.error or res.summary.p50_us is None:
        sys.exit(f"the lone ping-pong failed: {res.error}")
    return res.summary.p50_us / 1e6


def print_windows(server: Any, pair: tuple[str, str], t_a: int, t_b: int) -> None:
    """The pair's smallest latency windows (both ways) from 6 s before the transfers began
    (T_A, the collector's clock) to T_B, each one's span in seconds from T_A."""
    index = server.attribution.fabric.index
    with server.attribution.fabric.index_lock:
        ws = [w for key in (pair, pair[::-1]) for w in index.any.get(key, [])]
    ws = [w for w in ws if w.rtt_p50_s is not None and w.end_ns > t_a - 6e9 and w.start_ns < t_b]
    if not ws:
        return
    size = min(w.size for w in ws)
    for w in sorted((w for w in ws if w.size == size), key=lambda w: w.end_ns):
        print(
            f"  {w.src}->{w.dst} {w.op} {w.size} B [{(w.start_ns - t_a) / 1e9:+6.2f}, "
            f"{(w.end_ns - t_a) / 1e9:+6.2f}] s: p50 {w.rtt_p50_s * 1e3:.3f} ms, min "
            f"{(w.rtt_min_s or 0) * 1e3:.3f} ms, {w.samples} samples"
        )
    print(f"  transfers: [+0.00, {(t_b - t_a) / 1e9:+6.2f}] s (with the report wait)")


def known(v: float | None) -> float:
    return math.nan if v is None else v


def split_requests(
    stub: pb_grpc.QueryStub, done: dict[str, RequestResult], delay_s: float, lone_s: float
) -> list[Row]:
    """DONE's requests (by id) as the collector's Why splits them; waits up to 60 s for
    all of them to carry a fabric figure (their path's probe windows arrive a report
    interval after the transfers)."""
    deadline = time.monotonic() + 60
    while True:
        reply = stub.Why(pb.WhyRequest(slowest=200, window_s=600, by="e2e_s"), timeout=30)
        got = {
            r.request_id: r
            for r in reply.slowest
            if r.request_id in done and r.HasField("fabric_s")
        }
        if len(got) == len(done) or time.monotonic() > deadline:
            break
        time.sleep(2)
    return [
        Row(
            delay_s=delay_s,
            round_trips=done[rid].kv_round_trips,
            kv_wait_s=r.kv_wait_s,
            fabric_s=r.fabric_s,
            transfer_stack_s=r.transfer_stack_s if r.HasField("transfer_stack_s") else math.nan,
            engine_wait_s=r.engine_wait_s,
            library_s=done[rid].kv_library_s,
            cpu_wait_s=known(done[rid].kv_cpu_wait_s),
            poll_cpu_wait_s=known(done[rid].kv_poll_cpu_wait_s),
            rtt_p50_s=r.rtt_p50_s,
            fabric_source=r.fabric_source,
            lone_rtt_s=lone_s,
        )
        for rid, r in got.items()
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--delays", default="0,1ms,3ms", help="netem delays on h0 -> h1, in turn")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of every delay")
    ap.add_argument("--requests", type=int, default=8, help="requests a round")
    ap.add_argument("--prompt-tokens", type=int, default=1, help="128 KiB of KV a token")
    ap.add_argument("--outstanding", type=int, default=4, help="KV WRITEs (layers) in flight")
    ap.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="requests a second (Poisson; 0: back to back, the transfers filling the probe "
        "windows they run in)",
    )
    ap.add_argument(
        "--kv-poll-ms",
        type=float,
        default=5.0,
        help="the decode side learns its KV has landed at its next scheduler step, every "
        "this many ms (0: at once)",
    )
    ap.add_argument(
        "--probe-spin-us",
        type=int,
        default=-1,
        help="the agents' --probe-spin-us (-1: their default, busy-poll 5 ms then poll every "
        "50 us; 0: sleep on completion events at once)",
    )
    ap.add_argument(
        "--kinds",
        default="rdma_rc_read,rdma_rc_bw",
        help="the probe kinds planned (rdma_rc_lat for the two-sided ping-pong's RTT)",
    )
    ap.add_argument(
        "--windows", action="store_true", help="print the path's latency windows each round"
    )
    ap.add_argument(
        "--inline-agents", action="store_true", help="agents in this process, not their own"
    )
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    delays = [d.strip() for d in args.delays.split(",")]

    lane = lane_hosts(2)
    h0, h1 = (workload_host(h) for h in lane)
    # 64 B probes for the RTT, 64 KiB ones for the bandwidth (the join and the price take
    # each from its own size)
    plan = PlanConfig(
        interval_ms=1000,
        count=10,
        budget=8,
        sizes=(64, 65536),
        kinds=tuple(args.kinds.split(",")),
    )
    model = PRESETS["Llama-3.1-8B"]
    rows: list[Row] = []
    with (
        probing_fleet(
            lane, plan, processes=not args.inline_agents, spin_us=args.probe_spin_us
        ) as server,
        Responder("0.0.0.0", 0, sessions=served_sessions(), auth=None) as responder,
        grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel,
    ):
        stub = pb_grpc.QueryStub(channel)
        sender = SpanSender(f"127.0.0.1:{server.port}")
        try:
            for r in range(args.rounds):
                for spec in delays:
                    d = delay_seconds(spec)
                    if d > 0:
                        netem.impair(lane[0]["netdev"], h1.address, delay=spec)
                    try:
                        time.sleep(4)  # two probe windows at this delay before the transfers
                        lone = lone_rtt(h0, h1, responder.port)
                        cfg = kv_workload(model, args, responder.port, seed=r)
                        t_a = time.time_ns()
                        results = run_pipeline(
                            [(h0, h1)], cfg, on_request=lambda q: sender.emit(q, model.name)
                        )
                        time.sleep(4)  # the windows the transfers ran in, reported
                    finally:
                        netem.clear(lane[0]["netdev"])
                    sender.provider.force_flush(30_000)
                    done = {q.request_id: q for q in results if not q.error}
                    got = split_requests(stub, done, d, lone)
                    print(f"round {r + 1}, {spec}: {len(got)} of {len(results)} requests split")
                    if args.windows:
                        print_windows(server, (h0.name, h1.name), t_a, time.time_ns())
                    rows += got
        finally:
            sender.close()
    report(rows, delays)


def median(values: list[float]) -> float:
    """The median of VALUES' known figures (NaN: none known)."""
    known = [v for v in values if not math.isnan(v)]
    return statistics.median(known) if known else math.nan


def report(rows: list[Row], delays: list[str]) -> None:
    by = {delay_seconds(s): [r for r in rows if r.delay_s == delay_seconds(s)] for s in delays}
    print(
        f"\n{'delay':>6} {'requests':>8} {'round trips':>11}" + "".join(f" {p:>14}" for p in PARTS)
    )
    med: dict[float, dict[str, float]] = {}
    for d, rs in by.items():
        if not rs:
            print(f"{d * 1e3:4.0f}ms        0")
            continue
        med[d] = {p: median([getattr(r, p) for r in rs]) for p in PARTS}
        trips = statistics.median(r.round_trips for r in rs)
        print(
            f"{d * 1e3:4.0f}ms {len(rs):8d} {trips:11.0f}"
            + "".join(f" {med[d][p] * 1e3:11.3f} ms" for p in PARTS)
        )
    print(f"fabric_source: {', '.join(sorted({r.fabric_source for r in rows}))}")
    if 0.0 not in med:
        print("no requests at d = 0: no rises to print")
        return
    print(
        f"\n{'delay':>6} {'fabric_s rise':>14} {'trips x d':>12} {'ratio':>6} "
        f"{'trips x lone':>13} {'ratio':>6} {'stack rise':>11} {'engine rise':>12} "
        f"{'CPU wait rise':>14} {'poll CPU wait rise':>19} {'RTT rise':>11}"
    )
    for d, m in med.items():
        if d == 0.0:
            continue
        trips = statistics.median(r.round_trips for r in by[d])
        rise = m["fabric_s"] - med[0.0]["fabric_s"]
        want = trips * d
        stack = m["transfer_stack_s"] - med[0.0]["transfer_stack_s"]
        engine = m["engine_wait_s"] - med[0.0]["engine_wait_s"]
        cpu = m["cpu_wait_s"] - med[0.0]["cpu_wait_s"]
        poll_cpu = m["poll_cpu_wait_s"] - med[0.0]["poll_cpu_wait_s"]
        rtt = m["rtt_p50_s"] - med[0.0]["rtt_p50_s"]
        lone = trips * (m["lone_rtt_s"] - med[0.0]["lone_rtt_s"])
        print(
            f"{d * 1e3:4.0f}ms {rise * 1e3:11.3f} ms {want * 1e3:9.3f} ms {rise / want:6.2f}"
            f" {lone * 1e3:10.3f} ms {rise / lone if lone > 0 else float('nan'):6.2f}"
            f" {stack * 1e3:8.3f} ms {engine * 1e3:9.3f} ms {cpu * 1e3:11.3f} ms"
            f" {poll_cpu * 1e3:16.3f} ms"
            f" {rtt * 1e3:8.3f} ms"
        )
    print("(emulated soft-RoCE under QEMU's software CPU: the rises against d are the figure)")


if __name__ == "__main__":
    main()
