"""Map the window store to Prometheus metric families (a custom prometheus_client collector).

Reading is apart from exporting: WindowStore holds the figures, this module only names
them. Every family is built fresh on each scrape from its row in collector/families.py;
describe() lists them without touching the store, so registering the collector is free.
Names follow collector/metrics.toml, which a test holds to what collect() really yields.

A scrape picks what it shows one by one (collector/detail.py), copies only that out of
the store (WindowStore.snapshot), and fills the families group by group: paths, counters,
hosts and their agents, the store's totals, then the fleet and ToR-pair aggregates. The
collector's own service figures come from collector/serverfamilies.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from fabricprobe.collector.auth import Gate
from fabricprobe.collector.detail import (
    HOST_REASONS,
    MIN_BASELINE_WINDOWS,
    PATH_REASONS,
    TOR_REASONS,
    DetailSelector,
    Selection,
    tor_label,
)
from fabricprobe.collector.exposition import ScrapeStats
from fabricprobe.collector.families import (
    AGENT_FAMILIES,
    PFC_DURATIONS,
    SCRAPE_DURATION,
    STORE_FAMILIES,
    TOTAL_FAMILIES,
    new_families,
    sketch_histogram,
)
from fabricprobe.collector.pathfold import FoldConfig, PathFold
from fabricprobe.collector.rpcstats import RpcStats
from fabricprobe.collector.serverfamilies import ServerFamilies
from fabricprobe.collector.store import DROPS, PathKey, PathStats, StoreSnapshot, WindowStore
from fabricprobe.core.errors import REFUSAL_REASONS
from fabricprobe.core.web import WebStats

Families = dict[str, Any]  # key (collector/families.py) -> the family being filled

# Counters whose rate an alert rule watches (grafana/build.py): a host over one of these
# thresholds has its counters shown by the collector (collector/detail.py), not only by
# its own agent. rx_pause_duration_us: 0.1 s paused a second (FabricprobePfcPauseStorm).
ALERT_RATES: dict[str, float] = {
    "rx_pause_duration_us": 0.1e6,
    "roce_adp_retrans": 1.0,
    "local_ack_timeout_err": 1.0,
    "packet_seq_err": 1.0,
    "to_retransmits": 1.0,
}
FOOTPRINT_CPU = 0.01  # FabricprobeAgentFootprint: 1 % of a core...
FOOTPRINT_RSS = 64 << 20  # ...or 64 MiB resident


class FabricCollector(Collector):
    """prometheus_client collector over a WindowStore."""

    def __init__(
        self,
        store: WindowStore,
        rpc: RpcStats | None = None,
        gate: Gate | None = None,
        scrapes: ScrapeStats | None = None,
        detail: DetailSelector | None = None,
        topology: Callable[[str], str | None] | None = None,
        http: dict[str, WebStats] | None = None,
    ) -> None:
        self.store = store
        # the service's own figures; HTTP: listener -> its server's counts (core/web.py)
        self.server = ServerFamilies(rpc or RpcStats(), gate, scrapes or ScrapeStats(), http or {})
        self.detail = detail or DetailSelector()
        self._topology = topology  # a host this collector does not hold (the fleet's plan)
        d = self.detail.cfg
        # the ranking figures, folded as reports arrive (collector/pathfold.py)
        self.fold = PathFold(
            self.topology,
            FoldConfig(d.worst_k, d.loss_alert, d.tail_factor, MIN_BASELINE_WINDOWS),
        )
        store.add_fold(self.fold)

    def topology(self, host: str) -> str:
        """HOST's ToR label: its registration here, else the plan's, else 'unknown'."""
        h = self.store.host_view(host)
        if h is not None:
            return tor_label(h.info.topology)
        return tor_label((self._topology(host) if self._topology else None) or "")

    def alert_hosts(self) -> list[str]:
        """Hosts over a threshold an alert rule uses: a watched counter's rate, a spool
        that is not draining, an agent throttled past 2x or over its footprint. (Alerts
        on counts that only grow, such as thread failures and refusals, fire from the
        agents' own /metrics, which carry the same names.)"""
        rates = self.store.counter_rates(ALERT_RATES)
        out = [k.src for k, rate in rates if rate > ALERT_RATES[k.name]]
        for name, h in self.store.host_views().items():
            a = h.agent
            if a is not None and (
                a.spool_depth > 0
                or a.self_throttle > 2
                or a.cpu_share > FOOTPRINT_CPU
                or a.rss_bytes > FOOTPRINT_RSS
            ):
                out.append(name)
        return out

    def select(self) -> Selection:
        """This scrape's bounded detail (collector/detail.py), from the figures folded as
        reports came (collector/pathfold.py): no walk over every path."""
        store, cfg = self.store, self.detail.cfg
        now = store.clock()
        named = store.named_since(now - int(cfg.hold_s * 1e9))
        since = now - int(cfg.fresh_s * 1e9)
        fresh, total = store.fresh_paths(since, 2 * cfg.max_paths)
        requested = store.paths_of_pairs(named) if named else []
        hosts = store.host_names()
        folded = store.folded(self.fold, since)
        return self.detail.select_folded(
            folded, fresh, requested, total, now, self.alert_hosts(), hosts
        )

    def describe(self) -> Iterator[Metric]:
        yield from new_families(STORE_FAMILIES).values()
        yield from self.server.collect()

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        sel = self.select()
        # reports go on being taken while this scrape is built; only what is shown is copied
        snap = self.store.snapshot(paths=sel.paths, counter_hosts=sel.hosts)
        f = new_families(STORE_FAMILIES)
        fill_store(snap, f, sel.hosts)
        fill_aggregates(self.store, self.detail, sel, f)
        dur = SCRAPE_DURATION.new()
        dur.add_metric([], time.perf_counter() - started)
        yield from f.values()
        yield from self.server.collect()
        yield dur


def fill_store(snap: StoreSnapshot, f: Families, shown: dict[str, str] | None = None) -> None:
    """SNAP's paths, counters, hosts (the agent figures of the SHOWN ones, None: all) and
    totals into F."""
    for key, st in snap.paths.items():
        fill_path(_path_labels(key), st, f)
    fill_ratios(snap, f)
    fill_counters(snap, f)
    fill_hosts(snap, f, shown)
    for fam in TOTAL_FAMILIES:
        if fam.field:
            f[fam.key].add_metric([], float(getattr(snap, fam.field)))
    f["hosts"].add_metric([], float(len(snap.hosts)))
    for what in DROPS:
        f["dropped"].add_metric([what], float(snap.dropped.get(what, 0)))


def _path_labels(key: PathKey) -> list[str]:
    src, dst, transport, op, size = key
    return [src, dst, transport, op, str(size)]


def fill_path(labels: list[str], st: PathStats, f: Families) -> None:
    rtt = st.rtt
    if rtt.count or rtt.lost:
        f["rtt"].add_sketch(labels, rtt)
        f["sent"].add_metric(labels, float(rtt.count + rtt.lost))
        f["lost"].add_metric(labels, float(rtt.lost))
    if st.last_rtt is not None:
        f["loss"].add_metric(labels, st.last_rtt.loss_ratio)
    prober = st.last_prober_delay_ns
    if prober is not None:
        f["prober_delay"].add_metric(labels, prober / 1e9)
    f["failures"].add_metric(labels, float(st.failures))
    if st.bytes_moved:
        f["bytes"].add_metric(labels, float(st.bytes_moved))
    if st.last_bytes_per_second is not None:
        f["bw"].add_metric(labels, st.last_bytes_per_second)


def fill_ratios(snap: StoreSnapshot, f: Families) -> None:
    """Median RDMA RTT over median TCP RTT, per pair and size, from the newest windows."""
    tcp_p50: dict[tuple[str, str, int], float] = {}
    for (src, dst, transport, op, size), st in snap.paths.items():
        if transport == "tcp" and op == "pingpong" and st.last_rtt is not None:
            v = st.last_rtt.percentile_ns(50.0)
            if v:
                tcp_p50[(src, dst, size)] = float(v)
    for (src, dst, transport, op, size), st in snap.paths.items():
        if transport != "rdma" or st.last_rtt is None or op == "stream":
            continue
        tcp = tcp_p50.get((src, dst, size))
        rdma = st.last_rtt.percentile_ns(50.0)
        if tcp and rdma:
            f["ratio"].add_metric([src, dst, op, str(size)], rdma / tcp)


def fill_counters(snap: StoreSnapshot, f: Families) -> None:
    """Each counter's total and rate, by kind: RDMA port, netdev, PFC per priority."""
    newest = {name: h.last_window_end_ns for name, h in snap.hosts.items()}
    for key, track in snap.counters.items():
        rate = track.rate
        if rate is not None and track.last_ns < newest.get(key.src, 0):
            # Agents send a counter only when it moved (and once a minute in full):
            # absent from the host's newest window means unchanged.
            rate = 0.0
        if key.kind == "rdma":
            labels = [key.src, key.device, str(key.port), key.name]
            f["rdma"].add_metric(labels, float(track.total))
            if rate is not None:
                f["rdma_rate"].add_metric(labels, rate)
        elif key.kind == "netdev":
            labels = [key.src, key.netdev, key.name]
            f["netdev"].add_metric(labels, float(track.total))
            if rate is not None:
                f["netdev_rate"].add_metric(labels, rate)
        elif key.kind == "pfc" and ("pfc:" + key.name) in f:
            scale = 1e-6 if key.name in PFC_DURATIONS else 1.0
            labels = [key.src, key.netdev, str(key.priority)]
            f["pfc:" + key.name].add_metric(labels, track.total * scale)


def fill_hosts(snap: StoreSnapshot, f: Families, shown: dict[str, str] | None) -> None:
    """Every host's liveness and attributes; the agent figures of the SHOWN hosts."""
    for name, h in snap.hosts.items():
        f["up"].add_metric([name], 0.0 if h.stale else 1.0)
        f["info"].add_metric([name, h.info.topology, h.info.version], 1.0)
        f["last"].add_metric([name], h.last_report_ns / 1e9)
        a = h.agent
        if a is None or (shown is not None and name not in shown):
            continue
        for fam in AGENT_FAMILIES:
            if fam.field:
                f[fam.key].add_metric([name], float(getattr(a, fam.field)))
        f["throttle"].add_metric([name], a.self_throttle or 1.0)  # 0: an agent too old to say
        if a.cpu_pressure >= 0:
            f["pressure"].add_metric([name], a.cpu_pressure)
        by = a.sessions_refused_by_reason
        for reason in REFUSAL_REASONS:  # a fixed set: an agent adds no label values
            f["refused_by"].add_metric([name, reason], float(by.get(reason, 0)))


def fill_aggregates(
    store: WindowStore, detail: DetailSelector, sel: Selection, f: Families
) -> None:
    """The fleet's histograms per probe kind, the ToR pairs, and what the bounded detail
    showed and left out."""
    for (transport, op, size), sk in sorted(store.fleet_sketches().items()):
        labels = [transport, op, str(size)]
        buckets, total = sketch_histogram(sk)
        f["fleet_rtt"].add_metric(labels, buckets, total)
        f["fleet_sent"].add_metric(labels, float(sk.count + sk.lost))
        f["fleet_lost"].add_metric(labels, float(sk.lost))
    for tk, (p99, loss) in sel.tor_pairs.items():
        if p99 is not None:
            f["tor_p99"].add_metric(list(tk), p99)
        f["tor_loss"].add_metric(list(tk), loss)
    f["paths"].add_metric([], float(sel.omitted_paths + len(sel.paths)))
    for fam, reasons, got in (
        ("detail_paths", PATH_REASONS, sel.paths.values()),
        ("detail_hosts", HOST_REASONS, sel.hosts.values()),
        ("detail_tors", TOR_REASONS, sel.tor_reasons.values()),
    ):
        chosen = list(got)
        for reason in reasons:
            f[fam].add_metric([reason], float(chosen.count(reason)))
    f["omitted"].add_metric(["path"], float(sel.omitted_paths))
    f["omitted"].add_metric(["tor_pair"], float(sel.omitted_tor_pairs))
    for what, by in detail.dropped_counts()._asdict().items():
        for reason, n in by.items():
            f["detail_dropped"].add_metric([what, reason], float(n))
