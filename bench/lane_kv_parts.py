#!/usr/bin/env python3
"""A KV wait's three parts against a known delay: with `tc netem` delaying the KV path by
d, a request's fabric_s must rise by d times the round trips its transfer waited for,
and its engine wait must not.

Agents on h0 and h1 of the soft-RoCE lane probe each other (RC latency and bandwidth)
into a collector in this process; the workload (the real pipeline: KV caches moved by
RDMA WRITE, `--outstanding` layers in flight) sends its requests h0 -> h1 with their spans
to the same collector over OTLP, each KV transfer's span saying the round trips it
waited for (`fabricprobe.round_trips`). Rounds take d = 0, 1 ms and 3 ms in turn, on h0's
netdev towards h1, so the probes and the transfers cross the same delay. After each
round the collector's Why (the Query API that `probe why` reads) gives every request's
kv_wait_s, fabric_s and engine_wait_s; per d the script prints their medians and, against
d = 0, the rise of fabric_s beside the rise d explains (round trips x d) and the rise of
engine_wait_s.

Runs in the lane (the delay needs the lane's netdevs; the milliseconds are emulation,
the rises against a known delay are the figure):

    lane/run.sh --hosts 3 -- .venv/bin/python bench/lane_kv_parts.py
    lane/run.sh --hosts 3 -- .venv/bin/python bench/lane_kv_parts.py --rounds 3 --delays 0,1ms,3ms
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from dataclasses import dataclass

import grpc  # type: ignore[import-untyped]  # grpcio ships no type hints
from lanefleet import kv_workload, lane_hosts, probing_fleet, workload_host

from fabricprobe.cli import netem
from fabricprobe.cli.sessions import served_sessions
from fabricprobe.collector.assign import PlanConfig
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.api import fabricprobe_pb2_grpc as pb_grpc
from fabricprobe.core.models import PRESETS
from fabricprobe.probes.responder import Responder
from fabricprobe.workload.pipeline import run_pipeline
from fabricprobe.workload.spans import SpanSender

PARTS = ("kv_wait_s", "fabric_s", "engine_wait_s", "rtt_p50_s")


@dataclass
class Row:
    """One request as the collector split it, with what its transfer waited for."""

    delay_s: float
    round_trips: int
    kv_wait_s: float
    fabric_s: float
    engine_wait_s: float
    rtt_p50_s: float  # the path's, as the join matched it
    fabric_source: str


def delay_seconds(spec: str) -> float:
    units = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
    for unit in ("us", "ms", "s"):
        if spec.endswith(unit):
            return float(spec[: -len(unit)]) * units[unit]
    return float(spec)


def split_requests(stub: pb_grpc.QueryStub, ids: dict[str, int], delay_s: float) -> list[Row]:
    """IDS' requests (id -> round trips) as the collector's Why splits them; waits up to
    60 s for all of them to carry a fabric figure (their path's probe windows arrive a
    report interval after the transfers)."""
    deadline = time.monotonic() + 60
    while True:
        reply = stub.Why(pb.WhyRequest(slowest=200, window_s=600, by="e2e_s"), timeout=30)
        got = {
            r.request_id: r for r in reply.slowest if r.request_id in ids and r.HasField("fabric_s")
        }
        if len(got) == len(ids) or time.monotonic() > deadline:
            break
        time.sleep(2)
    return [
        Row(
            delay_s=delay_s,
            round_trips=ids[rid],
            kv_wait_s=r.kv_wait_s,
            fabric_s=r.fabric_s,
            engine_wait_s=r.engine_wait_s,
            rtt_p50_s=r.rtt_p50_s,
            fabric_source=r.fabric_source,
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
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    delays = [d.strip() for d in args.delays.split(",")]

    lane = lane_hosts(2)
    h0, h1 = (workload_host(h) for h in lane)
    # 64 B probes for the RTT, 64 KiB ones for the bandwidth (the join and the price take
    # each from its own size)
    plan = PlanConfig(
        interval_ms=1000, count=10, budget=8, sizes=(64, 65536), kinds=("rdma_rc_lat", "rdma_rc_bw")
    )
    model = PRESETS["Llama-3.1-8B"]
    rows: list[Row] = []
    with (
        probing_fleet(lane, plan) as server,
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
                        cfg = kv_workload(model, args, responder.port, seed=r)
                        results = run_pipeline(
                            [(h0, h1)], cfg, on_request=lambda q: sender.emit(q, model.name)
                        )
                        time.sleep(4)  # the windows the transfers ran in, reported
                    finally:
                        netem.clear(lane[0]["netdev"])
                    sender.provider.force_flush(30_000)
                    ids = {q.request_id: q.kv_round_trips for q in results if not q.error}
                    got = split_requests(stub, ids, d)
                    print(f"round {r + 1}, {spec}: {len(got)} of {len(results)} requests split")
                    rows += got
        finally:
            sender.close()
    report(rows, delays)


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
        med[d] = {p: statistics.median(getattr(r, p) for r in rs) for p in PARTS}
        trips = statistics.median(r.round_trips for r in rs)
        print(
            f"{d * 1e3:4.0f}ms {len(rs):8d} {trips:11.0f}"
            + "".join(f" {med[d][p] * 1e3:11.3f} ms" for p in PARTS)
        )
    sources = sorted({r.fabric_source for r in rows})
    print(f"fabric_source: {', '.join(sources)}")
    if 0.0 not in med:
        print("no requests at d = 0: no rises to print")
        return
    print(
        f"\n{'delay':>6} {'fabric_s rise':>14} {'explained':>12} {'ratio':>6} {'engine rise':>12}"
    )
    for d, m in med.items():
        if d == 0.0:
            continue
        trips = statistics.median(r.round_trips for r in by[d])
        rise = m["fabric_s"] - med[0.0]["fabric_s"]
        want = trips * d
        engine = m["engine_wait_s"] - med[0.0]["engine_wait_s"]
        rtt = m["rtt_p50_s"] - med[0.0]["rtt_p50_s"]
        print(
            f"{d * 1e3:4.0f}ms {rise * 1e3:11.3f} ms {want * 1e3:9.3f} ms {rise / want:6.2f}"
            f" {engine * 1e3:9.3f} ms {rtt * 1e3:10.3f} ms"
        )
    print("(emulated soft-RoCE under QEMU's software CPU: the rises against d are the figure)")


if __name__ == "__main__":
    main()
