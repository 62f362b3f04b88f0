"""Attribution analysis: pure pandas over the joined frames (attribution/join.py).

- `rank_correlation`: per time window and path, Spearman's rank correlation of KV
  transfer time with the path's probe tail latency.
- `rank_paths`: paths ranked by the KV-transfer time they explain, i.e. time spent
  beyond what the same bytes took on the rest of the fleet, and whether the fabric
  accounts for it (the path's probe tail RTT is above the fleet's too), or shows a
  fault whatever its transfers did (its probes' RTT floor stands out).
- `communication_bound`: KV-transfer time and queueing rising together over time
  while compute (prefill + decode per token) stays flat.
- `goodput`: tokens per second from requests that met their TTFT and inter-token
  targets, beside raw throughput.

Thresholds are parameters (`AnalysisConfig`) with defaults, never measurements. One pass
over a window gives an `Analysis` (attribution/core.py runs it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from fabricprobe.collector.attribution.join import HOST_FLOOR_S
from fabricprobe.collector.history import COUNTER_CATEGORIES


@dataclass(frozen=True)
class AnalysisConfig:
    window_s: float = 60.0  # analysis window (bins for correlation and goodput)
    kv_ratio: float = 1.25  # path KV s/byte over the fleet's reference to count as slow
    rtt_ratio: float = 1.5  # path probe RTT over the fleet's to count as fabric evidence
    # path RTT floor over the fleet's to count as a fault on its own (no slow transfers
    # to back it): a doubled floor, where a route or a device adds latency to every exchange
    fault_ratio: float = 2.0
    # which probe RTT statistics may give that evidence (any of them): the minimum rises
    # with added path latency (a longer route, a delaying device) and is immune to the
    # prober's own scheduling noise; the tail rises first under congestion
    rtt_evidence: tuple[str, ...] = ("rtt_min_s", "rtt_p50_s", "rtt_p99_s")
    min_transfers: int = 3  # KV transfers a path needs before it is judged
    # quantile of a path's KV seconds per byte that stands for its speed: below the
    # median, because a sender's stalls (CPU contention, pauses) lift some transfers
    # while latency the path adds lifts them all
    kv_quantile: float = 0.25
    rho_min: float = 0.6  # rank correlation that counts as "rising together"
    rise: float = 0.2  # relative rise of KV time across bins to count as rising
    flat_tol: float = 0.15  # relative change of compute per token that still counts as flat
    slo_ttft_s: float = 2.0
    slo_itl_s: float = 0.1


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


def spearman(x: pd.Series, y: pd.Series) -> float:
    """Spearman's rho: Pearson correlation of the ranks; NaN when either is constant."""
    both = pd.concat([x, y], axis=1).dropna()
    return spearman_arrays(both.iloc[:, 0].to_numpy(float), both.iloc[:, 1].to_numpy(float))


def _ranks(a: np.ndarray) -> np.ndarray:
    """1-based ranks of A, ties given their average rank (pandas' rank())."""
    _, inverse, counts = np.unique(a, return_inverse=True, return_counts=True)
    upto = np.cumsum(counts)
    return (upto - (counts - 1) / 2)[inverse].astype(float)


def spearman_arrays(x: np.ndarray, y: np.ndarray) -> float:
    """spearman() of two arrays of floats, pairs with a NaN left out."""
    keep = ~(np.isnan(x) | np.isnan(y))
    if keep.sum() < 3:
        return float("nan")
    rx, ry = _ranks(x[keep]), _ranks(y[keep])
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def _bin(ns: pd.Series, window_s: float) -> pd.Series:
    return (ns // int(window_s * 1e9)).astype("int64")


def rank_correlation(kv: pd.DataFrame, cfg: AnalysisConfig = AnalysisConfig()) -> pd.DataFrame:
    """Per window and path: transfers, rho(kv time per byte, probe p99 RTT)."""
    cols = ["window", "src", "dst", "transport", "transfers", "rho_rtt_p99"]
    if kv.empty:
        return pd.DataFrame(columns=cols)
    df = kv.assign(
        window=_bin(kv["start_ns"], cfg.window_s),
        s_per_byte=kv["duration_s"] / kv["bytes"].where(kv["bytes"] > 0),
    )
    rows = []
    for (win, src, dst, tr), g in df.groupby(["window", "src", "dst", "transport"]):
        per_byte = g["s_per_byte"] if g["s_per_byte"].notna().any() else g["duration_s"]
        rows.append((win, src, dst, tr, len(g), spearman(per_byte, g["rtt_p99_s"])))
    return pd.DataFrame(rows, columns=cols)


def leave_one_out_median(values: pd.Series) -> pd.Series:
    """For each entry, the median of all the others' values (NaN ones left out; NaN when
    none is left). One sort: the others of the k-th smallest are the sorted values without
    the k-th, so their middle is read at an index shifted past k."""
    x = values.to_numpy(dtype=float, na_value=np.nan)
    ok = ~np.isnan(x)
    v = np.sort(x[ok])
    out = np.full(len(x), np.nan)
    if len(v):
        out[~ok] = np.median(v)  # a NaN entry's others are all the values
    if len(v) >= 2:
        k = np.empty(len(v), dtype=np.int64)
        k[np.argsort(x[ok], kind="stable")] = np.arange(len(v))  # each entry's place
        r = len(v) - 1  # the others' count
        lo, hi = (r - 1) // 2, r // 2
        out[ok] = (v[lo + (lo >= k)] + v[hi + (hi >= k)]) / 2
    return pd.Series(out, index=values.index, dtype=float)


RANK_COLUMNS = [
    "src",
    "dst",
    "transport",
    "transfers",
    "kv_median_s",
    "kv_ratio",
    "rtt_min_s",
    "rtt_p50_s",
    "rtt_p99_s",
    "rtt_ratio",
    "congestion_per_s",
    "explained_s",
    "fabric_bound",
    "fabric_fault",
    "host_bound",
    "host_delay_s",
    "rank",
]
PATH = ["src", "dst", "transport"]
# the fabric figures a transfer was joined with, as its path is judged by them
RTT_FIGURES = (
    "rtt_min_s",
    "rtt_p50_s",
    "rtt_p99_s",
    "rtt_p50_net_s",
    "rtt_p99_net_s",
    "congestion_per_s",
)
# a path's figures over its transfers, what rank_figures judges it by
FIGURE_COLUMNS = [
    "transfers",
    "kv_median_s",
    "s_per_byte",
    *RTT_FIGURES,
    "host_share",
    "host_delay_s",
    "kv_bytes",
]


def transfer_figures(kv: pd.DataFrame) -> pd.DataFrame:
    """KV with what a path's figures are made of, per transfer: s_per_byte (NaN without
    bytes), congestion (the counter rates of both ends, summed), the RTTs with the hosts'
    delay taken out (the raw ones where it was not), host_bound and host_delay_s."""
    rate_cols = [
        c for c in kv.columns if c.endswith("_per_s") and c.split("_", 1)[0] in ("src", "dst")
    ]
    df = kv.assign(
        s_per_byte=kv["duration_s"] / kv["bytes"].where(kv["bytes"] > 0),
        congestion=kv[rate_cols].sum(axis=1, min_count=1) if rate_cols else np.nan,
    )
    for raw, net in (("rtt_p50_s", "rtt_p50_net_s"), ("rtt_p99_s", "rtt_p99_net_s")):
        df[net] = df[net].fillna(df[raw]) if net in df else df[raw]
    for col in ("host_bound", "host_delay_s"):
        if col not in df:
            df[col] = np.nan
    return df


def path_figures(kv: pd.DataFrame, cfg: AnalysisConfig = AnalysisConfig()) -> pd.DataFrame:
    """Each path's figures (FIGURE_COLUMNS, by src, dst, transport) over its transfers:
    their count, median time, the `kv_quantile` of their seconds per byte, medians of the
    RTT statistics, congestion and host delay, the share of host-bound ones and the
    bytes moved."""
    df = transfer_figures(kv)
    df["kv_bytes"] = df["bytes"].where(df["bytes"] > 0, 0.0)
    return df.groupby(PATH).agg(
        transfers=("duration_s", "size"),
        kv_median_s=("duration_s", "median"),
        s_per_byte=("s_per_byte", lambda x: x.quantile(cfg.kv_quantile)),
        rtt_min_s=("rtt_min_s", "median"),
        rtt_p50_s=("rtt_p50_s", "median"),
        rtt_p99_s=("rtt_p99_s", "median"),
        rtt_p50_net_s=("rtt_p50_net_s", "median"),
        rtt_p99_net_s=("rtt_p99_net_s", "median"),
        congestion_per_s=("congestion", "median"),
        host_share=("host_bound", "mean"),
        host_delay_s=("host_delay_s", "median"),
        kv_bytes=("kv_bytes", "sum"),
    )


def rank_paths(kv: pd.DataFrame, cfg: AnalysisConfig = AnalysisConfig()) -> pd.DataFrame:
    """Paths ranked by the KV-transfer seconds they explain, with the fabric evidence:
    rank_figures over each path's figures (path_figures)."""
    if kv.empty:
        return pd.DataFrame(columns=RANK_COLUMNS)
    return rank_figures(path_figures(kv, cfg), cfg)


def rank_figures(per: pd.DataFrame, cfg: AnalysisConfig = AnalysisConfig()) -> pd.DataFrame:
    """Paths ranked by the KV-transfer seconds they explain, with the fabric evidence,
    from each path's figures (PER: FIGURE_COLUMNS by src, dst, transport; path_figures
    makes them of transfers, attribution/kvfold.py as transfers arrive).

    A path's speed is the `kv_quantile` of its transfers' seconds per byte, its reference
    the median of the other paths' speeds (same transport); the time it explains is what
    the bytes it moved took beyond the reference at its speed (kv_bytes x (speed -
    reference), none when it is faster). It is fabric_bound when it is
    slow by `kv_ratio` and its probe RTT (the `rtt_evidence` statistics) exceeds the
    other paths' by `rtt_ratio`, or its ends show congestion counters moving where the
    others' do not. The RTT evidence uses the figures with the hosts' own delay taken
    out (rtt_p50_net_s, rtt_p99_net_s: attribution/fabricjoin.py) where the ends measured
    it, so a busy prober does not pass for a slow path. A path most of whose transfers ran
    in host-bound windows, and that the fabric does not explain, is host_bound: its time
    is the hosts', not the network's.

    fabric_fault is the evidence host noise cannot make, with or without slow transfers:
    the path's RTT floor at `fault_ratio` times the other judged paths' and HOST_FLOOR_S
    over it (any path's: noise cannot raise a floor, so none is left out). Counters are
    no such evidence (a busy receiver's slow drain moves retransmits and pauses too, and
    they are per device, shared by every path of the host). On a busy sender a path's
    added latency can hide inside the sender's own stalls (its transfers come out no
    slower than the others'), while its probes' quietest exchange still carries it.
    Paths go in order of the fabric's blame: fabric-bound first, then faulty ones, each
    by the time they explain."""
    if per.empty:
        return pd.DataFrame(columns=RANK_COLUMNS)
    net_of = {"rtt_p50_s": "rtt_p50_net_s", "rtt_p99_s": "rtt_p99_net_s"}
    parts = []
    for _tr, g in per.groupby(level="transport"):
        g = g.copy()
        judged = g["transfers"] >= cfg.min_transfers
        # the reference is what quiet hosts' paths do: a busy host slows its transfers
        # too, and counting its paths in would hide a slow path beside them
        quiet = judged & (g["host_share"].fillna(0) < 0.5)
        base = quiet if quiet.sum() >= 2 else judged
        ref_bpb = leave_one_out_median(g["s_per_byte"].where(base))
        ratios, rises = [], []
        # a floor needs no quiet reference (host noise cannot raise it): every judged
        # path's, so that one path dropped as host-bound does not leave a lone reference
        floors = g["rtt_min_s"]
        ref_floor = leave_one_out_median(floors.where(judged))
        floor_rise = (
            (floors / ref_floor >= cfg.fault_ratio) & (floors - ref_floor > HOST_FLOOR_S) & judged
        ).fillna(False)
        host = g["host_delay_s"].fillna(0.0).clip(lower=HOST_FLOOR_S)
        for stat in cfg.rtt_evidence:
            col = g[net_of.get(stat, stat)]
            ref_stat = leave_one_out_median(col.where(base))
            ratios.append(col / ref_stat)
            # a rise the hosts' own delay could account for is no evidence of the network;
            # the minimum of a window keeps its quietest exchange, which host noise (it
            # only ever adds delay) leaves alone, so it needs only to clear the floor
            room = HOST_FLOOR_S if stat == "rtt_min_s" else host
            rises.append((col / ref_stat >= cfg.rtt_ratio) & (col - ref_stat > room))
        ref_cong = leave_one_out_median(g["congestion_per_s"].where(base))
        g["kv_ratio"] = g["s_per_byte"] / ref_bpb
        g["rtt_ratio"] = pd.concat(ratios, axis=1).max(axis=1) if ratios else np.nan
        g["rtt_evidence"] = pd.concat(rises, axis=1).any(axis=1) if rises else False
        g["ref_s_per_byte"] = ref_bpb
        g["congested"] = (g["congestion_per_s"].fillna(0) > 0) & (ref_cong.fillna(0) == 0)
        g["floor_rise"] = floor_rise.astype(bool)
        parts.append(g)
    per = pd.concat(parts)
    beyond = (per["s_per_byte"] - per["ref_s_per_byte"]).clip(lower=0)
    per["explained_s"] = (per["kv_bytes"] * beyond).fillna(0.0)
    slow = (per["kv_ratio"] >= cfg.kv_ratio) & (per["transfers"] >= cfg.min_transfers)
    evidence = per["rtt_evidence"].astype(bool) | per["congested"]
    per["fabric_bound"] = (slow & evidence).astype(bool)
    per["fabric_fault"] = per["floor_rise"]  # judged paths only, as it was built
    per["host_bound"] = (per["host_share"].fillna(0) >= 0.5) & ~per["fabric_bound"]
    per = per.sort_values(
        ["fabric_bound", "fabric_fault", "explained_s"], ascending=False
    ).reset_index()
    per["rank"] = np.arange(1, len(per) + 1)
    return per[RANK_COLUMNS]


def communication_bound(
    stages: pd.DataFrame, cfg: AnalysisConfig = AnalysisConfig()
) -> tuple[bool, pd.DataFrame]:
    """(flag, per-window medians). The flag: over the windows, KV-transfer time and
    queueing rise together (rank correlation >= rho_min, KV time up by `rise` from the
    first window to the last) while compute per request stays within `flat_tol`."""
    cols = ["window", "kv_transfer_s", "queue_s", "compute_s"]
    if stages.empty:
        return False, pd.DataFrame(columns=cols)
    per_req = stages.pivot_table(
        index="request_id", columns="stage", values="duration_s", aggfunc="sum"
    )
    start = stages.groupby("request_id")["start_ns"].min()
    per_req = per_req.reindex(columns=["kv_transfer", "queue", "prefill", "decode"])
    per_req["window"] = _bin(start.reindex(per_req.index), cfg.window_s)
    per_req["compute"] = per_req[["prefill", "decode"]].sum(axis=1, min_count=1)
    bins = per_req.groupby("window").agg(
        kv_transfer_s=("kv_transfer", "median"),
        queue_s=("queue", "median"),
        compute_s=("compute", "median"),
    )
    bins = bins.reset_index()[cols]
    return comm_flag(bins, cfg), bins


def comm_flag(bins: pd.DataFrame, cfg: AnalysisConfig = AnalysisConfig()) -> bool:
    """communication_bound's flag over its per-window medians BINS (window, kv_transfer_s,
    queue_s, compute_s), in window order."""
    b = bins.dropna()
    if len(b) < 3:
        return False
    rho = spearman(b["kv_transfer_s"], b["queue_s"])
    first, last = b.iloc[0], b.iloc[-1]
    rising = last["kv_transfer_s"] >= first["kv_transfer_s"] * (1 + cfg.rise)
    queue_up = last["queue_s"] > first["queue_s"]
    comp = b["compute_s"]
    flat = (comp.max() - comp.min()) <= cfg.flat_tol * comp.median()
    return bool(rho >= cfg.rho_min and rising and queue_up and flat)


def goodput(
    requests: pd.DataFrame, cfg: AnalysisConfig = AnalysisConfig(), *, now_ns: int | None = None
) -> pd.DataFrame:
    """Per window: requests, those within SLO, goodput and raw throughput (tokens/s).

    A request meets its SLO when TTFT <= slo_ttft_s and its mean inter-token latency
    <= slo_itl_s (a single-token reply has no ITL and is judged on TTFT alone). With
    NOW_NS, one row for the window_s seconds that end at NOW_NS (window -1)."""
    cols = ["window", "requests", "met", "tokens", "goodput_tps", "throughput_tps"]
    r = requests.dropna(subset=["end_ns", "output_tokens"])
    if now_ns is not None:
        lo = now_ns - int(cfg.window_s * 1e9)
        r = r[(r["end_ns"] > lo) & (r["end_ns"] <= now_ns)]
    if r.empty:
        return pd.DataFrame(columns=cols)
    ok_ttft = r["ttft_s"].notna() & (r["ttft_s"] <= cfg.slo_ttft_s)
    ok_itl = r["itl_s"].isna() | (r["itl_s"] <= cfg.slo_itl_s)
    r = r.assign(
        window=_bin(r["end_ns"], cfg.window_s) if now_ns is None else -1,
        met=ok_ttft & ok_itl,
        tokens=r["output_tokens"].astype(float),
    )
    r = r.assign(good_tokens=r["tokens"].where(r["met"], 0.0))
    g = r.groupby("window").agg(
        requests=("request_id", "size"),
        met=("met", "sum"),
        tokens=("tokens", "sum"),
        good=("good_tokens", "sum"),
    )
    g["goodput_tps"] = g["good"] / cfg.window_s
    g["throughput_tps"] = g["tokens"] / cfg.window_s
    return g.reset_index()[cols]


__all__ = [
    "COUNTER_CATEGORIES",
    "AnalysisConfig",
    "comm_flag",
    "communication_bound",
    "goodput",
    "path_figures",
    "rank_correlation",
    "rank_figures",
    "rank_paths",
    "spearman",
]
