"""The collector's own service on /metrics: its API calls timed and counted, what the
authentication layer refused and the limits it holds, and what its HTTP servers
(OTLP/HTTP, /metrics) turned away.

Each figure comes from its owner's snapshot (RpcStats, the gate's Limits, ScrapeStats,
WebStats), taken under that owner's lock; the families are the rows of
collector/families.py.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.core import Metric

from fabricprobe.collector.auth import REFUSALS, Gate, LimitCounts
from fabricprobe.collector.exposition import ScrapeStats
from fabricprobe.collector.families import (
    GATE_FAMILIES,
    HTTP_FAMILIES,
    RPC_FAMILIES,
    new_families,
)
from fabricprobe.collector.rpcstats import RPC_BUCKETS_S, RpcStats
from fabricprobe.core.web import REASONS as WEB_REASONS
from fabricprobe.core.web import WebCounts, WebStats

HTTP_LISTENERS = ("otlp", "metrics")  # the collector's HTTP servers (collector/service.py)
NO_LIMITS = LimitCounts(dict.fromkeys(REFUSALS, 0), 0, 0, 0)  # a collector without a gate
NO_WEB = WebCounts({}, 0, 0)  # a listener that is not serving


class ServerFamilies:
    """Builds the service's families afresh for each scrape."""

    def __init__(
        self,
        rpc: RpcStats,
        gate: Gate | None,
        scrapes: ScrapeStats,
        http: Mapping[str, WebStats],
    ) -> None:
        self.rpc, self.gate, self.scrapes, self.http = rpc, gate, scrapes, http

    def collect(self) -> Iterator[Metric]:
        yield from self.rpc_families()
        yield from self.gate_families()
        yield from self.http_families()

    def rpc_families(self) -> Iterator[Metric]:
        f = new_families(RPC_FAMILIES)
        counts = self.rpc.snapshot()
        for method, per_bucket in sorted(counts.buckets.items()):
            cum, running = [], 0
            for le, n in zip(RPC_BUCKETS_S, per_bucket, strict=False):
                running += n
                cum.append((f"{le:g}", float(running)))
            cum.append(("+Inf", float(sum(per_bucket))))
            f["rpc_duration"].add_metric([method], cum, counts.sums[method])
        for (method, code), n in sorted(counts.codes.items()):
            f["rpcs"].add_metric([method, code], float(n))
        yield from f.values()

    def gate_families(self) -> Iterator[Metric]:
        f = new_families(GATE_FAMILIES)
        gate = self.gate
        limits = gate.limits.snapshot() if gate is not None else NO_LIMITS
        for reason in REFUSALS:
            f["calls_refused"].add_metric([reason], float(limits.refused.get(reason, 0)))
        f["evicted"].add_metric([], float(limits.evicted))
        f["identities"].add_metric([], float(limits.identities))
        f["streams"].add_metric([], float(limits.streams))
        f["idle_cancelled"].add_metric([], float(gate.idle_cancelled if gate is not None else 0))
        yield from f.values()

    def http_families(self) -> Iterator[Metric]:
        f = new_families(HTTP_FAMILIES)
        scrapes = self.scrapes.snapshot()
        for reason in ScrapeStats.REASONS:
            f["scrapes_refused"].add_metric([reason], float(scrapes.refused[reason]))
        f["renders"].add_metric([], float(scrapes.renders))
        for listener in HTTP_LISTENERS:
            stats = self.http.get(listener)
            web = stats.snapshot() if stats is not None else NO_WEB
            for reason in WEB_REASONS:
                f["http_refused"].add_metric([listener, reason], float(web.refused.get(reason, 0)))
            f["http_connections"].add_metric([listener], float(web.connections))
        yield from f.values()
