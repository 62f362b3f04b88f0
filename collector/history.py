"""Fabric figures over time, for joining stage spans with the windows they overlap.

The window store keeps per-path totals and the newest window only; a join needs the
window that was current when a KV transfer ran. A FabricHistory listens to the store,
for the host pairs that carry fabric stages (`watch()`: the join never looks at other
paths, and in a large fleet they are nearly all of them). Each report taken hands it
that report's windows and counter rates on those pairs and hosts (`report_taken`,
cheap, under the store's lock, into a bounded inbox), and `drain()` turns what arrived
into rows: each path window newer than the one before it (RTT percentiles, loss) and
each counter rate in the categories a stage is explained by (PFC pauses, ECN marks,
CNPs, retransmits), kept for `keep_s` seconds. The work follows the traffic that is
joined, never the size of the fleet.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import pandas as pd

from fabricprobe.collector.store import CounterKey, PathKey, WindowStore, host_pair
from fabricprobe.core.sketchwire import MergedSketch

# pause_us: the µs per second a PFC pause held the link (ethtool's *_pause_duration:
# mlx5, bnxt_en), which the KV split turns into time (collector/kvparts.py)
COUNTER_CATEGORIES = ("pfc_pause", "ecn_mark", "cnp", "retransmit", "pause_us")
# NIXL's per-engine transfer counters (agent/nixl.py), kept for every host that has them:
# the join reads the decode host's transfers around each KV transfer
NIXL_CATEGORY = "nixl"
# RDMA hw_counters that count a retransmission or what causes one (mlx5 and rxe names).
_RETRANSMIT = frozenset(
    {
        "local_ack_timeout_err",
        "packet_seq_err",
        "out_of_sequence",
        "implied_nak_seq_err",
        "duplicate_request",
        "out_of_seq_request",
        "rcvd_seq_err",
        "completer_retry_err",
        "retry_exceeded_err",
    }
)


def counter_category(kind: str, name: str) -> str | None:
    """Which explanatory category a counter belongs to, None for the rest."""
    lname = name.lower()
    if kind == "nixl":
        return NIXL_CATEGORY
    if kind == "pfc" and lname in ("rx_pause", "tx_pause"):
        return "pfc_pause"
    if kind == "pfc" and lname == "rx_pause_duration_us":
        return "pause_us"  # the time this end was paused: what held its sends back
    if "ecn" in lname:
        return "ecn_mark"
    if "cnp" in lname:
        return "cnp"
    if kind == "rdma" and (lname in _RETRANSMIT or "retrans" in lname):
        return "retransmit"
    return None


@dataclass(frozen=True, slots=True)
class FabricWindow:
    src: str
    dst: str
    transport: str
    op: str
    size: int
    start_ns: int
    end_ns: int
    rtt_min_s: float | None  # exact: the floor a path's added latency lifts
    rtt_p50_s: float | None
    rtt_p99_s: float | None
    loss_ratio: float
    samples: int
    # UD: the prober's own delay inside these RTTs (min, p50, p99), None for other probes
    prober_delay_min_s: float | None = None
    prober_delay_p50_s: float | None = None
    prober_delay_p99_s: float | None = None


_Rate = tuple[CounterKey, str, float]  # counter, category, rate
# what one report brought: its end, windows, kept rates, prober delays by path
_Taken = tuple[int, list[tuple[PathKey, MergedSketch]], list[_Rate], dict[PathKey, MergedSketch]]


@dataclass(frozen=True, slots=True)
class CounterRate:
    host: str
    device: str
    category: str
    name: str
    t_ns: int
    rate: float  # per second over the window that ended at t_ns


def window_from_sketch(
    key: PathKey, start_ns: int, end_ns: int, sk: MergedSketch, prober: MergedSketch | None = None
) -> FabricWindow:
    p50, p99 = sk.percentiles_ns((50.0, 99.0))
    d50, d99 = prober.percentiles_ns((50.0, 99.0)) if prober is not None else (None, None)
    return FabricWindow(
        *key,
        start_ns=start_ns,
        end_ns=end_ns,
        rtt_min_s=None if sk.min_ns is None else sk.min_ns / 1e9,
        rtt_p50_s=None if p50 is None else p50 / 1e9,
        rtt_p99_s=None if p99 is None else p99 / 1e9,
        loss_ratio=sk.loss_ratio,
        samples=sk.count,
        prober_delay_min_s=None if prober is None or prober.min_ns is None else prober.min_ns / 1e9,
        prober_delay_p50_s=None if d50 is None else d50 / 1e9,
        prober_delay_p99_s=None if d99 is None else d99 / 1e9,
    )


class FabricHistory:
    """Bounded, thread-safe history of path windows and counter rates."""

    def __init__(
        self, *, keep_s: float = 3600.0, first_window_s: float = 10.0, inbox: int = 200_000
    ) -> None:
        self.keep_ns = int(keep_s * 1e9)
        self.first_window_ns = int(first_window_s * 1e9)
        self.lock = threading.Lock()
        self.windows: deque[FabricWindow] = deque(maxlen=200_000)
        self.rates: deque[CounterRate] = deque(maxlen=200_000)
        # what reports brought since the last drain(); bounded like the rows themselves
        self._inbox: deque[_Taken] = deque(maxlen=inbox)
        self.inbox_dropped = 0  # reports' windows the inbox had no room for
        self._draining = threading.Lock()  # one drain at a time: rows in report order
        self._path_end: dict[PathKey, int] = {}
        self._category: dict[tuple[str, str], str | None] = {}
        # replaced whole, never changed in place: report_taken() reads them without a lock
        self.pairs: frozenset[tuple[str, str]] = frozenset()
        self.hosts: frozenset[str] = frozenset()
        # told of the rows each drain adds and lets go of (the join's index of them)
        self.sink: RowSink | None = None
        self.rows_dropped = 0  # rows let go of for room before keep_s had passed

    def watch(self, pairs: set[tuple[str, str]], store: WindowStore | None = None) -> None:
        """Keep windows of the paths between each of PAIRS (host names, either order)
        and the counter rates of their hosts from now on; the newest window each such
        path already has in STORE is taken at once."""
        new = {host_pair(a, b) for a, b in pairs} - self.pairs
        if not new:
            return
        fresh = {h for p in new for h in p} - self.hosts
        with self.lock:
            self.pairs = self.pairs | new
            self.hosts = self.hosts | fresh
        if store is not None:
            # each watched host's path to itself is its reference (agent.reference_spec)
            for a, b in [*new, *((h, h) for h in sorted(fresh))]:
                for v in store.pair_paths(a, b):
                    if v.rtt is None:
                        continue
                    delays = None if v.last_prober_delay is None else {v.key: v.last_prober_delay}
                    self.report_taken(v.last_end_ns, [(v.key, v.rtt)], [], delays)

    def report_taken(
        self,
        end_ns: int,
        windows: list[tuple[PathKey, MergedSketch]],
        rates: list[tuple[CounterKey, float]],
        prober_delays: Mapping[PathKey, MergedSketch] | None = None,
    ) -> None:
        """One report's path windows (their RTT sketches, and the prober-delay sketches of
        those that have one) and updated counter rates, as the store took them; kept are
        the windows of watched pairs and the counters of watched hosts in an explanatory
        category."""
        pairs = self.pairs
        nixl = [r for r in rates if r[0].kind == "nixl"]
        if not pairs and not nixl:
            return
        hosts = self.hosts
        windows = [
            (k, sk)
            for k, sk in windows
            if host_pair(k.src, k.dst) in pairs or (k.src == k.dst and k.src in hosts)
        ]
        if rates and rates[0][0].src not in self.hosts:
            rates = nixl  # one report, one host
        cats = self._category
        kept: list[_Rate] = []
        for key, rate in rates:
            kn = (key.kind, key.name)
            cat = cats.get(kn, "")
            if cat == "":
                cat = cats[kn] = counter_category(*kn)
            if cat is not None:
                kept.append((key, cat, rate))
        if not windows and not kept:
            return
        with self.lock:
            if len(self._inbox) == self._inbox.maxlen:
                self.inbox_dropped += 1
            delays = (
                {k: prober_delays[k] for k, _ in windows if k in prober_delays}
                if (prober_delays)
                else {}
            )
            self._inbox.append((end_ns, windows, kept, delays))

    def drain(self, now_ns: int) -> int:
        """Turn what reports brought into rows; return how many windows and rates were added."""
        with self._draining:
            return self._drain(now_ns)

    def _drain(self, now_ns: int) -> int:
        with self.lock:
            inbox, self._inbox = self._inbox, deque(maxlen=self._inbox.maxlen)
        rows: list[FabricWindow] = []
        rates: list[CounterRate] = []
        path_end = self._path_end
        for end, windows, kept, delays in inbox:
            for key, sketch in windows:
                prev = path_end.get(key)
                if prev is not None and end <= prev:
                    continue  # a window replayed after a newer one: its time has passed
                path_end[key] = end
                start = prev if prev is not None else end - self.first_window_ns
                rows.append(window_from_sketch(key, start, end, sketch, delays.get(key)))
            for ckey, cat, rate in kept:  # the store updates a rate only for a newer reading
                device = ckey.device or ckey.netdev
                rates.append(CounterRate(ckey.src, device, cat, ckey.name, end, rate))
        n_w, n_r = self.windows.maxlen or 0, self.rates.maxlen or 0
        over = max(0, len(rows) - n_w) + max(0, len(rates) - n_r)
        rows, rates = (
            rows[len(rows) - n_w :] if over else rows,
            rates[len(rates) - n_r :] if over else rates,
        )
        with self.lock:
            self.rows_dropped += over
            gone_w = _push(self.windows, rows)
            gone_r = _push(self.rates, rates)
            self.rows_dropped += len(gone_w) + len(gone_r)
            floor = now_ns - self.keep_ns
            while self.windows and self.windows[0].end_ns < floor:
                gone_w.append(self.windows.popleft())
            while self.rates and self.rates[0].t_ns < floor:
                gone_r.append(self.rates.popleft())
        if self.sink is not None:
            self.sink(rows, rates, gone_w, gone_r)
        return len(rows) + len(rates)

    def frames(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(windows, rates) as DataFrames with the dataclasses' fields as columns."""
        with self.lock:
            ws, rs = list(self.windows), list(self.rates)
        return windows_frame(ws), rates_frame(rs)


# (windows added, rates added, windows let go of, rates let go of) by one drain
RowSink = Callable[
    [list[FabricWindow], list[CounterRate], list[FabricWindow], list[CounterRate]], None
]


T = TypeVar("T")


def _push(rows: deque[T], new: list[T]) -> list[T]:
    """NEW onto ROWS (bounded, and NEW no longer than its bound); the oldest rows it
    pushed out."""
    room = (rows.maxlen or 0) - len(rows)
    gone = [rows.popleft() for _ in range(min(len(rows), max(0, len(new) - room)))]
    rows.extend(new)
    return gone


WINDOW_COLUMNS = [f for f in FabricWindow.__dataclass_fields__]
RATE_COLUMNS = [f for f in CounterRate.__dataclass_fields__]


def windows_frame(ws: list[FabricWindow]) -> pd.DataFrame:
    return pd.DataFrame(
        [[getattr(w, c) for c in WINDOW_COLUMNS] for w in ws], columns=WINDOW_COLUMNS
    )


def rates_frame(rs: list[CounterRate]) -> pd.DataFrame:
    return pd.DataFrame([[getattr(r, c) for c in RATE_COLUMNS] for r in rs], columns=RATE_COLUMNS)
