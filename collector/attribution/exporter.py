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

from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from fabricprobe.collector.attribution.core import Attribution
from fabricprobe.collector.attribution.families import ATTRIBUTION_FAMILIES
from fabricprobe.collector.attribution.histograms import HistogramSnapshot
from fabricprobe.collector.attribution.kvfold import FoldView
from fabricprobe.collector.attribution.linking import MatchConfig
from fabricprobe.collector.attribution.otlp import add_trace_service
from fabricprobe.collector.attribution.settle import WHY_REQUESTS
from fabricprobe.collector.drift import DriftBook
from fabricprobe.collector.exposition import gc_paused
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
        yield from new_families(ATTRIBUTION_FAMILIES).values()

    def collect(self) -> Iterator[Metric]:
        # the families' tens of thousands of samples are built with the cyclic collector
        # off (collector/exposition.py's reason): under generate_latest, which does not
        # pause it, the collections they set off walked the whole process
        with gc_paused():
            f = self._build()
        yield from f.values()

    def _build(self) -> dict[str, Any]:
        a = self.attribution
        f = new_families(ATTRIBUTION_FAMILIES)
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
        f["late"].add_metric([], float(counts.late_fragments))
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
