"""Rails in the collector: a registering host's devices on their rails, as the planner
pairs them (collector/assign.py), and the rails' /metrics families, one series per rail
(never per pair: `probe why` lists the pairs, collector/railtable.py keeps them).

A device is planned on its rail only at an address its host registered (and the
collector checked, collector/service.py check_addresses): its RoCE v2 GID must map one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fabricprobe.collector.assign import RailNic
from fabricprobe.collector.railtable import MAX_RAIL
from fabricprobe.collector.store import ReportError, WindowStore
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.probes.sysfs import Gid

GPU_LINKS = frozenset({"", "PIX", "PXB", "PHB", "NODE", "SYS"})
MAX_WHY_RAILS = 256  # rail paths one Why reply carries


def check_device(d: pb.RdmaDevice) -> None:
    """A registered device's rail and GPU fields within bounds; ReportError otherwise."""
    if d.HasField("rail") and d.rail > MAX_RAIL:
        raise ReportError(f"device {d.name[:40]!r}: rail {d.rail} is not 0..{MAX_RAIL}")
    if len(d.gpu) > 16 or len(d.gpu_address) > 32 or d.gpu_link not in GPU_LINKS:
        raise ReportError(f"device {d.name[:40]!r}: bad GPU fields")


def rail_nics(info: pb.HostInfo) -> tuple[RailNic, ...]:
    """INFO's devices on their rails, one per rail (the first by name), each at the
    registered address its RoCE v2 GID maps; () for a host that names no rail."""
    registered = set(info.addresses)
    by_rail: dict[int, RailNic] = {}
    for d in sorted(info.devices, key=lambda d: d.name):
        if not d.HasField("rail") or d.rail > MAX_RAIL or d.rail in by_rail:
            continue
        for p in d.ports:
            hit = next(
                (
                    (g.gid, v4)
                    for g in p.gids
                    if g.type == "RoCE v2"
                    and (v4 := Gid(g.index, g.gid, g.type, None).ipv4) in registered
                ),
                None,
            )
            if hit is not None:
                by_rail[d.rail] = RailNic(d.rail, d.name, hit[0], hit[1])
                break
    return tuple(by_rail[r] for r in sorted(by_rail))


def why_rails(store: WindowStore, ranked: Iterable[pb.PathRank]) -> list[pb.RailPath]:
    """The rails `probe why` shows: every rail of the RANKED paths' host pairs, and any
    rail path standing out anywhere (a fault with no request on it yet), those standing
    out first; at most MAX_WHY_RAILS."""
    pairs = {(p.src, p.dst) for p in ranked}
    keep = [
        m
        for m in store.rail_view().paths
        if m.stands_out or (m.src, m.dst) in pairs or (m.dst, m.src) in pairs
    ]
    return keep[:MAX_WHY_RAILS]


class RailCollector(Collector):
    """fabricprobe_rail_* from the store's rail table, one series per rail."""

    def __init__(self, store: WindowStore) -> None:
        self.store = store

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        view = self.store.rail_view()
        rails, windows = view.summary, view.windows
        paths = GaugeMetricFamily(
            "fabricprobe_rail_paths",
            "Host pairs probed on the rail with a fresh window (each way, each probe kind).",
            labels=["rail"],
        )
        out = GaugeMetricFamily(
            "fabricprobe_rail_paths_standing_out",
            "Of those, the ones whose median RTT is over twice their pair's other rails', "
            "or that lost probes while the other rails lost none.",
            labels=["rail"],
        )
        loss = GaugeMetricFamily(
            "fabricprobe_rail_loss_ratio",
            "Lost over sent probes on the rail, the newest window of each of its paths.",
            labels=["rail"],
        )
        for rail, s in rails.items():
            paths.add_metric([str(rail)], s.paths)
            out.add_metric([str(rail)], s.standing_out)
            loss.add_metric([str(rail)], s.lost / s.sent if s.sent else 0.0)
        yield from (paths, out, loss)
        taken = CounterMetricFamily(
            "fabricprobe_rail_windows",
            "Rail windows from the agents: taken, refused (malformed), dropped (over a "
            "host's bound) or evicted (the oldest, over the table's).",
            labels=["outcome"],
        )
        for outcome, n in windows.items():
            taken.add_metric([outcome], n)
        yield taken
