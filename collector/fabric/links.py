"""The collector's links: class paths learned from the agents' traces, class windows
fed to the localizer, and the classes it asks agents to trace again.

A class's path is its probes' way out, traced by its prober, and its answers' way back:
the responder's source port traced from the peer. Paths are cached per (host, peer,
source port, and rail: a rail host's classes to one peer, one set per rail, are apart)
and traced again when a route may have changed: the class lost probes, its hop count
changed, or the path is older than `refresh_s`. The request rides on the Ack
of the host's next report (Ack.retrace). Everything done is counted (LinkCounts).

Flows (collector/fabric/flows.py): the connected QP pairs the agents list are paired
across hosts, and each flow's source port is traced from its host as a class's is; a
flow's path is its own, never a class the localizer judges. A request's links are then
its flow's (`flow_links`).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from fabricprobe.collector.fabric.flows import FlowTable
from fabricprobe.collector.fabric.localize import (
    ClassKey,
    ClassWindow,
    LinkVerdict,
    LocalizeConfig,
    Localizer,
)
from fabricprobe.collector.fabric.plan import coverage
from fabricprobe.collector.fabric.topology import Topology
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.errors import ParseError
from fabricprobe.core.sketchwire import from_wire

MAX_PATHS = 200_000
MAX_RAIL = 63
Rail = int | None
MAX_RETRACE_PER_ACK = 64
MAX_HOPS = 32
MAX_CLASSES_PER_HOST = 16 * 1024  # 16 classes to each of 1,024 peers
ASK_AGAIN_S = 30.0  # a trace asked for and not yet come is not asked again before this
MAX_FLOWS = 16  # flows answered per request


@dataclass
class _Path:
    src_ip: str
    dst_ip: str
    links: tuple[str, ...]
    hops: int
    learned_s: float


@dataclass
class LinkCounts:
    paths_learned: int = 0
    paths_changed: int = 0
    paths_unresolved: dict[str, int] = field(default_factory=dict)
    retraces_asked: dict[str, int] = field(default_factory=dict)  # by why
    class_windows: int = 0
    class_windows_refused: int = 0


@dataclass(frozen=True)
class LinksSnapshot:
    verdicts: tuple[LinkVerdict, ...]
    counts: LinkCounts
    paths: int
    uncovered: tuple[str, ...] = ()  # links crossed by fewer than min_bad known classes
    partial: int = 0  # classes whose way back is not traced yet (ranked on their way out)


class FabricLinks:
    """Paths, the localizer and the retrace queue; thread-safe."""

    def __init__(
        self,
        topology: Topology,
        config: LocalizeConfig | None = None,
        refresh_s: float = 600.0,
        clock: Callable[[], float] = time.time,
        ecmp_classes: int = 4,
    ) -> None:
        self.topology = topology
        self.ecmp_classes = ecmp_classes  # per rdma_ud target, in the assignments
        self.localizer = Localizer(config)
        self.refresh_s = refresh_s
        self.clock = clock
        self._lock = threading.Lock()
        self._paths: OrderedDict[ClassKey, _Path] = OrderedDict()
        self._returns: dict[ClassKey, ClassKey] = {}  # class -> the path of its answers
        self._retrace: dict[str, dict[tuple[str, int, Rail], pb.Retrace]] = {}
        self._addresses: dict[tuple[str, Rail], str] = {}  # (host, rail) -> its address
        self._asked: OrderedDict[ClassKey, float] = OrderedDict()  # when last asked
        self._per_host: dict[str, set[tuple[str, int, Rail]]] = {}  # each host's classes
        self._flow_only: set[ClassKey] = set()  # paths traced for flows alone
        self.flows = FlowTable()
        self.counts = LinkCounts()

    # ------------------------------------------------------------------ intake
    def take(self, host: str, report: pb.WindowReport) -> None:
        """A report's class paths and class windows."""
        now = self.clock()
        for cp in report.class_paths[: MAX_RETRACE_PER_ACK * 4]:
            self._learn(host, cp, now)
        for w in report.class_windows:
            self._window(host, w, report.window_end_unix_ns / 1e9)
        if report.HasField("qps"):
            flows = self.flows.take(host, report.qps, report.window_end_unix_ns / 1e9)
            with self._lock:
                for f in flows:
                    if f.out.sport:
                        self._want_flow(ClassKey(f.src, f.dst, f.out.sport, f.rail), now)

    def _learn(self, host: str, cp: pb.ClassPath, now: float) -> None:
        if not 0 < cp.sport <= 0xFFFF or len(cp.hops) > MAX_HOPS:
            self._unresolved("bad class path")
            return
        res = self.topology.resolve(cp.src_ip, cp.dst_ip, [h or None for h in cp.hops])
        key = ClassKey(host, cp.dst, cp.sport, _rail(cp))
        with self._lock:
            self._addresses[(host, key.rail)] = cp.src_ip
            if not res.links:
                self.counts.paths_unresolved[res.reason] = (
                    self.counts.paths_unresolved.get(res.reason, 0) + 1
                )
                return
            old = self._paths.get(key)
            if old is None:
                self.counts.paths_learned += 1
            elif old.links != res.links:
                self.counts.paths_changed += 1
            self._paths[key] = _Path(cp.src_ip, cp.dst_ip, res.links, len(cp.hops), now)
            self._paths.move_to_end(key)
            while len(self._paths) > MAX_PATHS:
                self._paths.popitem(last=False)

    def _unresolved(self, why: str) -> None:
        with self._lock:
            self.counts.paths_unresolved[why] = self.counts.paths_unresolved.get(why, 0) + 1

    def _window(self, host: str, w: pb.ProbeWindow, end_s: float) -> None:
        if not 0 < w.sport <= 0xFFFF or w.return_sport > 0xFFFF or not w.dst:
            with self._lock:
                self.counts.class_windows_refused += 1
            return
        key = ClassKey(host, w.dst, w.sport, _rail(w))
        with self._lock:
            mine = self._per_host.setdefault(host, set())
            if key[1:] not in mine and len(mine) >= MAX_CLASSES_PER_HOST:
                self.counts.class_windows_refused += 1  # one host cannot fill the table
                return
            mine.add((key.dst, key.sport, key.rail))
            self._flow_only.discard(key)
        try:
            rtt = from_wire(w.rtt)
            delay_sk = from_wire(w.prober_delay) if w.HasField("prober_delay") else None
        except ParseError:
            with self._lock:
                self.counts.class_windows_refused += 1
            return
        lost, sent = rtt.lost, rtt.count + rtt.lost
        p50 = _p50_s(rtt.percentile_ns(50.0))
        delay = _p50_s(delay_sk.percentile_ns(50.0) if delay_sk else None) or 0.0
        bad = self.localizer.observe(ClassWindow(key, end_s, p50, sent, lost, delay))
        now = self.clock()
        with self._lock:
            self.counts.class_windows += 1
            if w.return_sport:
                back = self._returns[key] = ClassKey(w.dst, host, w.return_sport, key.rail)
                self._flow_only.discard(back)
            self._want_traces(key, lost > 0 or bad, now)

    def _want_traces(self, key: ClassKey, suspect: bool, now: float) -> None:
        """Queue traces for KEY's way out and way back where they are missing, old, or
        may have changed (the class lost probes or went bad). Under the lock."""
        for k in (key, self._returns.get(key)):
            if k is not None:
                self._want(k, suspect, now)

    def _want_flow(self, key: ClassKey, now: float) -> None:
        """Queue a trace of flow KEY's way where it is missing or old. Under the lock."""
        if key[1:] not in self._per_host.get(key.src, ()) and (
            key in self._flow_only or len(self._flow_only) < MAX_PATHS
        ):
            self._flow_only.add(key)
        self._want(key, False, now, new="flow")

    def _want(self, k: ClassKey, suspect: bool, now: float, new: str = "new") -> None:
        p = self._paths.get(k)
        why = (
            new
            if p is None
            else "old"
            if now - p.learned_s > self.refresh_s
            else "suspect"
            if suspect
            else ""
        )
        if not why or now - self._asked.get(k, -ASK_AGAIN_S) < ASK_AGAIN_S:
            return
        address = p.dst_ip if p else self._addresses.get((k.dst, k.rail), "")
        if not address:
            return  # the peer's address is learned from its own traces
        queue = self._retrace.setdefault(k.src, {})
        if k[1:] not in queue and len(queue) < MAX_RETRACE_PER_ACK:
            queue[(k.dst, k.sport, k.rail)] = pb.Retrace(
                dst=k.dst, address=address, sport=k.sport, rail=k.rail
            )
            self.counts.retraces_asked[why] = self.counts.retraces_asked.get(why, 0) + 1
            self._asked[k] = now
            self._asked.move_to_end(k)
            while len(self._asked) > MAX_PATHS:
                self._asked.popitem(last=False)

    def retraces(self, host: str) -> list[pb.Retrace]:
        """The traces HOST is asked for on its next Ack (each asked once)."""
        with self._lock:
            return list(self._retrace.pop(host, {}).values())

    # ------------------------------------------------------------------ answers
    def class_links(self) -> dict[ClassKey, tuple[str, ...]]:
        return self._class_paths()[0]

    def _class_paths(self) -> tuple[dict[ClassKey, tuple[str, ...]], set[ClassKey]]:
        """Each class's links, out then back, and the classes whose answers come back on
        a source port whose way is not traced yet (ranked on their way out alone)."""
        with self._lock:
            out, partial = {}, set()
            for k, p in self._paths.items():
                if k in self._flow_only:
                    continue
                back = self._returns.get(k)
                rp = self._paths.get(back) if back else None
                out[k] = p.links + (rp.links if rp else ())
                if back and rp is None:
                    partial.add(k)
            return out, partial

    def snapshot(self) -> LinksSnapshot:
        paths, partial = self._class_paths()
        verdicts = self.localizer.rank(
            paths,
            self.clock(),
            links=self.topology.links(),
            rail_of=rails_of(self.topology, paths),
        )
        with self._lock:
            counts = LinkCounts(
                self.counts.paths_learned,
                self.counts.paths_changed,
                dict(self.counts.paths_unresolved),
                dict(self.counts.retraces_asked),
                self.counts.class_windows,
                self.counts.class_windows_refused,
            )
        _, short = coverage(paths, self.topology.links(), self.localizer.config.min_bad)
        return LinksSnapshot(tuple(verdicts), counts, len(paths), tuple(short), len(partial))

    def links_of(self, src: str, dst: str) -> list[tuple[int, tuple[str, ...], Rail]]:
        """(source port, links, rail) of every class known from SRC to DST."""
        paths = self.class_links()
        return sorted(
            ((k.sport, v, k.rail) for k, v in paths.items() if k.src == src and k.dst == dst),
            key=lambda c: (-1 if c[2] is None else c[2], c[0]),
        )

    def flow_links(
        self, src: str, dst: str, from_s: float, to_s: float
    ) -> tuple[list[pb.FlowLinks], str]:
        """The flows from SRC to DST live between FROM_S and TO_S with their links (way
        out, then back where traced), and why no flow's links are known when none are;
        each lookup is counted by its outcome."""
        flows, why, outcome = self.flows.flows(src, dst, from_s, to_s)
        out = []
        now = self.clock()
        with self._lock:
            for f in flows[:MAX_FLOWS]:
                p = self._paths.get(ClassKey(f.src, f.dst, f.out.sport, f.rail))
                b = self._paths.get(ClassKey(f.dst, f.src, f.back.sport, f.rail))
                if f.out.sport and p is None:
                    self._want_flow(ClassKey(f.src, f.dst, f.out.sport, f.rail), now)
                out.append(
                    pb.FlowLinks(
                        sport=f.out.sport,
                        links=list(p.links if p else ()) + list(b.links if p and b else ()),
                        rail=f.rail,
                        src_qpn=f.out.lqpn,
                        dst_qpn=f.back.lqpn,
                        src_comm=f.out.comm,
                        dst_comm=f.back.comm,
                        traced=p is not None,
                        psn_gap=f.gap,
                    )
                )
        if any(f.traced for f in out):
            outcome, why = "flow", ""
        elif any(f.sport for f in out):
            outcome, why = "not traced", "its flow's trace is asked for and not in yet"
        elif out:
            outcome, why = "no source-port rule", "its QPs' driver has no known source-port rule"
        self.flows.counted(outcome)
        return out, why


def rails_of(topology: Topology, paths: Mapping[ClassKey, Sequence[str]]) -> dict[str, int | None]:
    """Each link's rail: the fabric file's, else the one rail of all the classes known to
    cross it (their devices' rail, which the agents register), else None."""
    seen: dict[str, set[Rail]] = {}
    for k, links in paths.items():
        for link in links:
            seen.setdefault(link, set()).add(k.rail)
    out: dict[str, int | None] = {}
    for link in {*topology.links(), *seen}:
        rail = topology.rail_of(link)
        rails = seen.get(link, set())
        if rail is None and len(rails) == 1:
            rail = next(iter(rails))
        out[link] = rail
    return out


def _rail(msg: pb.ClassPath | pb.ProbeWindow) -> Rail:
    return msg.rail if msg.HasField("rail") and msg.rail <= MAX_RAIL else None


def _p50_s(ns: int | None) -> float | None:
    return None if ns is None else ns / 1e9


__all__: Sequence[str] = ["FabricLinks", "LinkCounts", "LinksSnapshot"]
