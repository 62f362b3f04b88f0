"""Flows: the connected QP pairs between hosts, paired from the agents' QP listings
(agent/flows.py), so that a KV transfer's own 5-tuple, and with a trace its links, is
known rather than its pair's probed classes.

Two QPs pair when host A's QP (lqpn L, rqpn R) and host B's (lqpn R, rqpn L) were live at
overlapping times, on the same rail where both have one, and their PSNs agree: A's next
PSN to send is near B's next PSN expected, and the other way round. QP numbers repeat
across devices (every rxe device starts at 17), so the PSNs, 24-bit and drawn at random
when a connection is made, are what tells two pairs with the same numbers apart: a
stranger's PSNs fall within PSN_SLACK of both by chance 1 time in 16. Of several
candidates the closest is taken, and the gap is given with the flow as its evidence.

A pair of QPs that the agents made themselves (their probes and answers) is no flow.
Bounded: MAX_QPS_PER_HOST QPs per host, each forgotten `keep_s` after it was last seen.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.probes.qps import PSN_MAX, QPN_MAX, psn_gap

MAX_QPS_PER_HOST = 8192
MAX_HOSTS = 100_000
PSN_SLACK = 1 << 22  # a quarter of the PSN space each way
DEFAULT_INTERVAL_S = 15.0  # a host's listing interval until two listings say otherwise
MAX_TEXT = 64


@dataclass
class _Seen:
    qp: pb.LiveQp
    first_s: float
    last_s: float


@dataclass(frozen=True)
class Flow:
    src: str
    dst: str
    out: pb.LiveQp  # src's QP: the flow's source port from src to dst
    back: pb.LiveQp  # dst's QP
    gap: int  # the larger of the two PSN gaps

    @property
    def rail(self) -> int | None:
        return self.out.rail if self.out.HasField("rail") else None


@dataclass
class FlowCounts:
    listings: int = 0
    listings_failed: int = 0
    qps_refused: int = 0  # malformed QPs in listings
    qps_dropped: int = 0  # past an agent's or this table's bound
    lookups: dict[str, int] = field(default_factory=dict)  # by outcome


def _valid(q: pb.LiveQp) -> bool:
    return (
        0 < q.lqpn <= QPN_MAX
        and 0 < q.rqpn <= QPN_MAX
        and q.sq_psn <= PSN_MAX
        and q.rq_psn <= PSN_MAX
        and q.sport <= 0xFFFF
        and 0 < len(q.device) <= MAX_TEXT
        and len(q.comm) <= MAX_TEXT
        and len(q.type) <= 16
        and len(q.state) <= 16
        and (not q.HasField("rail") or q.rail <= 63)
    )


class FlowTable:
    """Each host's live QPs over time, paired into flows on demand; thread-safe."""

    def __init__(self, keep_s: float = 900.0) -> None:
        self.keep_s = keep_s
        self.counts = FlowCounts()
        self._lock = threading.Lock()
        self._qps: dict[str, dict[tuple[str, int], _Seen]] = {}  # host -> (device, lqpn)
        self._listed: dict[str, float] = {}  # host -> its newest listing
        self._interval: dict[str, float] = {}  # host -> seconds between its listings
        self._errors: dict[str, str] = {}  # host -> why its newest listing failed
        self._swept_s = float("-inf")
        # (lqpn, rqpn) -> host -> its QPs with those numbers, (device, lqpn)
        self._index: dict[tuple[int, int], dict[str, set[tuple[str, int]]]] = {}

    def take(self, host: str, listing: pb.QpList, at_s: float) -> list[Flow]:
        """HOST's listing at AT_S; the flows it makes with the other hosts now."""
        with self._lock:
            if host not in self._qps and len(self._qps) >= MAX_HOSTS:
                self.counts.qps_dropped += len(listing.qps)
                return []
            self.counts.listings += 1
            self.counts.qps_dropped += listing.dropped
            if listing.error:
                self.counts.listings_failed += 1
                self._errors[host] = listing.error[:300]
            else:
                self._errors.pop(host, None)
            last = self._listed.get(host)
            if last is not None and 0 < at_s - last <= 3600:
                self._interval[host] = at_s - last
            self._listed[host] = at_s
            mine = self._qps.setdefault(host, {})
            now_live = []
            for q in listing.qps:
                if not _valid(q):
                    self.counts.qps_refused += 1
                    continue
                key = (q.device, q.lqpn)
                seen = mine.get(key)
                if seen is None or seen.qp.rqpn != q.rqpn:  # new, or its number reused
                    if seen is not None:
                        self._unindex(host, seen.qp)
                    if len(mine) >= MAX_QPS_PER_HOST:
                        self._forget_oldest(host, mine)
                    seen = mine[key] = _Seen(q, at_s, at_s)
                    self._index.setdefault((q.lqpn, q.rqpn), {}).setdefault(host, set()).add(key)
                else:
                    if not q.comm and q.pid == seen.qp.pid:
                        # the tool reads a QP's task name from /proc as it lists: the
                        # thread that made the QP may have ended since, its QP still live
                        q.comm = seen.qp.comm
                    seen.qp, seen.last_s = q, at_s
                now_live.append(seen)
            self._expire(host, mine, at_s)
            self._sweep(at_s)
            return [f for s in now_live for f in self._pairs(host, s, at_s, at_s)]

    def _unindex(self, host: str, q: pb.LiveQp) -> None:
        hosts = self._index.get((q.lqpn, q.rqpn), {})
        keys = hosts.get(host, set())
        keys.discard((q.device, q.lqpn))
        if not keys:
            hosts.pop(host, None)
        if not hosts:
            self._index.pop((q.lqpn, q.rqpn), None)

    def _forget_oldest(self, host: str, mine: dict[tuple[str, int], _Seen]) -> None:
        key = min(mine, key=lambda k: mine[k].last_s)
        self._unindex(host, mine.pop(key).qp)
        self.counts.qps_dropped += 1

    def _expire(self, host: str, mine: dict[tuple[str, int], _Seen], now_s: float) -> None:
        for key in [k for k, s in mine.items() if now_s - s.last_s > self.keep_s]:
            self._unindex(host, mine.pop(key).qp)

    def _sweep(self, now_s: float) -> None:
        """Forget the hosts that have sent no listing for keep_s (once a minute at most)."""
        if now_s - self._swept_s < 60.0:
            return
        self._swept_s = now_s
        for host in [h for h, t in self._listed.items() if now_s - t > self.keep_s]:
            for seen in self._qps.pop(host, {}).values():
                self._unindex(host, seen.qp)
            for table in (self._listed, self._interval, self._errors):
                table.pop(host, None)

    def _slack(self, host: str) -> float:
        return self._interval.get(host, DEFAULT_INTERVAL_S)

    def _live(self, host: str, s: _Seen, from_s: float, to_s: float) -> bool:
        slack = self._slack(host)
        return s.first_s - slack <= to_s and s.last_s + slack >= from_s

    def _pairs(
        self, host: str, s: _Seen, from_s: float, to_s: float, only: str | None = None
    ) -> list[Flow]:
        """The flows HOST's QP S makes, each way, with QPs live from FROM_S to TO_S (with
        peer ONLY alone, when given)."""
        a = s.qp
        best: dict[str, tuple[int, _Seen]] = {}
        for peer, keys in self._index.get((a.rqpn, a.lqpn), {}).items():
            if peer == host or (only is not None and peer != only):
                continue
            for key in keys:
                t = self._qps[peer][key]
                b = t.qp
                if a.own and b.own:
                    continue
                if a.HasField("rail") and b.HasField("rail") and a.rail != b.rail:
                    continue
                if not self._live(peer, t, from_s, to_s):
                    continue
                gap = max(psn_gap(a.sq_psn, b.rq_psn), psn_gap(a.rq_psn, b.sq_psn))
                if gap <= PSN_SLACK and (peer not in best or gap < best[peer][0]):
                    best[peer] = (gap, t)
        out = []
        for peer, (gap, t) in best.items():
            out += [Flow(host, peer, a, t.qp, gap), Flow(peer, host, t.qp, a, gap)]
        return out

    def flows(self, src: str, dst: str, from_s: float, to_s: float) -> tuple[list[Flow], str, str]:
        """The flows from SRC to DST live between FROM_S and TO_S, closest match first; when
        there are none, why, and the outcome it is counted as ("no listing", "no pair")."""
        with self._lock:
            why = self._missing(src) or self._missing(dst)
            if why:
                return [], why, "no listing"
            got = [
                f
                for s in self._qps.get(src, {}).values()
                if self._live(src, s, from_s, to_s)
                for f in self._pairs(src, s, from_s, to_s, only=dst)
                if f.src == src
            ]
        got.sort(key=lambda f: (f.gap, f.out.lqpn))
        if not got:
            return [], f"no live QP pair from {src} to {dst} at that time", "no pair"
        return got, "", "pair"

    def _missing(self, host: str) -> str:
        if host in self._errors:
            return f"{host} cannot list its QPs ({self._errors[host]})"
        if host not in self._listed:
            return f"no QP listing from {host} (its agent lists none: qp_interval_s 0, no RDMA)"
        return ""

    def counted(self, outcome: str) -> None:
        with self._lock:
            self.counts.lookups[outcome] = self.counts.lookups.get(outcome, 0) + 1

    def live(self) -> int:
        """QPs held, over every host."""
        with self._lock:
            return sum(len(m) for m in self._qps.values())
