"""Stage spans x fabric: what the collector keeps of requests, and the analysis over it.

`Attribution` takes stage and request records and engine fragments from the OTLP
receiver and hands them to its parts: the running histograms for /metrics
(histograms.py), the engine requests being linked (linker.py), the requests being
assembled until they settle (assembly.py), the fabric history and its index the join
reads (fabric.py, fed by the window store), the fold of the settled requests that
/metrics reads (settle.py, kvfold.py), and the sync that brings them up to date
(sync.py). A request is joined with its path's fabric figures once, as it settles;
a scrape reads the fold (`view()`), whose cost follows the paths, not the requests.
`analyse()` runs the pure analysis functions over the newest settled requests and the
open ones, for `probe why`. (attribution/exporter.py wires it into the server.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fabricprobe.collector.attribution.analysis import (
    Analysis,
    AnalysisConfig,
    communication_bound,
    goodput,
    rank_correlation,
    rank_paths,
)
from fabricprobe.collector.attribution.assembly import Open, RequestAssembly
from fabricprobe.collector.attribution.cache import AnalysisCache
from fabricprobe.collector.attribution.engines.common import Fragment
from fabricprobe.collector.attribution.fabric import FabricFeed
from fabricprobe.collector.attribution.histograms import StageHistograms
from fabricprobe.collector.attribution.join import request_breakdown
from fabricprobe.collector.attribution.kvfold import FoldView, KvFold
from fabricprobe.collector.attribution.linker import ReasonCount, RequestLinker
from fabricprobe.collector.attribution.linking import HostDirectory, Linked, MatchConfig
from fabricprobe.collector.attribution.otlp import TraceIngest
from fabricprobe.collector.attribution.records import MAX_RECORDS, RecentRecords
from fabricprobe.collector.attribution.settle import (
    WHY_REQUESTS,
    Settled,
    Settler,
    join_open,
    request_figures,
    why_frames,
)
from fabricprobe.collector.attribution.stages import FABRIC_STAGES, RequestRecord, StageRecord
from fabricprobe.collector.attribution.sync import Sync
from fabricprobe.collector.kvshape import KvShape
from fabricprobe.collector.price import AnswerCounts
from fabricprobe.collector.store import WindowStore

HORIZON_S = 30.0  # a KV transfer waits this long at most for its hosts' reports
# a request with one side in waits this long after that side arrived for the other: two
# engines' OTLP exporters flush on timers of their own (the SDK's batch delay is 5 s by
# default), so the two sides of one request can arrive that far apart and more
LINK_WAIT_S = 10.0
SETTLE_S = 5.0  # a request settles once no record of it ended in this long


@dataclass(frozen=True)
class AttributionCounts:
    """The attribution's own counters at one moment (what /metrics shows of it)."""

    dropped_values: int  # records whose figures were out of range
    pairs_dropped: int  # KV host pairs beyond the bound, not watched
    history_dropped: int  # reports the fabric history's inbox had no room for
    analysis_failures: int
    path_known: int  # engine requests counted with their path found
    path_unknown: tuple[ReasonCount, ...]  # ... and without, by reason
    late_fragments: int  # engine spans that came after their request was counted
    fold_dropped: tuple[tuple[str, int], ...]  # what the bounds left out, by what


class Attribution:
    """Recent stage and request records, running histograms, fabric history."""

    def __init__(
        self,
        store: WindowStore | None = None,
        cfg: AnalysisConfig | None = None,
        *,
        max_records: int = MAX_RECORDS,
        clock: Callable[[], int] = time.time_ns,
        match: MatchConfig | None = None,
        link_wait_s: float = LINK_WAIT_S,
        pair_wait_s: float = 300.0,
        kv_models: dict[str, KvShape] | None = None,
        why_requests: int = WHY_REQUESTS,
    ) -> None:
        self.store, self.clock = store, clock
        self.cfg = cfg or AnalysisConfig()
        self.match = match or MatchConfig()  # how engine sides' attributes name hosts
        # served model name -> its KV shape: the bytes of a request no span gives
        self.kv_models: dict[str, KvShape] = dict(kv_models or {})
        # how the fabric's price was answered (the Query API's KvCost, GET /v1/kv-cost)
        self.price_answers = AnswerCounts()
        # a collector shard's other hosts (name, addresses): a request's decode host may
        # report to another shard (collector/shard.py sets it)
        self.fleet: Callable[[], list[tuple[str, list[str]]]] | None = None
        self.records = RecentRecords(0)  # checked and counted; the assembly keeps them
        self.histograms = StageHistograms()
        self.linker = RequestLinker(max_records, link_wait_s=link_wait_s, pair_wait_s=pair_wait_s)
        self.fabric = FabricFeed(store, keep_s=max(3600.0, 4 * self.cfg.window_s))
        self.cache = AnalysisCache()
        self.fold = KvFold(self.cfg)
        self.settler = Settler(self.fold, self.cfg, keep=why_requests)
        link_cap = max(120.0, 4 * link_wait_s, 2 * pair_wait_s)  # the linker's horizon
        self.assembly = RequestAssembly(
            settle_s=SETTLE_S, horizon_s=HORIZON_S, link_cap_s=link_cap, max_open=max_records
        )
        self.syncer = Sync(self.linker, self.fabric, self.histograms, self.cache, self.directory)
        self.syncer.settle = self._settle
        self.ingest = TraceIngest(self.take)

    def take(
        self,
        stages: list[StageRecord],
        requests: list[RequestRecord],
        fragments: list[Fragment] | None = None,
    ) -> None:
        """Take records and engine fragments from one OTLP batch: into the requests being
        assembled until they settle, measured stages counted into the histograms; records
        whose figures are out of range (records.stage_ok, request_ok) are counted and
        dropped. The fabric of the paths their KV transfers crossed is watched from now."""
        stages, requests = self.records.keep(stages, requests, self.clock())
        now = self.clock()
        self.linker.add(fragments or [], now)
        self.assembly.records(stages, requests, now)
        self.assembly.promised(fragments or [], now)
        measured = [s for s in stages if not s.derived]
        self.linker.measured(measured)
        self.histograms.observe(measured, requests)
        self.cache.invalidate()
        kv = {(s.src, s.dst) for s in stages if s.stage in FABRIC_STAGES}
        self.fabric.watch(kv, named=True)

    def directory(self) -> HostDirectory:
        """The agents' host names and addresses, for matching engine sides to hosts."""
        hosts: list[tuple[str, list[str]]] = []
        if self.store is not None:
            with self.store.lock:
                hosts = [(h, list(st.info.addresses)) for h, st in self.store.hosts.items()]
        if self.fleet is not None:
            here = {h for h, _ in hosts}
            hosts += [(h, a) for h, a in self.fleet() if h not in here]
        return HostDirectory(hosts, self.match)

    def linked(self, since_ns: int) -> list[Linked]:
        """Engine fragments that ended after SINCE_NS, linked into requests."""
        return self.linker.linked(since_ns, self.directory)

    def sync(self) -> int:
        """Turn the fabric windows and counter rates reports brought into history rows,
        count the engine requests that are complete, and settle the requests that can be
        (attribution/sync.py)."""
        return self.syncer.run(self.clock())

    def run_sync(self, stop: threading.Event, every_s: float = 0.5) -> threading.Thread:
        return self.syncer.start(stop, lambda: self.clock(), every_s)

    def bandwidth(self) -> dict[tuple[str, str], float]:
        """Each probed path's bandwidth by (src, dst) (attribution/fabric.py)."""
        return self.fabric.bandwidth()

    def _settle(self, now_ns: int, linked: list[Linked], ids: set[str]) -> int:
        """The sync's settling step: the requests the linker completed into the assembly
        (IDS: those its fragments named), the history's new rows into the index, and the
        requests that settle joined once and folded; how many history rows the drain
        added."""
        self.assembly.linked(linked, ids, now_ns)
        candidates = self.assembly.complete(now_ns)
        # the hosts' and paths' newest windows as taken so far: the drain below holds them
        ends = self.fabric.window_ends(self.assembly.hosts(candidates))
        paths = self.fabric.path_ends(self.assembly.pairs(candidates))
        added = self.fabric.history.drain(now_ns)
        due = self.assembly.settle(candidates, ends, now_ns, paths)
        if due:
            self._fold(due, now_ns)
        self.fold.advance(now_ns)
        return added

    def _fold(self, due: list[Open], now_ns: int) -> None:
        """The settled requests DUE joined and folded; when that fails, one at a time, so
        that a request no join can take costs only itself (counted as a failure)."""
        try:
            self.settler.take(due, self._join(due), now_ns)
            return
        except Exception as e:  # pandas raises many kinds; the sync must go on
            self.cache.failed(e)
        for o in due:
            try:
                self.settler.take([o], self._join([o]), now_ns)
            except Exception as e:
                self.cache.failed(e)

    def _join(self, requests: list[Open]) -> list[list[tuple[Any, ...]]]:
        pairs = {(s.src, s.dst) for o in requests for s in o.crossed()}
        bandwidth = self.fabric.bandwidth_of(pairs) if pairs else {}
        with self.fabric.index_lock:
            return join_open(
                requests, self.fabric.index, bandwidth=bandwidth, kv_models=self.kv_models
            )

    def view(self) -> FoldView:
        """What /metrics shows of the analysis now: the fold (attribution/kvfold.py)."""
        return self.fold.view(self.clock())

    def view_or_last(self) -> FoldView | None:
        """view(), or when it fails the last one that did not (the failure counted)."""
        return self.cache.or_last(self.view)

    def analyse(self, *, window_s: float | None = None, max_age_s: float = 1.0) -> Analysis:
        """Join and analyse the requests of the last WINDOW_S seconds (cached MAX_AGE_S):
        the newest settled ones `probe why` keeps, and those still open, joined with the
        fabric figures there are so far."""
        now = self.clock()
        if window_s is None and (cached := self.cache.fresh(now, max_age_s)) is not None:
            return cached
        self.sync()
        cfg = self.cfg
        since = now - int((window_s or cfg.window_s) * 1e9)
        got = why_frames([*self.settler.since(since), *self._open_since(since)])
        stages, requests, kv = got.stages, got.requests, got.kv
        flag, bins = communication_bound(stages, cfg)
        out = Analysis(
            now_ns=now,
            stages=stages,
            kv=kv,
            paths=rank_paths(kv, cfg),
            correlation=rank_correlation(kv, cfg),
            communication_bound=flag,
            bins=bins,
            goodput=goodput(requests, cfg, now_ns=now),
            requests=request_breakdown(stages, requests, got.paths_found, kv),
            paths_found=got.paths_found,
        )
        if window_s is None:
            self.cache.keep(out)
        return out

    def _open_since(self, since_ns: int) -> list[Settled]:
        """The requests still open that ended after SINCE_NS (those the linker has not
        completed among them), joined with the fabric figures there are so far."""
        opened = {o.rid: o for o in self.assembly.snapshot(since_ns)}
        for lk in self.linked(since_ns):
            o = opened.setdefault(lk.path.request_id, Open(lk.path.request_id, 0, 0))
            o.linked = o.linked or lk
        got = [o for o in opened.values() if o.stages or o.request or o.linked]
        kv = self._join(got)
        return [request_figures(o, rows, self.cfg)[1] for o, rows in zip(got, kv, strict=True)]

    def counts(self) -> AttributionCounts:
        paths = self.linker.counts()
        return AttributionCounts(
            dropped_values=self.records.dropped_total(),
            pairs_dropped=self.fabric.pairs_dropped_total(),
            history_dropped=self.fabric.history.inbox_dropped,
            analysis_failures=self.cache.failures_total(),
            path_known=paths.known,
            path_unknown=paths.unknown,
            late_fragments=paths.late,
            fold_dropped=(
                *sorted(self.fold.dropped_total().items()),
                ("request", self.assembly.forced_total()),
                ("fragment", self.linker.dropped),
            ),
        )
