"""Prometheus view of the attribution: stage histograms, per-path KV transfer time, what
each path explains, fabric-bound flags, goodput beside throughput, OTLP intake.

Labels are bounded: `stage` takes the six stage names, `src`/`dst` are agent host
names (capped by attribution/histograms.py's MAX_PATHS), `transport` is rdma or tcp. Request
ids never become labels; they are in `probe why`. `attach_attribution()` is the one call
the collector's server makes to add the OTLP receiver, Why and these metrics.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from typing import Any, NamedTuple

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from fabricprobe.collector.attribution.core import Attribution
from fabricprobe.collector.attribution.histograms import HistogramSnapshot
from fabricprobe.collector.attribution.kvfold import FoldView
from fabricprobe.collector.attribution.linking import MatchConfig
from fabricprobe.collector.attribution.otlp import add_trace_service
from fabricprobe.collector.attribution.settle import WHY_REQUESTS
from fabricprobe.collector.drift import DriftBook
from fabricprobe.collector.exposition import gc_paused
from fabricprobe.collector.fabric.links import FabricLinks
from fabricprobe.collector.kvshape import KvShape
from fabricprobe.collector.price import tor_prices
from fabricprobe.collector.query import add_query_service
from fabricprobe.collector.store import WindowStore

P = "fabricprobe_"
PATH = ["src", "dst", "transport"]
NIXL_LABELS = ["host", "engine"]


class NixlFamily(NamedTuple):
    family: str  # a key of _families()
    scale: float  # to the exported unit


# agent/nixl.py's counter names -> where they are exported
NIXL_COUNTERS = {
    "transfers": NixlFamily("nixl_transfers", 1.0),
    "bytes": NixlFamily("nixl_bytes", 1.0),
    "xfer_time_us": NixlFamily("nixl_xfer", 1e-6),
    "post_time_us": NixlFamily("nixl_post", 1e-6),
    "errors": NixlFamily("nixl_errors", 1.0),
}


def _families() -> dict[str, Any]:  # each family's own add_metric signature
    return {
        "stage": HistogramMetricFamily(
            P + "stage_duration_seconds",
            "Inference stage duration from OTLP stage spans.",
            labels=["stage"],
        ),
        "kv": HistogramMetricFamily(
            P + "kv_transfer_seconds", "KV-cache transfer time per fabric path.", labels=PATH
        ),
        "ttft": HistogramMetricFamily(
            P + "request_ttft_seconds", "Time to first token per request.", labels=[]
        ),
        "itl": HistogramMetricFamily(
            P + "request_itl_seconds", "Mean inter-token latency per request.", labels=[]
        ),
        "explained": GaugeMetricFamily(
            P + "path_explained_seconds",
            "KV-transfer seconds beyond the fleet's speed for the same bytes, last window.",
            labels=PATH,
        ),
        "bound": GaugeMetricFamily(
            P + "path_fabric_bound",
            "1 when the path's KV transfers are slow and its fabric figures account for it.",
            labels=PATH,
        ),
        "fault": GaugeMetricFamily(
            P + "path_fabric_fault",
            "1 when the path's probe RTT floor stands out from the other paths' (evidence "
            "host noise cannot make), whether or not its transfers were slow.",
            labels=PATH,
        ),
        "host_bound": GaugeMetricFamily(
            P + "path_host_bound",
            "1 when the path's KV transfers ran mostly in windows where its hosts' own "
            "delay made most of its RTT rise, and the fabric does not account for them.",
            labels=PATH,
        ),
        "host_delay": GaugeMetricFamily(
            P + "path_host_delay_seconds",
            "What the path's hosts add to its probe RTT (their reference probes), median.",
            labels=PATH,
        ),
        "rho": GaugeMetricFamily(
            P + "path_kv_rtt_rank_correlation",
            "Spearman rho of KV-transfer time per byte with probe p99 RTT, newest window.",
            labels=PATH,
        ),
        "kv_share": GaugeMetricFamily(
            P + "kv_share_ttft_ratio",
            "Median share of TTFT the decode side waited for remote KV, last window.",
            labels=[],
        ),
        "share": GaugeMetricFamily(
            P + "fabric_share_ttft_ratio",
            "Median share of TTFT the path's fabric explains (fabric_s / TTFT), last window.",
            labels=[],
        ),
        "comm": GaugeMetricFamily(
            P + "communication_bound",
            "1 when KV transfer and queueing rise together while compute stays flat.",
            labels=[],
        ),
        "goodput": GaugeMetricFamily(
            P + "goodput_tokens_per_second",
            "Tokens per second from requests that met their TTFT and ITL targets.",
            labels=[],
        ),
        "throughput": GaugeMetricFamily(
            P + "throughput_tokens_per_second",
            "Tokens per second from all requests, last window.",
            labels=[],
        ),
        "received": CounterMetricFamily(
            P + "otlp_spans_received", "Spans received by the OTLP receiver.", labels=[]
        ),
        "rejected": CounterMetricFamily(
            P + "otlp_spans_rejected", "Spans refused as malformed or oversized.", labels=[]
        ),
        "ignored": CounterMetricFamily(
            P + "otlp_spans_ignored",
            "Spans taken but not used: other instrumentation, engine spans not mapped.",
            labels=[],
        ),
        "engine_spans": CounterMetricFamily(
            P + "otlp_engine_spans",
            "Spans received from inference engines, by engine.",
            labels=["engine"],
        ),
        "unmapped": CounterMetricFamily(
            P + "otlp_engine_spans_unmapped",
            "Engine spans whose name the receiver does not map (counted, not errors).",
            labels=["engine"],
        ),
        "path_known": CounterMetricFamily(
            P + "requests_path_known",
            "Engine requests whose KV path (prefill host -> decode host) was found.",
            labels=[],
        ),
        "path_unknown": CounterMetricFamily(
            P + "requests_path_unknown",
            "Engine requests whose path is unknown, by reason.",
            labels=["reason"],
        ),
        "kv_wait": GaugeMetricFamily(
            P + "path_kv_wait_seconds",
            "Median wait of the decode side for remote KV on the path, last window.",
            labels=PATH,
        ),
        "kv_fabric": GaugeMetricFamily(
            P + "path_kv_fabric_seconds",
            "Median of that wait the path's fabric explains (RTTs, bandwidth, loss, pauses;"
            " estimated), last window.",
            labels=PATH,
        ),
        "kv_stack": GaugeMetricFamily(
            P + "path_kv_transfer_stack_seconds",
            "Median of that wait the transfer library took beyond the fabric (NIXL's"
            " telemetry), last window.",
            labels=PATH,
        ),
        "kv_engine": GaugeMetricFamily(
            P + "path_kv_engine_wait_seconds",
            "Median of that wait left to the engines (scheduling, polling), last window.",
            labels=PATH,
        ),
        "tor_price": GaugeMetricFamily(
            P + "tor_pair_kv_cost_seconds",
            "Predicted fabric time of a 1 MiB KV transfer between the ToR pair's engine hosts"
            " now (worst host pair; quantile 0.5 or 0.99 of its RTT).",
            labels=["src_tor", "dst_tor", "quantile"],
        ),
        "price_answers": CounterMetricFamily(
            P + "kv_cost_answers",
            "Requests for the fabric's price, by answer: known, unknown (no fresh figures),"
            " refused (a bad argument).",
            labels=["answer"],
        ),
        "price_pairs": GaugeMetricFamily(
            P + "kv_cost_host_pairs",
            "Engine host pairs priced (known) or without fresh figures (unknown), last scrape.",
            labels=["state"],
        ),
        "kv_speed_flag": GaugeMetricFamily(
            P + "path_kv_speed_above_bandwidth",
            "1 when NIXL's KV speed on the path exceeds its measured bandwidth, last window.",
            labels=PATH,
        ),
        "nixl_transfers": CounterMetricFamily(
            P + "nixl_transfers",
            "NIXL KV transfers the engines on a host counted.",
            labels=NIXL_LABELS,
        ),
        "nixl_bytes": CounterMetricFamily(
            P + "nixl_bytes",
            "Bytes of NIXL KV transfers the engines on a host counted.",
            labels=NIXL_LABELS,
        ),
        "nixl_xfer": CounterMetricFamily(
            P + "nixl_transfer_seconds",
            "Seconds NIXL KV transfers took, summed, per host and engine.",
            labels=NIXL_LABELS,
        ),
        "nixl_post": CounterMetricFamily(
            P + "nixl_post_seconds",
            "Seconds from NIXL transfer start to its post to the backend, summed.",
            labels=NIXL_LABELS,
        ),
        "nixl_errors": CounterMetricFamily(
            P + "nixl_errors",
            "Failed NIXL KV transfers per host and engine.",
            labels=NIXL_LABELS,
        ),
        "analysis_failures": CounterMetricFamily(
            P + "attribution_failures",
            "Analyses that failed; the last good one was served instead.",
            labels=[],
        ),
        "dropped_values": CounterMetricFamily(
            P + "attribution_dropped",
            "Stage and request records dropped for figures out of range.",
            labels=[],
        ),
        "pairs_dropped": CounterMetricFamily(
            P + "attribution_pairs_dropped",
            "KV host pairs beyond the bound whose fabric history is not kept.",
            labels=[],
        ),
        "fold_dropped": CounterMetricFamily(
            P + "attribution_fold_dropped",
            "What the analysis's bounds left out, by what: transfers of paths beyond the"
            " bound (path), correlation pairs past a path's sample (rho), requests settled"
            " early or let go of (request), engine fragments let go of before their request"
            " was linked (fragment).",
            labels=["what"],
        ),
        "history_dropped": CounterMetricFamily(
            P + "fabric_history_dropped",
            "Reports whose fabric windows the join's history had no room for.",
            labels=[],
        ),
    }


def _put(family: Metric, labels: dict[str, str], value: Any) -> None:
    """A sample of FAMILY with LABELS (a family's add_metric, without a dict of its own
    for each sample); a figure that is not finite is not exported."""
    v = float(value)
    if math.isfinite(v):
        family.samples.append(Sample(family.name, labels, v))


class AttributionCollector(Collector):
    """Custom collector over an Attribution; describe() touches nothing."""

    def __init__(self, attribution: Attribution) -> None:
        self.attribution = attribution

    def describe(self) -> Iterator[Metric]:
        yield from _families().values()

    def collect(self) -> Iterator[Metric]:
        # the families' tens of thousands of samples are built with the cyclic collector
        # off (collector/exposition.py's reason): under generate_latest, which does not
        # pause it, the collections they set off walked the whole process
        with gc_paused():
            f = self._build()
        yield from f.values()

    def _build(self) -> dict[str, Any]:
        a = self.attribution
        f = _families()
        self._histograms(a.histograms.snapshot(), f)
        res = a.view_or_last()  # the fold: its cost follows the paths, not the requests
        if res is not None:
            self._analysis(res, f)
        ing = a.ingest.counts()
        counts = a.counts()
        f["received"].add_metric([], float(ing.received))
        f["rejected"].add_metric([], float(ing.rejected))
        f["history_dropped"].add_metric([], float(counts.history_dropped))
        f["analysis_failures"].add_metric([], float(counts.analysis_failures))
        f["dropped_values"].add_metric([], float(counts.dropped_values))
        f["pairs_dropped"].add_metric([], float(counts.pairs_dropped))
        for what, n in counts.fold_dropped:
            f["fold_dropped"].add_metric([what], float(n))
        f["ignored"].add_metric([], float(ing.ignored))
        for e in ing.engine_spans:
            f["engine_spans"].add_metric([e.engine], float(e.spans))
        for e in ing.unmapped:
            f["unmapped"].add_metric([e.engine], float(e.spans))
        f["path_known"].add_metric([], float(counts.path_known))
        for r in counts.path_unknown:
            f["path_unknown"].add_metric([r.reason], float(r.requests))
        self._nixl(f)
        self._prices(f)
        return f

    @staticmethod
    def _histograms(snap: HistogramSnapshot, f: dict[str, Any]) -> None:
        for st in snap.stages:
            f["stage"].add_metric([st.stage], list(st.figures.buckets), st.figures.sum)
        for p in snap.kv:
            f["kv"].add_metric([p.src, p.dst, p.transport], list(p.figures.buckets), p.figures.sum)
        f["ttft"].add_metric([], list(snap.ttft.buckets), snap.ttft.sum)
        f["itl"].add_metric([], list(snap.itl.buckets), snap.itl.sum)

    def _prices(self, f: dict[str, Any]) -> None:
        """The fabric's price per ToR pair of the host pairs engines use (bounded)."""
        a = self.attribution
        if a.store is None:
            return
        got = tor_prices(a.store, a.fabric.pairs())
        for (st, dt), (p50, p99) in got.prices.items():
            f["tor_price"].add_metric([st, dt, "0.5"], p50)
            f["tor_price"].add_metric([st, dt, "0.99"], p99)
        for answer, n in a.price_answers.snapshot().items():
            f["price_answers"].add_metric([answer], float(n))
        f["price_pairs"].add_metric(["known"], float(got.known))
        f["price_pairs"].add_metric(["unknown"], float(got.unknown))

    @staticmethod
    def _analysis(res: FoldView, f: dict[str, Any]) -> None:
        def add(name: str, labels: list[str], value: Any) -> None:
            v = float(value)
            if math.isfinite(v):  # a figure that is not finite is not exported
                f[name].add_metric(labels, v)

        # one label set a path, shared by its samples (tens of thousands of paths)
        label_sets: dict[tuple[str, str, str], dict[str, str]] = {}

        def labels_of(src: str, dst: str, tr: str) -> dict[str, str]:
            got = label_sets.get((src, dst, tr))
            if got is None:
                got = label_sets[(src, dst, tr)] = {
                    "src": src, "dst": dst, "transport": tr or "unknown",
                }  # fmt: skip
            return got

        p = res.paths
        cols = ("src", "dst", "transport", "explained_s", "fabric_bound", "fabric_fault",
                "host_bound", "host_delay_s")  # fmt: skip
        rows = zip(*(p[c].tolist() for c in cols), strict=True)
        for src, dst, tr, explained, bound, fault, host, delay in rows:
            labels = labels_of(src, dst, tr)
            _put(f["explained"], labels, explained)
            _put(f["bound"], labels, 1.0 if bound else 0.0)
            _put(f["fault"], labels, 1.0 if fault else 0.0)
            _put(f["host_bound"], labels, 1.0 if host else 0.0)
            _put(f["host_delay"], labels, delay)
        for key, rho in res.rho:
            _put(f["rho"], labels_of(*key), rho)
        parts = (
            (f["kv_wait"], "kv_wait_s"),
            (f["kv_fabric"], "fabric_s"),
            (f["kv_stack"], "transfer_stack_s"),
            (f["kv_engine"], "engine_wait_s"),
        )
        for key, fig in res.parts:
            labels = labels_of(*key)
            for fam, col in parts:  # an unknown part is not exported, never as 0
                _put(fam, labels, getattr(fig, col))
            if fig.speed_above is not None:
                _put(f["kv_speed_flag"], labels, 1.0 if fig.speed_above else 0.0)
        add("kv_share", [], res.kv_share_ttft)
        add("share", [], res.fabric_share_ttft)
        add("comm", [], 1.0 if res.communication_bound else 0.0)
        if len(res.goodput):
            g = res.goodput.iloc[0]
            add("goodput", [], g["goodput_tps"])
            add("throughput", [], g["throughput_tps"])

    def _nixl(self, f: dict[str, Any]) -> None:
        store = self.attribution.store
        if store is None:
            return
        for t in sorted(store.nixl_counter_totals()):
            fam = NIXL_COUNTERS.get(t.name)
            if fam is not None:
                f[fam.family].add_metric([t.host, t.engine], float(t.total) * fam.scale)


def attach_attribution(
    server: Any,
    store: WindowStore,
    registry: Any,
    stop: threading.Event,
    *,
    match: MatchConfig | None = None,
    drift: DriftBook | None = None,
    kv_models: dict[str, KvShape] | None = None,
    links: FabricLinks | None = None,
    why_requests: int = WHY_REQUESTS,
) -> Attribution:
    """Add the OTLP TraceService to SERVER (a grpc.Server), the attribution metrics to
    REGISTRY, and keep the fabric history fed from STORE until STOP is set. MATCH says how
    engine spans' host attributes name the agents' hosts; KV_MODELS the served models'
    KV shapes (the bytes of a request no span gives); WHY_REQUESTS how many settled
    requests `probe why` reads."""
    attribution = Attribution(store, match=match, kv_models=kv_models, why_requests=why_requests)
    add_trace_service(server, attribution.ingest)
    add_query_service(server, attribution, drift, links)
    registry.register(AttributionCollector(attribution))
    attribution.run_sync(stop)
    return attribution
