"""Stage spans x fabric: what the collector keeps of requests, and the analysis over it.

`Attribution` takes stage and request records from the OTLP receiver, keeps the recent
ones (bounded), keeps running histograms for /metrics, and has a FabricHistory listen
to the window store, turning what reports brought into rows on a short period.
`analyse()` runs the pure join and analysis functions over the last window.
(collector/attribution_exporter.py wires it into the server.)
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from fabricprobe.collector.attribution.analysis import (
    AnalysisConfig,
    communication_bound,
    goodput,
    rank_correlation,
    rank_paths,
)
from fabricprobe.collector.attribution.engines.common import Fragment
from fabricprobe.collector.attribution.join import (
    join_fabric,
    paths_frame,
    request_breakdown,
    requests_frame,
    stages_frame,
)
from fabricprobe.collector.attribution.linking import (
    REASONS,
    HostDirectory,
    Linked,
    MatchConfig,
    group,
    link,
)
from fabricprobe.collector.attribution.otlp import TraceIngest
from fabricprobe.collector.attribution.stages import (
    FABRIC_STAGES,
    STAGES,
    RequestRecord,
    StageRecord,
)
from fabricprobe.collector.history import FabricHistory
from fabricprobe.collector.kvshape import KvShape, model_bytes
from fabricprobe.collector.price import AnswerCounts
from fabricprobe.collector.store import WindowStore, host_pair

DURATION_BUCKETS_S: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
)  # fmt: skip
MAX_PATHS = 1024  # distinct (src, dst, transport) label sets; the rest are counted as "other"
MAX_FINAL = 200_000  # request ids remembered as counted (a late fragment counts nothing twice)
log = logging.getLogger("fabricprobe.collector")
MAX_PAIRS = 4096  # host pairs whose fabric history is kept for the join
MAX_RECORDS = 50_000  # stage records kept (and as many request records), newest first
MAX_BYTES = 2**53  # a KV transfer larger than this (8 PiB) is not a measurement
MAX_SECONDS = 86_400.0  # request figures (TTFT, e2e) beyond a day are not either
FUTURE_TOLERANCE_NS = 300 * 10**9  # records may end this far past the collector's clock
PathLabels = tuple[str, str, str]


def _seconds_ok(v: float | None) -> bool:
    return v is None or (math.isfinite(v) and 0.0 <= v <= MAX_SECONDS)


def stage_ok(s: StageRecord, now_ns: int) -> bool:
    """A stage record whose figures can go into a frame and a histogram: times in
    range and ordered, bytes a count a float holds exactly."""
    return (
        0 <= s.start_ns <= s.end_ns <= now_ns + FUTURE_TOLERANCE_NS
        and 0 <= s.bytes <= MAX_BYTES
        and s.duration_s <= MAX_SECONDS
    )


def request_ok(r: RequestRecord, now_ns: int) -> bool:
    counts = (r.output_tokens, r.prompt_tokens)
    return (
        0 <= r.start_ns <= r.end_ns <= now_ns + FUTURE_TOLERANCE_NS
        and _seconds_ok(r.ttft_s)
        and _seconds_ok(r.e2e_s)
        and all(n is None or 0 <= n <= MAX_BYTES for n in counts)
    )


@dataclass
class Histogram:
    """Cumulative-at-scrape histogram kept as per-bucket counts."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(DURATION_BUCKETS_S) + 1))
    total: float = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(DURATION_BUCKETS_S, seconds)] += 1
        self.total += seconds

    def buckets(self) -> list[tuple[str, float]]:
        out, running = [], 0
        for bound, n in zip((*DURATION_BUCKETS_S, float("inf")), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(bound), float(running)))
        return out


@dataclass(frozen=True)
class Analysis:
    """One pass of the analysis over the last window (frames are copies: safe to keep)."""

    now_ns: int
    stages: pd.DataFrame
    kv: pd.DataFrame
    paths: pd.DataFrame
    correlation: pd.DataFrame
    communication_bound: bool
    bins: pd.DataFrame
    goodput: pd.DataFrame
    requests: pd.DataFrame  # per-request breakdown
    paths_found: pd.DataFrame = field(default_factory=pd.DataFrame)  # per-request path


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
        self.store = store
        # served model name -> its KV shape: the bytes of a request no span gives
        self.kv_models: dict[str, KvShape] = dict(kv_models or {})
        # how the fabric's price was answered (the Query API's KvCost, GET /v1/kv-cost)
        self.price_answers = AnswerCounts()
        self.cfg = cfg or AnalysisConfig()
        self.clock = clock
        self.lock = threading.Lock()
        self.stages: deque[StageRecord] = deque(maxlen=max_records)
        self.requests: deque[RequestRecord] = deque(maxlen=max_records)
        self.stage_hist: dict[str, Histogram] = {s: Histogram() for s in STAGES}
        self.kv_hist: dict[PathLabels, Histogram] = {}
        self.ttft_hist = Histogram()
        self.itl_hist = Histogram()
        self.history = FabricHistory(keep_s=max(3600.0, 4 * self.cfg.window_s))
        if store is not None:
            store.listeners.append(self.history)
        self.ingest = TraceIngest(self.take)
        self._cache: Analysis | None = None
        self.last_good: Analysis | None = None  # what a scrape shows when analysis fails
        self.analysis_failures = 0
        self.dropped_values = 0  # records whose figures were out of range
        self.pairs_dropped = 0  # KV host pairs beyond MAX_PAIRS, not watched
        # engine spans, linked into requests with a path (collector/linking.py)
        self.match = match or MatchConfig()
        # a collector shard's other hosts (name, addresses): a request's decode host may
        # report to another shard (collector/shard.py sets it)
        self.fleet: Callable[[], list[tuple[str, list[str]]]] | None = None
        self.link_wait_s = link_wait_s  # no new fragment this long: a request is complete
        self.pair_wait_s = pair_wait_s  # ... unless it is half of a pair (PathInfo.pending)
        self.fragments: deque[Fragment] = deque(maxlen=max_records)
        self._final: dict[str, None] = {}  # request ids counted, oldest first
        self._measured: dict[tuple[str, str], tuple[str, str]] = {}  # (rid, stage) -> path
        self._new_fragments = False
        self._frag_total = 0  # fragments taken, ever
        self._hosts_seen = 0  # of those, looked at for their hosts
        self._paths_seen = 0
        self._identity_host: dict[str, str | None] = {}
        self._engine_hosts: set[str] = set()
        self.path_known_total = 0
        self.path_unknown_total: dict[str, int] = dict.fromkeys(REASONS, 0)

    def take(
        self,
        stages: list[StageRecord],
        requests: list[RequestRecord],
        fragments: list[Fragment] | None = None,
    ) -> None:
        """Keep records from one OTLP batch and count them into the histograms; records
        whose figures are out of range (stage_ok, request_ok) are counted and dropped."""
        now = self.clock()
        good_st = [s for s in stages if stage_ok(s, now)]
        good_rq = [r for r in requests if request_ok(r, now)]
        dropped = len(stages) - len(good_st) + len(requests) - len(good_rq)
        stages, requests = good_st, good_rq
        with self.lock:
            self.dropped_values += dropped
            self.stages.extend(stages)
            self.requests.extend(requests)
            if fragments:
                self.fragments.extend(fragments)
                self._frag_total += len(fragments)
                self._new_fragments = True
            pairs = {(s.src, s.dst) for s in stages if s.stage in FABRIC_STAGES}
            for s in stages:
                if s.derived:
                    continue
                self._remember_measured(s)
                self.stage_hist[s.stage].observe(s.duration_s)
                if s.stage == "kv_transfer":
                    self._kv_hist(s).observe(s.duration_s)
            for r in requests:
                if r.ttft_s is not None:
                    self.ttft_hist.observe(r.ttft_s)
                if r.itl_s is not None:
                    self.itl_hist.observe(r.itl_s)
            self._cache = None
        pairs = self._bounded(pairs)
        if pairs:  # the fabric of these paths is now wanted for the join
            self.history.watch(pairs, self.store)
            if self.store is not None:  # and shown path by path (collector/detail.py)
                self.store.name_pairs(pairs)

    def _bounded(self, pairs: set[tuple[str, str]]) -> set[tuple[str, str]]:
        """The host pairs of PAIRS the fabric history may watch: one end at least is a host the
        store knows (no agent at either end, no fabric figures to keep), and at most
        MAX_PAIRS in all; the others are counted in pairs_dropped."""
        if self.store is not None:
            known = self.store.hosts
            pairs = {p for p in pairs if p[0] in known or p[1] in known}
        new = sorted({host_pair(a, b) for a, b in pairs} - self.history.pairs)
        room = max(0, MAX_PAIRS - len(self.history.pairs))
        if len(new) > room:
            with self.lock:
                self.pairs_dropped += len(new) - room
            return set(new[:room])
        return set(new)

    def _kv_hist(self, s: StageRecord) -> Histogram:
        key = (s.src, s.dst, s.transport or "unknown")
        h = self.kv_hist.get(key)
        if h is None:
            if len(self.kv_hist) >= MAX_PATHS:
                key = ("other", "other", key[2])
                h = self.kv_hist.get(key)
            if h is None:
                h = self.kv_hist[key] = Histogram()
        return h

    def _remember_measured(self, s: StageRecord) -> None:
        m = self._measured
        m[(s.request_id, s.stage)] = (s.src, s.dst)
        if len(m) > MAX_FINAL:
            del m[next(iter(m))]

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
        with self.lock:
            frags = [f for f in self.fragments if f.end_ns > since_ns]
        if not frags:
            return []
        hosts = self.directory()
        return [link(g, hosts) for g in group(frags)]

    def _path_known(self, lk: Linked) -> bool:
        """A request's path is known from its engines' link, or from a measured KV span."""
        got = self._measured.get((lk.path.request_id, "kv_transfer"))
        return lk.path.path_known or (got is not None and bool(got[0] and got[1]))

    def _watch_engine_hosts(self) -> None:
        """Watch the probed paths of every host an engine side runs on, from the first
        fragment on: a KV transfer's path is known only once its decode side reports
        (after the decode), and its fabric windows must be kept from before that."""
        with self.lock:
            n = min(self._frag_total - self._hosts_seen, len(self.fragments))
            new = list(self.fragments)[-n:] if n > 0 else []
            self._hosts_seen = self._frag_total
        if len(self._identity_host) > 100_000:
            self._identity_host.clear()
        hosts = self.directory() if new else None
        found: set[str] = set()
        for f in new:
            assert hosts is not None
            if f.identity in self._identity_host:
                continue
            got, _ = hosts.resolve(f.hosts)
            if got is None and f.peer:
                got, _ = hosts.resolve([("peer", f.peer)])
            self._identity_host[f.identity] = got
            if got is not None and got not in self._engine_hosts:
                found.add(got)
        self._engine_hosts |= found
        if self.store is None or not self._engine_hosts:
            return
        with self.store.lock:
            n_paths = len(self.store.paths)
            if not found and n_paths == self._paths_seen:
                return  # nothing new: no host, no path
            self._paths_seen = n_paths
            eh = self._engine_hosts
            pairs = {(k[0], k[1]) for k in self.store.paths if k[0] in eh or k[1] in eh}
        pairs = self._bounded(pairs)
        if pairs:
            self.history.watch(pairs, self.store)

    def finalize(self, now_ns: int) -> int:
        """Count linked requests that are complete: both sides with hosts, or no fragment
        for link_wait_s. Their stages go to the histograms, their path to the counters."""
        with self.lock:
            fresh, self._new_fragments = self._new_fragments, False
        horizon = max(120.0, 4 * self.link_wait_s, 2 * self.pair_wait_s)
        done = 0
        pairs: set[tuple[str, str]] = set()
        for lk in self.linked(now_ns - int(horizon * 1e9)):
            p = lk.path
            if p.request_id in self._final:
                continue
            known = self._path_known(lk)
            wait = self.pair_wait_s if p.pending else self.link_wait_s
            waited = (now_ns - p.last_ns) / 1e9 >= wait
            if not (fresh and known and p.path_known) and not waited:
                continue
            done += 1
            with self.lock:
                self._final[p.request_id] = None
                if len(self._final) > MAX_FINAL:
                    del self._final[next(iter(self._final))]
                if known:
                    self.path_known_total += 1
                else:
                    self.path_unknown_total[p.reason or "one side only"] += 1
                for s in lk.stages:
                    if (s.request_id, s.stage) in self._measured:
                        continue  # the measured span of this stage was counted already
                    self.stage_hist[s.stage].observe(s.duration_s)
                    if s.stage == "kv_transfer" and s.src and s.dst:
                        self._kv_hist(s).observe(s.duration_s)
                        pairs.add((s.src, s.dst))
                r = lk.request
                if r.ttft_s is not None:
                    self.ttft_hist.observe(r.ttft_s)
                if r.itl_s is not None:
                    self.itl_hist.observe(r.itl_s)
                self._cache = None
        pairs = self._bounded(pairs)
        if pairs:
            self.history.watch(pairs, self.store)
            if self.store is not None:
                self.store.name_pairs(pairs)
        return done

    def sync(self) -> int:
        """Turn the fabric windows and counter rates reports brought into history rows,
        and count the engine requests that are complete."""
        now = self.clock()
        self._watch_engine_hosts()
        self.finalize(now)
        return self.history.drain(now)

    def bandwidth(self) -> dict[tuple[str, str], float]:
        """Each probed path's bandwidth (bytes/s), by (src, dst): the highest throughput
        its windows measured. A bandwidth probe is a sender on a host that may be busy:
        a starved sender measures its CPU, not the path (on a 2-core machine beside two
        engines one window read 2.5 MB/s of a loopback that carries GB/s), while the
        fabric's own slowing shows in the RTT, loss and pause figures the split counts."""
        out: dict[tuple[str, str], float] = {}
        if self.store is None:
            return out
        with self.store.lock:
            for key, st in self.store.paths.items():
                bps = st.peak_bytes_per_second
                if bps:
                    out[(key[0], key[1])] = max(out.get((key[0], key[1]), 0.0), bps)
        return out

    def run_sync(self, stop: threading.Event, every_s: float = 0.5) -> threading.Thread:
        def loop() -> None:
            while not stop.wait(every_s):
                self.sync()

        t = threading.Thread(target=loop, name="attribution-sync", daemon=True)
        t.start()
        return t

    def analyse(self, *, window_s: float | None = None, max_age_s: float = 1.0) -> Analysis:
        """Join and analyse the records of the last WINDOW_S seconds (cached MAX_AGE_S)."""
        now = self.clock()
        cached = self._cache
        if cached is not None and window_s is None and (now - cached.now_ns) / 1e9 < max_age_s:
            return cached
        self.sync()
        cfg = self.cfg
        span = int((window_s or cfg.window_s) * 1e9)
        with self.lock:
            st = [s for s in self.stages if s.end_ns > now - span]
            rq = [r for r in self.requests if r.end_ns > now - span]
        linked = self.linked(now - span)
        for lk in linked:
            st.extend(lk.stages)
            rq.append(lk.request)
        found = paths_frame([lk.path for lk in linked], st)
        stages, requests = stages_frame(st), requests_frame(rq)
        windows, rates = self.history.frames()
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
            self._cache = out
        return out

    def analyse_or_last(self) -> Analysis | None:
        """analyse(), or when it fails the last analysis that did not (counted in
        analysis_failures): a scrape never fails for what one batch of spans held."""
        try:
            res = self.analyse()
        except Exception as e:  # pandas raises many kinds; the scrape must go on
            with self.lock:
                self.analysis_failures += 1
                first = self.analysis_failures == 1
            # said once in full, then counted (fabricprobe_attribution_analysis_failures)
            log.log(
                logging.ERROR if first else logging.DEBUG,
                "analysis failed (%d so far): %s: %s",
                self.analysis_failures,
                type(e).__name__,
                e,
                exc_info=first,
            )
            return self.last_good
        self.last_good = res
        return res
