"""The collector's own metric families, as data: one row per family (the key the exporter
fills it by, its type, name, help and labels), in the order /metrics shows them.

collector/metrics.toml catalogues the same names, and a test holds what the exporter
yields to it. `new_families()` builds fresh families from rows on every scrape; the
exporters (collector/exporter.py, collector/serverfamilies.py) only fill them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from fabricprobe.core.cumulative import RTT_BUCKETS_NS, RTT_BUCKETS_S, CumulativeSketch
from fabricprobe.core.promproto import SketchHistogramFamily
from fabricprobe.core.sketchwire import MergedSketch

PREFIX = "fabricprobe_"
PATH_LABELS = ("src", "dst", "transport", "op", "size")
RDMA_LABELS = ("src", "device", "port", "counter")
PFC_LABELS = ("src", "netdev", "priority")
NETDEV_LABELS = ("src", "netdev", "counter")
FLEET_LABELS = ("transport", "op", "size")
TOR_LABELS = ("src_tor", "dst_tor", "transport")
SRC = ("src",)
REASON = ("reason",)


@dataclass(frozen=True)
class Family:
    """One metric family: KEY is what the exporter fills it by; NAME follows PREFIX (a
    counter's without `_total`, which the exposition adds)."""

    key: str
    kind: str  # counter, gauge, histogram, or sketch (native buckets over protobuf)
    name: str
    help: str
    labels: tuple[str, ...] = ()
    # the figure it shows: a pb.AgentStats field (agent families) or a StoreSnapshot
    # attribute (store totals); "" where the exporter computes it
    field: str = ""

    def new(self) -> Any:  # each family type has an add_metric() of its own
        """An empty family of this row, for one scrape."""
        name, labels = PREFIX + self.name, list(self.labels)
        if self.kind == "sketch":  # classic buckets in text, native ones over protobuf
            return SketchHistogramFamily(name, self.help, labels, classic=sketch_histogram)
        cls = {
            "counter": CounterMetricFamily,
            "gauge": GaugeMetricFamily,
            "histogram": HistogramMetricFamily,
        }[self.kind]
        return cls(name, self.help, labels=labels)


def new_families(rows: Iterable[Family]) -> dict[str, Any]:
    """Fresh families of ROWS by key, in the rows' order."""
    return {row.key: row.new() for row in rows}


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

PATH_FAMILIES = (
    Family("rtt", "sketch", "rtt_seconds", "Probe round-trip time per path.", PATH_LABELS),
    Family(
        "sent", "counter", "probe_exchanges", "Probe exchanges attempted per path.", PATH_LABELS
    ),
    Family(
        "lost", "counter", "probe_lost", "Probe exchanges with no answer per path.", PATH_LABELS
    ),
    Family(
        "failures",
        "counter",
        "probe_failures",
        "Probe bursts that could not start (peer down or refusing) per path.",
        PATH_LABELS,
    ),
    Family(
        "loss", "gauge", "loss_ratio", "Lost over attempted exchanges, newest window.", PATH_LABELS
    ),
    Family(
        "prober_delay",
        "gauge",
        "prober_delay_seconds",
        "RDMA probes: the prober's own delay inside their RTTs (software-timed; still in the"
        " RTT), p50 of the newest window.",
        PATH_LABELS,
    ),
    Family(
        "bw",
        "gauge",
        "bandwidth_bytes_per_second",
        "Throughput confirmed by the peer, newest window.",
        PATH_LABELS,
    ),
    Family(
        "bytes", "counter", "bandwidth_bytes", "Bytes confirmed by the peer per path.", PATH_LABELS
    ),
    Family(
        "ratio",
        "gauge",
        "rdma_tcp_rtt_ratio",
        "Median RDMA RTT over median TCP RTT on the same pair and size, newest window.",
        ("src", "dst", "op", "size"),
    ),
)

# ethtool PFC fields (fabricprobe.agent.counters) -> their families, keyed "pfc:<field>";
# the durations are µs on the wire and exported in seconds
PFC_DURATIONS = frozenset({"rx_pause_duration_us", "tx_pause_duration_us"})
COUNTER_FAMILIES = (
    Family(
        "rdma",
        "counter",
        "rdma_port_stat",
        "RDMA port counter (counters/, hw_counters/) increase, wraps and resets counted.",
        RDMA_LABELS,
    ),
    Family(
        "rdma_rate",
        "gauge",
        "rdma_port_stat_per_second",
        "RDMA port counter rate between the two newest readings.",
        RDMA_LABELS,
    ),
    Family(
        "netdev",
        "counter",
        "netdev_stat",
        "Network device counter from ethtool -S (discards, ECN marks, link pause).",
        NETDEV_LABELS,
    ),
    Family(
        "netdev_rate",
        "gauge",
        "netdev_stat_per_second",
        "Network device counter rate between the two newest readings.",
        NETDEV_LABELS,
    ),
    Family(
        "pfc:rx_pause",
        "counter",
        "pfc_rx_pause_frames",
        "PFC pause (XOFF) frames received per priority.",
        PFC_LABELS,
    ),
    Family(
        "pfc:tx_pause",
        "counter",
        "pfc_tx_pause_frames",
        "PFC pause (XOFF) frames sent per priority.",
        PFC_LABELS,
    ),
    Family(
        "pfc:rx_pause_transitions",
        "counter",
        "pfc_rx_pause_transitions",
        "Received pause-to-resume transitions per priority.",
        PFC_LABELS,
    ),
    Family(
        "pfc:tx_pause_transitions",
        "counter",
        "pfc_tx_pause_transitions",
        "Sent pause-to-resume transitions per priority.",
        PFC_LABELS,
    ),
    Family(
        "pfc:rx_discards",
        "counter",
        "pfc_rx_discards",
        "Packets dropped for lack of buffer per priority.",
        PFC_LABELS,
    ),
    Family(
        "pfc:rx_pause_duration_us",
        "counter",
        "pfc_rx_pause_seconds",
        "Time this port was paused by its peer per priority.",
        PFC_LABELS,
    ),
    Family(
        "pfc:tx_pause_duration_us",
        "counter",
        "pfc_tx_pause_seconds",
        "Time this port held its peer paused per priority.",
        PFC_LABELS,
    ),
)

HOST_FAMILIES = (
    Family("up", "gauge", "host_up", "1 when the agent reported recently, 0 when stale.", SRC),
    Family(
        "info", "gauge", "host_info", "Agent attributes (value 1).", ("src", "topology", "version")
    ),
    Family(
        "last",
        "gauge",
        "host_last_report_timestamp_seconds",
        "When the agent's last report arrived.",
        SRC,
    ),
)

# each host's agent figures, shown for the hosts the bounded export picks (collector/detail.py)
AGENT_FAMILIES = (
    Family("cpu", "counter", "agent_cpu_seconds", "Agent process CPU time.", SRC, "cpu_seconds"),
    Family(
        "rss", "gauge", "agent_resident_memory_bytes", "Agent resident memory.", SRC, "rss_bytes"
    ),
    Family("probes", "counter", "agent_probes", "Probe bursts the agent ran.", SRC, "probes"),
    Family(
        "probe_rate",
        "gauge",
        "agent_probe_rate",
        "Probe bursts per second over the agent's newest window.",
        SRC,
        "probe_rate",
    ),
    Family(
        "throttle",
        "gauge",
        "agent_self_throttle",
        "Factor the agent stretches its probe intervals by to spare its host "
        "(1 = the plan's pace, at most 4).",
        SRC,
    ),
    Family(
        "cpu_share",
        "gauge",
        "agent_cpu_share",
        "Share of a core the agent used over its newest window.",
        SRC,
        "cpu_share",
    ),
    Family(
        "pressure",
        "gauge",
        "host_cpu_pressure_ratio",
        "Share of the newest window in which some task on the host waited for a CPU "
        "(PSI); absent where the kernel has none.",
        SRC,
    ),
    Family(
        "spool",
        "gauge",
        "agent_spool_windows",
        "Windows waiting in the agent's spool.",
        SRC,
        "spool_depth",
    ),
    Family(
        "spool_bytes",
        "gauge",
        "agent_spool_bytes",
        "Bytes held in the agent's spool.",
        SRC,
        "spool_bytes",
    ),
    Family(
        "spool_dropped",
        "counter",
        "agent_spool_dropped",
        "Windows dropped because the agent's spool was full.",
        SRC,
        "spool_dropped",
    ),
    Family(
        "spool_write_failures",
        "counter",
        "agent_spool_write_failures",
        "Window writes the agent's disk refused (ENOSPC, EIO...); kept in memory.",
        SRC,
        "spool_write_failures",
    ),
    Family(
        "spool_quarantined",
        "counter",
        "agent_spool_quarantined",
        "Corrupt spool files the agent moved to quarantine.",
        SRC,
        "spool_quarantined",
    ),
    Family(
        "spool_memory",
        "gauge",
        "agent_spool_memory_windows",
        "Windows the agent holds in memory because its disk refused them.",
        SRC,
        "spool_memory_windows",
    ),
    Family(
        "thread_failures",
        "counter",
        "agent_thread_failures",
        "Agent processes on this host ended by a dead thread (then restarted).",
        SRC,
        "thread_failures",
    ),
    Family(
        "links",
        "gauge",
        "agent_probe_links",
        "Kept probe links the agent holds to its targets.",
        SRC,
        "links",
    ),
    Family(
        "sessions",
        "gauge",
        "agent_probe_sessions",
        "Probe sessions the agent's responder is running, kept links included.",
        SRC,
        "sessions",
    ),
    Family(
        "refused",
        "counter",
        "agent_probe_sessions_refused",
        "Probers the agent's responder turned away (full, a source's share, memory, "
        "hello deadline, no fleet token, RDMA endpoint not the peer's).",
        SRC,
        "sessions_refused",
    ),
    Family(
        "refused_by",
        "counter",
        "agent_probe_sessions_refused_by_reason",
        "Probers the agent's responder turned away, by reason: busy, source, memory, "
        "hello, unauthenticated, address.",
        ("src", "reason"),
    ),
)

TOTAL_FAMILIES = (
    Family(
        "reports",
        "counter",
        "collector_reports",
        "Window reports merged by the collector.",
        field="reports_total",
    ),
    Family(
        "dups",
        "counter",
        "collector_duplicate_reports",
        "Window reports received again and dropped (replays).",
        field="duplicates_total",
    ),
    Family(
        "rejected",
        "counter",
        "collector_rejected_reports",
        "Window reports refused as malformed.",
        field="rejected_total",
    ),
    Family(
        "merges",
        "counter",
        "collector_sketch_merges",
        "Latency sketches merged by the collector.",
        field="merges_total",
    ),
    Family("hosts", "gauge", "collector_hosts", "Agents known to the collector."),
)

AGGREGATE_FAMILIES = (
    Family(
        "fleet_rtt",
        "histogram",
        "fleet_rtt_seconds",
        "Probe round-trip time of every path of the collector's hosts, per probe kind.",
        FLEET_LABELS,
    ),
    Family(
        "fleet_sent",
        "counter",
        "fleet_probe_exchanges",
        "Probe exchanges attempted by the collector's hosts, per probe kind.",
        FLEET_LABELS,
    ),
    Family(
        "fleet_lost",
        "counter",
        "fleet_probe_lost",
        "Probe exchanges with no answer, per probe kind.",
        FLEET_LABELS,
    ),
    Family(
        "tor_p99",
        "gauge",
        "tor_pair_worst_rtt_p99_seconds",
        "Highest newest-window p99 RTT among the paths from one ToR to another.",
        TOR_LABELS,
    ),
    Family(
        "tor_loss",
        "gauge",
        "tor_pair_loss_ratio",
        "Lost over attempted exchanges in the newest windows from one ToR to another.",
        TOR_LABELS,
    ),
    Family(
        "paths",
        "gauge",
        "collector_paths",
        "Paths the collector holds (every one in the aggregates).",
    ),
    Family(
        "detail_paths",
        "gauge",
        "collector_detail_paths",
        "Paths shown one by one, by why: alert, request, worst, held, fill.",
        REASON,
    ),
    Family(
        "detail_hosts",
        "gauge",
        "collector_detail_hosts",
        "Hosts whose counters and agent figures are shown, by why: alert, path, held, fill.",
        REASON,
    ),
    Family(
        "detail_tors",
        "gauge",
        "collector_detail_tor_pairs",
        "ToR pairs shown, by why: intra, worst, held, fill.",
        REASON,
    ),
    Family(
        "omitted",
        "gauge",
        "collector_detail_omitted",
        "Paths and ToR pairs only in the aggregates this scrape (the agents' own "
        "/metrics show their hosts' paths).",
        ("what",),
    ),
    Family(
        "detail_dropped",
        "counter",
        "collector_detail_dropped",
        "Candidates the detail bounds kept out, counted per scrape, by what and why.",
        ("what", "reason"),
    ),
    Family(
        "dropped",
        "counter",
        "collector_dropped",
        "Records the collector's bounds and checks kept out, by what they were.",
        ("what",),
    ),
)

# everything FabricCollector fills from the store, in exposition order
STORE_FAMILIES = (
    PATH_FAMILIES
    + COUNTER_FAMILIES
    + HOST_FAMILIES
    + AGENT_FAMILIES
    + TOTAL_FAMILIES
    + AGGREGATE_FAMILIES
)

# the collector's own service: its API calls, the authentication layer, its HTTP servers
P = "collector_"
RPC_FAMILIES = (
    Family(
        "rpc_duration",
        "histogram",
        P + "rpc_duration_seconds",
        "Time the collector took per API call.",
        ("method",),
    ),
    Family(
        "rpcs",
        "counter",
        P + "rpcs",
        "API calls finished, by method and status code.",
        ("method", "code"),
    ),
)
GATE_FAMILIES = (
    Family(
        "calls_refused",
        "counter",
        P + "calls_refused",
        "Calls the authentication layer refused before any servicer ran, by reason.",
        REASON,
    ),
    Family(
        "evicted",
        "counter",
        P + "identities_evicted",
        "Callers forgotten by the bounded limits table (their bucket starts full again).",
    ),
    Family("identities", "gauge", P + "identities", "Callers whose rate and streams are tracked."),
    Family("streams", "gauge", P + "streams", "Streaming calls open now."),
    Family(
        "idle_cancelled",
        "counter",
        P + "streams_idle_cancelled",
        "Streams cancelled for sending nothing too long.",
    ),
)
HTTP_FAMILIES = (
    Family(
        "scrapes_refused",
        "counter",
        P + "scrapes_refused",
        "Requests to /metrics turned away: busy, unauthorized or not found.",
        REASON,
    ),
    Family(
        "renders",
        "counter",
        P + "scrape_renders",
        "Renders of /metrics (one serves every GET within a second).",
    ),
    Family(
        "http_refused",
        "counter",
        P + "http_refused",
        "Requests and connections the HTTP servers (OTLP/HTTP, /metrics) turned away, by"
        " listener (otlp, metrics) and reason: unauthenticated, permission, busy, source,"
        " memory, too_large, header_timeout, body_timeout, bad_request, not_found.",
        ("listener", "reason"),
    ),
    Family(
        "http_connections",
        "gauge",
        P + "http_connections",
        "Connections open to each HTTP server (otlp, metrics).",
        ("listener",),
    ),
)
SCRAPE_DURATION = Family(
    "scrape_duration",
    "gauge",
    P + "scrape_duration_seconds",
    "Time the collector took to build this scrape.",
)
