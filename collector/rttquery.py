"""The Rtt query: each path's whole RTT distribution, from the store's per-path sketches.

A path's `CumulativeSketch` (core/cumulative.py) holds every window the collector took
for it at the native histogram's resolution (schema 6: buckets 1.09 % wide), with exact
count, loss, min, max and sum. `rtt_reply()` reads it for every path: p50 to p99.9 from
the buckets (within 0.54 % of the agents' sketches' own percentiles), the exact figures
beside them, and for the first paths asked the CDF's buckets. A host's probe of its own
responder (src == dst) is its reference, the host's own delay, and travels apart from the
paths. The store's lock is held a chunk of paths at a time, never for the whole table.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fabricprobe.collector.pathtable import PathKey, PathStats
from fabricprobe.collector.price import CostError, check_host
from fabricprobe.collector.store import WindowStore, host_pair
from fabricprobe.core.api import fabricprobe_pb2 as pb

MAX_PATHS = 2000  # paths in one reply, and host references
DEFAULT_PATHS = 200
MAX_CDF_PATHS = 100  # of those, the ones sent with their CDF buckets
MIN_BUCKETS, MAX_BUCKETS, DEFAULT_BUCKETS = 16, 1024, 512  # CDF buckets a path
MAX_RANKED = 200  # paths of a Why reply's ranking given their distribution
CHUNK = 1000  # paths read under one hold of the store's lock
PERCENTILES = (50.0, 90.0, 99.0, 99.9)


@dataclass(frozen=True)
class RttAsk:
    max_paths: int = DEFAULT_PATHS
    cdf_paths: int = 0
    max_buckets: int = DEFAULT_BUCKETS
    src: str = ""
    dst: str = ""


def check_rtt(request: pb.RttRequest) -> RttAsk:
    """REQUEST's bounds and filters; ValueError says what is out of range."""
    n = request.max_paths or DEFAULT_PATHS
    if not 1 <= n <= MAX_PATHS:
        raise ValueError(f"max_paths must be 1..{MAX_PATHS}, not {n}")
    if not 0 <= request.cdf_paths <= MAX_CDF_PATHS:
        raise ValueError(f"cdf_paths must be 0..{MAX_CDF_PATHS}, not {request.cdf_paths}")
    b = request.max_buckets or DEFAULT_BUCKETS
    if not MIN_BUCKETS <= b <= MAX_BUCKETS:
        raise ValueError(f"max_buckets must be {MIN_BUCKETS}..{MAX_BUCKETS}, not {b}")
    try:
        src = check_host(request.src, "src") if request.src else ""
        dst = check_host(request.dst, "dst") if request.dst else ""
    except CostError as e:
        raise ValueError(str(e)) from None
    return RttAsk(n, min(request.cdf_paths, n), b, src, dst)


def path_rtt(key: PathKey, st: PathStats, max_buckets: int = 0) -> pb.PathRtt:
    """One path's distribution; with MAX_BUCKETS, its CDF buckets too (at most that many)."""
    src, dst, transport, op, size = key
    sk = st.rtt
    msg = pb.PathRtt(
        src=src,
        dst=dst,
        transport=transport,
        op=op,
        size=size,
        host_reference=src == dst,
        count=sk.count,
        lost=sk.lost,
        since_unix_ns=st.first_ns,
        newest_unix_ns=st.last_end_ns,
    )
    if sk.count and sk.min_ns is not None and sk.max_ns is not None:
        msg.min_s, msg.max_s, msg.mean_s = (
            sk.min_ns / 1e9,
            sk.max_ns / 1e9,
            sk.sum_ns / sk.count / 1e9,
        )
        figures = sk.percentiles_ns(PERCENTILES)
        for name, v in zip(("p50_s", "p90_s", "p99_s", "p999_s"), figures, strict=True):
            if v is not None:
                setattr(msg, name, v / 1e9)
    if max_buckets and sk.count:
        schema, buckets, zero = sk.cdf_buckets(max_buckets)
        msg.schema = schema
        msg.buckets.extend(i for i, _ in buckets)
        msg.counts.extend(n for _, n in buckets)
        msg.zero_count = zero
    return msg


def _slowest_first(m: pb.PathRtt) -> tuple[int, float]:
    """Sort key: every exchange lost first, then the highest p99."""
    return (0 if not m.count else 1, -m.p99_s if m.HasField("p99_s") else 0.0)


def _read(store: WindowStore, keys: list[PathKey], max_buckets: int = 0) -> list[pb.PathRtt]:
    """path_rtt() of each of KEYS still held that has an RTT or a loss, a chunk at a time."""
    out: list[pb.PathRtt] = []
    for i in range(0, len(keys), CHUNK):
        with store.lock:
            held = store.paths
            for k in keys[i : i + CHUNK]:
                st = held.get(k)
                if st is not None and (st.rtt.count or st.rtt.lost):
                    out.append(path_rtt(k, st, max_buckets))
    return out


def _key(m: pb.PathRtt) -> PathKey:
    return PathKey(m.src, m.dst, m.transport, m.op, m.size)


def rtt_reply(store: WindowStore, ask: RttAsk) -> pb.RttReply:
    """Every path's distribution matching ASK, the slowest first, within its bounds."""
    with store.lock:
        now = store.clock()
        keys = [
            k
            for k in store.paths
            if (not ask.src or k.src == ask.src) and (not ask.dst or k.dst == ask.dst)
        ]
    read = _read(store, keys)
    reply = pb.RttReply(now_ns=now)
    for field, refs in (("paths", False), ("host_references", True)):
        got = sorted((m for m in read if m.host_reference == refs), key=_slowest_first)
        setattr(reply, f"{field}_total", len(got))
        kept = got[: ask.max_paths]
        # the first cdf_paths again with their buckets, read anew so that the figures and
        # the CDF come from the same moment
        first = [_key(m) for m in kept[: ask.cdf_paths]]
        again = {_key(m): m for m in _read(store, first, ask.max_buckets)}
        getattr(reply, field).extend(again.get(_key(m), m) for m in kept)
    return reply


def ranked_rtt(store: WindowStore, ranked: Iterable[pb.PathRank]) -> list[pb.PathRtt]:
    """The distribution (no CDF) of every probed path of each of RANKED's (src, dst,
    transport), for a Why reply: at most MAX_RANKED paths."""
    wanted = {(r.src, r.dst, r.transport) for r in list(ranked)[:MAX_RANKED]}
    keys = store.paths_of_pairs({host_pair(s, d) for s, d, _ in wanted})
    keys = [k for k in keys if (k.src, k.dst, k.transport) in wanted]
    return _read(store, keys[:MAX_RANKED])
