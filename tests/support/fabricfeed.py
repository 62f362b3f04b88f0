"""A fixture leaf-spine for the dashboards' Links and rails row: what only a routed
fabric with rails makes (traced ECMP classes, class windows, rail windows), sent through
the collector's API as agents on such a fabric would.

Four hosts on three leaves (fab-a and fab-b on leaf0, fab-c on leaf1, fab-d on leaf2), two
spines; each host probes each peer in two classes, one through each spine, and sends its
classes' traces with its first report. From round RISE_AT on, the classes through
leaf0->spine1 rise by 2 ms: that link is named suspect and no other. Each host also
probes its first peer on two rails, fab-a's rail 1 three times slower: that pair stands
out on rail 1.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from fabricprobe.collector.service import CollectorServer
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.sketchwire import to_wire
from fabricprobe.core.stats import LatencySketch

HOSTS = {"fab-a": "leaf0", "fab-b": "leaf0", "fab-c": "leaf1", "fab-d": "leaf2"}
LEAVES, SPINES = ("leaf0", "leaf1", "leaf2"), ("spine0", "spine1")
SLOW = "leaf0->spine1"
RISE_AT = 4  # rounds of baseline first (the localizer's warm-up is two windows)


def host_ip(h: str) -> str:
    return f"10.9.0.{list(HOSTS).index(h) + 1}"


def _cables() -> list[dict[str, object]]:
    """Every cable with a /31: host uplinks first, then leaf-spine."""
    pairs = [(h, leaf, "host") for h, leaf in HOSTS.items()]
    pairs += [(leaf, spine, "leaf-spine") for leaf in LEAVES for spine in SPINES]
    out = []
    for k, (a, b, tier) in enumerate(pairs):
        a_ip = host_ip(a) if tier == "host" else f"10.10.0.{2 * k}"
        out.append(
            {"a": a, "a_dev": f"{a}-{b}", "a_ip": a_ip, "b": b, "b_dev": f"{b}-{a}",
             "b_ip": f"10.10.0.{2 * k + 1}", "rail": 0, "tier": tier}
        )  # fmt: skip
    return out


def fabric_file(tmp: Path) -> Path:
    doc = {
        "routers": [
            {"name": n, "kind": "router", "rail": 0, "interfaces": []} for n in (*LEAVES, *SPINES)
        ],
        "links": _cables(),
        "nics": [
            {"name": h, "ip": host_ip(h), "rail": 0, "leaf": leaf} for h, leaf in HOSTS.items()
        ],
    }
    p = tmp / "fabric.json"
    p.write_text(json.dumps(doc))
    return p


def _ingress(node: str, prev: str) -> str:
    """NODE's address on its cable to PREV (where a probe from PREV comes in)."""
    for c in _cables():
        if (c["a"], c["b"]) == (node, prev):
            return str(c["a_ip"])
        if (c["b"], c["a"]) == (node, prev):
            return str(c["b_ip"])
    raise KeyError((node, prev))


def _hops(src: str, dst: str, spine: str) -> list[str]:
    a, b = HOSTS[src], HOSTS[dst]
    if a == b:
        return [_ingress(a, src)]
    return [_ingress(a, src), _ingress(spine, a), _ingress(b, spine)]


def _sport(cls: int, dst: str) -> int:
    return 0xC000 + 16 * cls + list(HOSTS).index(dst)


def _sketch(us: float, n: int = 40) -> pb.Sketch:
    sk = LatencySketch()
    for i in range(n):
        sk.record(int(us * 1000) + 7 * i)
    return to_wire(sk)


def fabric_windows(server: CollectorServer, seq: int) -> None:
    """Round SEQ (from 1) of every fixture host's report: its class windows, on the first
    round its class traces, and its rail windows; registers the hosts first."""
    now = time.time_ns()
    for src in HOSTS:
        if src not in server.store.hosts:
            server.api.register(pb.HostInfo(host=src, addresses=[host_ip(src)], topology="tor-f"))
        r = pb.WindowReport(
            host=src, epoch=11, seq=seq, window_start_unix_ns=now - 10**9, window_end_unix_ns=now
        )
        for dst in HOSTS:
            if dst == src:
                continue
            for cls, spine in enumerate(SPINES):
                hops = _hops(src, dst, spine)
                slow = (
                    seq >= RISE_AT
                    and HOSTS[src] == "leaf0"
                    and spine == "spine1"
                    and (HOSTS[dst] != "leaf0")
                )
                r.class_windows.add(
                    dst=dst, transport="rdma", op="ud", size=64, sport=_sport(cls, dst),
                    return_sport=0xD000 + cls, rtt=_sketch(2020.0 if slow else 20.0),
                )  # fmt: skip
                if seq == 1:
                    r.class_paths.add(
                        dst=dst, sport=_sport(cls, dst), src_ip=host_ip(src),
                        dst_ip=host_ip(dst), hops=hops, complete=True, method="ud",
                    )  # fmt: skip
            r.probes.add(dst=dst, transport="rdma", op="ud", size=64, rtt=_sketch(20.0, 80))
        first = next(h for h in HOSTS if h != src)
        for rail in (0, 1):
            us = 60.0 if rail == 1 and src == "fab-a" else 20.0
            r.rail_windows.add(
                dst=first, transport="rdma", op="ud", size=64, rail=rail, rtt=_sketch(us)
            )
        server.api.report(r)


def fabric_feed(stop: threading.Event, server: CollectorServer) -> threading.Thread:
    """fabric_windows() every 2 s until STOP."""

    def feed() -> None:
        n = 1
        while not stop.is_set():
            fabric_windows(server, n)
            n += 1
            stop.wait(2.0)

    t = threading.Thread(target=feed, name="fabric-feed", daemon=True)
    t.start()
    return t
