"""The fabric side of the attribution: which host pairs' history is kept for the join.

A FabricHistory (collector/history.py) listens to the window store for the host pairs it
is told to watch. This feed decides those pairs: the pairs a KV transfer ran over, and
every probed path of a host an engine side runs on (a transfer's path is known only once
its decode side reports, and the fabric windows from before that are wanted). A pair is
watched only when one end at least is an agent host, and at most MAX_PAIRS are; the
others are counted. The feed keeps an index of the history's rows (attribution/
fabricjoin.py) as each drain adds and lets go of them: the join of a settled request
reads it.
"""

from __future__ import annotations

import threading

from fabricprobe.collector.attribution.assembly import PathEnds
from fabricprobe.collector.attribution.fabricjoin import FabricIndex
from fabricprobe.collector.history import CounterRate, FabricHistory, FabricWindow
from fabricprobe.collector.store import WindowStore, host_pair

MAX_PAIRS = 16_384  # host pairs whose fabric history is kept for the join
Pair = tuple[str, str]


class FabricFeed:
    """The store, the history that listens to it, and the bounded set of pairs watched."""

    def __init__(self, store: WindowStore | None, *, keep_s: float) -> None:
        self.store = store
        self.history = FabricHistory(keep_s=keep_s)
        if store is not None:
            store.listeners.append(self.history)
        self.index = FabricIndex()
        self.index_lock = threading.Lock()  # held while the index is changed or read
        self.history.sink = self._rows
        self.lock = threading.Lock()
        self.pairs_dropped = 0  # KV host pairs beyond MAX_PAIRS, not watched
        self._paths_seen = 0  # the store's paths when the engine hosts were last looked at

    def _rows(
        self,
        windows: list[FabricWindow],
        rates: list[CounterRate],
        gone_windows: list[FabricWindow],
        gone_rates: list[CounterRate],
    ) -> None:
        """What one drain of the history added and let go of, into the index."""
        with self.index_lock:
            ix = self.index
            for w in gone_windows:
                ix.drop_window(w)
            for r in gone_rates:
                ix.drop_rate(r)
            for w in windows:
                ix.add_window(w)
            for r in rates:
                ix.add_rate(r)

    def window_ends(self, hosts: set[str]) -> dict[str, int]:
        """Each agent host's newest window's end (attribution/assembly.py waits for it)."""
        return self.store.window_ends(hosts) if self.store is not None and hosts else {}

    def path_ends(self, pairs: set[Pair]) -> PathEnds:
        """The newest end of an RTT window of each path probed between PAIRS, either
        way (attribution/assembly.py waits for the one a transfer's join reads)."""
        out: PathEnds = {}
        if self.store is None:
            return out
        for a, b in {host_pair(a, b) for a, b in pairs}:
            for v in self.store.pair_paths(a, b):
                if v.rtt is None:
                    continue  # its newest window held no RTT: the history took none
                k = v.key
                for key in ((k.src, k.dst, k.transport), (k.src, k.dst, "")):
                    out[key] = max(out.get(key, 0), v.last_end_ns)
        return out

    def watch(self, pairs: set[Pair], *, named: bool) -> None:
        """Keep the fabric history of PAIRS (bounded); NAMED: a request's KV transfer
        ran over them, so the export shows their paths one by one (collector/detail.py)."""
        pairs = self._bounded(pairs)
        if not pairs:
            return
        self.history.watch(pairs, self.store)
        if named and self.store is not None:
            self.store.name_pairs(pairs)

    def _bounded(self, pairs: set[Pair]) -> set[Pair]:
        """The host pairs of PAIRS the fabric history may watch: one end at least is a host
        the store knows (no agent at either end, no fabric figures to keep), and at most
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

    def watch_hosts(self, hosts: set[str], *, new: bool) -> None:
        """Watch every probed path of HOSTS (the engines' hosts); the store's paths are
        looked at again only when NEW hosts came or the store has other paths."""
        if self.store is None or not hosts:
            return
        with self.store.lock:
            n_paths = len(self.store.paths)
            if not new and n_paths == self._paths_seen:
                return  # nothing new: no host, no path
            self._paths_seen = n_paths
            pairs = {(k[0], k[1]) for k in self.store.paths if k[0] in hosts or k[1] in hosts}
        self.watch(pairs, named=False)

    def bandwidth(self) -> dict[Pair, float]:
        """Each probed path's bandwidth (bytes/s), by (src, dst): the highest throughput
        its windows measured. A bandwidth probe is a sender on a host that may be busy:
        a starved sender measures its CPU, not the path (on a 2-core machine beside two
        engines one window read 2.5 MB/s of a loopback that carries GB/s), while the
        fabric's own slowing shows in the RTT, loss and pause figures the split counts."""
        out: dict[Pair, float] = {}
        if self.store is None:
            return out
        with self.store.lock:
            for key, st in self.store.paths.items():
                bps = st.peak_bytes_per_second
                if bps:
                    out[(key[0], key[1])] = max(out.get((key[0], key[1]), 0.0), bps)
        return out

    def bandwidth_of(self, pairs: set[Pair]) -> dict[Pair, float]:
        """bandwidth() of the paths between PAIRS (either way) only."""
        out: dict[Pair, float] = {}
        if self.store is None:
            return out
        for a, b in {host_pair(a, b) for a, b in pairs}:
            for v in self.store.pair_paths(a, b):
                bps = v.peak_bytes_per_second
                if bps:
                    k = (v.key.src, v.key.dst)
                    out[k] = max(out.get(k, 0.0), bps)
        return out

    def pairs(self) -> list[Pair]:
        """The host pairs watched, sorted."""
        return sorted(self.history.pairs)

    def pairs_dropped_total(self) -> int:
        with self.lock:
            return self.pairs_dropped
