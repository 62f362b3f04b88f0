"""Map the window store to Prometheus metric families (a custom prometheus_client collector).

Reading is apart from exporting: WindowStore holds the figures, this module only names
them. Every family is built fresh on each scrape; describe() lists them without
touching the store, so registering the collector is free. Names follow
collector/metrics.toml, which a test holds to what collect() really yields.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from fabricprobe.collector.auth import REFUSALS, Gate
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
from fabricprobe.collector.pathfold import FoldConfig, PathFold
from fabricprobe.collector.rpcstats import RPC_BUCKETS_S, RpcStats
from fabricprobe.collector.store import DROPS, PathStats, StoreSnapshot, WindowStore
from fabricprobe.core.cumulative import RTT_BUCKETS_NS, RTT_BUCKETS_S, CumulativeSketch
from fabricprobe.core.errors import REFUSAL_REASONS
from fabricprobe.core.promproto import SketchHistogramFamily
from fabricprobe.core.sketchwire import MergedSketch
from fabricprobe.core.web import REASONS as WEB_REASONS
from fabricprobe.core.web import WebStats

HTTP_LISTENERS = ("otlp", "metrics")  # the collector's HTTP servers (collector/service.py)

PATH_LABELS = ["src", "dst", "transport", "op", "size"]
PROBER_DELAY_HELP = (
    "RDMA probes: the prober's own delay inside their RTTs (software-timed; still in the"
    " RTT), p50 of the newest window."
)
RDMA_LABELS = ["src", "device", "port", "counter"]
PFC_LABELS = ["src", "netdev", "priority"]
NETDEV_LABELS = ["src", "netdev", "counter"]

# ethtool PFC fields (fabricprobe.agent.counters) -> metric name stem; durations are µs on the wire.
PFC_FAMILIES: dict[str, tuple[str, str]] = {
    "rx_pause": ("pfc_rx_pause_frames", "PFC pause (XOFF) frames received per priority."),
    "tx_pause": ("pfc_tx_pause_frames", "PFC pause (XOFF) frames sent per priority."),
    "rx_pause_transitions": (
        "pfc_rx_pause_transitions",
        "Received pause-to-resume transitions per priority.",
    ),
    "tx_pause_transitions": (
        "pfc_tx_pause_transitions",
        "Sent pause-to-resume transitions per priority.",
    ),
    "rx_discards": ("pfc_rx_discards", "Packets dropped for lack of buffer per priority."),
}
PFC_DURATIONS: dict[str, tuple[str, str]] = {
    "rx_pause_duration_us": (
        "pfc_rx_pause_seconds",
        "Time this port was paused by its peer per priority.",
    ),
    "tx_pause_duration_us": (
        "pfc_tx_pause_seconds",
        "Time this port held its peer paused per priority.",
    ),
}


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
FLEET_LABELS = ["transport", "op", "size"]
TOR_LABELS = ["src_tor", "dst_tor", "transport"]


def sketch_histogram(
    sketch: MergedSketch | CumulativeSketch,
) -> tuple[list[tuple[str, float]], float]:
    """Cumulative (le, count) buckets in seconds and the sum in seconds of SKETCH."""
    cum = sketch.cumulative(RTT_BUCKETS_NS)
    out = [(le, float(n)) for le, n in zip(_RTT_LE, cum, strict=False)]
    out.append(("+Inf", float(sketch.count)))
    return out, sketch.sum_ns / 1e9


def _fmt(x: float) -> str:
    return f"{x:.0e}".replace("e-0", "e-").replace("e+0", "e")


_RTT_LE = [_fmt(le) for le in RTT_BUCKETS_S]


def _path_labels(key: tuple[str, str, str, str, int]) -> list[str]:
    return [key[0], key[1], key[2], key[3], str(key[4])]


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
        self.rpc = rpc or RpcStats()
        self.gate = gate
        self.scrapes = scrapes or ScrapeStats()
        self.http = http or {}  # listener -> its HTTP server's counts (core/web.py)
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
        yield from self._families().values()
        yield from self._rpc_families()
        yield from self._gate_families()

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        sel = self.select()
        # reports go on being taken while this scrape is built; only what is shown is copied
        snap = self.store.snapshot(paths=sel.paths, counter_hosts=sel.hosts)
        fams = self._families()
        self._fill(snap, fams, sel)
        self._fill_aggregates(sel, fams)
        dur = GaugeMetricFamily(
            "fabricprobe_collector_scrape_duration_seconds",
            "Time the collector took to build this scrape.",
        )
        dur.add_metric([], time.perf_counter() - started)
        yield from fams.values()
        yield from self._rpc_families()
        yield from self._gate_families()
        yield dur

    def _gate_families(self) -> Iterator[Metric]:
        if self.gate is not None:
            refused, evicted, held, streams = self.gate.limits.snapshot()  # LimitCounts
            idle = self.gate.idle_cancelled
        else:
            refused, evicted, held, streams, idle = dict.fromkeys(REFUSALS, 0), 0, 0, 0, 0
        p = "fabricprobe_collector_"
        calls = CounterMetricFamily(
            p + "calls_refused",
            "Calls the authentication layer refused before any servicer ran, by reason.",
            labels=["reason"],
        )
        for reason in REFUSALS:
            calls.add_metric([reason], float(refused.get(reason, 0)))
        yield calls
        ev = CounterMetricFamily(
            p + "identities_evicted",
            "Callers forgotten by the bounded limits table (their bucket starts full again).",
        )
        ev.add_metric([], float(evicted))
        yield ev
        ids = GaugeMetricFamily(p + "identities", "Callers whose rate and streams are tracked.")
        ids.add_metric([], float(held))
        yield ids
        st = GaugeMetricFamily(p + "streams", "Streaming calls open now.")
        st.add_metric([], float(streams))
        yield st
        cancelled = CounterMetricFamily(
            p + "streams_idle_cancelled", "Streams cancelled for sending nothing too long."
        )
        cancelled.add_metric([], float(idle))
        yield cancelled
        sc = self.scrapes
        counts = sc.snapshot()
        refused_http, renders = counts.refused, counts.renders
        http = CounterMetricFamily(
            p + "scrapes_refused",
            "Requests to /metrics turned away: busy, unauthorized or not found.",
            labels=["reason"],
        )
        for reason in ScrapeStats.REASONS:
            http.add_metric([reason], float(refused_http[reason]))
        yield http
        rendered = CounterMetricFamily(
            p + "scrape_renders", "Renders of /metrics (one serves every GET within a second)."
        )
        rendered.add_metric([], float(renders))
        yield rendered
        yield from self._http_families()

    def _http_families(self) -> Iterator[Metric]:
        p = "fabricprobe_collector_"
        refused = CounterMetricFamily(
            p + "http_refused",
            "Requests and connections the HTTP servers (OTLP/HTTP, /metrics) turned away, by"
            " listener (otlp, metrics) and reason: unauthenticated, permission, busy, source,"
            " memory, too_large, header_timeout, body_timeout, bad_request, not_found.",
            labels=["listener", "reason"],
        )
        conns = GaugeMetricFamily(
            p + "http_connections",
            "Connections open to each HTTP server (otlp, metrics).",
            labels=["listener"],
        )
        for listener in HTTP_LISTENERS:
            stats = self.http.get(listener)
            by, _, open_now = stats.snapshot() if stats else ({}, 0, 0)
            for reason in WEB_REASONS:
                refused.add_metric([listener, reason], float(by.get(reason, 0)))
            conns.add_metric([listener], float(open_now))
        yield refused
        yield conns

    def _rpc_families(self) -> Iterator[Metric]:
        buckets, sums, codes = self.rpc.snapshot()
        hist = HistogramMetricFamily(
            "fabricprobe_collector_rpc_duration_seconds",
            "Time the collector took per API call.",
            labels=["method"],
        )
        for method, counts in sorted(buckets.items()):
            cum, running = [], 0
            for le, n in zip(RPC_BUCKETS_S, counts, strict=False):
                running += n
                cum.append((f"{le:g}", float(running)))
            cum.append(("+Inf", float(sum(counts))))
            hist.add_metric([method], cum, sums[method])
        yield hist
        calls = CounterMetricFamily(
            "fabricprobe_collector_rpcs",
            "API calls finished, by method and status code.",
            labels=["method", "code"],
        )
        for (method, code), n in sorted(codes.items()):
            calls.add_metric([method, code], float(n))
        yield calls

    # -- families -----------------------------------------------------------------------

    def _families(self) -> dict[str, Any]:
        p = "fabricprobe_"
        f: dict[str, Any] = {
            # Native (exponential) buckets over protobuf, the classic ones in text.
            "rtt": SketchHistogramFamily(
                p + "rtt_seconds",
                "Probe round-trip time per path.",
                PATH_LABELS,
                classic=sketch_histogram,
            ),
            "sent": CounterMetricFamily(
                p + "probe_exchanges", "Probe exchanges attempted per path.", labels=PATH_LABELS
            ),
            "lost": CounterMetricFamily(
                p + "probe_lost", "Probe exchanges with no answer per path.", labels=PATH_LABELS
            ),
            "failures": CounterMetricFamily(
                p + "probe_failures",
                "Probe bursts that could not start (peer down or refusing) per path.",
                labels=PATH_LABELS,
            ),
            "loss": GaugeMetricFamily(
                p + "loss_ratio",
                "Lost over attempted exchanges, newest window.",
                labels=PATH_LABELS,
            ),
            "prober_delay": GaugeMetricFamily(
                p + "prober_delay_seconds",
                PROBER_DELAY_HELP,
                labels=PATH_LABELS,
            ),
            "bw": GaugeMetricFamily(
                p + "bandwidth_bytes_per_second",
                "Throughput confirmed by the peer, newest window.",
                labels=PATH_LABELS,
            ),
            "bytes": CounterMetricFamily(
                p + "bandwidth_bytes", "Bytes confirmed by the peer per path.", labels=PATH_LABELS
            ),
            "ratio": GaugeMetricFamily(
                p + "rdma_tcp_rtt_ratio",
                "Median RDMA RTT over median TCP RTT on the same pair and size, newest window.",
                labels=["src", "dst", "op", "size"],
            ),
            "rdma": CounterMetricFamily(
                p + "rdma_port_stat",
                "RDMA port counter (counters/, hw_counters/) increase, wraps and resets counted.",
                labels=RDMA_LABELS,
            ),
            "rdma_rate": GaugeMetricFamily(
                p + "rdma_port_stat_per_second",
                "RDMA port counter rate between the two newest readings.",
                labels=RDMA_LABELS,
            ),
            "netdev": CounterMetricFamily(
                p + "netdev_stat",
                "Network device counter from ethtool -S (discards, ECN marks, link pause).",
                labels=NETDEV_LABELS,
            ),
            "netdev_rate": GaugeMetricFamily(
                p + "netdev_stat_per_second",
                "Network device counter rate between the two newest readings.",
                labels=NETDEV_LABELS,
            ),
        }
        for field_name, (stem, doc) in PFC_FAMILIES.items():
            f["pfc:" + field_name] = CounterMetricFamily(p + stem, doc, labels=PFC_LABELS)
        for field_name, (stem, doc) in PFC_DURATIONS.items():
            f["pfc:" + field_name] = CounterMetricFamily(p + stem, doc, labels=PFC_LABELS)
        f |= {
            "up": GaugeMetricFamily(
                p + "host_up", "1 when the agent reported recently, 0 when stale.", labels=["src"]
            ),
            "info": GaugeMetricFamily(
                p + "host_info",
                "Agent attributes (value 1).",
                labels=["src", "topology", "version"],
            ),
            "last": GaugeMetricFamily(
                p + "host_last_report_timestamp_seconds",
                "When the agent's last report arrived.",
                labels=["src"],
            ),
            "cpu": CounterMetricFamily(
                p + "agent_cpu_seconds", "Agent process CPU time.", labels=["src"]
            ),
            "rss": GaugeMetricFamily(
                p + "agent_resident_memory_bytes", "Agent resident memory.", labels=["src"]
            ),
            "probes": CounterMetricFamily(
                p + "agent_probes", "Probe bursts the agent ran.", labels=["src"]
            ),
            "probe_rate": GaugeMetricFamily(
                p + "agent_probe_rate",
                "Probe bursts per second over the agent's newest window.",
                labels=["src"],
            ),
            "throttle": GaugeMetricFamily(
                p + "agent_self_throttle",
                "Factor the agent stretches its probe intervals by to spare its host "
                "(1 = the plan's pace, at most 4).",
                labels=["src"],
            ),
            "cpu_share": GaugeMetricFamily(
                p + "agent_cpu_share",
                "Share of a core the agent used over its newest window.",
                labels=["src"],
            ),
            "pressure": GaugeMetricFamily(
                p + "host_cpu_pressure_ratio",
                "Share of the newest window in which some task on the host waited for a CPU "
                "(PSI); absent where the kernel has none.",
                labels=["src"],
            ),
            "spool": GaugeMetricFamily(
                p + "agent_spool_windows",
                "Windows waiting in the agent's spool.",
                labels=["src"],
            ),
            "spool_bytes": GaugeMetricFamily(
                p + "agent_spool_bytes", "Bytes held in the agent's spool.", labels=["src"]
            ),
            "spool_dropped": CounterMetricFamily(
                p + "agent_spool_dropped",
                "Windows dropped because the agent's spool was full.",
                labels=["src"],
            ),
            "spool_write_failures": CounterMetricFamily(
                p + "agent_spool_write_failures",
                "Window writes the agent's disk refused (ENOSPC, EIO...); kept in memory.",
                labels=["src"],
            ),
            "spool_quarantined": CounterMetricFamily(
                p + "agent_spool_quarantined",
                "Corrupt spool files the agent moved to quarantine.",
                labels=["src"],
            ),
            "spool_memory": GaugeMetricFamily(
                p + "agent_spool_memory_windows",
                "Windows the agent holds in memory because its disk refused them.",
                labels=["src"],
            ),
            "thread_failures": CounterMetricFamily(
                p + "agent_thread_failures",
                "Agent processes on this host ended by a dead thread (then restarted).",
                labels=["src"],
            ),
            "links": GaugeMetricFamily(
                p + "agent_probe_links",
                "Kept probe links the agent holds to its targets.",
                labels=["src"],
            ),
            "sessions": GaugeMetricFamily(
                p + "agent_probe_sessions",
                "Probe sessions the agent's responder is running, kept links included.",
                labels=["src"],
            ),
            "refused": CounterMetricFamily(
                p + "agent_probe_sessions_refused",
                "Probers the agent's responder turned away (full, a source's share, memory, "
                "hello deadline, no fleet token, RDMA endpoint not the peer's).",
                labels=["src"],
            ),
            "refused_by": CounterMetricFamily(
                p + "agent_probe_sessions_refused_by_reason",
                "Probers the agent's responder turned away, by reason: busy, source, memory, "
                "hello, unauthenticated, address.",
                labels=["src", "reason"],
            ),
            "reports": CounterMetricFamily(
                p + "collector_reports", "Window reports merged by the collector."
            ),
            "dups": CounterMetricFamily(
                p + "collector_duplicate_reports",
                "Window reports received again and dropped (replays).",
            ),
            "rejected": CounterMetricFamily(
                p + "collector_rejected_reports", "Window reports refused as malformed."
            ),
            "merges": CounterMetricFamily(
                p + "collector_sketch_merges", "Latency sketches merged by the collector."
            ),
            "hosts": GaugeMetricFamily(p + "collector_hosts", "Agents known to the collector."),
            "fleet_rtt": HistogramMetricFamily(
                p + "fleet_rtt_seconds",
                "Probe round-trip time of every path of the collector's hosts, per probe kind.",
                labels=FLEET_LABELS,
            ),
            "fleet_sent": CounterMetricFamily(
                p + "fleet_probe_exchanges",
                "Probe exchanges attempted by the collector's hosts, per probe kind.",
                labels=FLEET_LABELS,
            ),
            "fleet_lost": CounterMetricFamily(
                p + "fleet_probe_lost",
                "Probe exchanges with no answer, per probe kind.",
                labels=FLEET_LABELS,
            ),
            "tor_p99": GaugeMetricFamily(
                p + "tor_pair_worst_rtt_p99_seconds",
                "Highest newest-window p99 RTT among the paths from one ToR to another.",
                labels=TOR_LABELS,
            ),
            "tor_loss": GaugeMetricFamily(
                p + "tor_pair_loss_ratio",
                "Lost over attempted exchanges in the newest windows from one ToR to another.",
                labels=TOR_LABELS,
            ),
            "paths": GaugeMetricFamily(
                p + "collector_paths", "Paths the collector holds (every one in the aggregates)."
            ),
            "detail_paths": GaugeMetricFamily(
                p + "collector_detail_paths",
                "Paths shown one by one, by why: alert, request, worst, held, fill.",
                labels=["reason"],
            ),
            "detail_hosts": GaugeMetricFamily(
                p + "collector_detail_hosts",
                "Hosts whose counters and agent figures are shown, by why: alert, path, held, "
                "fill.",
                labels=["reason"],
            ),
            "detail_tors": GaugeMetricFamily(
                p + "collector_detail_tor_pairs",
                "ToR pairs shown, by why: intra, worst, held, fill.",
                labels=["reason"],
            ),
            "omitted": GaugeMetricFamily(
                p + "collector_detail_omitted",
                "Paths and ToR pairs only in the aggregates this scrape (the agents' own "
                "/metrics show their hosts' paths).",
                labels=["what"],
            ),
            "detail_dropped": CounterMetricFamily(
                p + "collector_detail_dropped",
                "Candidates the detail bounds kept out, counted per scrape, by what and why.",
                labels=["what", "reason"],
            ),
            "dropped": CounterMetricFamily(
                p + "collector_dropped",
                "Records the collector's bounds and checks kept out, by what they were.",
                labels=["what"],
            ),
        }
        return f

    def _fill_aggregates(self, sel: Selection, f: dict[str, Any]) -> None:
        for (transport, op, size), sk in sorted(self.store.fleet_sketches().items()):
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
        for what, by in self.detail.dropped_counts()._asdict().items():
            for reason, n in by.items():
                f["detail_dropped"].add_metric([what, reason], float(n))

    def _fill(self, snap: StoreSnapshot, f: dict[str, Any], sel: Selection | None = None) -> None:
        shown = None if sel is None else sel.hosts
        for key, st in snap.paths.items():
            self._fill_path(_path_labels(key), st, f)
        self._fill_ratios(snap, f)
        newest = {name: h.last_window_end_ns for name, h in snap.hosts.items()}
        for ckey, track in snap.counters.items():
            src, kind, device, port, netdev, prio, name = ckey  # a CounterKey
            rate = track.rate
            if rate is not None and track.last_ns < newest.get(src, 0):
                # Agents send a counter only when it moved (and once a minute in full):
                # absent from the host's newest window means unchanged.
                rate = 0.0
            if kind == "rdma":
                labels = [src, device, str(port), name]
                f["rdma"].add_metric(labels, float(track.total))
                if rate is not None:
                    f["rdma_rate"].add_metric(labels, rate)
            elif kind == "netdev":
                labels = [src, netdev, name]
                f["netdev"].add_metric(labels, float(track.total))
                if rate is not None:
                    f["netdev_rate"].add_metric(labels, rate)
            elif kind == "pfc" and ("pfc:" + name) in f:
                scale = 1e-6 if name in PFC_DURATIONS else 1.0
                f["pfc:" + name].add_metric([src, netdev, str(prio)], track.total * scale)
        for name, h in snap.hosts.items():
            f["up"].add_metric([name], 0.0 if h.stale else 1.0)
            f["info"].add_metric([name, h.info.topology, h.info.version], 1.0)
            f["last"].add_metric([name], h.last_report_ns / 1e9)
            a = h.agent
            if a is not None and (shown is None or name in shown):
                f["cpu"].add_metric([name], a.cpu_seconds)
                f["rss"].add_metric([name], float(a.rss_bytes))
                f["probes"].add_metric([name], float(a.probes))
                f["probe_rate"].add_metric([name], a.probe_rate)
                f["throttle"].add_metric([name], a.self_throttle or 1.0)
                f["cpu_share"].add_metric([name], a.cpu_share)
                if a.cpu_pressure >= 0:
                    f["pressure"].add_metric([name], a.cpu_pressure)
                f["spool"].add_metric([name], float(a.spool_depth))
                f["spool_bytes"].add_metric([name], float(a.spool_bytes))
                f["spool_dropped"].add_metric([name], float(a.spool_dropped))
                f["spool_write_failures"].add_metric([name], float(a.spool_write_failures))
                f["spool_quarantined"].add_metric([name], float(a.spool_quarantined))
                f["spool_memory"].add_metric([name], float(a.spool_memory_windows))
                f["thread_failures"].add_metric([name], float(a.thread_failures))
                f["links"].add_metric([name], float(a.links))
                f["sessions"].add_metric([name], float(a.sessions))
                f["refused"].add_metric([name], float(a.sessions_refused))
                by = a.sessions_refused_by_reason
                for reason in REFUSAL_REASONS:  # a fixed set: an agent adds no label values
                    f["refused_by"].add_metric([name, reason], float(by.get(reason, 0)))
        f["reports"].add_metric([], float(snap.reports_total))
        f["dups"].add_metric([], float(snap.duplicates_total))
        f["rejected"].add_metric([], float(snap.rejected_total))
        f["merges"].add_metric([], float(snap.merges_total))
        f["hosts"].add_metric([], float(len(snap.hosts)))
        for what in DROPS:
            f["dropped"].add_metric([what], float(snap.dropped.get(what, 0)))

    @staticmethod
    def _fill_path(labels: list[str], st: PathStats, f: dict[str, Any]) -> None:
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

    @staticmethod
    def _fill_ratios(snap: StoreSnapshot, f: dict[str, Any]) -> None:
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
