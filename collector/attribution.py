"""Stage spans x fabric: what the collector keeps of requests, and the analysis over it.

`Attribution` takes stage and request records from the OTLP receiver, keeps the recent
ones (bounded), keeps running histograms for /metrics, and has a FabricHistory listen
to the window store, turning what reports brought into rows on a short period.
`analyse()` runs the pure join and analysis functions over the last window.
(collector/attribution_exporter.py wires it into the server.)
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from fabricprobe.collector.analysis import (
    AnalysisConfig,
    communication_bound,
    goodput,
    rank_correlation,
    rank_paths,
)
from fabricprobe.collector.engines import Fragment
from fabricprobe.collector.history import FabricHistory
from fabricprobe.collector.join import (
    join_fabric,
    paths_frame,
    request_breakdown,
    requests_frame,
    stages_frame,
)
from fabricprobe.collector.linking import (
    REASONS,
    HostDirectory,
    Linked,
    MatchConfig,
    group,
    link,
)
from fabricprobe.collector.otlp import TraceIngest
from fabricprobe.collector.stages import FABRIC_STAGES, STAGES, RequestRecord, StageRecord
from fabricprobe.collector.store import WindowStore

DURATION_BUCKETS_S: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
)  # fmt: skip
MAX_PATHS = 1024  # distinct (src, dst, transport) label sets; the rest are counted as "other"
MAX_FINAL = 200_000  # request ids remembered as counted (a late fragment counts nothing twice)
PathLabels = tuple[str, str, str]


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
        max_records: int = 200_000,
        clock: Callable[[], int] = time.time_ns,
        match: MatchConfig | None = None,
        link_wait_s: float = 5.0,
        pair_wait_s: float = 300.0,
    ) -> None:
        self.store = store
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
        # engine spans, linked into requests with a path (collector/linking.py)
        self.match = match or MatchConfig()
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
        """Keep records from one OTLP batch and count them into the histograms."""
        with self.lock:
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
        if pairs:  # the fabric of these paths is now wanted for the join
            self.history.watch(pairs, self.store)

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
        if pairs:
            self.history.watch(pairs, self.store)
        return done

    def sync(self) -> int:
        """Turn the fabric windows and counter rates reports brought into history rows,
        and count the engine requests that are complete."""
        now = self.clock()
        self._watch_engine_hosts()
        self.finalize(now)
        return self.history.drain(now)

    def bandwidth(self) -> dict[tuple[str, str], float]:
        """Each probed path's newest measured throughput (bytes/s), by (src, dst)."""
        out: dict[tuple[str, str], float] = {}
        if self.store is None:
            return out
        with self.store.lock:
            for key, st in self.store.paths.items():
                bps = st.last_bytes_per_second
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
        kv = join_fabric(stages, windows, rates, bandwidth=self.bandwidth())
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
            requests=request_breakdown(stages, requests, found),
            paths_found=found,
        )
        if window_s is None:
            self._cache = out
        return out


# -- the `probe why` query: JSON over a generic gRPC method (no generated code needed) --

WHY_METHOD = "/fabricprobe.Attribution/Why"
MAX_WHY = 200


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as JSON-safe dicts (NaN -> None)."""
    clean = df.astype(object).where(df.notna(), None)
    return [{str(k): v for k, v in row.items()} for row in clean.to_dict("records")]


def why_report(res: Analysis, slowest: int = 10, by: str = "e2e_s") -> dict[str, Any]:
    """The slowest requests of the analysed window with their path's figures at the time,
    the path ranking, the communication-bound flag and goodput."""
    req = res.requests
    if by not in req.columns:
        raise ValueError(f"cannot sort by {by!r}")
    # an empty window (or one whose figures are all missing) has an object-typed column
    ranked = req.assign(**{by: pd.to_numeric(req[by], errors="coerce")}).dropna(subset=[by])
    top = ranked.nlargest(min(slowest, MAX_WHY), by)
    kv = res.kv.drop(columns=["stage", "derived"], errors="ignore")
    fabric_cols = [c for c in kv.columns if c not in top.columns or c == "request_id"]
    top = top.merge(kv[fabric_cols], on="request_id", how="left")
    return {
        "now_ns": res.now_ns,
        "slowest": _records(top),
        "paths": _records(res.paths),
        "communication_bound": res.communication_bound,
        "goodput": _records(res.goodput),
        "stages": len(res.stages),
    }


def add_why_service(server: Any, attribution: Attribution) -> None:
    """Serve why_report() as JSON at WHY_METHOD on SERVER."""
    import json

    import grpc  # type: ignore[import-untyped]  # grpcio ships no type hints

    def why(request: dict[str, Any], context: Any) -> dict[str, Any]:
        try:
            n = int(request.get("slowest", 10))
            window = request.get("window_s")
            res = attribution.analyse(window_s=float(window) if window else None)
            return why_report(res, n, str(request.get("by", "e2e_s")))
        except (TypeError, ValueError) as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"why: {e}")
            raise AssertionError("context.abort returned") from None  # pragma: no cover

    def load(data: bytes) -> dict[str, Any]:
        obj = json.loads(data or b"{}")
        return obj if isinstance(obj, dict) else {}

    handler = grpc.method_handlers_generic_handler(
        "fabricprobe.Attribution",
        {
            "Why": grpc.unary_unary_rpc_method_handler(
                why,
                request_deserializer=load,
                response_serializer=lambda obj: json.dumps(obj, default=str).encode(),
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))
