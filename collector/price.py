"""The fabric's price of a KV transfer: the predicted seconds for N bytes from a prefill
host to a decode host, from the path's current figures in the window store.

A scheduler choosing a decode host for a request asks what moving its KV cache there
would cost on the fabric now. The answer is the fabric part of a KV wait
(collector/kvparts.py: the protocol's round trips at the path's RTT, the bytes at its
measured bandwidth, a round trip per packet its probe loss says is lost) at the RTT's
p50 and at its p99, with the figures it came from and their age. A path with no
figures, or figures older than `max_age_s`, is answered "unknown" with the reason:
never a guess. Only the fabric is priced; the engines' own wait around a transfer is
not the path's.

`kv_price()` reads the store's views of the pair's paths (O(paths of the pair)); `kv_cost_http()`
is the `GET /v1/kv-cost` handler as a plain function (query parameters in, status and
JSON body out) for the collector's HTTP server to mount; `Price.reply()`
(fabricprobe.core.price) is the Query API's KvCost answer.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fabricprobe.collector.kvparts import (
    DEFAULT_RTTS,
    ONE_SIDED_OP,
    PROTOCOL_RTTS,
    fabric_seconds,
)
from fabricprobe.collector.store import PathView, WindowStore
from fabricprobe.core.price import Price
from fabricprobe.core.web import Call, Reply, Route

MAX_BYTES = 1 << 40  # 1 TiB: more than any request's KV cache
MAX_HOST = 253  # a DNS name's length; agents' host names are no longer
HOST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")
TRANSPORT_ORDER = ("rdma", "tcp")  # the figures of the path KV would take, best first
PARAMS = frozenset({"src", "dst", "bytes"})


ANSWERS = ("known", "unknown", "refused")


class AnswerCounts:
    """How price requests were answered (known, unknown, refused: a bad argument), for
    /metrics; safe across the server's threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._n = dict.fromkeys(ANSWERS, 0)

    def count(self, answer: str) -> None:
        with self._lock:
            self._n[answer] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._n)


@dataclass(frozen=True)
class PriceConfig:
    max_age_s: float = 30.0  # figures older than this are stale: the price is unknown
    max_bytes: int = MAX_BYTES


class CostError(ValueError):
    """A price request that is wrong; `status` is the HTTP status it is answered with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def check_host(name: str, what: str) -> str:
    if not name:
        raise CostError(f"{what} is required")
    if len(name) > MAX_HOST or not HOST_RE.fullmatch(name):
        raise CostError(f"{what} is not a host name")
    return name


def check_bytes(value: object, cfg: PriceConfig = PriceConfig()) -> int:
    """BYTES as a positive whole number at most cfg.max_bytes; CostError otherwise."""
    if isinstance(value, bool):
        raise CostError("bytes must be a whole number")
    if isinstance(value, str):
        if not value.isdigit() or len(value) > 20:  # digits only: no sign, no spaces
            raise CostError("bytes must be a positive whole number")
        value = int(value)
    if not isinstance(value, int):
        raise CostError("bytes must be a whole number")
    if not 1 <= value <= cfg.max_bytes:
        raise CostError(f"bytes must be 1..{cfg.max_bytes}")
    return value


def _newest(cands: Sequence[PathView], *, smallest: bool) -> PathView | None:
    """The candidate of the best transport (TRANSPORT_ORDER), then one-sided (an RDMA
    READ's RTT: no far-end software in it, ONE_SIDED_OP), then of the smallest probe
    size (SMALLEST: an RTT, whose larger sizes add their own serialization) or the
    largest (a bandwidth, which small messages hold to their message rate), newest
    within it."""
    if not cands:
        return None

    def rank(v: PathView) -> tuple[int, bool, int, int]:
        t = v.key.transport
        order = TRANSPORT_ORDER.index(t) if t in TRANSPORT_ORDER else len(TRANSPORT_ORDER)
        one_sided = v.key.op == ONE_SIDED_OP  # no software on the far end in its RTT
        return (-order, one_sided, -v.key.size if smallest else v.key.size, v.last_end_ns)

    return max(cands, key=rank)


def kv_price(
    store: WindowStore,
    src: str,
    dst: str,
    nbytes: int,
    *,
    now_ns: int | None = None,
    cfg: PriceConfig = PriceConfig(),
    views: list[PathView] | None = None,
) -> Price:
    """The price of moving NBYTES from SRC to DST now (arguments checked by the caller:
    check_host, check_bytes). The path's RTT comes from its newest latency window of the
    smallest probe size (either direction: a round trip crosses both), its bandwidth
    from its newest throughput window of the largest size (the direction the bytes flow
    first), at the highest throughput that path's windows measured; either missing or
    older than cfg.max_age_s makes the price unknown. VIEWS: the pair's paths
    (store.pair_paths), when the caller has them and knows both hosts are registered."""

    def unknown(reason: str, age_s: float | None = None) -> Price:
        return Price(src, dst, nbytes, known=False, reason=reason, age_s=age_s)

    now = store.clock() if now_ns is None else now_ns
    if views is None:
        for host in (src, dst):
            if not store.has_host(host):
                return unknown(f"host {host} is not registered")
        views = store.pair_paths(src, dst)
    rtt: list[PathView] = []
    bw_fwd: list[PathView] = []
    bw_rev: list[PathView] = []
    for v in views:
        if v.key.src == v.key.dst:
            continue
        if v.rtt is not None and v.rtt.count:
            rtt.append(v)
        if v.last_bytes_per_second:
            (bw_fwd if v.key.src == src else bw_rev).append(v)
    got_rtt = _newest(rtt, smallest=True)
    got_bw = _newest(bw_fwd, smallest=False) or _newest(bw_rev, smallest=False)
    if got_rtt is None:
        return unknown(f"no RTT probes between {src} and {dst}")
    if got_bw is None:
        return unknown(f"no bandwidth probes (tcp_bw, rdma_rc_bw) between {src} and {dst}")
    sketch = got_rtt.rtt
    assert sketch is not None
    p50_ns, p99_ns = sketch.percentiles_ns((50.0, 99.0))
    loss = sketch.loss_ratio
    # the path's capacity as its windows measured it, as the KV split uses it
    # (Attribution.bandwidth); its freshness is the newest bandwidth window's
    bps = float(got_bw.peak_bytes_per_second or 0.0)
    age = max(0.0, (now - min(got_rtt.last_end_ns, got_bw.last_end_ns)) / 1e9)
    if age > cfg.max_age_s:
        return unknown(f"figures {age:.0f} s old (fresh within {cfg.max_age_s:g} s)", age)
    if p50_ns is None or p99_ns is None or not bps > 0:
        return unknown("the path's newest window holds no figures")
    rtt50, rtt99 = p50_ns / 1e9, p99_ns / 1e9
    transport = got_rtt.key.transport
    return Price(
        src=src,
        dst=dst,
        bytes=nbytes,
        known=True,
        p50_s=fabric_seconds(nbytes, rtt50, bps, loss, transport),
        p99_s=fabric_seconds(nbytes, rtt99, bps, loss, transport),
        rtt_p50_s=rtt50,
        rtt_p99_s=rtt99,
        bandwidth_bytes_per_s=bps,
        loss_ratio=loss,
        age_s=age,
        transport=transport,
        rtts=PROTOCOL_RTTS.get(transport, DEFAULT_RTTS),
    )


def kv_cost_http(
    params: Mapping[str, Sequence[str] | str],
    store: WindowStore,
    cfg: PriceConfig = PriceConfig(),
    counts: AnswerCounts | None = None,
) -> tuple[int, dict[str, Any]]:
    """`GET /v1/kv-cost?src=A&dst=B&bytes=N`: PARAMS as the query string parsed (each a
    value or a list of them, as urllib.parse.parse_qs gives) -> (HTTP status, JSON body).

    400: a parameter missing, repeated, unknown or out of range; 404: a host the
    collector does not know; 200: the price, `known` false with the reason when the path
    has no fresh figures. Bodies are small and bounded: a value is echoed only once it
    passed as a host name. COUNTS (when given) counts each answer."""
    status, body = _kv_cost_http(params, store, cfg)
    if counts is not None:
        counts.count("refused" if status != 200 else "known" if body["known"] else "unknown")
    return status, body


def _kv_cost_http(
    params: Mapping[str, Sequence[str] | str], store: WindowStore, cfg: PriceConfig
) -> tuple[int, dict[str, Any]]:
    unexpected = set(params) - PARAMS
    if unexpected:
        return 400, {"error": f"unknown parameter(s): {len(unexpected)}; expected src, dst, bytes"}
    got: dict[str, str] = {}
    for name in sorted(PARAMS):
        raw = params.get(name)
        values = [raw] if isinstance(raw, str) else list(raw or [])
        if len(values) != 1 or not isinstance(values[0], str):
            return 400, {"error": f"{name} must be given once"}
        got[name] = values[0]
    try:
        src = check_host(got["src"], "src")
        dst = check_host(got["dst"], "dst")
        if src == dst:
            raise CostError("src and dst are the same host: no fabric between them")
        nbytes = check_bytes(got["bytes"], cfg)
        missing = [h for h in (src, dst) if not store.has_host(h)]
        if missing:
            raise CostError(f"host {missing[0]} is not registered", 404)
    except CostError as e:
        return e.status, {"error": str(e)}
    return 200, kv_price(store, src, dst, nbytes, cfg=cfg).as_dict()


PRICE_REFERENCE_BYTES = 1 << 20  # the size the ToR-pair series price: 1 MiB of KV cache
MAX_TOR_PRICES = 3000  # ToR pairs priced on /metrics, at most (as detail_max_tor_pairs)


@dataclass(frozen=True)
class TorPrices:
    """The price of PRICE_REFERENCE_BYTES per ToR pair, the worst of its host pairs."""

    prices: dict[tuple[str, str], tuple[float, float]]  # (src_tor, dst_tor) -> (p50, p99)
    known: int  # host pairs priced
    unknown: int  # host pairs with no fresh figures
    omitted: int  # ToR pairs beyond MAX_TOR_PRICES (the cheapest left out)


def tor_prices(
    store: WindowStore,
    pairs: Sequence[tuple[str, str]],
    *,
    nbytes: int = PRICE_REFERENCE_BYTES,
    cfg: PriceConfig = PriceConfig(),
    max_tors: int = MAX_TOR_PRICES,
) -> TorPrices:
    """Price each host pair of PAIRS (the KV paths engines use: bounded by the fabric
    history's MAX_PAIRS) and keep, per ToR pair of its hosts' topology labels, the worst
    p50 and p99: what a scheduler placing decode across ToRs pays at most. At most
    MAX_TORS ToR pairs, the dearest first."""
    now = store.clock()
    worst: dict[tuple[str, str], tuple[float, float]] = {}
    known = unknown = 0
    labels: dict[str, str | None] = {}  # host -> its topology label (None: not registered)

    def tor(host: str) -> str | None:
        if host not in labels:
            view = store.host_view(host)
            labels[host] = None if view is None else view.info.topology
        return labels[host]

    for a, b in pairs:
        ta, tb = tor(a), tor(b)
        tors = (ta, tb) if ta is not None and tb is not None else None
        views = store.pair_paths(a, b) if tors else []
        # no throughput window between them: no price (the reason is not shown here)
        priced = any(v.last_bytes_per_second and v.key.src != v.key.dst for v in views)
        p = kv_price(store, a, b, nbytes, now_ns=now, cfg=cfg, views=views) if priced else None
        if p is None or not p.known or p.p50_s is None or p.p99_s is None:
            unknown += 1
            continue
        known += 1
        assert tors is not None
        key = (tors[0] or "none", tors[1] or "none")
        old = worst.get(key, (0.0, 0.0))
        worst[key] = (max(old[0], p.p50_s), max(old[1], p.p99_s))
    kept = sorted(worst.items(), key=lambda kv: kv[1][1], reverse=True)[:max_tors]
    return TorPrices(dict(kept), known, unknown, max(0, len(worst) - max_tors))


KV_COST_PATH = "/v1/kv-cost"


def kv_cost_route(
    store: WindowStore, cfg: PriceConfig, counts: AnswerCounts | None, role: str
) -> Route:
    """`GET /v1/kv-cost` on an HTTP listener (collector/attribution/otlp_http.py's), for callers
    holding ROLE: kv_cost_http() with every value of each parameter (a repeated one is
    refused there), the answer as JSON."""

    def handle(call: Call) -> Reply:
        params: dict[str, list[str]] = {}
        for name, value in call.query.items():  # a multidict: repeats come as they were sent
            params.setdefault(name, []).append(value)
        status, body = kv_cost_http(params, store, cfg, counts)
        return Reply(status, json.dumps(body).encode(), "application/json")

    return Route((KV_COST_PATH,), ("GET",), role, handle)
