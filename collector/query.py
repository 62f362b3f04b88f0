"""The Query service: `probe why` as a typed RPC over the attribution analysis, the
fabric's price of a KV transfer (`probe cost`, collector/price.py) and each path's whole
RTT distribution (`probe report`, collector/rttquery.py).

`why_reply()` turns one Analysis into a WhyReply (pure; tests call it bare);
`QueryServicer` is its gRPC edge. Who may call it is decided by the server's one
authentication layer (collector/auth.py), not here.
"""

from __future__ import annotations

import math
from typing import Any, TypeVar

import grpc  # type: ignore[import-untyped]  # grpcio ships no type hints
import pandas as pd

from fabricprobe.collector.attribution.analysis import Analysis
from fabricprobe.collector.attribution.core import Attribution
from fabricprobe.collector.attribution.join import RATE_FIELDS
from fabricprobe.collector.drift import DriftBook
from fabricprobe.collector.fabric.links import FabricLinks
from fabricprobe.collector.fabric.service import links_reply
from fabricprobe.collector.price import (
    CostError,
    PriceConfig,
    check_bytes,
    check_host,
    kv_price,
)
from fabricprobe.collector.rails import why_rails
from fabricprobe.collector.rttquery import check_rtt, ranked_rtt, rtt_reply
from fabricprobe.collector.store import WindowStore
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.api import fabricprobe_pb2_grpc as pb_grpc

MAX_WHY = 200
MAX_LINK_SPANS = MAX_WHY  # a Links ask's spans: `probe why --links`'s slowest requests
M = TypeVar("M", pb.SlowRequest, pb.PathRank)
Names = tuple[str, ...]
SORT_KEYS = ("e2e_s", "ttft_s", "kv_transfer_s", "itl_s", "kv_wait_s", "fabric_s")
MAX_WINDOW_S = 86_400.0
_REQUEST_FLOATS = (
    "queue_s", "prefill_s", "kv_transfer_s", "decode_s", "detokenize_s", "deliver_s", "ttft_s",
    "itl_s", "e2e_s", "fabric_share_ttft", "fabric_share_e2e", "rtt_min_s", "rtt_p50_s",
    "rtt_p99_s", "loss_ratio", "host_delay_s", "kv_wait_s", "fabric_s", "transfer_stack_s",
    "engine_wait_s", "over_explained_s", "kv_share_ttft", "kv_share_e2e",
)  # fmt: skip
_REQUEST_TEXTS = (
    "request_id", "src", "dst", "transport", "path_reason", "engine", "kv_source",
    "fabric_source", "transfer_stack_source", "kv_bytes_source",
)  # fmt: skip
_REQUEST_COUNTS = ("fabric_windows", "output_tokens", "kv_bytes")
_PATH_FLOATS = (
    "kv_median_s", "kv_ratio", "rtt_min_s", "rtt_p50_s", "rtt_p99_s", "rtt_ratio",
    "congestion_per_s", "explained_s", "host_delay_s",
)  # fmt: skip
_PATH_TEXTS = ("src", "dst", "transport")
_PATH_COUNTS = ("rank", "transfers")
_PATH_FLAGS = ("fabric_bound", "fabric_fault", "host_bound")


def _finite(v: Any) -> float | None:
    """A number that can go on the wire as a measured figure, else None."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _count(v: Any) -> int | None:
    f = _finite(v)
    return int(f) if f is not None and 0 <= f < 2**64 else None


def _text(v: Any) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def _filled(msg: M, row: dict[str, Any], texts: Names, counts: Names, floats: Names) -> M:
    """MSG with ROW's TEXTS, and those of its COUNTS and FLOATS that are figures (a figure
    that is not stays absent: 0 for a field that has no presence)."""
    for name in texts:
        setattr(msg, name, _text(row.get(name)))
    for name in counts:
        if (n := _count(row.get(name))) is not None:
            setattr(msg, name, n)
    for name in floats:
        if (f := _finite(row.get(name))) is not None:
            setattr(msg, name, f)
    return msg


def _slow_request(row: dict[str, Any]) -> pb.SlowRequest:
    msg = pb.SlowRequest(host_bound=_finite(row.get("host_bound")) == 1.0)
    _filled(msg, row, _REQUEST_TEXTS, _REQUEST_COUNTS, _REQUEST_FLOATS)
    for name, field in (("start_ns", "start_unix_ns"), ("end_ns", "end_unix_ns")):
        if (t := _count(row.get(name))) is not None and t < 2**63:
            setattr(msg, field, t)
    for name in RATE_FIELDS:
        if (f := _finite(row.get(name))) is not None:
            msg.counter_rates[name] = f
    return msg


def _path_rank(row: dict[str, Any]) -> pb.PathRank:
    msg = _filled(pb.PathRank(), row, _PATH_TEXTS, _PATH_COUNTS, _PATH_FLOATS)
    for name in _PATH_FLAGS:
        setattr(msg, name, bool(row.get(name)))
    return msg


def empty_reason(res: Analysis) -> str:
    """Why the analysis has no request on a path with fabric figures ("" when it has)."""
    if res.stages.empty:
        return (
            "no spans in the window: point the engines' OTLP exporter at the collector "
            "(docs/engines.md: Pointing an engine at fabricprobe)"
        )
    kv = res.kv
    if kv.empty:
        reasons = res.requests.get("path_reason")
        counts = reasons.value_counts().head(3) if reasons is not None else None
        why = (
            ", ".join(f"{r or 'none'} x{n}" for r, n in counts.items())
            if counts is not None and len(counts)
            else "no KV-transfer stage in the spans"
        )
        return f"{len(res.requests)} request(s), none joined to a fabric path ({why})"
    if not (pd.to_numeric(kv["fabric_windows"], errors="coerce").fillna(0) > 0).any():
        paths = sorted({f"{s}->{d}" for s, d in zip(kv["src"], kv["dst"], strict=True)})[:5]
        return (
            f"no fabric windows for the paths the spans crossed ({', '.join(paths)}): are "
            "agents running on those hosts, under the names the engines report?"
        )
    return ""


def why_reply(res: Analysis, slowest: int = 10, by: str = "e2e_s") -> pb.WhyReply:
    """The slowest requests of the analysed window with their path's figures at the time,
    the path ranking, the communication-bound flag and goodput."""
    if by not in SORT_KEYS:
        raise ValueError(f"cannot sort by {by!r} (one of {', '.join(SORT_KEYS)})")
    req = res.requests
    if by in req.columns:
        # an empty window (or one whose figures are all missing) has an object-typed column
        ranked = req.assign(**{by: pd.to_numeric(req[by], errors="coerce")}).dropna(subset=[by])
        top = ranked.nlargest(min(slowest, MAX_WHY), by)
    else:
        top = req.iloc[0:0]
    kv = res.kv.drop(columns=["stage", "derived"], errors="ignore")
    fabric_cols = [c for c in kv.columns if c not in top.columns or c == "request_id"]
    top = top.merge(kv[fabric_cols], on="request_id", how="left")
    reply = pb.WhyReply(
        now_ns=res.now_ns,
        communication_bound=bool(res.communication_bound),
        stages=len(res.stages),
    )
    reply.slowest.extend(_slow_request(r) for r in top.to_dict("records"))
    reply.paths.extend(_path_rank(r) for r in res.paths.to_dict("records"))
    reply.empty_reason = empty_reason(res)
    if len(res.goodput):
        g = res.goodput.iloc[0]
        reply.goodput.CopyFrom(
            pb.Goodput(
                requests=_count(g["requests"]) or 0,
                met=_count(g["met"]) or 0,
                tokens=_finite(g["tokens"]) or 0.0,
                goodput_tps=_finite(g["goodput_tps"]) or 0.0,
                throughput_tps=_finite(g["throughput_tps"]) or 0.0,
            )
        )
    return reply


def check_why(request: pb.WhyRequest) -> tuple[int, float | None, str]:
    """(slowest, window_s, by) of REQUEST; ValueError says what is out of range."""
    n = request.slowest or 10
    if not 1 <= n <= MAX_WHY:
        raise ValueError(f"slowest must be 1..{MAX_WHY}, not {n}")
    w = request.window_s
    if not math.isfinite(w) or not 0 <= w <= MAX_WINDOW_S:
        raise ValueError(f"window_s must be 0..{MAX_WINDOW_S:g} seconds")
    by = request.by or "e2e_s"
    if by not in SORT_KEYS:
        raise ValueError(f"cannot sort by {by[:40]!r} (one of {', '.join(SORT_KEYS)})")
    return n, (w or None), by


class QueryServicer(pb_grpc.QueryServicer):
    def __init__(
        self,
        attribution: Attribution,
        drift: DriftBook | None = None,
        links: FabricLinks | None = None,
    ) -> None:
        self.attribution = attribution
        self.drift = drift
        self.links = links
        # a price from figures older than a stale host's is no price
        stale = attribution.store.stale_after if attribution.store is not None else 30.0
        self.price = PriceConfig(max_age_s=stale)
        self.price_answers = attribution.price_answers  # exported with the attribution

    def Why(self, request: pb.WhyRequest, context: grpc.ServicerContext) -> pb.WhyReply:
        try:
            n, window_s, by = check_why(request)
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"why: {e}")
            raise AssertionError("context.abort returned") from None  # pragma: no cover
        try:
            res = self.attribution.analyse(window_s=window_s)
        except Exception as e:  # pandas raises many kinds; say so, stay up
            self.attribution.cache.count_failure()
            context.abort(grpc.StatusCode.INTERNAL, f"why: the analysis failed: {e!s:.200}")
            raise AssertionError("context.abort returned") from None  # pragma: no cover
        reply = why_reply(res, n, by)
        if self.attribution.store is not None:
            reply.rtt.extend(ranked_rtt(self.attribution.store, reply.paths))
            reply.rails.extend(why_rails(self.attribution.store, reply.paths))
        return reply

    def _store(self, context: grpc.ServicerContext, what: str) -> WindowStore:
        """The window store WHAT reads, or the call ends UNIMPLEMENTED: a collector made
        without one (an attribution over spans alone) keeps no paths."""
        store = self.attribution.store
        if store is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{what}: this collector keeps no paths")
            raise AssertionError("context.abort returned")  # pragma: no cover
        return store

    def Rtt(self, request: pb.RttRequest, context: grpc.ServicerContext) -> pb.RttReply:
        """Each path's RTT distribution since its first window (collector/rttquery.py)."""
        try:
            ask = check_rtt(request)
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"rtt: {e}")
            raise AssertionError("context.abort returned") from None  # pragma: no cover
        return rtt_reply(self._store(context, "rtt"), ask)

    def KvCost(self, request: pb.KvCostRequest, context: grpc.ServicerContext) -> pb.KvCostReply:
        """The fabric's price of REQUEST.bytes from src to dst now (collector/price.py)."""
        try:
            src = check_host(request.src, "src")
            dst = check_host(request.dst, "dst")
            if src == dst:
                raise CostError("src and dst are the same host: no fabric between them")
            nbytes = check_bytes(int(request.bytes))
        except CostError as e:
            self.price_answers.count("refused")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"kv cost: {e}")
            raise AssertionError("context.abort returned") from None  # pragma: no cover
        got = kv_price(self._store(context, "kv cost"), src, dst, nbytes, cfg=self.price)
        self.price_answers.count("known" if got.known else "unknown")
        return got.reply()

    def Links(self, request: pb.LinksRequest, context: grpc.ServicerContext) -> pb.LinksReply:
        """The links ranked (collector/fabric); the classes and flows from src to dst when
        asked, and those of each of the request's spans."""
        try:
            src = check_host(request.src, "src") if request.src else ""
            dst = check_host(request.dst, "dst") if request.dst else ""
            span = check_span(request.from_unix_ns, request.to_unix_ns)
            if len(request.spans) > MAX_LINK_SPANS:
                raise CostError(f"at most {MAX_LINK_SPANS} spans in one ask")
            spans = [
                (
                    check_host(s.src, f"spans[{i}].src"),
                    check_host(s.dst, f"spans[{i}].dst"),
                    check_span(s.from_unix_ns, s.to_unix_ns, f"spans[{i}]: "),
                )
                for i, s in enumerate(request.spans)
            ]
        except CostError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"links: {e}")
            raise AssertionError("context.abort returned") from None  # pragma: no cover
        return links_reply(self.links, src, dst, span, spans)

    def Drift(self, request: pb.DriftRequest, context: grpc.ServicerContext) -> pb.DriftReply:
        if self.drift is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "drift: this collector keeps no verdicts")
            raise AssertionError("context.abort returned")  # pragma: no cover
        if len(request.host) > 256:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "drift: host name too long")
        return self.drift.reply(request.host, request.include_waived)


def check_span(from_ns: int, to_ns: int, where: str = "") -> tuple[float, float] | None:
    """A Links ask's span in seconds: None for 0 and 0 (the last minute); CostError
    unless it is a span of at most a day."""
    if not from_ns and not to_ns:
        return None
    lo, hi = from_ns / 1e9, to_ns / 1e9
    if not 0 < lo <= hi or hi - lo > MAX_WINDOW_S:
        raise CostError(f"{where}from_unix_ns..to_unix_ns must be a span of at most a day")
    return lo, hi


def add_query_service(
    server: grpc.Server,
    attribution: Attribution,
    drift: DriftBook | None = None,
    links: FabricLinks | None = None,
) -> None:
    pb_grpc.add_QueryServicer_to_server(QueryServicer(attribution, drift, links), server)
