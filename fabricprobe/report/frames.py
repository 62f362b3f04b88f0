"""The report's figures as frames: pure pandas, text or rows in, DataFrame out, no I/O.

Everything here comes from outside (a collector's /metrics text, its Why reply, a
Prometheus answer), so every parser keeps what it can read and counts the rest. The
paths' RTT figures and CDFs come from the collector's sketches instead (report/rtt.py);
/metrics gives the hosts' topology labels, counters and verdicts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
from prometheus_client.parser import text_string_to_metric_families

from fabricprobe.collector.attribution.stages import STAGES
from fabricprobe.collector.history import counter_category

PATH_KEYS = ["src", "dst", "transport", "op", "size"]
MAX_SAMPLES = 1_000_000  # sample lines kept from one exposition; the rest are counted
MAX_LABEL = 64  # characters of a label kept for display

# per-host counter columns of the report, in the order shown
COUNTER_COLUMNS = [
    "pfc_pause_frames",
    "pfc_pause_s",
    "ecn_marks",
    "cnp",
    "retransmits",
    "discards",
]


@dataclass(frozen=True)
class Exposition:
    """Samples of one /metrics text, by sample name; `dropped` lines could not be read."""

    samples: Mapping[str, pd.DataFrame]
    dropped: int

    def get(self, name: str) -> pd.DataFrame:
        return self.samples.get(name, pd.DataFrame(columns=["value"]))


def _read_families(text: str) -> Iterable[tuple[str, dict[str, str], float]]:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            yield s.name, s.labels, float(s.value)


def parse_exposition(text: str, max_samples: int = MAX_SAMPLES) -> Exposition:
    """The Prometheus text format as one frame per sample name (label columns + value).

    A text the parser refuses as a whole is read again line by line, so one bad line
    costs only itself."""
    rows: dict[str, list[dict[str, Any]]] = {}
    kept = dropped = 0

    def take(found: Iterable[tuple[str, dict[str, str], float]]) -> None:
        nonlocal kept, dropped
        for name, labels, value in found:
            if kept >= max_samples:
                dropped += 1
                continue
            rows.setdefault(name, []).append({**labels, "value": value})
            kept += 1

    try:
        take(list(_read_families(text)))
    except (ValueError, TypeError, IndexError):
        rows.clear()
        kept = dropped = 0
        for line in text.splitlines():
            if not line.strip() or line.startswith("#"):
                continue
            try:
                take(list(_read_families(line + "\n")))
            except (ValueError, TypeError, IndexError):
                dropped += 1
    return Exposition({k: pd.DataFrame(v) for k, v in rows.items()}, dropped)


def clip(text: Any, limit: int = MAX_LABEL) -> str:
    """A label fit for display: printable characters only, at most LIMIT long."""
    s = "".join(c if c.isprintable() else "?" for c in str(text))
    return s if len(s) <= limit else s[: limit - 1] + "…"


def path_name(row: Mapping[str, Any]) -> str:
    size = row.get("size", "")
    return (
        f"{clip(row.get('src'), 40)} → {clip(row.get('dst'), 40)} "
        f"{clip(row.get('transport'), 8)} {clip(row.get('op'), 16)}"
        + (f" {clip(size, 10)} B" if size not in ("", None) else "")
    )


# -- src x dst ---------------------------------------------------------------------------


def matrix(
    table: pd.DataFrame, value: str, rows: str = "src", cols: str = "dst", limit: int = 40
) -> tuple[pd.DataFrame, int]:
    """ROWS x COLS of VALUE (NaN where not measured) over at most LIMIT names per axis,
    the busiest first; and how many names were left out."""
    if table.empty:
        return pd.DataFrame(), 0
    weight = table.assign(w=table.get("exchanges", pd.Series(1.0, index=table.index)).fillna(0))
    busy = (
        pd.concat([weight.groupby(rows)["w"].sum(), weight.groupby(cols)["w"].sum()])
        .groupby(level=0)
        .sum()
    )
    names = list(busy.sort_values(ascending=False).index)
    kept, left = sorted(names[:limit]), max(0, len(names) - limit)
    sub = table[table[rows].isin(kept) & table[cols].isin(kept)]
    grid = sub.pivot_table(index=rows, columns=cols, values=value, aggfunc="max")
    return grid.reindex(index=kept, columns=kept), left


# -- topology ---------------------------------------------------------------------------


def host_topology(expo: Exposition) -> pd.DataFrame:
    """Host -> topology label (the ToR) from fabricprobe_host_info; "" when not given."""
    info = expo.get("fabricprobe_host_info")
    if info.empty or "src" not in info.columns:
        return pd.DataFrame(columns=["src", "topology"])
    out = info.reindex(columns=["src", "topology"]).fillna("").astype(str)
    return out.drop_duplicates("src", keep="last").reset_index(drop=True)


def with_tor(df: pd.DataFrame, topology: pd.DataFrame) -> pd.DataFrame:
    """DF (RTT buckets, loss counts) with the ToR of each end (src_tor, dst_tor), hosts
    with no label under "(none)"; buckets then merge by path_quantiles(keys=[src_tor,
    dst_tor])."""
    tor = dict(zip(topology["src"], topology["topology"], strict=True))

    def label(h: str) -> str:
        return tor.get(h) or "(none)"

    return df.assign(src_tor=df["src"].map(label), dst_tor=df["dst"].map(label)).reset_index(
        drop=True
    )


# -- the Why reply ----------------------------------------------------------------------


def slowest_frame(rows: Any, limit: int) -> tuple[pd.DataFrame, int]:
    """The Why reply's slowest requests (a list of flat dicts), figures as numbers (bad
    ones NaN), at most LIMIT; and how many more there were."""
    listed = rows if isinstance(rows, list | tuple) else []
    good = [dict(r) for r in listed if isinstance(r, Mapping)]
    df = pd.DataFrame(good)
    if df.empty:
        return pd.DataFrame(columns=["request_id", "src", "dst", "transport"]), 0
    for c in ("request_id", "src", "dst", "transport"):
        df[c] = df[c].fillna("").astype(str) if c in df.columns else ""
    for c in df.columns:
        if c.endswith(("_s", "_per_s", "_ratio")) or c.startswith("fabric_share"):
            df[c] = pd.to_numeric(df[c], errors="coerce")
    return df.head(limit).reset_index(drop=True), max(0, len(df) - limit)


def waterfall(slowest: pd.DataFrame) -> pd.DataFrame:
    """Stages of each request laid end to end in pipeline order: request_id, stage,
    start_s (from the request's first stage), duration_s. Stages not measured are absent."""
    rows: list[dict[str, Any]] = []
    for _, r in slowest.iterrows():
        t = 0.0
        for stage in STAGES:
            d = r.get(f"{stage}_s")
            if d is None or pd.isna(d) or d < 0:
                continue
            rows.append(
                {"request_id": r["request_id"], "stage": stage, "start_s": t, "duration_s": d}
            )
            t += float(d)
    return pd.DataFrame(rows, columns=["request_id", "stage", "start_s", "duration_s"])


FABRIC_FIGURES = [
    ("rtt_min_s", "RTT min", "us"),
    ("rtt_p50_s", "RTT p50", "us"),
    ("rtt_p99_s", "RTT p99", "us"),
    ("loss_ratio", "loss", "ratio"),
    ("kv_share_ttft", "KV wait share of TTFT", "ratio"),
    ("fabric_share_ttft", "fabric share of TTFT (estimated)", "ratio"),
    ("src_pfc_pause_per_s", "src PFC pauses/s", "rate"),
    ("dst_pfc_pause_per_s", "dst PFC pauses/s", "rate"),
    ("src_ecn_mark_per_s", "src ECN marks/s", "rate"),
    ("dst_ecn_mark_per_s", "dst ECN marks/s", "rate"),
    ("src_cnp_per_s", "src CNPs/s", "rate"),
    ("dst_cnp_per_s", "dst CNPs/s", "rate"),
    ("src_retransmit_per_s", "src retransmits/s", "rate"),
    ("dst_retransmit_per_s", "dst retransmits/s", "rate"),
]


# the KV wait in three parts (collector/kvparts.py): (column, name, its *_source column)
KV_PARTS = [
    ("kv_wait_s", "KV wait (the engine's)", ""),
    ("fabric_s", "fabric", "fabric_source"),
    ("transfer_stack_s", "transfer stack", "transfer_stack_source"),
    ("engine_wait_s", "engine wait", ""),
    ("over_explained_s", "estimates beyond the wait", ""),
]


def kv_parts(row: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The parts of one request's KV wait as (name, text): ms, and how a part was found
    where it was estimated; the bytes with their source. Unknown parts say so."""
    out = []
    for col, name, source in KV_PARTS:
        v = row.get(col)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            if col != "over_explained_s":
                out.append((name, "not known"))
            continue
        if col == "over_explained_s" and not float(v) > 0:
            continue
        how = str(row.get(source) or "") if source else ""
        out.append((name, f"{float(v) * 1e3:,.3f} ms" + (f" ({clip(how, 60)})" if how else "")))
    b = pd.to_numeric(row.get("kv_bytes"), errors="coerce")
    if b is not None and math.isfinite(b) and 0 <= b < 2**63:
        how = clip(str(row.get("kv_bytes_source") or ""), 40)
        out.append(("KV bytes", f"{int(b):,}" + (f" ({how})" if how else "")))
    return out


def fabric_figures(row: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The path figures of one slow request as (name, text); absent ones say so."""
    out = []
    for col, name, kind in FABRIC_FIGURES:
        v = row.get(col)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            text = "not measured"
        elif kind == "us":
            text = f"{float(v) * 1e6:,.1f} µs"
        elif kind == "ratio":
            text = f"{float(v):.2%}"
        else:
            text = f"{float(v):,.1f}"
        out.append((name, text))
    return out


# -- counters and verdicts per host -----------------------------------------------------


def _per_host(df: pd.DataFrame, mask: pd.Series | None = None) -> pd.Series:
    if df.empty or "src" not in df.columns:
        return pd.Series(dtype=float)
    sub = df if mask is None else df[mask]
    return sub.groupby(sub["src"].fillna("").astype(str))["value"].sum()


def host_counters(expo: Exposition) -> pd.DataFrame:
    """Congestion and loss counters per host since each agent started counting: PFC pause
    frames (sent and received) and pause time, ECN marks, CNPs, retransmission counters
    and discards. A host that exports none of a kind has NaN there, not 0."""
    pfc = [expo.get(f"fabricprobe_pfc_{d}_pause_frames_total") for d in ("rx", "tx")]
    pfc_s = [expo.get(f"fabricprobe_pfc_{d}_pause_seconds_total") for d in ("rx", "tx")]
    rdma = expo.get("fabricprobe_rdma_port_stat_total")
    netdev = expo.get("fabricprobe_netdev_stat_total")

    def by_category(df: pd.DataFrame, kind: str, cat: str) -> pd.Series:
        if df.empty or "counter" not in df.columns:
            return pd.Series(dtype=float)
        mask = df["counter"].astype(str).map(lambda n: counter_category(kind, n) == cat)
        return _per_host(df, mask)

    def named(df: pd.DataFrame, words: tuple[str, ...]) -> pd.Series:
        if df.empty or "counter" not in df.columns:
            return pd.Series(dtype=float)
        mask = df["counter"].astype(str).str.lower().map(lambda n: any(w in n for w in words))
        return _per_host(df, mask)

    def total(parts: list[pd.Series]) -> pd.Series:
        parts = [p for p in parts if not p.empty]
        return pd.concat(parts).groupby(level=0).sum() if parts else pd.Series(dtype=float)

    cols = {
        "pfc_pause_frames": total([_per_host(d) for d in pfc]),
        "pfc_pause_s": total([_per_host(d) for d in pfc_s]),
        "ecn_marks": total([by_category(rdma, "rdma", "ecn_mark"), named(netdev, ("ecn",))]),
        "cnp": total([by_category(rdma, "rdma", "cnp"), named(netdev, ("cnp",))]),
        "retransmits": by_category(rdma, "rdma", "retransmit"),
        "discards": total(
            [
                _per_host(expo.get("fabricprobe_pfc_rx_discards_total")),
                named(netdev, ("discard", "drop")),
                named(rdma, ("discard", "out_of_buffer")),
            ]
        ),
    }
    up = _per_host(expo.get("fabricprobe_host_up"))
    hosts = sorted(set(up.index).union(*[set(s.index) for s in cols.values()]))
    out = pd.DataFrame({k: v.reindex(hosts) for k, v in cols.items()}, index=hosts)
    out.insert(0, "up", up.reindex(hosts))
    out.index.name = "src"
    return out.reset_index()[["src", "up", *COUNTER_COLUMNS]]


VERDICT_PREFIX = "fabricprobe_validate"


def host_verdicts(expo: Exposition) -> pd.DataFrame:
    """Validate verdicts per host, when the collector exports any (a family whose name
    starts with fabricprobe_validate, labelled by src and check): src, check, verdict,
    value. Empty when none is exported."""
    cols = ["src", "check", "verdict", "value"]
    frames = [
        df.reindex(columns=cols)
        for name, df in expo.samples.items()
        if name.startswith(VERDICT_PREFIX) and {"src", "check"} <= set(df.columns)
    ]
    if not frames:
        return pd.DataFrame(columns=cols)
    out = pd.concat(frames, ignore_index=True)
    out[["src", "check", "verdict"]] = out[["src", "check", "verdict"]].fillna("").astype(str)
    return out.sort_values(["src", "check"]).reset_index(drop=True)


# -- Prometheus range queries -----------------------------------------------------------


def range_frame(result: Any, keys: Sequence[str] = ("src", "dst", "transport")) -> pd.DataFrame:
    """A Prometheus matrix result ([{metric: {...}, values: [[t, "v"], ...]}, ...]) as
    rows of KEYS, t (unix seconds), value; malformed series or points are skipped."""
    rows: list[dict[str, Any]] = []
    for series in result if isinstance(result, list) else []:
        if not isinstance(series, dict):
            continue
        metric, values = series.get("metric"), series.get("values")
        if not isinstance(metric, dict) or not isinstance(values, list):
            continue
        labels = {k: str(metric.get(k, "")) for k in keys}
        for point in values:
            if not isinstance(point, list | tuple) or len(point) < 2:
                continue
            try:
                t, v = float(point[0]), float(point[1])
            except (TypeError, ValueError, OverflowError):  # OverflowError: an int past 1e308
                continue
            if math.isfinite(t) and math.isfinite(v):
                rows.append({**labels, "t": t, "value": v})
    return pd.DataFrame(rows, columns=[*keys, "t", "value"])
