"""Stage spans x fabric: what the collector keeps of requests, and the analysis over it.

`Attribution` takes stage and request records and engine fragments from the OTLP
receiver and hands them to its parts: the recent records (attribution/records.py), the
running histograms for /metrics (histograms.py), the engine requests being linked
(linker.py), the fabric history the join reads (fabric.py, fed by the window store),
the analysis kept between scrapes (cache.py) and the sync that brings them up to date
(sync.py). `analyse()` runs the pure join and analysis functions over the last window.
(attribution/exporter.py wires it into the server.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from fabricprobe.collector.attribution.analysis import (
    Analysis,
    AnalysisConfig,
    communication_bound,
    goodput,
    rank_correlation,
    rank_paths,
)
from fabricprobe.collector.attribution.cache import AnalysisCache
from fabricprobe.collector.attribution.engines.common import Fragment
from fabricprobe.collector.attribution.fabric import FabricFeed
from fabricprobe.collector.attribution.histograms import StageHistograms
from fabricprobe.collector.attribution.join import (
    join_fabric,
    paths_frame,
    request_breakdown,
    requests_frame,
    stages_frame,
)
from fabricprobe.collector.attribution.linker import ReasonCount, RequestLinker
from fabricprobe.collector.attribution.linking import HostDirectory, Linked, MatchConfig
from fabricprobe.collector.attribution.otlp import TraceIngest
from fabricprobe.collector.attribution.records import MAX_RECORDS, RecentRecords
from fabricprobe.collector.attribution.stages import FABRIC_STAGES, RequestRecord, StageRecord
from fabricprobe.collector.attribution.sync import Sync
from fabricprobe.collector.kvshape import KvShape, model_bytes
from fabricprobe.collector.price import AnswerCounts
from fabricprobe.collector.store import WindowStore


@dataclass(frozen=True)
class AttributionCounts:
    """The attribution's own counters at one moment (what /metrics shows of it)."""

    dropped_values: int  # records whose figures were out of range
    pairs_dropped: int  # KV host pairs beyond the bound, not watched
    history_dropped: int  # reports the fabric history's inbox had no room for
    analysis_failures: int
    path_known: int  # engine requests counted with their path found
    path_unknown: tuple[ReasonCount, ...]  # ... and without, by reason


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
        link_wait_s: float = 5.0,
        pair_wait_s: float = 300.0,
        kv_models: dict[str, KvShape] | None = None,
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
        self.records = RecentRecords(max_records)
        self.histograms = StageHistograms()
        self.linker = RequestLinker(max_records, link_wait_s=link_wait_s, pair_wait_s=pair_wait_s)
        self.fabric = FabricFeed(store, keep_s=max(3600.0, 4 * self.cfg.window_s))
        self.cache = AnalysisCache()
        self.syncer = Sync(self.linker, self.fabric, self.histograms, self.cache, self.directory)
        self.ingest = TraceIngest(self.take)

    def take(
        self,
        stages: list[StageRecord],
        requests: list[RequestRecord],
        fragments: list[Fragment] | None = None,
    ) -> None:
        """Keep records from one OTLP batch and count them into the histograms; records
        whose figures are out of range (records.stage_ok, request_ok) are counted and
        dropped. The fabric of the paths their KV transfers crossed is watched from now."""
        stages, requests = self.records.keep(stages, requests, self.clock())
        self.linker.add(fragments or [])
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
        and count the engine requests that are complete (attribution/sync.py)."""
        return self.syncer.run(self.clock())

    def run_sync(self, stop: threading.Event, every_s: float = 0.5) -> threading.Thread:
        return self.syncer.start(stop, lambda: self.clock(), every_s)

    def bandwidth(self) -> dict[tuple[str, str], float]:
        """Each probed path's bandwidth by (src, dst) (attribution/fabric.py)."""
        return self.fabric.bandwidth()

    def analyse(self, *, window_s: float | None = None, max_age_s: float = 1.0) -> Analysis:
        """Join and analyse the records of the last WINDOW_S seconds (cached MAX_AGE_S)."""
        now = self.clock()
        if window_s is None and (cached := self.cache.fresh(now, max_age_s)) is not None:
            return cached
        self.sync()
        cfg = self.cfg
        since = now - int((window_s or cfg.window_s) * 1e9)
        st, rq = self.records.since(since)
        linked = self.linked(since)
        for lk in linked:
            st.extend(lk.stages)
            rq.append(lk.request)
        found = paths_frame([lk.path for lk in linked], st)
        stages, requests = stages_frame(st), requests_frame(rq)
        windows, rates = self.fabric.history.frames()
        shaped = model_bytes(((r.request_id, r.model, r.prompt_tokens) for r in rq), self.kv_models)
        kv = join_fabric(stages, windows, rates, bandwidth=self.bandwidth(), model_bytes=shaped)
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
            requests=request_breakdown(stages, requests, found, kv),
            paths_found=found,
        )
        if window_s is None:
            self.cache.keep(out)
        return out

    def analyse_or_last(self) -> Analysis | None:
        """analyse(), or when it fails the last analysis that did not (attribution/cache.py)."""
        return self.cache.or_last(self.analyse)

    def counts(self) -> AttributionCounts:
        paths = self.linker.counts()
        return AttributionCounts(
            dropped_values=self.records.dropped_total(),
            pairs_dropped=self.fabric.pairs_dropped_total(),
            history_dropped=self.fabric.history.inbox_dropped,
            analysis_failures=self.cache.failures_total(),
            path_known=paths.known,
            path_unknown=paths.unknown,
        )
