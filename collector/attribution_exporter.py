"""Prometheus view of the attribution: stage histograms, per-path KV transfer time, what
each path explains, fabric-bound flags, goodput beside throughput, OTLP intake.

Labels are bounded: `stage` takes the six stage names, `src`/`dst` are agent host
names (capped by fabricprobe.collector.attribution.MAX_PATHS), `transport` is rdma or tcp. Request
ids never become labels; they are in `probe why`. `attach_attribution()` is the one call
the collector's server makes to add the OTLP receiver, Why and these metrics.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from fabricprobe.collector.attribution import Attribution
from fabricprobe.collector.otlp import add_trace_service
from fabricprobe.collector.query import add_query_service
from fabricprobe.collector.store import WindowStore

P = "fabricprobe_"
PATH = ["src", "dst", "transport"]


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
        "rho": GaugeMetricFamily(
            P + "path_kv_rtt_rank_correlation",
            "Spearman rho of KV-transfer time per byte with probe p99 RTT, newest window.",
            labels=PATH,
        ),
        "share": GaugeMetricFamily(
            P + "fabric_share_ttft_ratio",
            "Median share of TTFT spent in KV transfer over the last window.",
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
        "history_dropped": CounterMetricFamily(
            P + "fabric_history_dropped",
            "Reports whose fabric windows the join's history had no room for.",
            labels=[],
        ),
    }


class AttributionCollector(Collector):
    """Custom collector over an Attribution; describe() touches nothing."""

    def __init__(self, attribution: Attribution) -> None:
        self.attribution = attribution

    def describe(self) -> Iterator[Metric]:
        yield from _families().values()

    def collect(self) -> Iterator[Metric]:
        a = self.attribution
        f = _families()
        with a.lock:
            for stage, h in a.stage_hist.items():
                f["stage"].add_metric([stage], h.buckets(), h.total)
            for path, h in sorted(a.kv_hist.items()):
                f["kv"].add_metric(list(path), h.buckets(), h.total)
            f["ttft"].add_metric([], a.ttft_hist.buckets(), a.ttft_hist.total)
            f["itl"].add_metric([], a.itl_hist.buckets(), a.itl_hist.total)
        res = a.analyse_or_last()
        if res is not None:
            self._analysis(res, f)
        f["received"].add_metric([], float(a.ingest.received_total))
        f["rejected"].add_metric([], float(a.ingest.rejected_total))
        f["history_dropped"].add_metric([], float(a.history.inbox_dropped))
        f["analysis_failures"].add_metric([], float(a.analysis_failures))
        f["dropped_values"].add_metric([], float(a.dropped_values))
        f["pairs_dropped"].add_metric([], float(a.pairs_dropped))
        yield from f.values()

    @staticmethod
    def _analysis(res: Any, f: dict[str, Any]) -> None:
        def add(name: str, labels: list[str], value: Any) -> None:
            v = float(value)
            if math.isfinite(v):  # a figure that is not finite is not exported
                f[name].add_metric(labels, v)

        for row in res.paths.itertuples(index=False):
            labels = [str(row.src), str(row.dst), str(row.transport) or "unknown"]
            add("explained", labels, row.explained_s)
            add("bound", labels, 1.0 if row.fabric_bound else 0.0)
        corr = res.correlation.dropna(subset=["rho_rtt_p99"])
        if len(corr):
            newest = corr[corr["window"] == corr["window"].max()]
            for row in newest.itertuples(index=False):
                labels = [str(row.src), str(row.dst), str(row.transport) or "unknown"]
                add("rho", labels, row.rho_rtt_p99)
        share = res.requests["fabric_share_ttft"].median() if len(res.requests) else math.nan
        add("share", [], share)
        add("comm", [], 1.0 if res.communication_bound else 0.0)
        if len(res.goodput):
            g = res.goodput.iloc[0]
            add("goodput", [], g["goodput_tps"])
            add("throughput", [], g["throughput_tps"])


def attach_attribution(
    server: Any, store: WindowStore, registry: Any, stop: threading.Event
) -> Attribution:
    """Add the OTLP TraceService to SERVER (a grpc.Server), the attribution metrics to
    REGISTRY, and keep the fabric history fed from STORE until STOP is set."""
    attribution = Attribution(store)
    add_trace_service(server, attribution.ingest)
    add_query_service(server, attribution)
    registry.register(AttributionCollector(attribution))
    attribution.run_sync(stop)
    return attribution
