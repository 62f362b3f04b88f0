#!/usr/bin/env python3
"""What /metrics costs the collector when many callers GET it at once.

A collector holding --agents agents x --peers paths serves /metrics on 127.0.0.1; for
each count of concurrent GETs (--clients, e.g. 1,8,32) every client GETs once at the
same moment, and the figures are the renders the server ran and the CPU seconds the
whole process spent (the clients' share is small: urllib reading bytes). With the
render cache, one render serves all the GETs within a second, so the CPU stays flat as
the number of callers grows; with --no-cache every GET renders, as before.

    python bench/metrics_scrapes.py
    python bench/metrics_scrapes.py --agents 500 --clients 1,16,64 --no-cache
"""

from __future__ import annotations

import argparse
import threading
import time
import urllib.request

from fabricprobe.collector.service import CollectorServer, ServerConfig
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.sketchwire import to_wire
from fabricprobe.core.stats import LatencySketch


def fill(server: CollectorServer, agents: int, peers: int) -> None:
    sk = LatencySketch()
    sk.record_many([20_000 + i * 37 for i in range(50)])
    wire = to_wire(sk)
    now = time.time_ns()
    for a in range(agents):
        host = f"h{a}"
        server.api.register(pb.HostInfo(host=host))
        r = pb.WindowReport(host=host, epoch=1, seq=1, window_end_unix_ns=now)
        for p in range(peers):
            r.probes.add(
                dst=f"h{(a + p + 1) % agents}", transport="tcp", op="pingpong", size=64, rtt=wire
            )
        server.api.report(r)


def burst(url: str, n: int) -> int:
    ok = [0]
    lock = threading.Lock()
    go = threading.Barrier(n)

    def one() -> None:
        go.wait()
        with urllib.request.urlopen(url, timeout=300) as r:
            r.read()
            if r.status == 200:
                with lock:
                    ok[0] += 1

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return ok[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=200)
    ap.add_argument("--peers", type=int, default=16)
    ap.add_argument("--clients", default="1,8,32", help="concurrent GET counts, comma-separated")
    ap.add_argument("--no-cache", action="store_true", help="render on every GET")
    args = ap.parse_args()
    cache_s = 0.0 if args.no_cache else 1.0
    server = CollectorServer(
        ServerConfig(
            listen="127.0.0.1:0",
            metrics_listen="127.0.0.1:0",
            metrics_threads=64,
            metrics_cache_s=cache_s,
        )
    )
    server.start()
    try:
        fill(server, args.agents, args.peers)
        url = f"http://127.0.0.1:{server.metrics_port}/metrics"
        print(f"{args.agents} agents x {args.peers} paths, cache {cache_s:g} s")
        print(f"{'GETs':>6} {'served':>7} {'renders':>8} {'CPU s':>7} {'wall s':>7}")
        for n in (int(x) for x in args.clients.split(",")):
            time.sleep(cache_s + 0.1)  # the cache of the previous burst has expired
            renders0 = server.scrapes.renders
            c0, w0 = time.process_time(), time.perf_counter()
            served = burst(url, n)
            cpu, wall = time.process_time() - c0, time.perf_counter() - w0
            renders = server.scrapes.renders - renders0
            print(f"{n:>6} {served:>7} {renders:>8} {cpu:>7.2f} {wall:>7.2f}")
    finally:
        server.stop(0)


if __name__ == "__main__":
    main()
