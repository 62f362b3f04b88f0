"""The attribution's sync pass over real parts: completed engine requests into the
histograms, their KV paths watched and named, fabric windows into history rows; and the
thread that runs it."""

from __future__ import annotations

import threading
import time

from fabricprobe.collector.attribution.cache import AnalysisCache
from fabricprobe.collector.attribution.fabric import FabricFeed
from fabricprobe.collector.attribution.histograms import StageHistograms
from fabricprobe.collector.attribution.linker import RequestLinker
from fabricprobe.collector.attribution.linking import HostDirectory, MatchConfig
from fabricprobe.collector.attribution.sync import Sync
from tests.unit.test_attribution_cache import analysis
from tests.unit.test_attribution_fabric import probe, store_of
from tests.unit.test_attribution_linker import pair

S = 1_000_000_000
NOW = 1_000 * S
PRE, DEC = "pre-node", "dec-node.example"


def parts(*, probed: bool = False) -> tuple[Sync, FabricFeed]:
    store = store_of(PRE, DEC)
    if probed:
        probe(store, PRE, DEC, 1)
    fabric = FabricFeed(store, keep_s=3600.0)

    def directory() -> HostDirectory:
        return HostDirectory([(PRE, []), (DEC, [])], MatchConfig())

    linker = RequestLinker(1000, link_wait_s=5.0, pair_wait_s=300.0)
    return Sync(linker, fabric, StageHistograms(), AnalysisCache(), directory), fabric


def test_a_pass_counts_complete_requests_and_watches_and_names_their_path() -> None:
    sync, fabric = parts()
    assert sync.run(NOW) == 0  # nothing arrived, nothing watched
    sync.cache.keep(analysis(NOW))
    sync.linker.add(pair("req-1", 201, NOW - 2 * S))
    assert sync.run(NOW) == 0  # no window of the path yet
    snap = sync.histograms.snapshot()
    assert [(p.src, p.dst) for p in snap.kv] == [(PRE, DEC)]
    assert dict(next(s for s in snap.stages if s.stage == "decode").figures.buckets)["+Inf"] == 2
    assert sync.cache.fresh(NOW, 10.0) is None  # the counts changed: analysed afresh
    assert fabric.pairs() == [(DEC, PRE)]  # host_pair order
    assert fabric.store is not None and fabric.store.named_since(0) == {(DEC, PRE)}
    assert sync.linker.counts().known == 1


def test_the_paths_of_engine_hosts_are_watched_before_a_request_names_them() -> None:
    sync, fabric = parts(probed=True)
    sync.linker.add(pair("req-1", 201, NOW - 2 * S)[:1])  # the prefill side only, so far
    assert sync.run(NOW) == 1  # the path's newest window, taken when it was first watched
    assert fabric.pairs() == [(DEC, PRE)]
    assert sync.linker.counts().known == 0
    assert sync.run(NOW + S) == 0


def test_the_thread_runs_passes_until_stopped() -> None:
    sync, _ = parts()
    sync.linker.add(pair("req-2", 202, NOW - 2 * S))
    stop = threading.Event()
    t = sync.start(stop, lambda: NOW, every_s=0.01)
    deadline = time.monotonic() + 10
    while sync.linker.counts().known == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    t.join(5)
    assert sync.linker.counts().known == 1
    assert not t.is_alive() and t.name == "attribution-sync"
