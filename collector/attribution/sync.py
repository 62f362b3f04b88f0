"""The attribution's sync: one pass that brings what arrived into what the analysis and
/metrics read, run on a thread every half second and before each analysis.

A pass watches the fabric of the hosts new engine sides run on, counts the engine
requests that became complete (their stages into the histograms, their KV paths
watched and named), and turns the fabric windows and counter rates reports brought into
history rows; with a `settle` step (the Attribution's), that step takes the requests the
linker completed and drains the history itself, around its settling of requests.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from fabricprobe.collector.attribution.cache import AnalysisCache
from fabricprobe.collector.attribution.fabric import FabricFeed
from fabricprobe.collector.attribution.histograms import StageHistograms
from fabricprobe.collector.attribution.linker import Directory, RequestLinker
from fabricprobe.collector.attribution.linking import Linked

# (now, the requests the linker completed, the ids of the fragments it is done with)
# -> history rows added
Settle = Callable[[int, list[Linked], set[str]], int]


class Sync:
    """The pass over the attribution's parts, and the thread that runs it."""

    def __init__(
        self,
        linker: RequestLinker,
        fabric: FabricFeed,
        histograms: StageHistograms,
        cache: AnalysisCache,
        directory: Directory,
    ) -> None:
        self.linker, self.fabric, self.histograms = linker, fabric, histograms
        self.cache, self.directory = cache, directory
        self.settle: Settle | None = None
        self._running = threading.Lock()  # one pass at a time (the thread, an analysis)

    def run(self, now_ns: int) -> int:
        """One pass at NOW_NS; how many history rows it added."""
        with self._running:
            return self._run(now_ns)

    def _run(self, now_ns: int) -> int:
        found = self.linker.new_engine_hosts(self.directory)
        self.fabric.watch_hosts(self.linker.engine_hosts, new=bool(found))
        done = self.linker.complete(now_ns, self.directory)
        if done.requests:
            self.histograms.observe(done.stages, done.records)
            self.cache.invalidate()
            kv = {(s.src, s.dst) for s in done.stages if s.stage == "kv_transfer"}
            self.fabric.watch({p for p in kv if p[0] and p[1]}, named=True)
        if self.settle is not None:
            return self.settle(now_ns, done.linked, done.ids)
        return self.fabric.history.drain(now_ns)

    def start(
        self, stop: threading.Event, clock: Callable[[], int], every_s: float = 0.5
    ) -> threading.Thread:
        """Run a pass at CLOCK's time every EVERY_S seconds until STOP is set."""

        def loop() -> None:
            while not stop.wait(every_s):
                self.run(clock())

        t = threading.Thread(target=loop, name="attribution-sync", daemon=True)
        t.start()
        return t
