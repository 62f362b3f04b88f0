"""Which paths, hosts and ToR pairs the collector's /metrics shows one by one.

A fleet of N hosts probing k peers each holds N·k paths; exported one series set per path,
/metrics grows with host pairs (1,637 series per host at the default plan). Instead every
path feeds the fleet and ToR-pair aggregates, and a path gets its own series only while it
is one of these (in this order of priority):

- `alert`: its newest window crosses a threshold the alert rules use: loss over
  `loss_alert` (FabricprobePathLoss), or a p99 over `tail_factor` times the path's own
  running p99 (an EWMA over its earlier windows, kept by the store, standing in for
  FabricprobePathTailRegressed's daily median);
- `request`: a request's KV transfer ran between its two hosts in the last `hold_s`
  (collector/attribution/ names them);
- `worst`: one of the `worst_k` highest newest-window p99 RTTs of its (transport, op,
  size) class, or one of the `worst_k` highest loss ratios;
- `held`: it was one of the above within the last `hold_s`, so that a path near the
  edge of the worst set does not come and go every scrape (and `rate()` over 5 minutes
  has samples to work with);
- `fill`: room left under the bound goes to the other paths with a fresh window, oldest
  first (stable from scrape to scrape): a fleet smaller than the bound shows every path.

At most `max_paths` paths are shown; what the bound keeps out is counted per reason.
Hosts get their counter and agent series while they are in trouble themselves (`alert`:
a counter over an alert threshold, a spooling or throttled agent) or an end of a shown
path (`path`), held the same way, at most `max_hosts`. ToR pairs: every pair under one
ToR, and the inter-ToR pairs with the worst p99 or loss (held), at most `max_tor_pairs`.
The agent's own /metrics always has its host's figures in full.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeVar

from fabricprobe.collector.pathfold import Folded
from fabricprobe.collector.store import PathKey

PATH_REASONS = ("alert", "request", "worst", "held", "fill")
HOST_REASONS = ("alert", "path", "held", "fill")
TOR_REASONS = ("intra", "worst", "held", "fill")
TorKey = tuple[str, str, str]  # src_tor, dst_tor, transport
UNKNOWN_TOR = "unknown"  # a host that registered no topology, or one this collector never saw
MIN_BASELINE_WINDOWS = 5  # windows before a path's running p99 can call a tail regressed


@dataclass(frozen=True)
class DetailConfig:
    worst_k: int = 10  # per (transport, op, size) class, and by loss
    hold_s: float = 300.0
    max_paths: int = 500
    max_hosts: int = 32
    max_tor_pairs: int = 3000
    loss_alert: float = 0.01  # as FabricprobePathLoss (grafana/build.py)
    tail_factor: float = 3.0  # as FabricprobePathTailRegressed
    fresh_s: float = 30.0  # a path whose newest window arrived longer ago is not ranked

    def __post_init__(self) -> None:
        if min(self.worst_k, self.max_paths, self.max_hosts, self.max_tor_pairs) < 0:
            raise ValueError("detail bounds must be >= 0")
        if self.hold_s < 0 or self.fresh_s <= 0:
            raise ValueError("hold_s >= 0 and fresh_s > 0")


K = TypeVar("K", bound=Hashable)


@dataclass
class Chosen(Generic[K]):
    """What one choose() kept, in priority order, and what the bound left out."""

    kept: dict[K, str] = field(default_factory=dict)  # key -> reason
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> keys left out


def choose(
    candidates: Iterable[tuple[K, str]],
    held: dict[K, int],
    now_ns: int,
    hold_ns: int,
    limit: int,
    fill: Iterable[K] = (),
) -> Chosen[K]:
    """Keep CANDIDATES (key, reason), best first, then the keys of HELD that qualified
    within HOLD_NS (newest first), then FILL's first keys in the room left, up to LIMIT.
    Every candidate is (re)held at NOW_NS, held keys past their hold are forgotten, and
    HELD never grows past 4 x LIMIT. FILL comes in a stable order (the store's, oldest
    first), so a small fleet shows everything and a large one fills its budget without
    flapping."""
    out: Chosen[K] = Chosen()
    for key, reason in candidates:
        held[key] = now_ns
        if key in out.kept:
            continue
        if len(out.kept) < limit:
            out.kept[key] = reason
        else:
            out.dropped[reason] = out.dropped.get(reason, 0) + 1
    expired = [k for k, t in held.items() if now_ns - t > hold_ns]
    for k in expired:
        del held[k]
    rest = sorted((k for k in held if k not in out.kept), key=held.__getitem__, reverse=True)
    for key in rest:
        if len(out.kept) < limit:
            out.kept[key] = "held"
        else:
            out.dropped["held"] = out.dropped.get("held", 0) + 1
    room = limit - len(out.kept)
    if room > 0:
        for key in fill:
            if key not in out.kept:
                out.kept[key] = "fill"
                room -= 1
                if not room:
                    break
    if len(held) > 4 * max(1, limit):  # the longest-quiet ones go first
        kept = out.kept
        order = sorted(held, key=lambda k: (k in kept, held[k]))  # shown ones go last
        for key in order[: len(held) - 4 * max(1, limit)]:
            del held[key]
    return out


@dataclass
class Selection:
    """One scrape's choice: what is shown in full, the ToR-pair figures, what was left out."""

    paths: dict[PathKey, str]
    hosts: dict[str, str]
    tor_pairs: dict[TorKey, tuple[float | None, float]]  # (p99 seconds, loss ratio)
    tor_reasons: dict[TorKey, str]
    ranked_paths: int  # paths with a fresh window, every one in the aggregates
    omitted_paths: int  # paths held by the store and not shown in full
    omitted_tor_pairs: int


class DetailDrops(NamedTuple):
    """Candidates the bounds kept out so far, by reason, of each kind (a copy)."""

    path: dict[str, int]
    host: dict[str, int]
    tor_pair: dict[str, int]


class DetailSelector:
    """Keeps the hold times and running p99s between scrapes (one per collector)."""

    def __init__(self, cfg: DetailConfig | None = None) -> None:
        self.cfg = cfg or DetailConfig()
        self.lock = threading.Lock()
        self._held_paths: dict[PathKey, int] = {}
        self._held_hosts: dict[str, int] = {}
        self._held_tors: dict[TorKey, int] = {}
        # cumulative: candidates the bounds kept out, per kind and reason
        self.dropped: dict[str, dict[str, int]] = {
            "path": dict.fromkeys(PATH_REASONS, 0),
            "host": dict.fromkeys(HOST_REASONS, 0),
            "tor_pair": dict.fromkeys(TOR_REASONS, 0),
        }

    def dropped_counts(self) -> DetailDrops:
        with self.lock:
            return DetailDrops(**{what: dict(by) for what, by in self.dropped.items()})

    def select_folded(
        self,
        folded: Iterable[Folded],
        fresh: list[PathKey],
        requested: list[PathKey],
        total: int,
        now_ns: int,
        alert_hosts: Iterable[str] = (),
        all_hosts: Iterable[str] = (),
    ) -> Selection:
        """select() from the paths folded as reports came (collector/pathfold.py): the
        fresh reports' folds (one per host), the first fresh paths in the store's order
        (at most 2 x max_paths: what fill may take), the paths of the host pairs requests
        named in the store's order, and how many paths the store holds."""
        k = self.cfg.worst_k
        tor: dict[TorKey, list[int]] = {}
        heaps: dict[tuple[str, str, int], list[tuple[int, PathKey]]] = {}
        lossy: list[tuple[float, PathKey]] = []
        alerts: list[tuple[int, PathKey]] = []
        ranked = 0
        for f in folded:
            ranked += f.ranked
            for tk, (p99, sent, lost, first) in f.tor.items():
                acc = tor.get(tk)
                if acc is None:
                    tor[tk] = [p99, sent, lost, first]
                    continue
                if p99 > acc[0]:
                    acc[0] = p99
                acc[1] += sent
                acc[2] += lost
                if first < acc[3]:
                    acc[3] = first
            for c, best in f.worst.items():
                heap = heaps.get(c)
                if heap is None:
                    heap = heaps[c] = []
                _keep_best(heap, best, k)
            _keep_best(lossy, f.lossy, k)
            alerts += f.alerts
        # the walk meets each ToR pair first at its first path in the store's order
        tor_acc = {tk: acc[:3] for tk, acc in sorted(tor.items(), key=lambda kv: kv[1][3])}
        worst = [key for c in sorted(heaps) for _, key in sorted(heaps[c], reverse=True)]
        worst += [key for _, key in sorted(lossy, reverse=True)]
        alerts.sort()
        with self.lock:
            return self._finish(
                now_ns, [key for _, key in alerts], requested, worst, fresh, tor_acc, ranked,
                total, alert_hosts, all_hosts,
            )  # fmt: skip

    def _finish(
        self,
        now_ns: int,
        alerts: list[PathKey],
        requested: list[PathKey],
        worst: list[PathKey],
        fresh: list[PathKey],
        tor_acc: dict[TorKey, list[int]],
        ranked: int,
        total: int,
        alert_hosts: Iterable[str],
        all_hosts: Iterable[str],
    ) -> Selection:
        """The choice over what a walk or a fold found (called with the lock held)."""
        cfg = self.cfg
        hold_ns = int(cfg.hold_s * 1e9)
        cands = [(k, "alert") for k in alerts]
        cands += [(k, "request") for k in requested]
        cands += [(k, "worst") for k in worst]
        paths = choose(cands, self._held_paths, now_ns, hold_ns, cfg.max_paths, fill=fresh)
        path_keys = paths.kept
        host_cands = [(h, "alert") for h in alert_hosts]
        for key in path_keys:
            host_cands += [(key.src, "path"), (key.dst, "path")]
        hosts = choose(host_cands, self._held_hosts, now_ns, hold_ns, cfg.max_hosts, fill=all_hosts)
        tors = self._tor_pairs(tor_acc, now_ns, hold_ns)
        for kind, got in (("path", paths), ("host", hosts)):
            for reason, n in got.dropped.items():
                self.dropped[kind][reason] += n
        return Selection(
            paths=path_keys,
            hosts=hosts.kept,
            tor_pairs=tors[0],
            tor_reasons=tors[1],
            ranked_paths=ranked,
            omitted_paths=max(0, total - len(path_keys)),
            omitted_tor_pairs=tors[2],
        )

    def _tor_pairs(
        self, acc: Mapping[TorKey, list[int]], now_ns: int, hold_ns: int
    ) -> tuple[dict[TorKey, tuple[float | None, float]], dict[TorKey, str], int]:
        figs: dict[TorKey, tuple[float | None, float]] = {
            tk: (p99 / 1e9 if p99 else None, lost / sent if sent else 0.0)
            for tk, (p99, sent, lost) in acc.items()
        }
        intra = [tk for tk in figs if tk[0] == tk[1]]
        inter = [tk for tk in figs if tk[0] != tk[1]]
        room = max(0, self.cfg.max_tor_pairs - len(intra)) // 2
        by_p99 = [tk for _, tk in heapq.nlargest(room, [(figs[tk][0] or 0.0, tk) for tk in inter])]
        lossy = [(figs[tk][1], tk) for tk in inter if figs[tk][1] > 0]
        by_loss = [tk for _, tk in heapq.nlargest(room, lossy)]
        cands = [(tk, "intra") for tk in sorted(intra)]
        cands += [(tk, "worst") for tk in by_loss + by_p99]
        got = choose(cands, self._held_tors, now_ns, hold_ns, self.cfg.max_tor_pairs, fill=figs)
        for reason, n in got.dropped.items():
            self.dropped["tor_pair"][reason] += n
        # a held pair with no fresh window this scrape has no figure to show
        reasons = {tk: why for tk, why in got.kept.items() if tk in figs}
        return {tk: figs[tk] for tk in reasons}, reasons, len(figs) - len(reasons)


def _keep_best(heap: list[Any], best: Iterable[Any], k: int) -> None:
    """Offer BEST's items (best first) to HEAP, the k best so far: once one does not get
    in, none after it does."""
    for item in best:
        if len(heap) < k:
            heapq.heappush(heap, item)
        elif item > heap[0]:
            heapq.heapreplace(heap, item)
        else:
            break


def tor_label(topology: str) -> str:
    return topology or UNKNOWN_TOR
