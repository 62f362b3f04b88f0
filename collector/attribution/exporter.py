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

import pandas as pd
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from fabricprobe.collector.attribution.analysis import Analysis
from fabricprobe.collector.attribution.core import Attribution
from fabricprobe.collector.attribution.families import ATTRIBUTION_FAMILIES
from fabricprobe.collector.attribution.histograms import HistogramSnapshot
from fabricprobe.collector.attribution.linking import MatchConfig
from fabricprobe.collector.attribution.otlp import add_trace_service
from fabricprobe.collector.drift import DriftBook
from fabricprobe.collector.fabric.links import FabricLinks
from fabricprobe.collector.families import new_families
from fabricprobe.collector.kvshape import KvShape
from fabricprobe.collector.price import tor_prices
from fabricprobe.collector.query import add_query_service
from fabricprobe.collector.store import WindowStore


class NixlFamily(NamedTuple):
    family: str  # a key of ATTRIBUTION_FAMILIES
    scale: float  # to the exported unit


# agent/nixl.py's counter names -> where they are exported
NIXL_COUNTERS = {
    "transfers": NixlFamily("nixl_transfers", 1.0),
    "bytes": NixlFamily("nixl_bytes", 1.0),
    "xfer_time_us": NixlFamily("nixl_xfer", 1e-6),
    "post_time_us": NixlFamily("nixl_post", 1e-6),
    "errors": NixlFamily("nixl_errors", 1.0),
}


class AttributionCollector(Collector):
    """Custom collector over an Attribution; describe() touches nothing."""

    def __init__(self, attribution: Attribution) -> None:
        self.attribution = attribution

    def describe(self) -> Iterator[Metric]:
        yield from new_families(ATTRIBUTION_FAMILIES).values()

    def collect(self) -> Iterator[Metric]:
        a = self.attribution
        f = new_families(ATTRIBUTION_FAMILIES)
        self._histograms(a.histograms.snapshot(), f)
        res = a.analyse_or_last()
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
        f["ignored"].add_metric([], float(ing.ignored))
        for e in ing.engine_spans:
            f["engine_spans"].add_metric([e.engine], float(e.spans))
        for e in ing.unmapped:
            f["unmapped"].add_metric([e.engine], float(e.spans))
        f["path_known"].add_metric([], float(counts.path_known))
        for r in counts.path_unknown:
            f["path_unknown"].add_metric([r.reason], float(r.requests))
        if res is not None:
            self._kv_split(res.kv, f)
        self._nixl(f)
        self._prices(f)
        yield from f.values()

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
    def _analysis(res: Analysis, f: dict[str, Any]) -> None:
        def add(name: str, labels: list[str], value: Any) -> None:
            v = float(value)
            if math.isfinite(v):  # a figure that is not finite is not exported
                f[name].add_metric(labels, v)

        for row in res.paths.itertuples(index=False):
            labels = [str(row.src), str(row.dst), str(row.transport) or "unknown"]
            add("explained", labels, row.explained_s)
            add("bound", labels, 1.0 if row.fabric_bound else 0.0)
            add("fault", labels, 1.0 if row.fabric_fault else 0.0)
            add("host_bound", labels, 1.0 if row.host_bound else 0.0)
            add("host_delay", labels, row.host_delay_s)
        corr = res.correlation.dropna(subset=["rho_rtt_p99"])
        if len(corr):
            newest = corr[corr["window"] == corr["window"].max()]
            for row in newest.itertuples(index=False):
                labels = [str(row.src), str(row.dst), str(row.transport) or "unknown"]
                add("rho", labels, row.rho_rtt_p99)
        for name, col in (("kv_share", "kv_share_ttft"), ("share", "fabric_share_ttft")):
            got = res.requests.get(col)
            add(name, [], got.median() if got is not None and len(got) else math.nan)
        add("comm", [], 1.0 if res.communication_bound else 0.0)
        if len(res.goodput):
            g = res.goodput.iloc[0]
            add("goodput", [], g["goodput_tps"])
            add("throughput", [], g["throughput_tps"])

    @staticmethod
    def _kv_split(kv: Any, f: dict[str, Any]) -> None:
        if kv.empty or "fabric_s" not in kv.columns:
            return
        kv = kv.assign(transport=kv["transport"].replace("", "unknown"))
        parts = (
            ("kv_wait", "kv_wait_s"),
            ("kv_fabric", "fabric_s"),
            ("kv_stack", "transfer_stack_s"),
            ("kv_engine", "engine_wait_s"),
        )
        for (src, dst, tr), g in kv.groupby(["src", "dst", "transport"]):
            labels = [str(src), str(dst), str(tr)]
            for name, col in parts:
                v = pd.to_numeric(g[col], errors="coerce").median()
                if math.isfinite(v):  # an unknown part is not exported, never as 0
                    f[name].add_metric(labels, float(v))
            flags = g["kv_speed_above_path"].dropna()
            if len(flags):
                f["kv_speed_flag"].add_metric(labels, 1.0 if flags.astype(bool).any() else 0.0)

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
) -> Attribution:
    """Add the OTLP TraceService to SERVER (a grpc.Server), the attribution metrics to
    REGISTRY, and keep the fabric history fed from STORE until STOP is set. MATCH says how
    engine spans' host attributes name the agents' hosts; KV_MODELS the served models'
    KV shapes (the bytes of a request no span gives)."""
    attribution = Attribution(store, match=match, kv_models=kv_models)
    add_trace_service(server, attribution.ingest)
    add_query_service(server, attribution, drift, links)
    registry.register(AttributionCollector(attribution))
    attribution.run_sync(stop)
    return attribution
