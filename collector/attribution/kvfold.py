"""The KV transfers' figures folded per path as they are joined, and the requests' as they
settle: what /metrics reads, without the rows (attribution/exporter.py).

A scrape of the attribution used to join and analyse every request of the last window,
and its cost grew with them. All of it can be known as each request settles (joined
with its path's fabric figures once: attribution/assembly.py), the way the store folds
its ranking figures per report (collector/pathfold.py). `KvFold` keeps:

- per path (src, dst, transport), up to `max_paths` of them (the others are counted in
  `dropped["path"]`), one `PathBin` per BINS-th of the analysis window the transfers
  ended in: their count, a quantile sketch per figure (fabricprobe/core/quantiles.py:
  exact up to 32 values, then within 1 % relatively), the host-bound share, the bytes
  moved, the speed flag; and the figures rank_figures judges it by (attribution/
  analysis.py), made again of its bins whenever a transfer comes or a bin leaves the
  window. The window is the bins that end after the last window_s began: up to one bin
  (window_s / BINS) more than window_s.
- per path and correlation window (window_s, by the transfers' start), the pairs of
  (seconds per byte or seconds, probe p99 RTT) Spearman's rho is taken over, up to
  MAX_RHO_PAIRS (a uniform sample past that: `dropped["rho"]` counts the pairs left
  out), and that rho, taken again as pairs come.
- per bin of the window, the requests' goodput figures (requests, met, tokens, good
  tokens) and sketches of their KV and fabric shares of TTFT; per window_s of the
  requests' start, sketches of their KV, queue and compute seconds (communication-bound).

`view()` ranks the paths' figures (rank_figures, over the paths and not the rows) and
reads the rest; it is kept until something changes or a bin leaves the window.
"""

from __future__ import annotations

import math
import random
import threading
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from fabricprobe.collector.attribution.analysis import (
    FIGURE_COLUMNS,
    PATH,
    RTT_FIGURES,
    AnalysisConfig,
    comm_flag,
    rank_figures,
    spearman_arrays,
)
from fabricprobe.collector.attribution.fabricjoin import RATE_FIELDS
from fabricprobe.core.quantiles import EXACT_MAX, QuantileSketch

BINS = 6  # bins in an analysis window
MAX_FOLD_PATHS = 16_384  # paths folded one by one (as many as the fabric history watches)
MAX_RHO_PAIRS = 256  # pairs a path's rho is taken over, per correlation window
NAN = math.nan
PathKey = tuple[str, str, str]  # src, dst, transport ("" when not given)
# a transfer's figures, as a bin keeps them: the first Q in sketches, then host_bound,
# the bytes and the speed flag
VECTOR = (
    "duration_s",
    "s_per_byte",
    *RTT_FIGURES,
    "host_delay_s",
    "kv_wait_s",
    "fabric_s",
    "transfer_stack_s",
    "engine_wait_s",
    "host_bound",
    "kv_bytes",
    "speed_above",
)
Q = 13
PARTS = ("kv_wait_s", "fabric_s", "transfer_stack_s", "engine_wait_s")


def _num(v: Any) -> float:
    try:
        return NAN if v is None else float(v)
    except (TypeError, ValueError):
        return NAN


def transfer_vector(row: Mapping[str, Any]) -> tuple[float, ...]:
    """VECTOR of one joined KV transfer (a row of join_fabric's frame), as
    analysis.transfer_figures makes it of a frame."""
    d, nbytes = _num(row.get("duration_s")), _num(row.get("bytes"))
    p50, p99 = _num(row.get("rtt_p50_s")), _num(row.get("rtt_p99_s"))
    net50, net99 = _num(row.get("rtt_p50_net_s")), _num(row.get("rtt_p99_net_s"))
    rates = [r for r in (_num(row.get(c)) for c in RATE_FIELDS) if r == r]
    flag = row.get("kv_speed_above_path")
    return (
        d,
        d / nbytes if nbytes > 0 else NAN,
        _num(row.get("rtt_min_s")),
        p50,
        p99,
        net50 if net50 == net50 else p50,
        net99 if net99 == net99 else p99,
        sum(rates) if rates else NAN,
        _num(row.get("host_delay_s")),
        *(_num(row.get(c)) for c in PARTS),
        _num(row.get("host_bound")),
        nbytes if nbytes > 0 else 0.0,
        NAN if flag is None or flag != flag else float(bool(flag)),
    )


class PathBin:
    """One path's transfers that ended in one bin: their figures, exact while few."""

    __slots__ = ("flag_any", "flag_n", "host_n", "host_sum", "kv_bytes", "n", "rows", "sketches")

    def __init__(self) -> None:
        self.n = 0
        self.rows: array[float] | None = array("d")  # Q figures a transfer, while few
        self.sketches: list[QuantileSketch] | None = None
        self.host_n, self.host_sum, self.kv_bytes = 0, 0.0, 0.0
        self.flag_n, self.flag_any = 0, False

    def add(self, vec: tuple[float, ...]) -> None:
        self.n += 1
        host, nbytes, flag = vec[Q], vec[Q + 1], vec[Q + 2]
        if host == host:
            self.host_n += 1
            self.host_sum += host
        self.kv_bytes += nbytes
        if flag == flag:
            self.flag_n += 1
            self.flag_any = self.flag_any or flag > 0
        if self.rows is not None:
            self.rows.extend(vec[:Q])
            if self.n <= EXACT_MAX:
                return
            held, self.rows = self.rows, None
            self.sketches = [QuantileSketch() for _ in range(Q)]
            for i, sk in enumerate(self.sketches):
                sk.add_many(held[i::Q])
            return
        assert self.sketches is not None
        for sk, v in zip(self.sketches, vec[:Q], strict=False):
            sk.add(v)


class PathFigures(NamedTuple):
    """A path's figures over the window (FIGURE_COLUMNS, then the KV parts' medians and
    the speed flag: None when no transfer had one)."""

    transfers: int
    kv_median_s: float
    s_per_byte: float
    rtt_min_s: float
    rtt_p50_s: float
    rtt_p99_s: float
    rtt_p50_net_s: float
    rtt_p99_net_s: float
    congestion_per_s: float
    host_share: float
    host_delay_s: float
    kv_bytes: float
    kv_wait_s: float
    fabric_s: float
    transfer_stack_s: float
    engine_wait_s: float
    speed_above: bool | None


def path_figures_of(bins: Iterable[PathBin], kv_quantile: float) -> PathFigures:
    """A path's figures over BINS: medians (the speed at KV_QUANTILE) from its sketches."""
    sk = [QuantileSketch() for _ in range(Q)]
    n = host_n = flag_n = 0
    host_sum = kv_bytes = 0.0
    flag_any = False
    for b in bins:
        n += b.n
        host_n += b.host_n
        host_sum += b.host_sum
        kv_bytes += b.kv_bytes
        flag_n += b.flag_n
        flag_any = flag_any or b.flag_any
        if b.rows is not None:
            for i, s in enumerate(sk):
                s.add_many(b.rows[i::Q])
        else:
            assert b.sketches is not None
            for s, other in zip(sk, b.sketches, strict=True):
                s.merge(other)
    med = [s.median() for s in sk]
    return PathFigures(
        transfers=n,
        kv_median_s=med[0],
        s_per_byte=sk[1].quantile(kv_quantile),
        rtt_min_s=med[2],
        rtt_p50_s=med[3],
        rtt_p99_s=med[4],
        rtt_p50_net_s=med[5],
        rtt_p99_net_s=med[6],
        congestion_per_s=med[7],
        host_share=host_sum / host_n if host_n else NAN,
        host_delay_s=med[8],
        kv_bytes=kv_bytes,
        kv_wait_s=med[9],
        fabric_s=med[10],
        transfer_stack_s=med[11],
        engine_wait_s=med[12],
        speed_above=flag_any if flag_n else None,
    )


class RhoWindow:
    """One path's transfers of one correlation window, for Spearman's rho: (seconds per
    byte, seconds, probe p99 RTT) a transfer, in one array."""

    __slots__ = ("pairs", "rho", "seen")

    def __init__(self) -> None:
        self.pairs: array[float] = array("d")
        self.seen = 0
        self.rho = NAN

    def add(self, vec: tuple[float, ...], rng: random.Random) -> bool:
        """One transfer's pair; False when the sample left it out (past MAX_RHO_PAIRS)."""
        self.seen += 1
        at = len(self.pairs) // 3
        if at >= MAX_RHO_PAIRS:
            at = rng.randrange(self.seen)
            if at >= MAX_RHO_PAIRS:
                return False
            self.pairs[3 * at : 3 * at + 3] = array("d", (vec[1], vec[0], vec[4]))
            return True
        self.pairs.extend((vec[1], vec[0], vec[4]))
        return True

    def update(self) -> None:
        """rank_correlation's rho of these pairs: seconds per byte where any transfer
        has it, else seconds, against the probe p99 RTT."""
        got = np.frombuffer(self.pairs).reshape(-1, 3)
        x = got[:, 0] if not np.isnan(got[:, 0]).all() else got[:, 1]
        self.rho = spearman_arrays(x, got[:, 2])


@dataclass(slots=True)
class PathState:
    bins: dict[int, PathBin] = field(default_factory=dict)
    figures: PathFigures | None = None
    rho: dict[int, RhoWindow] = field(default_factory=dict)


@dataclass
class RequestFigures:
    """What one settled request adds to the fold (attribution/assembly.py makes it)."""

    start_ns: int  # its first stage's start: its communication-bound bin
    end_ns: int  # its newest record's end: its bin in the window
    kv_s: float  # its KV, queue and compute (prefill + decode) seconds (NaN: none)
    queue_s: float
    compute_s: float
    kv_share_ttft: float  # NaN when unknown (no path, no TTFT)
    fabric_share_ttft: float
    goodput: tuple[float, bool] | None  # (output tokens, SLO met) of its request record
    transfers: list[tuple[PathKey, int, int, tuple[float, ...]]]  # key, start, end, VECTOR


@dataclass
class WindowBin:
    """The requests that ended in one bin: goodput figures and share sketches."""

    requests: int = 0
    met: int = 0
    tokens: float = 0.0
    good: float = 0.0
    kv_share: QuantileSketch = field(default_factory=QuantileSketch)
    fabric_share: QuantileSketch = field(default_factory=QuantileSketch)


@dataclass(frozen=True)
class FoldView:
    """What /metrics shows of the attribution at one moment."""

    now_ns: int
    paths: pd.DataFrame  # rank_figures' frame
    parts: list[tuple[PathKey, PathFigures]]  # every path's figures, KV parts among them
    rho: list[tuple[PathKey, float]]  # the newest correlation window's
    kv_share_ttft: float
    fabric_share_ttft: float
    communication_bound: bool
    bins: pd.DataFrame  # per communication-bound window: medians of KV, queue, compute
    goodput: pd.DataFrame  # one row as analysis.goodput gives it with now_ns, or none


class KvFold:
    """The fold (see the module docstring), thread-safe."""

    def __init__(self, cfg: AnalysisConfig, *, max_paths: int = MAX_FOLD_PATHS) -> None:
        self.cfg, self.max_paths = cfg, max_paths
        self.window_ns = int(cfg.window_s * 1e9)
        self.bin_ns = max(1, self.window_ns // BINS)
        self.lock = threading.Lock()
        self.paths: dict[PathKey, PathState] = {}
        self.by_bin: dict[int, set[PathKey]] = {}  # paths with transfers in each bin
        self.window: dict[int, WindowBin] = {}
        self.comm: dict[int, tuple[QuantileSketch, QuantileSketch, QuantileSketch]] = {}
        self.dropped = {"path": 0, "rho": 0}
        self.rng = random.Random(0)
        self.version = 0  # changes whenever what view() reads does
        self._view: tuple[int, int, FoldView] | None = None  # (version, first bin, view)

    def _first_bin(self, now_ns: int) -> int:
        return (now_ns - self.window_ns) // self.bin_ns

    def add(self, requests: Iterable[RequestFigures], now_ns: int) -> None:
        """Fold settled REQUESTS in (those that ended before the window are left out)."""
        first = self._first_bin(now_ns)
        touched: set[PathKey] = set()
        rho_touched: set[tuple[PathKey, int]] = set()
        with self.lock:
            for r in requests:
                self._request(r, now_ns)
                for key, start, end, vec in r.transfers:
                    b = end // self.bin_ns
                    if b < first:
                        continue
                    st = self.paths.get(key)
                    if st is None:
                        if len(self.paths) >= self.max_paths:
                            self.dropped["path"] += 1
                            continue
                        st = self.paths[key] = PathState()
                    st.bins.setdefault(b, PathBin()).add(vec)
                    self.by_bin.setdefault(b, set()).add(key)
                    touched.add(key)
                    w = start // self.window_ns
                    if w not in st.rho:
                        for old in [x for x in st.rho if x < self._first_comm(now_ns)]:
                            del st.rho[old]  # windows that left the analysis window
                        st.rho[w] = RhoWindow()
                    if not st.rho[w].add(vec, self.rng):
                        self.dropped["rho"] += 1
                    rho_touched.add((key, w))
            for key in touched:
                self._refresh(key)
            for key, w in rho_touched:
                self.paths[key].rho[w].update()
            self.version += 1

    def _request(self, r: RequestFigures, now_ns: int) -> None:
        b = r.end_ns // self.bin_ns
        if b < self._first_bin(now_ns):
            return  # it ended before the window: none of its figures are shown
        wb = self.window.setdefault(b, WindowBin())
        wb.kv_share.add(r.kv_share_ttft)
        wb.fabric_share.add(r.fabric_share_ttft)
        if r.goodput is not None:
            tokens, met = r.goodput
            wb.requests += 1
            wb.met += int(met)
            wb.tokens += tokens
            wb.good += tokens if met else 0.0
        w = r.start_ns // self.window_ns
        if w >= self._first_comm(now_ns):
            c = self.comm.get(w)
            if c is None:
                c = self.comm[w] = (QuantileSketch(), QuantileSketch(), QuantileSketch())
            for sk, v in zip(c, (r.kv_s, r.queue_s, r.compute_s), strict=True):
                sk.add(v)

    def _first_comm(self, now_ns: int) -> int:
        """The first communication-bound window that overlaps the analysis window."""
        return (now_ns - self.window_ns) // self.window_ns

    def _refresh(self, key: PathKey) -> None:
        st = self.paths[key]
        st.figures = path_figures_of(st.bins.values(), self.cfg.kv_quantile)

    def advance(self, now_ns: int) -> None:
        """Let go of the bins that left the window by NOW_NS."""
        first = self._first_bin(now_ns)
        with self.lock:
            gone = [b for b in self.by_bin if b < first]
            for b in sorted(gone):
                for key in self.by_bin.pop(b):
                    st = self.paths[key]
                    st.bins.pop(b, None)
                    if st.bins:
                        self._refresh(key)
                    else:
                        del self.paths[key]
            for b in [b for b in self.window if b < first]:
                del self.window[b]
            oldest = self._first_comm(now_ns)
            for w in [w for w in self.comm if w < oldest]:
                del self.comm[w]
            if gone:
                self.version += 1

    def view(self, now_ns: int) -> FoldView:
        """What /metrics shows at NOW_NS (kept while nothing changed)."""
        self.advance(now_ns)
        first = self._first_bin(now_ns)
        with self.lock:
            kept = self._view
            if kept is not None and kept[0] == self.version and kept[1] == first:
                return kept[2]
            version = self.version
            parts = [(k, st.figures) for k, st in self.paths.items() if st.figures is not None]
            rho = self._rho(now_ns)
            window = [wb for b, wb in self.window.items() if b >= first]
            comm = sorted(self.comm.items())
        keys = [k for k, _ in parts]
        per = pd.DataFrame(
            [f[: len(FIGURE_COLUMNS)] for _, f in parts],
            columns=FIGURE_COLUMNS,
            index=pd.MultiIndex.from_arrays(
                [[k[i] for k in keys] for i in range(len(PATH))], names=PATH
            ),
            dtype=float,
        )
        out = FoldView(
            now_ns=now_ns,
            paths=rank_figures(per, self.cfg),
            parts=parts,
            rho=rho,
            kv_share_ttft=_merged(wb.kv_share for wb in window),
            fabric_share_ttft=_merged(wb.fabric_share for wb in window),
            **self._comm(comm),
            goodput=self._goodput(window),
        )
        with self.lock:
            self._view = (version, first, out)
        return out

    def _rho(self, now_ns: int) -> list[tuple[PathKey, float]]:
        """The rho of each path in the newest correlation window that has any (the
        windows that overlap the analysis window; older ones are let go of)."""
        oldest = self._first_comm(now_ns)
        newest: int | None = None
        got: list[tuple[PathKey, float]] = []
        for key, st in self.paths.items():
            for w in [w for w in st.rho if w < oldest]:
                del st.rho[w]
            for w, rw in st.rho.items():
                if math.isnan(rw.rho) or (newest is not None and w < newest):
                    continue
                if newest is None or w > newest:
                    newest, got = w, []
                got.append((key, rw.rho))
        return got

    def _comm(self, comm: Sequence[tuple[int, tuple[QuantileSketch, ...]]]) -> dict[str, Any]:
        rows = [(w, *(sk.median() for sk in sks)) for w, sks in comm]
        bins = pd.DataFrame(rows, columns=["window", "kv_transfer_s", "queue_s", "compute_s"])
        return {"communication_bound": comm_flag(bins, self.cfg), "bins": bins}

    def _goodput(self, window: list[WindowBin]) -> pd.DataFrame:
        cols = ["window", "requests", "met", "tokens", "goodput_tps", "throughput_tps"]
        n = sum(wb.requests for wb in window)
        if not n:
            return pd.DataFrame(columns=cols)
        tokens = sum(wb.tokens for wb in window)
        good = sum(wb.good for wb in window)
        met = sum(wb.met for wb in window)
        w = self.cfg.window_s
        return pd.DataFrame([(-1, n, met, tokens, good / w, tokens / w)], columns=cols)

    def dropped_total(self) -> dict[str, int]:
        with self.lock:
            return dict(self.dropped)


def _merged(sketches: Iterable[QuantileSketch]) -> float:
    out = QuantileSketch()
    for sk in sketches:
        out.merge(sk)
    return out.median()
