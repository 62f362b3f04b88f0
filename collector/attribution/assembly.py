"""Requests assembled from what arrives of them, until each settles, once.

Stage records (fabricprobe's own spans) come in the batches their spans came in, and an
engine's request comes linked from its fragments (attribution/linker.py) when the linker
takes it as complete. An open request collects both under its request id. It settles
when
- it is complete: the link its engines' fragments promise has come (none is promised
  when no fragment named it), and no record of it ended in the last `settle_s` seconds
  (or, for records dated ahead of the collector's clock, none arrived for that long);
- and its KV transfers can be joined with their paths' figures once and for all: each
  agent host at their ends has reported a window that ended after them (so both ends'
  references and their counter readings of that time are in), or has been silent for
  `horizon_s` (no report to wait for); and the path the join reads has an RTT window
  that ended after them, or none for `horizon_s` (a host's report need not carry every
  path: a peer's bulk burst holds its latency bursts back, a loaded host runs them
  late); or `horizon_s` has passed since the transfer ended.
The promise of a link is kept when the linker hands the request on, or is done with the
fragments that made it (linked into a request of another id, or let go of); one that
is never kept settles after `link_cap_s`. At most `max_open` requests are open; the
oldest beyond settle at the next pass, as they are (counted in `forced`; of a flood
between two passes, `max_open` settle and the older ones are let go of).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from fabricprobe.collector.attribution.engines.common import Fragment
from fabricprobe.collector.attribution.linking import Linked
from fabricprobe.collector.attribution.stages import FABRIC_STAGES, RequestRecord, StageRecord

MAX_OPEN = 50_000  # requests being assembled (as many as the records kept)
WindowEnds = Callable[[set[str]], dict[str, int]]  # agent host -> its newest window's end


@dataclass
class Open:
    """One request being assembled."""

    rid: str
    arrived_ns: int  # the collector's clock when its last record came
    first_ns: int  # ... when its first came
    stages: list[StageRecord] = field(default_factory=list)
    request: RequestRecord | None = None
    linked: Linked | None = None
    promised: bool = False  # engine fragments named it: its link is to come
    newest_end: int = 0

    def all_stages(self) -> list[StageRecord]:
        """Its stages, each once: a stage measured as a span supersedes the one laid out
        of the same name (attribution/join.py's measured_first)."""
        got = self.stages + (list(self.linked.stages) if self.linked is not None else [])
        measured = {s.stage for s in got if not s.derived}
        return [s for s in got if not s.derived or s.stage not in measured]

    def record(self) -> RequestRecord | None:
        """Its request figures: the engines' link's, else its own span's."""
        return self.linked.request if self.linked is not None else self.request

    def crossed(self) -> list[StageRecord]:
        """Its KV transfers whose path is known."""
        return [s for s in self.all_stages() if s.stage in FABRIC_STAGES and s.src and s.dst]


# the newest end of each probed path's RTT windows, by (src, dst, transport) and, over
# its transports, by (src, dst, "")
PathEnds = dict[tuple[str, str, str], int]


def path_end(paths: PathEnds, s: StageRecord) -> int | None:
    """The newest RTT window's end of the path the join reads for transfer S (its
    transport's, else any; its direction's, else the reverse: an RTT crosses both), None
    when neither direction is probed."""
    fwd = paths.get((s.src, s.dst, s.transport))
    return fwd if fwd is not None else paths.get((s.dst, s.src, s.transport))


class RequestAssembly:
    """The open requests (see the module docstring), thread-safe."""

    def __init__(
        self,
        *,
        settle_s: float,
        horizon_s: float,
        link_cap_s: float,
        max_open: int = MAX_OPEN,
    ) -> None:
        self.settle_ns = int(settle_s * 1e9)
        self.horizon_ns = int(horizon_s * 1e9)
        self.link_cap_ns = int(link_cap_s * 1e9)
        self.max_open = max_open
        self.lock = threading.Lock()
        self.open: dict[str, Open] = {}  # oldest first
        self.forced = 0  # requests settled early to keep the bound
        self._early: list[Open] = []  # those, until the next pass takes them

    def _get(self, rid: str, now_ns: int) -> Open:
        o = self.open.get(rid)
        if o is None:
            o = self.open[rid] = Open(rid, now_ns, now_ns)
            if len(self.open) > self.max_open:
                oldest = next(iter(self.open))
                self._early.append(self.open.pop(oldest))
                self.forced += 1
                if len(self._early) > self.max_open:  # a flood between two passes
                    del self._early[0]  # counted already, as forced
        o.arrived_ns = now_ns
        return o

    def records(
        self, stages: Iterable[StageRecord], requests: Iterable[RequestRecord], now_ns: int
    ) -> None:
        with self.lock:
            for s in stages:
                o = self._get(s.request_id, now_ns)
                o.stages.append(s)
                o.newest_end = max(o.newest_end, s.end_ns)
            for r in requests:
                o = self._get(r.request_id, now_ns)
                o.request = r  # a retry's newest record
                o.newest_end = max(o.newest_end, r.end_ns)

    def promised(self, fragments: Iterable[Fragment], now_ns: int) -> None:
        """Engine FRAGMENTS came: the requests they name wait for their link."""
        with self.lock:
            for f in fragments:
                o = self._get(f.request_id or f.trace_id, now_ns)
                o.promised = True
                o.newest_end = max(o.newest_end, f.end_ns)

    def linked(self, requests: Iterable[Linked], ids: set[str], now_ns: int) -> None:
        """The linker took REQUESTS as complete, and is done with the fragments that
        named IDS (a request's fragments may name several: theirs is kept no longer)."""
        with self.lock:
            for rid in ids:
                o = self.open.get(rid)
                if o is not None:
                    o.promised = False
            for lk in requests:
                o = self._get(lk.path.request_id, now_ns)
                o.linked = lk
                o.newest_end = max(o.newest_end, lk.path.last_ns)

    def complete(self, now_ns: int) -> list[Open]:
        """The open requests that are complete at NOW_NS (not yet taken out)."""
        with self.lock:
            return [o for o in self.open.values() if self._complete(o, now_ns)]

    def _complete(self, o: Open, now_ns: int) -> bool:
        if o.promised and o.linked is None and now_ns - o.first_ns < self.link_cap_ns:
            return False
        quiet = now_ns - o.newest_end >= self.settle_ns or now_ns - o.arrived_ns >= self.settle_ns
        return (o.linked is not None and not o.stages) or quiet

    def settle(
        self,
        candidates: list[Open],
        ends: dict[str, int],
        now_ns: int,
        paths: PathEnds | None = None,
    ) -> list[Open]:
        """Of CANDIDATES (complete()), those whose KV transfers can be joined now (ENDS:
        each agent host's newest window's end; PATHS: each probed path's newest RTT
        window's end; both read before the history took their reports in), taken out;
        and those settled early to keep the bound."""
        ready = [o for o in candidates if self._joinable(o, ends, paths or {}, now_ns)]
        with self.lock:
            out, self._early = self._early, []
            for o in ready:
                if self.open.get(o.rid) is o:
                    del self.open[o.rid]
                    out.append(o)
        return out

    def _joinable(self, o: Open, ends: dict[str, int], paths: PathEnds, now_ns: int) -> bool:
        for s in o.crossed():
            if now_ns - s.end_ns >= self.horizon_ns:
                continue
            # None: no agent at a host, no probe on the path (no figures to wait for)
            got = [ends.get(s.src), ends.get(s.dst), path_end(paths, s)]
            if any(e is not None and s.end_ns - self.horizon_ns <= e < s.end_ns for e in got):
                return False
        return True

    def hosts(self, candidates: Iterable[Open]) -> set[str]:
        """The hosts at the ends of CANDIDATES' KV transfers."""
        return {h for o in candidates for s in o.crossed() for h in (s.src, s.dst)}

    def pairs(self, candidates: Iterable[Open]) -> set[tuple[str, str]]:
        """The (src, dst) of CANDIDATES' KV transfers."""
        return {(s.src, s.dst) for o in candidates for s in o.crossed()}

    def snapshot(self, since_ns: int) -> list[Open]:
        """The open requests with a record that ended after SINCE_NS (copies to read)."""
        with self.lock:
            return [
                Open(o.rid, o.arrived_ns, o.first_ns, list(o.stages), o.request, o.linked,
                     o.promised, o.newest_end)
                for o in self.open.values()
                if o.newest_end > since_ns
            ]  # fmt: skip

    def forced_total(self) -> int:
        with self.lock:
            return self.forced
