#!/usr/bin/env python3
"""One /metrics scrape of the collector in the text form (classic RTT buckets) and in the
protobuf form (native RTT histograms): bytes, gzip'd bytes, series and CPU.

A collector holding --paths probed paths (--peers per agent), each path's RTT sketch
filled with --samples values drawn around a RoCE-like 3 µs with a log-normal spread (a
fixed seed), renders its registry --repeat times in each form in this process; the CPU
figure is the median render (the families built from the store included, as a scrape
does). Series: text lines that are samples; in protobuf a native histogram is one
series, a classic one its buckets plus _sum and _count, anything else one. Last, what
each form resolves: one path's p50 and p99 read from the native buckets and from the
classic ones (histogram_quantile's linear interpolation inside a bucket, as Prometheus
does), against the recorded values.

    python bench/native_scrape.py
    python bench/native_scrape.py --paths 10000 --samples 2000
"""

from __future__ import annotations

import argparse
import gzip
import math
import random
import statistics
import time

from fabricprobe.collector.exposition import render
from fabricprobe.collector.service import CollectorServer, ServerConfig
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.cumulative import RTT_BUCKETS_S
from fabricprobe.core.nativehist import to_native
from fabricprobe.core.promproto import decode, encode
from fabricprobe.core.sketchwire import from_wire, to_wire
from fabricprobe.core.stats import LatencySketch


def draw(rng: random.Random, samples: int) -> list[int]:
    return [int(3_000 * rng.lognormvariate(0.0, 0.35)) for _ in range(samples)]


def fill(server: CollectorServer, paths: int, peers: int, samples: int) -> None:
    rng = random.Random(14)
    agents = max(2, -(-paths // peers))
    now = time.time_ns()
    made = 0
    for a in range(agents):
        host = f"h{a}"
        server.api.register(pb.HostInfo(host=host))
        r = pb.WindowReport(host=host, epoch=1, seq=1, window_end_unix_ns=now)
        for p in range(peers):
            if made == paths:
                break
            sk = LatencySketch()
            sk.record_many(draw(rng, samples))
            dst = f"h{(a + p + 1) % agents}"
            r.probes.add(dst=dst, transport="rdma", op="send", size=64, rtt=to_wire(sk))
            made += 1
        server.api.report(r)


def text_series(body: bytes) -> tuple[int, int]:
    lines = [ln for ln in body.split(b"\n") if ln and not ln.startswith(b"#")]
    return len(lines), sum(ln.startswith(b"fabricprobe_rtt_seconds") for ln in lines)


def proto_series(body: bytes) -> tuple[int, int, float]:
    total = rtt = buckets = 0
    for fam in decode(body):
        for m in fam.metric:
            h = m.histogram if m.HasField("histogram") else None
            n = 1 if h is None or h.positive_span else len(h.bucket) + 3
            total += n
            if fam.name == "fabricprobe_rtt_seconds":
                rtt += n
                buckets += sum(s.length for s in m.histogram.positive_span)
    return total, rtt, buckets / max(1, rtt)


def cpu_of(fn: object, repeat: int) -> tuple[bytes, float]:
    assert callable(fn)
    times, body = [], b""
    for _ in range(repeat):
        c0 = time.process_time()
        body = fn()
        times.append(time.process_time() - c0)
    return body, statistics.median(times)


def interpolate(buckets: list[tuple[float, float, int]], q: float) -> float:
    """histogram_quantile over (lower, upper, count) buckets, ascending."""
    rank = q * sum(n for _, _, n in buckets)
    running = 0
    for lo, hi, n in buckets:
        if n and running + n >= rank:
            return lo + (hi - lo) * (rank - running) / n
        running += n
    return math.nan


def bucket_bounds(index: int, schema: int) -> tuple[float, float]:
    """(lower, upper] of native bucket INDEX at SCHEMA, in seconds."""
    step = 2.0 ** (-schema)
    return 2.0 ** ((index - 1) * step), 2.0 ** (index * step)


def resolution(samples: int) -> None:
    values = draw(random.Random(14), samples)
    sk = LatencySketch()
    sk.record_many(values)
    merged = from_wire(to_wire(sk))
    nh = to_native(merged)
    native = [(*bucket_bounds(i, nh.schema), n) for i, n in nh.buckets]
    cum = merged.cumulative([round(b * 1e9) for b in RTT_BUCKETS_S])
    bounds = [0.0, *RTT_BUCKETS_S]
    classic = [
        (bounds[k], bounds[k + 1], cum[k] - (cum[k - 1] if k else 0))
        for k in range(len(RTT_BUCKETS_S))
    ]
    ordered = sorted(values)
    for q in (0.5, 0.99):
        exact = ordered[max(0, math.ceil(q * len(ordered)) - 1)] / 1e9
        n, c = interpolate(native, q), interpolate(classic, q)
        print(
            f"p{q * 100:g}: recorded {exact * 1e6:.3f} µs, "
            f"native {n * 1e6:.3f} µs ({(n / exact - 1) * 100:+.2f} %), "
            f"classic {c * 1e6:.3f} µs ({(c / exact - 1) * 100:+.2f} %)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--paths", type=int, default=1000)
    ap.add_argument("--peers", type=int, default=16)
    ap.add_argument("--samples", type=int, default=1000, help="RTT values per path")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    server = CollectorServer(ServerConfig(listen="127.0.0.1:0", metrics_listen=""))
    server.start()
    try:
        fill(server, args.paths, args.peers, args.samples)
        reg = server.registry
        text, text_cpu = cpu_of(lambda: render(reg), args.repeat)
        proto, proto_cpu = cpu_of(lambda: encode(reg.collect()), args.repeat)
    finally:
        server.stop(0)
    t_all, t_rtt = text_series(text)
    p_all, p_rtt, per = proto_series(proto)
    print(f"{args.paths} paths, {args.samples} RTT values each (median of {args.repeat} renders)")
    print(f"{'form':<9} {'bytes':>11} {'gzip':>10} {'series':>7} {'RTT series':>11} {'CPU s':>7}")
    for name, body, series, rtt, cpu in (
        ("text", text, t_all, t_rtt, text_cpu),
        ("protobuf", proto, p_all, p_rtt, proto_cpu),
    ):
        gz = len(gzip.compress(body, compresslevel=1))
        print(f"{name:<9} {len(body):>11,} {gz:>10,} {series:>7,} {rtt:>11,} {cpu:>7.3f}")
    print(f"native RTT buckets per series (schema 6, spans included): {per:.1f}")
    resolution(args.samples)


if __name__ == "__main__":
    main()
