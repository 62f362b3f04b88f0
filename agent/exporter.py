"""The agent's own /metrics: this host's counters, its probes' newest figures and its own
health, served on the host as node_exporter serves a node's.

Nothing here touches hardware: a scrape maps what the agent's last window already read
(counters, probe sketches, its own footprint), so scraping costs the GPU host next to
nothing and cannot stall on a driver. Series grow with this host's ports, priorities and
targets only (at the default plan, about 250): the collector tier keeps the fleet's.

- `fabricprobe_rdma_<counter>_total{device,port}`: one family per kernel counter name of
  `counters/` and `hw_counters/`, the name as the kernel spells it (raw values: mlx5's
  `port_rcv_data` and `port_xmit_data` count 4-byte words, as the kernel reports them).
- `fabricprobe_pfc_*{netdev,priority}` and `fabricprobe_netdev_<counter>_total{netdev}`
  from `ethtool -S`, parsed.
- `fabricprobe_agent_path_rtt_seconds{dst,transport,op,size,quantile}` (p50, p99) and
  `fabricprobe_agent_path_loss_ratio` from the newest window's sketches.
- `fabricprobe_agent_rtt_seconds{dst,transport,op,size}`: every window's RTT sketch since
  the agent started, merged, as a native histogram (one series per path, ~1 %
  resolution) for a server that scrapes in protobuf, which gets it in place of the
  percentile gauges above (it holds them; both would take the per-host series budget);
  the text form carries the gauges and no classic buckets for it.
- Health: CPU, memory, spool, links, sessions, refusals, reports acknowledged, the time of
  the newest acknowledged report, probe bursts and their rate, host CPU pressure (PSI),
  refusals by reason, and per-part scrape health
  (`fabricprobe_agent_scrape_part_success{part}`), so one failing part never hides the
  others.
"""

from __future__ import annotations

import gzip
import logging
import re
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from fabricprobe.agent.window import PathKey
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.errors import REFUSAL_REASONS, ParseError
from fabricprobe.core.promproto import (
    CONTENT_TYPE_PROTOBUF,
    SketchHistogramFamily,
    encode,
    wants_protobuf,
)
from fabricprobe.core.sketchwire import MergedSketch, from_wire, merged
from fabricprobe.core.web import OPEN, Call, Limits, Reply, Route, WebServer, WebStats
from fabricprobe.core.web import REASONS as WEB_REASONS

log = logging.getLogger("fabricprobe.agent")

P = "fabricprobe_"
M = TypeVar("M", CounterMetricFamily, GaugeMetricFamily)
NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]{0,127}$")
MAX_COUNTER_NAMES = 256  # families from kernel counter names; the rest are skipped
QUANTILES = (("0.5", 50.0), ("0.99", 99.0))
PFC_FAMILIES = {  # reading name -> (family, help, scale)
    "rx_pause": ("pfc_rx_pause_frames", "PFC pause (XOFF) frames received per priority.", 1.0),
    "tx_pause": ("pfc_tx_pause_frames", "PFC pause (XOFF) frames sent per priority.", 1.0),
    "rx_pause_duration_us": (
        "pfc_rx_pause_seconds",
        "Time this port was paused by its peer per priority.",
        1e-6,
    ),
    "tx_pause_duration_us": (
        "pfc_tx_pause_seconds",
        "Time this port held its peer paused per priority.",
        1e-6,
    ),
    "rx_pause_transitions": (
        "pfc_rx_pause_transitions",
        "Received pause-to-resume transitions per priority.",
        1.0,
    ),
    "tx_pause_transitions": (
        "pfc_tx_pause_transitions",
        "Sent pause-to-resume transitions per priority.",
        1.0,
    ),
    "rx_discards": ("pfc_rx_discards", "Packets dropped for lack of buffer per priority.", 1.0),
}
TOOLS = ("ethtool",)  # tools the agent runs to read counters
SKIP_SOURCES = ("sysfs", "ethtool", "nixl")  # readers that skip and count a bad input
# hw_counters entries that are settings, not counts
NOT_COUNTERS = {"lifespan"}


class SenderView(Protocol):
    """What the exporter reads of the agent's sender (fabricprobe.agent.sender.Sender)."""

    @property
    def acked(self) -> int: ...

    @property
    def handoffs(self) -> int: ...

    @property
    def replayed(self) -> int: ...

    @property
    def last_ack_unix_s(self) -> float: ...

    @property
    def registered(self) -> bool: ...


class AgentView(Protocol):
    """What the exporter reads of a running agent (fabricprobe.agent.agent.Agent)."""

    @property
    def last_report(self) -> pb.WindowReport | None: ...

    @property
    def latest_counters(self) -> list[pb.CounterReading]: ...

    @property
    def sender(self) -> SenderView: ...

    @property
    def tools_missing(self) -> set[str]: ...

    @property
    def inputs_skipped(self) -> Mapping[str, int]: ...

    @property
    def nics(self) -> Sequence[pb.RdmaDevice]: ...


@dataclass
class _Families:
    out: dict[str, Metric] = field(default_factory=dict)

    def counter(self, name: str, help_: str, labels: list[str]) -> CounterMetricFamily:
        return self._family(CounterMetricFamily, name, help_, labels)

    def gauge(self, name: str, help_: str, labels: list[str]) -> GaugeMetricFamily:
        return self._family(GaugeMetricFamily, name, help_, labels)

    def _family(self, kind: type[M], name: str, help_: str, labels: list[str]) -> M:
        """The family NAME of this scrape, made of KIND on first use."""
        fam = self.out.get(name)
        if fam is None:
            fam = self.out[name] = kind(P + name, help_, labels=labels)
        assert isinstance(fam, kind)
        return fam


def counter_families(readings: list[pb.CounterReading], f: _Families) -> None:
    """This host's RDMA, PFC and netdev counters, under the kernel's and ethtool's names."""
    names: set[str] = set()
    for r in readings:
        if r.kind == "rdma":
            if r.name in NOT_COUNTERS or not NAME.match(r.name):
                continue
            if r.name not in names and len(names) >= MAX_COUNTER_NAMES:
                continue
            names.add(r.name)
            fam = f.counter(
                f"rdma_{r.name}",
                f"RDMA port counter {r.name} (counters/ or hw_counters/), as the kernel reports it",
                ["device", "port"],
            )
            fam.add_metric([r.device, str(r.port)], float(r.value))
        elif r.kind == "pfc" and r.name in PFC_FAMILIES:
            name, help_, scale = PFC_FAMILIES[r.name]
            fam = f.counter(name, help_, ["netdev", "priority"])
            fam.add_metric([r.netdev, str(r.priority)], r.value * scale)
        elif r.kind == "netdev" and NAME.match(r.name):
            fam = f.counter(
                f"netdev_{r.name}", f"ethtool -S counter {r.name} of the netdev.", ["netdev"]
            )
            fam.add_metric([r.netdev], float(r.value))


def probe_families(report: pb.WindowReport, f: _Families) -> None:
    """The newest window's RTT percentiles and loss per target path."""
    labels = ["dst", "transport", "op", "size"]
    rtt = f.gauge(
        "agent_path_rtt_seconds",
        "RTT percentiles of this host's probes to a target in the newest window.",
        [*labels, "quantile"],
    )
    loss = f.gauge(
        "agent_path_loss_ratio",
        "Share of this host's probe exchanges to a target lost in the newest window.",
        labels,
    )
    for w in report.probes:
        if not w.HasField("rtt"):
            continue
        sk = from_wire(w.rtt)
        key = [w.dst, w.transport, w.op, str(w.size)]
        if sk.count:
            for q, p in QUANTILES:
                v = sk.percentile_ns(p)
                if v is not None:
                    rtt.add_metric([*key, q], v / 1e9)
        if sk.count or sk.lost:
            loss.add_metric(key, sk.lost / (sk.count + sk.lost))


def health_families(agent: AgentView, report: pb.WindowReport | None, f: _Families) -> None:
    up = f.gauge("agent_registered", "1 while the collector has this agent registered.", [])
    up.add_metric([], 1.0 if agent.sender.registered else 0.0)
    acked = f.counter("agent_reports_acked", "Windows the collector acknowledged.", [])
    acked.add_metric([], float(agent.sender.acked))
    moves = f.counter(
        "agent_shard_handoffs", "Times this host moved to another collector shard.", []
    )
    moves.add_metric([], float(agent.sender.handoffs))
    replayed = f.counter(
        "agent_windows_replayed",
        "Acknowledged windows sent again to a new shard after the old one died.",
        [],
    )
    replayed.add_metric([], float(agent.sender.replayed))
    last = f.gauge(
        "agent_last_ack_timestamp_seconds", "When the collector last acknowledged a window.", []
    )
    last.add_metric([], agent.sender.last_ack_unix_s)
    tools = f.gauge(
        "agent_tool_missing",
        "1 when a tool the agent reads counters with is not installed (its counters are absent).",
        ["tool"],
    )
    missing = agent.tools_missing
    for tool in TOOLS:
        tools.add_metric([tool], 1.0 if tool in missing else 0.0)
    skipped = f.counter(
        "agent_inputs_skipped",
        "Outside input left out, the rest of its reading kept: sysfs counter files that held "
        "no counter, ethtool -S lines, NIXL /metrics lines.",
        ["source"],
    )
    counts = agent.inputs_skipped
    for source in SKIP_SOURCES:  # a fixed set: no label value comes from outside
        skipped.add_metric([source], float(counts.get(source, 0)))
    for d in agent.nics:  # no family at all on a host without RDMA devices
        info = f.gauge(
            "rdma_device_info",
            "This host's RDMA devices (value 1): each one's rail and the GPU it serves "
            "(empty when none), to join its counters by.",
            ["device", "rail", "gpu", "gpu_link"],
        )
        info.add_metric([d.name, str(d.rail) if d.HasField("rail") else "", d.gpu, d.gpu_link], 1)
    if report is None or not report.HasField("agent"):
        return
    a = report.agent
    for name, kind, help_, value in (
        ("agent_cpu_seconds", "counter", "Agent process CPU time.", a.cpu_seconds),
        ("agent_resident_memory_bytes", "gauge", "Agent resident memory.", float(a.rss_bytes)),
        ("agent_spool_windows", "gauge", "Windows waiting in the spool.", float(a.spool_depth)),
        (
            "agent_spool_dropped",
            "counter",
            "Windows dropped because the spool was full.",
            float(a.spool_dropped),
        ),
        ("agent_probe_links", "gauge", "Kept probe links to targets.", float(a.links)),
        (
            "agent_self_throttle",
            "gauge",
            "Factor the probe intervals are stretched by to spare the host (1 to 4).",
            a.self_throttle or 1.0,
        ),
        ("agent_cpu_share", "gauge", "Share of a core used over the window.", a.cpu_share),
        ("agent_probe_sessions", "gauge", "Probe sessions the responder runs.", float(a.sessions)),
        (
            "agent_probe_sessions_refused",
            "counter",
            "Probers the responder turned away.",
            float(a.sessions_refused),
        ),
        (
            "agent_spool_write_failures",
            "counter",
            "Window writes the disk refused (ENOSPC, EIO...); kept in memory.",
            float(a.spool_write_failures),
        ),
        (
            "agent_spool_quarantined",
            "counter",
            "Corrupt spool files moved to quarantine.",
            float(a.spool_quarantined),
        ),
        (
            "agent_spool_memory_windows",
            "gauge",
            "Windows held in memory because the disk refused them.",
            float(a.spool_memory_windows),
        ),
        (
            "agent_thread_failures",
            "counter",
            "Agent processes on this spool ended by a dead thread (then restarted).",
            float(a.thread_failures),
        ),
        ("agent_probes", "counter", "Probe bursts the agent ran.", float(a.probes)),
        (
            "agent_probe_rate",
            "gauge",
            "Probe bursts per second over the newest window.",
            a.probe_rate,
        ),
        ("agent_spool_bytes", "gauge", "Bytes held in the spool.", float(a.spool_bytes)),
    ):
        fam = f.counter(name, help_, []) if kind == "counter" else f.gauge(name, help_, [])
        fam.add_metric([], value)
    if a.cpu_pressure >= 0:  # absent where the kernel has no PSI
        psi = f.gauge(
            "host_cpu_pressure_ratio",
            "Share of the newest window in which some task on the host waited for a CPU (PSI).",
            [],
        )
        psi.add_metric([], a.cpu_pressure)
    by = f.counter(
        "agent_probe_sessions_refused_by_reason",
        "Probers the responder turned away, by reason: busy, source, memory, hello, "
        "unauthenticated, address.",
        ["reason"],
    )
    for reason in REFUSAL_REASONS:  # a fixed set: a bad report adds no label values
        by.add_metric([reason], float(a.sessions_refused_by_reason.get(reason, 0)))


class RttTotals:
    """Every window's RTT sketch per target path since the agent started, merged: what
    the native histogram `fabricprobe_agent_rtt_seconds` serves (cumulative, as rate()
    wants it). Windows are taken in order, once each, by (epoch, seq).

    Bound: MAX_PATHS paths; a new path beyond it evicts the one updated longest ago (its
    series starts again from zero if it comes back), counted in `evicted`. A sketch that
    does not parse is skipped and counted in `rejected`."""

    MAX_PATHS = 512

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.paths: dict[PathKey, MergedSketch] = {}  # oldest update first
        self.last: tuple[int, int] | None = None
        self.evicted = 0
        self.rejected = 0

    def take(self, report: pb.WindowReport) -> None:
        at = (report.epoch, report.seq)
        with self.lock:
            if self.last is not None and at <= self.last:
                return
            self.last = at
            for w in report.probes:
                if not w.HasField("rtt"):
                    continue
                try:
                    sk = from_wire(w.rtt)
                    if sk.kind != "rtt":
                        raise ParseError(f"a {sk.kind} sketch where an RTT one belongs")
                except ParseError:
                    self.rejected += 1
                    continue
                if not sk.count:
                    continue
                key = PathKey(w.dst, w.transport, w.op, w.size)
                have = self.paths.pop(key, None)
                if have is None:
                    if len(self.paths) >= self.MAX_PATHS:
                        del self.paths[next(iter(self.paths))]
                        self.evicted += 1
                    have = merged(sk)
                else:
                    have.merge(sk)  # both of kind rtt: cannot fail
                self.paths[key] = have  # moved to the newest end

    def snapshot(self) -> list[tuple[PathKey, MergedSketch]]:
        with self.lock:
            return [(k, merged(v)) for k, v in sorted(self.paths.items())]


def rtt_families(totals: RttTotals, f: _Families) -> None:
    fam = SketchHistogramFamily(
        P + "agent_rtt_seconds",
        "RTT of this host's probes to a target since the agent started (native histogram "
        "over protobuf only).",
        ["dst", "transport", "op", "size"],
        classic=None,
    )
    for (dst, transport, op, size), sk in totals.snapshot():
        fam.add_sketch([dst, transport, op, str(size)], sk)
    f.out["agent_rtt_seconds"] = fam
    evicted = f.counter(
        "agent_rtt_paths_evicted",
        "Paths the agent's RTT histograms forgot to stay within their bound.",
        [],
    )
    evicted.add_metric([], float(totals.evicted))
    rejected = f.counter(
        "agent_rtt_sketches_rejected", "Window RTT sketches the histograms could not read.", []
    )
    rejected.add_metric([], float(totals.rejected))


class AgentCollector(Collector):
    """Custom collector over a running agent; describe() touches nothing."""

    PARTS = ("counters", "probes", "health")

    def __init__(self, agent: AgentView) -> None:
        self.agent = agent
        self.rtt = RttTotals()
        self.http: WebStats | None = None  # the /metrics server's own counts, once serving

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        report = self.agent.last_report
        f = _Families()
        success = GaugeMetricFamily(
            P + "agent_scrape_part_success",
            "1 when this part of the scrape worked.",
            labels=["part"],
        )
        took = GaugeMetricFamily(
            P + "agent_scrape_part_duration_seconds",
            "Time this part of the scrape took.",
            labels=["part"],
        )
        for part in self.PARTS:
            t0 = time.perf_counter()
            ok = 1.0
            try:
                if part == "counters":
                    counter_families(list(self.agent.latest_counters), f)
                elif part == "probes":
                    if report is not None:
                        self.rtt.take(report)  # a no-op when the agent already gave it
                        probe_families(report, f)
                    rtt_families(self.rtt, f)
                elif part == "health":
                    health_families(self.agent, report, f)
            except Exception:  # one bad part never fails the scrape
                log.exception("agent /metrics: %s failed", part)
                ok = 0.0
            success.add_metric([part], ok)
            took.add_metric([part], time.perf_counter() - t0)
        yield from f.out.values()
        yield success
        yield took
        if self.http is not None:
            refused = CounterMetricFamily(
                P + "agent_http_refused",
                "Requests and connections the agent's /metrics server turned away, by reason.",
                labels=["reason"],
            )
            by = self.http.snapshot()[0]
            for reason in WEB_REASONS:
                refused.add_metric([reason], float(by[reason]))
            yield refused


# Families a protobuf scrape leaves out: the native histogram agent_rtt_seconds holds them.
TEXT_ONLY = frozenset({P + "agent_path_rtt_seconds"})

# The agent's /metrics is scraped by one or two Prometheus servers: a small pool renders,
# the rest of fabricprobe.core.web's limits (deadlines, connections per source) as given.
SCRAPE_WORKERS = 2
LIMITS = Limits(max_body=1 << 10, max_inflated=1 << 10, body_budget=1 << 16, workers=SCRAPE_WORKERS)


def metrics_route(registry: CollectorRegistry) -> Route:
    """GET /metrics (and /): protobuf with native histograms to a client whose Accept
    header prefers it, else the text or OpenMetrics form prometheus_client negotiates;
    gzipped when asked."""

    def handle(call: Call) -> Reply:
        accept = call.headers.get("Accept", "")
        if wants_protobuf(accept):
            body = encode(m for m in registry.collect() if m.name not in TEXT_ONLY)
            ctype = CONTENT_TYPE_PROTOBUF
        else:
            encoder, ctype = choose_encoder(accept)
            body = encoder(registry)
        headers = {"Vary": "Accept, Accept-Encoding"}
        if "gzip" in call.headers.get("Accept-Encoding", ""):
            body = gzip.compress(body, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        return Reply(200, body, ctype, headers)

    return Route(("/metrics", "/"), ("GET",), OPEN, handle)


class MetricsServer:
    """/metrics of one agent on HOST:PORT (port 0 picks one), from its own thread and
    event loop (fabricprobe.core.web)."""

    def __init__(self, agent: AgentView, host: str, port: int, limits: Limits = LIMITS) -> None:
        self.registry = CollectorRegistry()
        self.collector = AgentCollector(agent)
        self.registry.register(self.collector)
        self.web = WebServer(
            host, port, [metrics_route(self.registry)], limits=limits, name="agent-metrics"
        )
        self.collector.http = self.web.stats
        self.web.start()  # binds now: a port in use fails the agent's start
        self.port = int(self.web.server_address[1])

    def take(self, report: pb.WindowReport) -> None:
        """Fold a finished window into the RTT histograms (every window, scraped or not)."""
        self.collector.rtt.take(report)

    def start(self) -> None:
        """Serving began in __init__ (kept for callers that start it apart)."""

    def stop(self) -> None:
        self.web.shutdown()
