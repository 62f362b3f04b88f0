#!/usr/bin/env python3
"""The attribution under span load: --paths distinct span paths (prefill host -> decode
host), --pairs span pairs at --rate pairs an hour, and what that costs the collector.

A real WindowStore and Attribution in this process, on a simulated clock. Every
prefill and decode host registers as an agent; every --report-s seconds each prefill
host reports a window with an RTT sketch to each of its decode peers and to itself (its
reference), as an agent does. The span pairs arrive as real OTLP protobuf batches,
serialized and parsed again as the gRPC servicer does, through the real ingest:

* `vllm`  - a pair is the two `llm_request` spans of one request, the prefill side's
            and the decode side's, each from its own host's resource (host.name), linked
            by trace id (unmodified vLLM; the decode side's time_in_queue is the KV wait);
* `stage` - a pair is fabricprobe's own `kv_transfer` span (src, dst, bytes) and the
            request's `llm_request` span (probe workload).

The attribution's sync pass runs every 0.5 simulated seconds, as its thread does. The
figures: ingest CPU (the batches' parse and ingest and the sync passes, once the first
--warm-s simulated seconds are in) per pair and as cores at 10^6 pairs an hour; the
agents' reports' CPU apart; then --renders fresh /metrics renders (new spans came before
each) with prometheus_client's generate_latest over the registry the attribution's
collector is registered in, and as many as the collector's /metrics server renders them
(collector/exposition.py: the same bytes, the garbage collector paused; generate_latest's
CPU holds the collections the render's allocations set off over the whole process), the
series and bytes; and the process's RSS.

    python bench/span_load.py                                  # 10,000 paths
    python bench/span_load.py --paths 500 --pairs 20000 --spans stage
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
import zlib

import psutil
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts_pb
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from prometheus_client import CollectorRegistry, generate_latest

from fabricprobe.collector.attribution.core import Attribution
from fabricprobe.collector.attribution.exporter import AttributionCollector
from fabricprobe.collector.exposition import render
from fabricprobe.collector.store import WindowStore
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.sketchwire import to_wire
from fabricprobe.core.stats import LatencySketch

S = 1_000_000_000
T0 = 1_700_000_000 * S
SYNC_S = 0.5  # attribution/sync.py's pass interval


def slow(pre: str, dec: str) -> bool:
    """One path in 50 is slow: its RTT and its KV transfers."""
    return zlib.crc32(f"{pre}>{dec}".encode()) % 50 == 0


def attr(key: str, value: object) -> common_pb2.KeyValue:
    v = common_pb2.AnyValue()
    if isinstance(value, int):
        v.int_value = value
    elif isinstance(value, float):
        v.double_value = value
    else:
        v.string_value = str(value)
    return common_pb2.KeyValue(key=key, value=v)


class Fleet:
    """Prefill and decode hosts, the span paths between them, the simulated clock."""

    def __init__(self, paths: int) -> None:
        n_pre = math.isqrt(paths - 1) + 1
        n_dec = -(-paths // n_pre)
        self.pre = [f"pre-{i:04d}" for i in range(n_pre)]
        self.dec = [f"dec-{i:04d}" for i in range(n_dec)]
        self.paths = [(p, d) for p in self.pre for d in self.dec][:paths]
        self.peers: dict[str, list[str]] = {}
        for p, d in self.paths:
            self.peers.setdefault(p, []).append(d)
        self.now = T0
        self.rng = random.Random(7)
        self.seq: dict[str, int] = {}
        self.sketches = []
        for i in range(64):  # RTTs of 20-60 µs; one path in 50 is slow (2 ms)
            s = LatencySketch()
            base = 2_000_000 if i == 0 else 20_000 + 600 * i
            s.record_many([base + self.rng.randrange(5_000) for _ in range(20)])
            self.sketches.append(to_wire(s))

    def clock(self) -> int:
        return self.now

    def register(self, store: WindowStore) -> None:
        for i, h in enumerate(self.pre + self.dec):
            address = f"10.{i // 65536}.{i // 256 % 256}.{i % 256}"
            store.register(pb.HostInfo(host=h, addresses=[address]))

    def reports(self) -> list[pb.WindowReport]:
        """One window of every prefill host: each decode peer's RTT, and its reference."""
        out = []
        for h, peers in self.peers.items():
            seq = self.seq[h] = self.seq.get(h, 0) + 1
            r = pb.WindowReport(
                host=h, epoch=1, seq=seq, window_start_unix_ns=self.now - 10 * S,
                window_end_unix_ns=self.now,
            )  # fmt: skip
            for d in peers:
                sk = self.sketches[0 if slow(h, d) else 1 + (zlib.crc32(f"{d}{seq}".encode()) % 63)]
                r.probes.add(dst=d, transport="rdma", op="write", size=64, rtt=sk)
            r.probes.add(dst=h, transport="tcp", op="pingpong", size=64, rtt=self.sketches[5])
            out.append(r)
        return out

    def batch(self, n: int, first: int, kind: str) -> bytes:
        """N span pairs (request ids from FIRST) that ended in the last sync interval, as
        one serialized ExportTraceServiceRequest: one resource per sending host."""
        by_host: dict[str, list[trace_pb2.Span]] = {}
        for i in range(first, first + n):
            pre, dec = self.paths[self.rng.randrange(len(self.paths))]
            end = self.now - self.rng.randrange(int(SYNC_S * S))
            kv = 0.02 * (3.0 if slow(pre, dec) else 1.0) * self.rng.uniform(0.9, 1.2)
            rid = f"req-{i}"
            tid = (i + 1).to_bytes(16, "big")
            if kind == "vllm":
                pre_end = end - int(0.3 * S)
                by_host.setdefault(pre, []).append(
                    self._request(rid, tid, 1, pre_end - int(0.05 * S), pre_end, 0.002, 1)
                )
                by_host.setdefault(dec, []).append(
                    self._request(rid, tid, 2, end - int(0.3 * S), end, kv, 16)
                )
            else:
                start = end - int(0.4 * S)
                sp = trace_pb2.Span(
                    trace_id=tid, span_id=(3).to_bytes(8, "big"), name="kv_transfer",
                    start_time_unix_nano=start, end_time_unix_nano=start + int(kv * S),
                    attributes=[
                        attr("gen_ai.request.id", rid), attr("fabricprobe.src.host", pre),
                        attr("fabricprobe.dst.host", dec), attr("fabricprobe.transport", "rdma"),
                        attr("fabricprobe.bytes", 16 << 20),
                    ],
                )  # fmt: skip
                by_host.setdefault(dec, []).extend(
                    [sp, self._request(rid, tid, 4, start - S // 10, end, 0.002, 16)]
                )
        req = ts_pb.ExportTraceServiceRequest()
        for host, spans in by_host.items():
            rs = req.resource_spans.add()
            rs.resource.attributes.extend(
                [attr("host.name", host), attr("service.name", "vllm-" + host)]
            )
            ss = rs.scope_spans.add()
            ss.scope.name = "vllm"
            ss.spans.extend(spans)
        return req.SerializeToString()

    @staticmethod
    def _request(
        rid: str, tid: bytes, sid: int, start: int, end: int, queue: float, out: int
    ) -> trace_pb2.Span:
        e2e = (end - start) / S
        return trace_pb2.Span(
            trace_id=tid, span_id=sid.to_bytes(8, "big"), name="llm_request",
            start_time_unix_nano=start, end_time_unix_nano=end,
            attributes=[
                attr("gen_ai.request.id", rid),
                attr("gen_ai.latency.time_in_queue", queue),
                attr("gen_ai.latency.time_in_model_prefill", 0.01),
                attr("gen_ai.latency.time_in_model_decode", max(0.0, e2e - queue - 0.01)),
                attr("gen_ai.latency.time_to_first_token", queue + 0.01),
                attr("gen_ai.latency.e2e", e2e),
                attr("gen_ai.usage.prompt_tokens", 512),
                attr("gen_ai.usage.completion_tokens", out),
            ],
        )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--paths", type=int, default=10_000, help="distinct span paths")
    ap.add_argument("--pairs", type=int, default=100_000, help="span pairs fed")
    ap.add_argument("--rate", type=float, default=1e6, help="span pairs an hour")
    ap.add_argument("--spans", choices=("vllm", "stage"), default="vllm")
    ap.add_argument("--report-s", type=float, default=10.0, help="agents' report interval")
    ap.add_argument("--warm-s", type=float, default=90.0, help="simulated s before measuring")
    ap.add_argument("--renders", type=int, default=3, help="fresh renders of each kind")
    args = ap.parse_args()
    fleet = Fleet(args.paths)
    store = WindowStore(clock=fleet.clock)
    fleet.register(store)
    att = Attribution(store, clock=fleet.clock)
    registry = CollectorRegistry()
    registry.register(AttributionCollector(att))
    me = psutil.Process()
    rss0 = me.memory_info().rss
    per_sync = args.rate / 3600 * SYNC_S
    owed, fed, measured_pairs = 0.0, 0, 0
    ingest_cpu = report_cpu = 0.0
    next_report = fleet.now
    warm_until = T0 + int(args.warm_s * S)
    wall0 = time.perf_counter()
    while fed < args.pairs:
        fleet.now += int(SYNC_S * S)
        if fleet.now >= next_report:
            c0 = time.process_time()
            for r in fleet.reports():
                store.take(r)
            report_cpu += time.process_time() - c0
            next_report += int(args.report_s * S)
        owed += per_sync
        n = min(int(owed), args.pairs - fed)
        owed -= n
        blob = fleet.batch(n, fed, args.spans)
        c0 = time.process_time()
        att.ingest.export(ts_pb.ExportTraceServiceRequest.FromString(blob))
        att.sync()
        cpu = time.process_time() - c0
        fed += n
        if fleet.now >= warm_until:
            ingest_cpu += cpu
            measured_pairs += n
    wall = time.perf_counter() - wall0
    # fresh renders: new spans came (and were settled) before each; generate_latest, then
    # as the collector's /metrics server renders it (collector/exposition.py: the same
    # bytes, with the garbage collector paused)
    latest: list[float] = []
    served: list[float] = []
    for i in range(2 * args.renders):
        fleet.now += int(SYNC_S * S)
        blob = fleet.batch(10, fed + 10 * i, args.spans)
        att.ingest.export(ts_pb.ExportTraceServiceRequest.FromString(blob))
        att.sync()
        c0 = time.process_time()
        text = generate_latest(registry) if i % 2 == 0 else render(registry)
        (latest if i % 2 == 0 else served).append(time.process_time() - c0)
    rss = me.memory_info().rss
    series = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
    per_pair = ingest_cpu / measured_pairs if measured_pairs else float("nan")
    sim_s = (fleet.now - T0) / S
    print(
        f"{args.paths:,} span paths ({len(fleet.pre)} prefill x {len(fleet.dec)} decode hosts),"
        f" {fed:,} {args.spans} span pairs over {sim_s:,.0f} simulated s"
        f" ({args.rate:,.0f} an hour), {wall:,.0f} s wall"
    )
    print(f"{'figure':<52} {'value':>16}")
    for what, got in (("generate_latest", latest), ("as served", served)):
        spread = f"{statistics.median(got):.3f} / {max(got):.3f}"
        print(f"{f'/metrics render, {what} (CPU s, median / max)':<52} {spread:>16}")
    print(f"{'  series / bytes':<52} {f'{series:,} / {len(text):,}':>16}")
    print(f"{'ingest CPU per pair (ms)':<52} {per_pair * 1e3:>16.3f}")
    print(f"{'ingest at 10^6 pairs an hour (cores)':<52} {per_pair * 1e6 / 3600:>16.3f}")
    print(f"{'agents reports, all (CPU s)':<52} {report_cpu:>16.2f}")
    print(f"{'RSS (MiB; at start)':<52} {f'{rss / 2**20:,.0f} ({rss0 / 2**20:,.0f})':>16}")


if __name__ == "__main__":
    main()
