"""Engine fragments kept, linked into requests as they arrive, and each request counted
once complete.

Fragments (attribution/engines/) arrive one engine side at a time, and the two sides of
a request may come far apart. Each fragment joins the open request that shares a trace
id or a link key with it (attribution/linking.py's rule, kept as fragments come: an
open request holds its fragments and its keys), so a pass looks only at the requests
that changed or whose wait is over, never at every fragment kept. A linked request is
complete when both sides are in with their hosts, or when no fragment came for
`link_wait_s` (`pair_wait_s` for a request that looks like half of a pair, whose other
side may come after the decode): then its path is counted as known, or as unknown by
reason, once, and it is handed on (its stages for the histograms, the request for the
analysis: attribution/assembly.py). A stage an engine measured as its own span was
counted when it arrived and is not counted again. At most `max_fragments` fragments
are held in open requests; the oldest requests beyond are let go of, counted in
`dropped`.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from fabricprobe.collector.attribution.engines.common import Fragment
from fabricprobe.collector.attribution.linking import REASONS, HostDirectory, Linked, link
from fabricprobe.collector.attribution.stages import RequestRecord, StageRecord

MAX_FINAL = 200_000  # request ids remembered as counted (a late fragment counts nothing twice)
MAX_IDENTITIES = 100_000  # sending processes whose host is remembered
Directory = Callable[[], HostDirectory]


class ReasonCount(NamedTuple):
    """Engine requests whose path is unknown for one reason."""

    reason: str  # one of linking.REASONS
    requests: int


@dataclass(frozen=True)
class PathCounts:
    """Engine requests counted as complete: path known, or unknown by reason."""

    known: int
    unknown: tuple[ReasonCount, ...]  # every reason of linking.REASONS, in that order
    late: int = 0  # fragments that came after their request was counted without them


@dataclass(frozen=True)
class Completed:
    """What the requests that became complete add to the histograms."""

    requests: int
    stages: list[StageRecord]  # those not counted before as a measured span
    records: list[RequestRecord]
    linked: list[Linked]  # the requests themselves
    # the request ids and trace ids of the fragments done with (linked, or let go of)
    ids: set[str] = field(default_factory=set)


class _Open:
    """One open request: its fragments, its keys, and its link while nothing changed."""

    __slots__ = ("arrived_ns", "fragments", "keys", "last_ns", "linked")

    def __init__(self) -> None:
        self.fragments: list[Fragment] = []
        self.keys: set[str] = set()
        self.last_ns = 0  # the newest fragment's end
        self.arrived_ns = 0  # when the newest fragment arrived (0: not told)
        self.linked: Linked | None = None  # linked again when a fragment comes


def _newest(o: _Open) -> int:
    """When an open request last changed: its newest fragment's end or arrival."""
    return max(o.last_ns, o.arrived_ns)


def _keys(f: Fragment) -> list[str]:
    return [*f.keys, "trace:" + f.trace_id] if f.trace_id else list(f.keys)


class RequestLinker:
    """Engine fragments in open requests (at most max_fragments), linked as they come;
    completed requests counted and handed on."""

    def __init__(self, max_fragments: int, *, link_wait_s: float, pair_wait_s: float) -> None:
        self.link_wait_s = link_wait_s  # no new fragment this long: a request is complete
        self.pair_wait_s = pair_wait_s  # ... unless it is half of a pair (PathInfo.pending)
        self.max_fragments = max_fragments
        self.lock = threading.Lock()
        self._open: dict[int, _Open] = {}  # open requests, oldest first
        self._owner: dict[str, int] = {}  # link key -> its open request
        self._next = 0
        self._held = 0  # fragments in open requests
        self._changed: set[int] = set()  # open requests a fragment came to since a pass
        self._done: set[str] = set()  # ids of fragments let go of since the last pass
        self._unlooked: deque[Fragment] = deque(maxlen=max_fragments)  # for engine hosts
        self.dropped = 0  # fragments of open requests let go of to keep the bound
        self._final: dict[str, None] = {}  # request ids counted, oldest first
        self._measured: dict[tuple[str, str], tuple[str, str]] = {}  # (rid, stage) -> path
        self._identity_host: dict[str, str | None] = {}
        self.engine_hosts: set[str] = set()  # agent hosts an engine side runs on
        self.path_known_total = 0
        self.path_unknown_total: dict[str, int] = dict.fromkeys(REASONS, 0)
        self.late_total = 0  # fragments that came after their request was counted

    @property
    def fragments(self) -> list[Fragment]:
        """The fragments of the open requests, oldest request first."""
        with self.lock:
            return [f for o in self._open.values() for f in o.fragments]

    def add(self, fragments: list[Fragment], now_ns: int = 0) -> None:
        """Take FRAGMENTS, arrived at NOW_NS: a request's wait runs from its newest
        fragment's arrival or end, whichever is later. Two engines' OTLP exporters send on
        timers of their own (the SDK's batch delay, 5 s by default), so one side of a
        request can arrive seconds after the other ended; a wait from the end alone
        would give that side none."""
        if not fragments:
            return
        with self.lock:
            for f in fragments:
                self._add(f, now_ns)
            self._unlooked.extend(fragments)
            while self._held > self.max_fragments and self._open:
                gid = next(iter(self._open))
                self.dropped += len(self._open[gid].fragments)
                self._forget(gid)

    def _add(self, f: Fragment, now_ns: int) -> None:
        keys = _keys(f)
        gids = {g for g in (self._owner.get(k) for k in keys) if g is not None}
        if not gids:
            gid = self._next
            self._next += 1
            self._open[gid] = _Open()
        else:  # the largest takes the others in (their keys follow)
            gid = max(gids, key=lambda g: len(self._open[g].fragments))
            into = self._open[gid]
            for other in gids - {gid}:
                o = self._open.pop(other)
                self._changed.discard(other)
                into.fragments += o.fragments
                into.keys |= o.keys
                into.last_ns = max(into.last_ns, o.last_ns)
                into.arrived_ns = max(into.arrived_ns, o.arrived_ns)
                for k in o.keys:
                    self._owner[k] = gid
        o = self._open[gid]
        o.fragments.append(f)
        o.keys.update(keys)
        o.last_ns = max(o.last_ns, f.end_ns)
        o.arrived_ns = max(o.arrived_ns, now_ns)
        o.linked = None
        for k in keys:
            self._owner[k] = gid
        self._held += 1
        self._changed.add(gid)

    def _forget(self, gid: int) -> None:
        o = self._open.pop(gid)
        self._done.update(f.request_id or f.trace_id for f in o.fragments)
        self._held -= len(o.fragments)
        self._changed.discard(gid)
        for k in o.keys:
            if self._owner.get(k) == gid:
                del self._owner[k]

    def measured(self, stages: list[StageRecord]) -> None:
        """Note STAGES, spans that measured their stage: a linked request's stage of the
        same request and name is not counted again, and a KV transfer's path is known."""
        with self.lock:
            m = self._measured
            for s in stages:
                m[(s.request_id, s.stage)] = (s.src, s.dst)
                if len(m) > MAX_FINAL:
                    del m[next(iter(m))]

    def linked(self, since_ns: int, directory: Directory) -> list[Linked]:
        """The open requests with a fragment that ended after SINCE_NS, linked."""
        with self.lock:
            groups = [(gid, o) for gid, o in self._open.items() if o.last_ns > since_ns]
        if not groups:
            return []
        hosts = directory()
        return [self._link(o, hosts) for _, o in groups]

    @staticmethod
    def _link(o: _Open, hosts: HostDirectory) -> Linked:
        got = o.linked
        if got is None:
            got = o.linked = link(list(o.fragments), hosts)
        return got

    def _path_known(self, lk: Linked) -> bool:
        """A request's path is known from its engines' link, or from a measured KV span."""
        got = self._measured.get((lk.path.request_id, "kv_transfer"))
        return lk.path.path_known or (got is not None and bool(got[0] and got[1]))

    def complete(self, now_ns: int, directory: Directory) -> Completed:
        """Count the open requests that are complete (see the module docstring): those a
        fragment came to since the last pass, and those whose wait is over."""
        horizon = max(120.0, 4 * self.link_wait_s, 2 * self.pair_wait_s)
        shortest = min(self.link_wait_s, self.pair_wait_s)
        with self.lock:
            changed, self._changed = self._changed, set()
            old = now_ns - horizon * 1e9
            for gid in [g for g, o in self._open.items() if _newest(o) < old]:
                self._forget(gid)  # too old to be waited for (and never seen whole)
            due = [
                (gid, o)
                for gid, o in self._open.items()
                if gid in changed or (now_ns - _newest(o)) / 1e9 >= shortest
            ]
        out = Completed(0, [], [], [])
        if not due:
            with self.lock:
                ids, self._done = self._done, set()
            return Completed(0, [], [], [], ids)
        hosts = directory()
        for gid, o in due:
            lk = self._link(o, hosts)
            p = lk.path
            with self.lock:
                if gid not in self._open:
                    continue
                if p.request_id in self._final:
                    self.late_total += len(o.fragments)
                    self._forget(gid)  # a late fragment of a request counted already
                    continue
                known = self._path_known(lk)
                wait = self.pair_wait_s if p.pending else self.link_wait_s
                waited = (now_ns - _newest(o)) / 1e9 >= wait
                if not (gid in changed and known and p.path_known) and not waited:
                    continue
                self._forget(gid)
                self._final[p.request_id] = None
                if len(self._final) > MAX_FINAL:
                    del self._final[next(iter(self._final))]
                if known:
                    self.path_known_total += 1
                else:
                    self.path_unknown_total[p.reason or "one side only"] += 1
                # the measured span of a stage was counted already
                out.stages.extend(
                    s for s in lk.stages if (s.request_id, s.stage) not in self._measured
                )
            out.records.append(lk.request)
            out.linked.append(lk)
        with self.lock:
            ids, self._done = self._done, set()
        return Completed(len(out.records), out.stages, out.records, out.linked, ids)

    def new_engine_hosts(self, directory: Directory) -> set[str]:
        """The agent hosts of the engine sides that arrived since the last call, not seen
        before (each sending process is looked up once)."""
        with self.lock:
            new, self._unlooked = list(self._unlooked), deque(maxlen=self.max_fragments)
        if len(self._identity_host) > MAX_IDENTITIES:
            self._identity_host.clear()
        hosts = directory() if new else None
        found: set[str] = set()
        for f in new:
            assert hosts is not None
            if f.identity in self._identity_host:
                continue
            got, _ = hosts.resolve(f.hosts)
            if got is None and f.peer:
                got, _ = hosts.resolve([("peer", f.peer)])
            self._identity_host[f.identity] = got
            if got is not None and got not in self.engine_hosts:
                found.add(got)
        self.engine_hosts |= found
        return found

    def counts(self) -> PathCounts:
        with self.lock:
            unknown = tuple(ReasonCount(r, n) for r, n in self.path_unknown_total.items())
            return PathCounts(self.path_known_total, unknown, self.late_total)
