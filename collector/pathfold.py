"""The figures the bounded export ranks paths by, folded as each report is taken.

A scrape of a shard holding 120,000 paths spent most of its time walking every path
(collector/detail.py) to build the ToR-pair figures, the worst p99s and losses and the
alert set. All of it is known when a report is taken: the paths of one report are
touched at one instant, so they are fresh or stale together, and their ranking figures
do not change until the host's next report. `PathFold` keeps, per host, one `Folded`
per report still holding paths: what that report's paths add to the ToR pairs, their k
worst p99s per (transport, op, size) class and their k worst losses (each sorted, best
first), their alerts. A scrape merges the fresh ones (one per host) instead of walking
the paths. The merge gives what the walk gives (tests/unit/test_pathfold.py holds them
equal over random reports): each ToR pair's figures with the store order in which the
walk would have met it first, alerts in the store's order.

A host's next report supersedes its previous `Folded`; a path that report did not touch
(the plan moved a peer) stays in an older one, folded again without the moved paths. A
registration that moves a host to another ToR, and a host let go of, fold again what
used its label. A label the fleet's plan gives (a host registered with another shard) is
read when the report is taken, so a change there shows from the host's next report on
(the walk read labels through a cache of a minute).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from fabricprobe.collector.pathtable import PathKey

TorKey = tuple[str, str, str]  # src_tor, dst_tor, transport
Class = tuple[str, str, int]  # transport, op, size


class Ranked(Protocol):
    """What a fold reads of a path (collector/pathtable.py PathStats)."""

    seq: int
    touched_ns: int
    last_p99_ns: int | None
    last_loss: float
    p99_ewma: float
    p99_windows: int

    @property
    def last_rtt(self) -> object | None: ...


@dataclass(frozen=True)
class FoldConfig:
    worst_k: int
    loss_alert: float
    tail_factor: float
    min_windows: int


@dataclass
class Folded:
    """One report's paths, folded (see the module docstring)."""

    touched_ns: int
    keys: frozenset[PathKey]
    hosts: frozenset[str] = frozenset()  # both ends of its paths: whose ToR labels it used
    ranked: int = 0
    # ToR pair -> [worst p99 ns, exchanges, lost, the first path's store order]
    tor: dict[TorKey, list[int]] = field(default_factory=dict)
    worst: dict[Class, list[tuple[int, PathKey]]] = field(default_factory=dict)
    lossy: list[tuple[float, PathKey]] = field(default_factory=list)
    alerts: list[tuple[int, PathKey]] = field(default_factory=list)  # (store order, path)


def fold(
    touched_ns: int,
    paths: Iterable[tuple[PathKey, Ranked]],
    tor_of: Callable[[str], str],
    cfg: FoldConfig,
) -> Folded:
    """PATHS (one report's, all touched at TOUCHED_NS) folded, as the walk takes each."""
    keys: list[PathKey] = []
    out = Folded(touched_ns, frozenset())
    k = cfg.worst_k
    worst: dict[Class, list[tuple[int, PathKey]]] = {}
    lossy: list[tuple[float, PathKey]] = []
    tors: dict[str, str] = {}
    for key, v in paths:
        keys.append(key)
        sk = v.last_rtt
        if sk is None:
            continue
        out.ranked += 1
        p99, loss = v.last_p99_ns, v.last_loss
        src, dst = key.src, key.dst
        st = tors.get(src)
        if st is None:
            st = tors[src] = tor_of(src)
        dt = tors.get(dst)
        if dt is None:
            dt = tors[dst] = tor_of(dst)
        tk = (st, dt, key.transport)
        acc = out.tor.get(tk)
        if acc is None:
            acc = out.tor[tk] = [0, 0, 0, v.seq]
        elif v.seq < acc[3]:
            acc[3] = v.seq
        lost = sk.lost  # type: ignore[attr-defined]
        acc[1] += sk.count + lost  # type: ignore[attr-defined]
        if lost:
            acc[2] += lost
            if k:
                lossy.append((loss, key))
        if p99 is None:
            if loss > cfg.loss_alert:
                out.alerts.append((v.seq, key))
            continue
        if p99 > acc[0]:
            acc[0] = p99
        if k:
            worst.setdefault((key.transport, key.op, key.size), []).append((p99, key))
        if loss > cfg.loss_alert or (
            v.p99_windows >= cfg.min_windows and p99 > cfg.tail_factor * v.p99_ewma
        ):
            out.alerts.append((v.seq, key))
    out.keys = frozenset(keys)
    out.hosts = frozenset(tors)
    out.worst = {c: sorted(got, reverse=True)[:k] for c, got in worst.items()}
    out.lossy = sorted(lossy, reverse=True)[:k]
    return out


class PathFold:
    """Every host's folded reports, kept up to date by the store (under its lock)."""

    def __init__(self, tor_of: Callable[[str], str], cfg: FoldConfig) -> None:
        self.tor_of, self.cfg = tor_of, cfg
        self.hosts: dict[str, list[Folded]] = {}

    def taken(
        self, src: str, now_ns: int, keys: list[PathKey], paths: Mapping[PathKey, Ranked]
    ) -> None:
        """A report of SRC touched KEYS at NOW_NS (PATHS: the store's table)."""
        keys = list(dict.fromkeys(keys))  # a report may name one path twice
        new = fold(now_ns, ((key, paths[key]) for key in keys), self.tor_of, self.cfg)
        kept = [new]
        for old in self.hosts.get(src, ()):
            if old.keys <= new.keys:
                continue  # superseded (the steady state: the same peers every window)
            rest = [k for k in old.keys if k not in new.keys and k in paths]
            if rest:
                rest.sort(key=lambda k: paths[k].seq)
                kept.append(
                    fold(old.touched_ns, ((k, paths[k]) for k in rest), self.tor_of, self.cfg)
                )
        self.hosts[src] = kept

    def relabel(self, host: str, paths: Mapping[PathKey, Ranked]) -> None:
        """HOST's ToR label may have changed (a registration, a host let go of): fold
        again what used it."""
        for src, held in self.hosts.items():
            if any(host in f.hosts for f in held):
                self.hosts[src] = [
                    self._again(f, f.keys, paths) if host in f.hosts else f for f in held
                ]

    def _again(self, f: Folded, keys: Iterable[PathKey], paths: Mapping[PathKey, Ranked]) -> Folded:
        rest = sorted((k for k in keys if k in paths), key=lambda k: paths[k].seq)
        return fold(f.touched_ns, ((k, paths[k]) for k in rest), self.tor_of, self.cfg)

    def forgot(
        self, keys: Iterable[PathKey], hosts: Iterable[str], paths: Mapping[PathKey, Ranked]
    ) -> None:
        """Paths (KEYS) and HOSTS the store let go of."""
        hosts = list(hosts)
        for h in hosts:
            self.hosts.pop(h, None)
        for h in hosts:
            self.relabel(h, paths)
        gone = set(keys)
        for src in {k.src for k in gone}:
            held = self.hosts.get(src)
            if held is None:
                continue
            kept = []
            for old in held:
                if not old.keys & gone:
                    kept.append(old)
                    continue
                rest = sorted(
                    (k for k in old.keys if k not in gone and k in paths),
                    key=lambda k: paths[k].seq,
                )
                if rest:
                    kept.append(
                        fold(old.touched_ns, ((k, paths[k]) for k in rest), self.tor_of, self.cfg)
                    )
            if kept:
                self.hosts[src] = kept
            else:
                del self.hosts[src]

    def rebuild(self, paths: Mapping[PathKey, Ranked]) -> None:
        """Fold what the store holds already (a fold that starts on a store in use)."""
        groups: dict[tuple[str, int], list[PathKey]] = {}
        for key, v in paths.items():
            groups.setdefault((key.src, v.touched_ns), []).append(key)
        self.hosts = {}
        for (src, touched), keys in groups.items():
            got = fold(touched, ((k, paths[k]) for k in keys), self.tor_of, self.cfg)
            self.hosts.setdefault(src, []).append(got)

    def fresh(self, since_ns: int) -> list[Folded]:
        """The folded reports whose paths are fresh (touched at or after SINCE_NS)."""
        return [f for held in self.hosts.values() for f in held if f.touched_ns >= since_ns]
