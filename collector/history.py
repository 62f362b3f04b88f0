"""Fabric figures over time, for joining stage spans with the windows they overlap.

The window store keeps per-path totals and the newest window only; a join needs the
window that was current when a KV transfer ran. `FabricHistory.feed()` reads a store
snapshot and keeps each path window it has not seen yet (RTT percentiles, loss) and
each new counter rate in the categories a stage is explained by (PFC pauses, ECN
marks, CNPs, retransmits), for `keep_s` seconds. It is fed on a short period, so
every window is seen at least once while it is the newest.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

import pandas as pd

from collector.sketchwire import MergedSketch
from collector.store import StoreSnapshot

COUNTER_CATEGORIES = ("pfc_pause", "ecn_mark", "cnp", "retransmit")
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
    if kind == "pfc" and lname in ("rx_pause", "tx_pause"):
        return "pfc_pause"
    if "ecn" in lname:
        return "ecn_mark"
    if "cnp" in lname:
        return "cnp"
    if kind == "rdma" and (lname in _RETRANSMIT or "retrans" in lname):
        return "retransmit"
    return None


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class CounterRate:
    host: str
    device: str
    category: str
    name: str
    t_ns: int
    rate: float  # per second over the window that ended at t_ns


def window_from_sketch(
    key: tuple[str, str, str, str, int], start_ns: int, end_ns: int, sk: MergedSketch
) -> FabricWindow:
    p50, p99 = sk.percentile_ns(50.0), sk.percentile_ns(99.0)
    return FabricWindow(
        *key,
        start_ns=start_ns,
        end_ns=end_ns,
        rtt_min_s=None if sk.min_ns is None else sk.min_ns / 1e9,
        rtt_p50_s=None if p50 is None else p50 / 1e9,
        rtt_p99_s=None if p99 is None else p99 / 1e9,
        loss_ratio=sk.loss_ratio,
        samples=sk.count,
    )


class FabricHistory:
    """Bounded, thread-safe history of path windows and counter rates."""

    def __init__(self, *, keep_s: float = 3600.0, first_window_s: float = 10.0) -> None:
        self.keep_ns = int(keep_s * 1e9)
        self.first_window_ns = int(first_window_s * 1e9)
        self.lock = threading.Lock()
        self.windows: deque[FabricWindow] = deque(maxlen=200_000)
        self.rates: deque[CounterRate] = deque(maxlen=200_000)
        self._path_end: dict[tuple[str, str, str, str, int], int] = {}
        self._counter_t: dict[tuple[str, ...], int] = {}

    def add_window(self, w: FabricWindow) -> None:
        with self.lock:
            self.windows.append(w)

    def add_rate(self, r: CounterRate) -> None:
        with self.lock:
            self.rates.append(r)

    def feed(self, snap: StoreSnapshot) -> int:
        """Keep what is new in SNAP; return how many windows and rates were added."""
        added = 0
        with self.lock:
            for key, stats in snap.paths.items():
                end = stats.last_end_ns
                prev = self._path_end.get(key)
                if stats.last_rtt is None or (prev is not None and end <= prev):
                    continue
                start = prev if prev is not None else end - self.first_window_ns
                self._path_end[key] = end
                self.windows.append(window_from_sketch(key, start, end, stats.last_rtt))
                added += 1
            for ckey, track in snap.counters.items():
                src, kind, device, _port, netdev, _prio, name = ckey
                cat = counter_category(kind, name)
                if cat is None or track.rate is None:
                    continue
                ident = tuple(map(str, ckey))
                if self._counter_t.get(ident, -1) >= track.last_ns:
                    continue
                self._counter_t[ident] = track.last_ns
                self.rates.append(
                    CounterRate(src, device or netdev, cat, name, track.last_ns, track.rate)
                )
                added += 1
            self._trim(snap.now_ns)
        return added

    def _trim(self, now_ns: int) -> None:
        floor = now_ns - self.keep_ns
        while self.windows and self.windows[0].end_ns < floor:
            self.windows.popleft()
        while self.rates and self.rates[0].t_ns < floor:
            self.rates.popleft()

    def frames(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(windows, rates) as DataFrames with the dataclasses' fields as columns."""
        with self.lock:
            ws, rs = list(self.windows), list(self.rates)
        return windows_frame(ws), rates_frame(rs)


WINDOW_COLUMNS = [f for f in FabricWindow.__dataclass_fields__]
RATE_COLUMNS = [f for f in CounterRate.__dataclass_fields__]


def windows_frame(ws: list[FabricWindow]) -> pd.DataFrame:
    return pd.DataFrame([w.__dict__ for w in ws], columns=WINDOW_COLUMNS)


def rates_frame(rs: list[CounterRate]) -> pd.DataFrame:
    return pd.DataFrame([r.__dict__ for r in rs], columns=RATE_COLUMNS)
