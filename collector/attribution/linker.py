"""Engine fragments kept, linked into requests, and each request counted once complete.

Fragments (attribution/engines/) arrive one engine side at a time, and the two sides of
a request may come far apart. They are kept (bounded) and linked again whenever asked
(attribution/linking.py). A linked request is complete when both sides are in with
their hosts, or when no fragment came for `link_wait_s` (`pair_wait_s` for a request
that looks like half of a pair, whose other side may come after the decode): then its
path is counted as known, or as unknown by reason, once, and its stages are handed on
for the histograms. A stage an engine measured as its own span was counted when it
arrived and is not counted again.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from fabricprobe.collector.attribution.engines.common import Fragment
from fabricprobe.collector.attribution.linking import REASONS, HostDirectory, Linked, group, link
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


@dataclass(frozen=True)
class Completed:
    """What the requests that became complete add to the histograms."""

    requests: int
    stages: list[StageRecord]  # those not counted before as a measured span
    records: list[RequestRecord]


class RequestLinker:
    """Engine fragments (newest MAX_RECORDS), linked on demand; completed requests counted."""

    def __init__(self, max_fragments: int, *, link_wait_s: float, pair_wait_s: float) -> None:
        self.link_wait_s = link_wait_s  # no new fragment this long: a request is complete
        self.pair_wait_s = pair_wait_s  # ... unless it is half of a pair (PathInfo.pending)
        self.lock = threading.Lock()
        self.fragments: deque[Fragment] = deque(maxlen=max_fragments)
        self._total = 0  # fragments taken, ever
        self._looked_at = 0  # of those, looked at for their hosts
        self._fresh = False  # fragments came since the last complete()
        self._final: dict[str, None] = {}  # request ids counted, oldest first
        self._measured: dict[tuple[str, str], tuple[str, str]] = {}  # (rid, stage) -> path
        self._identity_host: dict[str, str | None] = {}
        self.engine_hosts: set[str] = set()  # agent hosts an engine side runs on
        self.path_known_total = 0
        self.path_unknown_total: dict[str, int] = dict.fromkeys(REASONS, 0)

    def add(self, fragments: list[Fragment]) -> None:
        if not fragments:
            return
        with self.lock:
            self.fragments.extend(fragments)
            self._total += len(fragments)
            self._fresh = True

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
        """Fragments that ended after SINCE_NS, linked into requests."""
        with self.lock:
            frags = [f for f in self.fragments if f.end_ns > since_ns]
        if not frags:
            return []
        hosts = directory()
        return [link(g, hosts) for g in group(frags)]

    def _path_known(self, lk: Linked) -> bool:
        """A request's path is known from its engines' link, or from a measured KV span."""
        got = self._measured.get((lk.path.request_id, "kv_transfer"))
        return lk.path.path_known or (got is not None and bool(got[0] and got[1]))

    def complete(self, now_ns: int, directory: Directory) -> Completed:
        """Count the linked requests that are complete (see the module docstring)."""
        with self.lock:
            fresh, self._fresh = self._fresh, False
        horizon = max(120.0, 4 * self.link_wait_s, 2 * self.pair_wait_s)
        stages: list[StageRecord] = []
        records: list[RequestRecord] = []
        for lk in self.linked(now_ns - int(horizon * 1e9), directory):
            p = lk.path
            if p.request_id in self._final:
                continue
            known = self._path_known(lk)
            wait = self.pair_wait_s if p.pending else self.link_wait_s
            waited = (now_ns - p.last_ns) / 1e9 >= wait
            if not (fresh and known and p.path_known) and not waited:
                continue
            with self.lock:
                self._final[p.request_id] = None
                if len(self._final) > MAX_FINAL:
                    del self._final[next(iter(self._final))]
                if known:
                    self.path_known_total += 1
                else:
                    self.path_unknown_total[p.reason or "one side only"] += 1
                # the measured span of a stage was counted already
                stages += [s for s in lk.stages if (s.request_id, s.stage) not in self._measured]
            records.append(lk.request)
        return Completed(len(records), stages, records)

    def new_engine_hosts(self, directory: Directory) -> set[str]:
        """The agent hosts of the engine sides that arrived since the last call, not seen
        before (each sending process is looked up once)."""
        with self.lock:
            n = min(self._total - self._looked_at, len(self.fragments))
            new = list(self.fragments)[-n:] if n > 0 else []
            self._looked_at = self._total
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
            return PathCounts(self.path_known_total, unknown)
