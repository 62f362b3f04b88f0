"""The links in the running collector: their settings, their /metrics families (one
series per directed link, never per pair or class) and their Query answer."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from fabricprobe.collector.fabric.links import FabricLinks, LinksSnapshot
from fabricprobe.collector.fabric.localize import LocalizeConfig
from fabricprobe.collector.fabric.topology import Topology
from fabricprobe.core.api import fabricprobe_pb2 as pb


@dataclass(frozen=True)
class FabricConfig:
    """Where the known fabric is described, and how its links are judged."""

    topology_file: str
    localize: LocalizeConfig = field(default_factory=LocalizeConfig)
    refresh_s: float = 600.0  # a class path older than this is traced again
    ecmp_classes: int = 4  # ECMP classes per rdma_ud target

    def __post_init__(self) -> None:
        if not 1 <= self.ecmp_classes <= 16:
            raise ValueError("ecmp_classes must be 1..16")
        if not 10 <= self.refresh_s <= 86400:
            raise ValueError("refresh_s must be 10..86400")


FLOW_SPAN_S = 60.0  # a flow lookup with no span: the flows of the last minute
# a Links reply's bound: under gRPC's default 4 MiB a client takes, with room to spare
REPLY_BYTES = 3 * 2**20
LINKS_BYTES = 2 * 2**20  # of that, the ranked links': a fabric's lowest ranked past it
LEFT_OUT = "left out of this reply: its size bound (ask for fewer spans)"


def attach_links(cfg: FabricConfig | None, registry: CollectorRegistry) -> FabricLinks | None:
    """The collector's FabricLinks for CFG (None: no fabric file, no links), its
    families registered."""
    if cfg is None:
        return None
    links = FabricLinks(
        Topology.load(cfg.topology_file),
        cfg.localize,
        refresh_s=cfg.refresh_s,
        ecmp_classes=cfg.ecmp_classes,
    )
    registry.register(LinkCollector(links))
    return links


def _label(rail: int | None) -> str:
    return "" if rail is None else str(rail)


class LinkCollector(Collector):
    """fabricprobe_link_* from one snapshot per scrape."""

    def __init__(self, links: FabricLinks) -> None:
        self.links = links

    def collect(self) -> Iterator[Metric]:
        snap: LinksSnapshot = self.links.snapshot()
        labels = ["link", "rail"]
        fams = {
            "suspect": GaugeMetricFamily(
                "fabricprobe_link_suspect",
                "1 when the link is named by the tomography over the probed ECMP classes.",
                labels=labels,
            ),
            "rank": GaugeMetricFamily(
                "fabricprobe_link_rank", "The link's rank, 1 the likeliest at fault.", labels=labels
            ),
            "rise": GaugeMetricFamily(
                "fabricprobe_link_rtt_rise_seconds",
                "Median RTT rise over their baselines of the classes through the link.",
                labels=labels,
                unit="seconds",
            ),
            "loss": GaugeMetricFamily(
                "fabricprobe_link_loss_ratio",
                "Lost over sent probes of the classes through the link, newest windows.",
                labels=labels,
            ),
            "classes": GaugeMetricFamily(
                "fabricprobe_link_classes",
                "ECMP classes with a fresh window whose path crosses the link.",
                labels=labels,
            ),
            "bad": GaugeMetricFamily(
                "fabricprobe_link_bad_classes",
                "Of those, the classes that rose or lost in their newest window.",
                labels=labels,
            ),
        }
        for v in snap.verdicts:
            key = [v.link, _label(v.rail)]
            fams["suspect"].add_metric(key, 1.0 if v.suspect else 0.0)
            fams["rank"].add_metric(key, v.rank)
            fams["rise"].add_metric(key, v.rtt_rise_s)
            fams["loss"].add_metric(key, v.loss)
            fams["classes"].add_metric(key, v.classes)
            fams["bad"].add_metric(key, v.bad_classes)
        yield from fams.values()
        c = snap.counts
        f = self.links.flows.counts
        yield GaugeMetricFamily(
            "fabricprobe_link_live_qps",
            "Connected QPs the agents listed and the collector holds, to pair into flows.",
            value=self.links.flows.live(),
        )
        yield GaugeMetricFamily(
            "fabricprobe_link_class_paths", "ECMP class paths known.", value=snap.paths
        )
        yield GaugeMetricFamily(
            "fabricprobe_links_uncovered",
            "Links of the fabric file crossed by fewer known classes than a suspect needs.",
            value=len(snap.uncovered),
        )
        counted: tuple[tuple[str, str, str, dict[str, int]], ...] = (
            (
                "paths",
                "outcome",
                "Class paths learned from traces (new), or found changed (changed).",
                {"new": c.paths_learned, "changed": c.paths_changed},
            ),
            (
                "paths_unresolved",
                "reason",
                "Traces that could not be placed on the fabric file's links, by why.",
                c.paths_unresolved,
            ),
            (
                "retraces",
                "reason",
                "Traces asked of agents: new, old (past the refresh), suspect (a loss, a rise), "
                "or flow (a request's QP pair).",
                c.retraces_asked,
            ),
            (
                "class_windows",
                "outcome",
                "Class windows taken, refused (malformed), or host-bound (never judged).",
                {
                    "taken": c.class_windows,
                    "refused": c.class_windows_refused,
                    "host_bound": self.links.localizer.stats.host_bound,
                },
            ),
        )
        counted += (
            (
                "qp_listings",
                "outcome",
                "QP listings the agents sent: read, or failed (the agent said why).",
                {"ok": f.listings - f.listings_failed, "failed": f.listings_failed},
            ),
            (
                "qps_left",
                "reason",
                "Listed QPs not held: refused (malformed) or dropped (past a bound).",
                {"refused": f.qps_refused, "dropped": f.qps_dropped},
            ),
            (
                "flow_lookups",
                "outcome",
                "Requests' flows looked up: flow (links known), not traced, no source-port "
                "rule, no pair (no live QP pair), no listing.",
                f.lookups,
            ),
        )
        for name, label, help_text, values in counted:
            fam = CounterMetricFamily(f"fabricprobe_link_{name}", help_text, labels=[label])
            for value, n in sorted(values.items()):
                fam.add_metric([value], n)
            yield fam


def links_reply(
    links: FabricLinks | None,
    src: str = "",
    dst: str = "",
    span_s: tuple[float, float] | None = None,
    spans: Sequence[tuple[str, str, tuple[float, float] | None]] = (),
) -> pb.LinksReply:
    """The Query answer: every link ranked; with SRC and DST, the classes from SRC to DST
    and the flows between them live in SPAN_S (from, to; the last FLOW_SPAN_S when
    None); and as much for each of SPANS (src, dst, span), in order, while the reply
    stays within REPLY_BYTES (the spans past that say so and carry nothing)."""
    if links is None:
        return pb.LinksReply(configured=False, spans=[pb.SpanLinks() for _ in spans])
    snap = links.snapshot()
    reply = pb.LinksReply(configured=True, class_paths=snap.paths)
    size = 0
    for i, v in enumerate(snap.verdicts):  # the same fields; a link on no rail has rail -1
        rail = -1 if v.rail is None else v.rail
        verdict = pb.LinkVerdict(**(asdict(v) | {"rail": rail}))
        size += verdict.ByteSize() + 8  # with the field's tag and length
        if size > LINKS_BYTES:
            reply.links_left_out = len(snap.verdicts) - i
            break
        reply.links.append(verdict)
    if src and dst:
        one = pair_links(links, src, dst, span_s)
        reply.classes.extend(one.classes)
        reply.flows.extend(one.flows)
        reply.flows_reason = one.flows_reason
    left_out = pb.SpanLinks(flows_reason=LEFT_OUT)
    # room held for every span to say it was left out; a field's tag and length <= 8 B
    room = REPLY_BYTES - reply.ByteSize() - len(spans) * (left_out.ByteSize() + 8)
    for a, b, span in spans:
        got = left_out
        if room > 0:
            got = pair_links(links, a, b, span)
            room -= got.ByteSize() + 8
            if room < 0:
                got = left_out
        reply.spans.append(got)
    return reply


def pair_links(
    links: FabricLinks, src: str, dst: str, span_s: tuple[float, float] | None
) -> pb.SpanLinks:
    """The classes known from SRC to DST, and the flows between them live in SPAN_S."""
    out = pb.SpanLinks()
    for sport, path, on in links.links_of(src, dst):
        out.classes.append(pb.ClassLinks(sport=sport, links=list(path), rail=on))
    now = links.clock()
    lo, hi = span_s or (now - FLOW_SPAN_S, now)
    flows, out.flows_reason = links.flow_links(src, dst, lo, hi)
    out.flows.extend(flows)
    return out
