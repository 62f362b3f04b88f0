"""The from-scratch selection the collector's folds are held to: one walk over every path
the store holds, as /metrics chose its detail before the ranking figures were folded per
report (collector/pathfold.py). tests/unit/test_pathfold.py compares the two."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence

from fabricprobe.collector.detail import MIN_BASELINE_WINDOWS, DetailSelector, Selection, TorKey
from fabricprobe.collector.store import PathKey, PathStats, host_pair


class WalkSelector(DetailSelector):
    """A DetailSelector that also chooses by walking every path (`select`)."""

    def select(
        self,
        views: Sequence[tuple[PathKey, PathStats]],
        now_ns: int,
        topology: Callable[[str], str],
        named: set[tuple[str, str]],
        alert_hosts: Iterable[str] = (),
        all_hosts: Iterable[str] = (),
    ) -> Selection:
        """The scrape's detail chosen from VIEWS (every path the store holds) in one
        walk, each path's ToR labels read afresh."""
        cfg = self.cfg
        fresh_after = now_ns - int(cfg.fresh_s * 1e9)
        loss_alert, tail_factor = cfg.loss_alert, cfg.tail_factor
        fresh: list[PathKey] = []  # every path with a fresh window: what fill may take
        alerts: list[PathKey] = []
        requested: list[PathKey] = []
        tor_acc: dict[TorKey, list[int]] = {}  # [worst path p99 ns, exchanges, lost]
        tor_of: dict[str, str] = {}
        total = 0
        min_windows = MIN_BASELINE_WINDOWS
        k = cfg.worst_k
        fresh_cap = 2 * cfg.max_paths  # fill takes at most max_paths keys not already kept
        # bounded min-heaps: the k worst of each (transport, op, size) class, and by loss
        heaps: dict[tuple[str, str, int], list[tuple[int, PathKey]]] = {}
        lossy: list[tuple[float, PathKey]] = []
        ranked = 0
        tor_cache: dict[PathKey, TorKey] = {}
        with self.lock:
            tor_get, acc_get, heap_get = tor_cache.get, tor_acc.get, heaps.get
            push, replace = heapq.heappush, heapq.heapreplace
            add_fresh, add_alert = fresh.append, alerts.append
            for key, v in views:
                total += 1
                if named and host_pair(key[0], key[1]) in named:
                    requested.append(key)
                if v.touched_ns < fresh_after:
                    continue
                if len(fresh) < fresh_cap:
                    add_fresh(key)
                sk = v.last_rtt
                if sk is None:  # a bandwidth path: no RTT to rank it by
                    continue
                ranked += 1
                p99, loss = v.last_p99_ns, v.last_loss  # each read once (path_views)
                tk = tor_get(key)
                if tk is None:
                    src, dst = key[0], key[1]
                    st = tor_of.get(src)
                    if st is None:
                        st = tor_of[src] = topology(src)
                    dt = tor_of.get(dst)
                    if dt is None:
                        dt = tor_of[dst] = topology(dst)
                    tk = tor_cache[key] = (st, dt, key[2])
                acc = acc_get(tk)
                if acc is None:
                    acc = tor_acc[tk] = [0, 0, 0]
                lost = sk.lost
                acc[1] += sk.count + lost
                if lost:
                    acc[2] += lost
                    if k:
                        if len(lossy) < k:
                            push(lossy, (loss, key))
                        elif (loss, key) > lossy[0]:
                            replace(lossy, (loss, key))
                if p99 is None:
                    if loss > loss_alert:
                        add_alert(key)
                    continue
                if p99 > acc[0]:
                    acc[0] = p99
                if k:
                    heap = heap_get(key[2:])
                    if heap is None:
                        heap = heaps[key[2:]] = []
                    if len(heap) < k:
                        push(heap, (p99, key))
                    elif p99 >= heap[0][0] and (p99, key) > heap[0]:
                        replace(heap, (p99, key))
                if loss > loss_alert or (
                    v.p99_windows >= min_windows and p99 > tail_factor * v.p99_ewma
                ):
                    add_alert(key)
            worst = [key for c in sorted(heaps) for _, key in sorted(heaps[c], reverse=True)]
            worst += [key for _, key in sorted(lossy, reverse=True)]
            return self._finish(
                now_ns, alerts, requested, worst, fresh, tor_acc, ranked, total,
                alert_hosts, all_hosts,
            )  # fmt: skip
