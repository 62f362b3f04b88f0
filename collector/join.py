"""Join stages with the fabric: pure pandas, DataFrame in, DataFrame out, no I/O.

Stage and request records become frames; each stage that crossed the fabric is matched
with the probe windows of its path (src -> dst, same transport when given; the reverse
direction when the forward one was not probed, since an RTT crosses both) that overlap
its time window, and with the counter rates of both ends over that time. A request's
breakdown puts its stages side by side with TTFT and inter-token latency kept apart,
and the fabric's share of each.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from fabricprobe.collector.history import COUNTER_CATEGORIES
from fabricprobe.collector.stages import FABRIC_STAGES, STAGES, RequestRecord, StageRecord

STAGE_COLUMNS = [
    "request_id",
    "stage",
    "start_ns",
    "end_ns",
    "duration_s",
    "src",
    "dst",
    "src_device",
    "dst_device",
    "transport",
    "bytes",
    "derived",
]
REQUEST_COLUMNS = [
    "request_id",
    "start_ns",
    "end_ns",
    "ttft_s",
    "e2e_s",
    "itl_s",
    "output_tokens",
    "prompt_tokens",
    "model",
]
RATE_FIELDS = [f"{end}_{c}_per_s" for end in ("src", "dst") for c in COUNTER_CATEGORIES]


def stages_frame(records: Iterable[StageRecord]) -> pd.DataFrame:
    rows = [{**r.__dict__, "duration_s": r.duration_s} for r in records]
    return pd.DataFrame(rows, columns=STAGE_COLUMNS)


def requests_frame(records: Iterable[RequestRecord]) -> pd.DataFrame:
    rows = [{**r.__dict__, "itl_s": r.itl_s} for r in records]
    df = pd.DataFrame(rows, columns=REQUEST_COLUMNS)
    # a request may be reported twice (a retry): keep its newest record
    return df.drop_duplicates("request_id", keep="last").reset_index(drop=True)


def measured_first(stages: pd.DataFrame) -> pd.DataFrame:
    """Drop derived stages (from llm_request) where a measured span of that stage exists."""
    if stages.empty:
        return stages
    measured = stages.loc[~stages["derived"].astype(bool), ["request_id", "stage"]]
    keys = set(zip(measured["request_id"], measured["stage"], strict=True))
    keep = ~stages["derived"].astype(bool) | ~pd.Series(
        [(r, s) in keys for r, s in zip(stages["request_id"], stages["stage"], strict=True)],
        index=stages.index,
        dtype=bool,
    )
    return stages[keep]


class _PathIndex:
    """Probe windows split by path once, so each stage looks up its own (a join of
    hundreds of stages must not filter the whole history for each one)."""

    def __init__(self, windows: pd.DataFrame) -> None:
        self.empty = windows.iloc[0:0]
        self.exact = {k: g for k, g in windows.groupby(["src", "dst", "transport"], sort=False)}
        self.any = {k: g for k, g in windows.groupby(["src", "dst"], sort=False)}

    def get(self, src: str, dst: str, transport: str) -> pd.DataFrame:
        if transport:
            fwd = self.exact.get((src, dst, transport))
            rev = self.exact.get((dst, src, transport))
        else:
            fwd, rev = self.any.get((src, dst)), self.any.get((dst, src))
        if fwd is not None and not fwd.empty:
            return fwd
        return rev if rev is not None else self.empty


def join_fabric(
    stages: pd.DataFrame,
    windows: pd.DataFrame,
    rates: pd.DataFrame,
    *,
    slack_s: float = 1.0,
    horizon_s: float = 30.0,
) -> pd.DataFrame:
    """Fabric stages with the figures of their path over their time.

    Adds rtt_min_s (min over the overlapping windows), rtt_p50_s (mean), rtt_p99_s (max),
    loss_ratio
    (mean), fabric_windows (how many matched), and for each end and counter category the
    rate (per second) of the first reading at or after the stage started, within
    HORIZON_S: the counter window the stage ran in. A stage no window overlaps takes
    the first window of its path that ended after it, within HORIZON_S."""
    fab = stages[stages["stage"].isin(FABRIC_STAGES)].copy()
    slack = int(slack_s * 1e9)
    horizon = int(horizon_s * 1e9)
    rmin: list[float] = []
    p50: list[float] = []
    p99: list[float] = []
    loss: list[float] = []
    matched: list[int] = []
    rate_cols: dict[str, list[float]] = {c: [] for c in RATE_FIELDS}
    paths = _PathIndex(windows)
    by_host = {h: g for h, g in rates.groupby("host", sort=False)}
    no_rates = rates.iloc[0:0]
    for row in fab.itertuples(index=False):
        pw = paths.get(row.src, row.dst, row.transport)
        w = pw[(pw["start_ns"] <= row.end_ns + slack) & (pw["end_ns"] >= row.start_ns - slack)]
        if w.empty and not pw.empty:  # a gap, or a first window's estimated start: take the next
            later = pw[(pw["end_ns"] >= row.end_ns) & (pw["end_ns"] <= row.end_ns + horizon)]
            w = later.sort_values("end_ns").head(1)
        matched.append(len(w))
        rmin.append(float(w["rtt_min_s"].min()) if len(w) else np.nan)
        p50.append(float(w["rtt_p50_s"].mean()) if len(w) else np.nan)
        p99.append(float(w["rtt_p99_s"].max()) if len(w) else np.nan)
        loss.append(float(w["loss_ratio"].mean()) if len(w) else np.nan)
        for end, host, device in (
            ("src", row.src, row.src_device),
            ("dst", row.dst, row.dst_device),
        ):
            hr = by_host.get(host, no_rates)
            r = hr[(hr["t_ns"] >= row.start_ns) & (hr["t_ns"] <= row.end_ns + horizon)]
            if device:
                # RDMA counters are per device; netdev ones (PFC, ECN) stay whatever device
                r = r[(r["device"] == device) | r["category"].isin(("pfc_pause", "ecn_mark"))]
            first = r.sort_values("t_ns").drop_duplicates(["device", "name"], keep="first")
            per_cat = first.groupby("category")["rate"].sum()
            for cat in COUNTER_CATEGORIES:
                col = f"{end}_{cat}_per_s"
                rate_cols[col].append(float(per_cat.get(cat, np.nan)) if len(r) else np.nan)
    fab["rtt_min_s"] = rmin
    fab["rtt_p50_s"] = p50
    fab["rtt_p99_s"] = p99
    fab["loss_ratio"] = loss
    fab["fabric_windows"] = matched
    for col, values in rate_cols.items():
        fab[col] = values
    return fab.reset_index(drop=True)


def request_breakdown(stages: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """One row per request: seconds per stage, TTFT, ITL, e2e, the KV path, fabric share.

    fabric_share_ttft is KV-transfer time over TTFT (in disaggregated serving the KV
    cache must arrive before decode can produce the first token); fabric_share_e2e is
    over the whole request."""
    st = measured_first(stages)
    per = st.pivot_table(
        index="request_id", columns="stage", values="duration_s", aggfunc="sum"
    ).reindex(columns=list(STAGES))
    per.columns = [f"{c}_s" for c in per.columns]
    kv = st[st["stage"].isin(FABRIC_STAGES)]
    path = kv.groupby("request_id").agg(
        src=("src", "first"),
        dst=("dst", "first"),
        transport=("transport", "first"),
        kv_bytes=("bytes", "sum"),
        first_ns=("start_ns", "min"),
    )
    out = per.join(path, how="left")
    span = st.groupby("request_id").agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max"))
    out = out.join(span, how="left")
    req = requests.set_index("request_id")[["ttft_s", "itl_s", "e2e_s", "output_tokens"]]
    out = out.join(req, how="outer")
    kv_s = out["kv_transfer_s"].fillna(0.0)
    out["fabric_share_ttft"] = kv_s / out["ttft_s"].where(out["ttft_s"] > 0)
    out["fabric_share_e2e"] = kv_s / out["e2e_s"].where(out["e2e_s"] > 0)
    return out.reset_index().rename(columns={"index": "request_id"})
