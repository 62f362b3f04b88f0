"""Join stages with the fabric: pure pandas, DataFrame in, DataFrame out, no I/O.

Stage and request records become frames; each stage that crossed the fabric is matched
with the probe windows of its path (src -> dst, same transport when given; the reverse
direction when the forward one was not probed, since an RTT crosses both) that overlap
its time window, and with the counter rates of both ends over that time. A request's
breakdown puts its stages side by side with TTFT and inter-token latency kept apart,
and the fabric's share of each.

A KV wait is split in three (collector/kvparts.py): what the path's fabric explains at
that moment for the bytes moved, the transfer library's own time beyond it (NIXL's
telemetry on the decode host), and the engine's wait around both. The bytes are the
span's, else the model shape's for the request's prompt, else the mean bytes per
transfer NIXL counted on the decode host around that time. NIXL's own figures ride
along, and a KV speed above the path's measured bandwidth is flagged: the transfer
cannot have crossed that path at that speed.
A request whose path is unknown keeps NaN fabric figures and share, never 0.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from fabricprobe.collector.attribution.linking import PathInfo
from fabricprobe.collector.attribution.stages import (
    FABRIC_STAGES,
    STAGES,
    RequestRecord,
    StageRecord,
)
from fabricprobe.collector.history import COUNTER_CATEGORIES, NIXL_CATEGORY
from fabricprobe.collector.kvparts import PART_COLUMNS, split_parts

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
    "round_trips",
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
PATH_COLUMNS = [
    "request_id",
    "engine",
    "path_src",
    "path_dst",
    "path_known",
    "path_reason",
    "path_detail",
    "kv_source",
]
NIXL_FIELDS = [
    "nixl_bytes_per_s",
    "nixl_transfers_per_s",
    "nixl_mean_bytes",
    "nixl_mean_xfer_s",
    "nixl_speed_bytes_per_s",
    "nixl_errors_per_s",
]
SPEED_SLACK = 1.1  # a KV speed this far above the measured bandwidth is flagged


def paths_frame(paths: Iterable[PathInfo], stages: Iterable[StageRecord]) -> pd.DataFrame:
    """One row per linked request: engine, whether its path is known, and why not. A
    measured KV span with its hosts (fabricprobe's own spans) makes a path known."""
    measured = {
        s.request_id
        for s in stages
        if s.stage in FABRIC_STAGES and not s.derived and s.src and s.dst
    }
    rows = [
        {
            "request_id": p.request_id,
            "engine": p.engine,
            "path_src": p.src if p.path_known else "",
            "path_dst": p.dst if p.path_known else "",
            "path_known": p.path_known or p.request_id in measured,
            "path_reason": "" if (p.path_known or p.request_id in measured) else p.reason,
            "path_detail": p.detail,
            "kv_source": p.kv_source or ("span" if p.request_id in measured else ""),
        }
        for p in paths
    ]
    return pd.DataFrame(rows, columns=PATH_COLUMNS).drop_duplicates("request_id", keep="last")


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
        self._floors: dict[tuple[str, str, str], float] = {}
        self._prober_floors: dict[tuple[str, str], float] = {}

    def floor(self, key: tuple[str, str, str]) -> float:
        """The lowest RTT minimum of path KEY's windows, computed once per join."""
        if key not in self._floors:
            self._floors[key] = float(self.exact[key]["rtt_min_s"].min())
        return self._floors[key]

    def prober_floor(self, key: tuple[str, str]) -> float:
        """The lowest prober delay of the windows from KEY's prober to its responder (UD
        probes, whatever the transport asked), computed once per join."""
        if key not in self._prober_floors:
            self._prober_floors[key] = float(self.any[key]["prober_delay_min_s"].min())
        return self._prober_floors[key]

    def get(self, src: str, dst: str, transport: str) -> pd.DataFrame:
        if transport:
            fwd = self.exact.get((src, dst, transport))
            rev = self.exact.get((dst, src, transport))
        else:
            fwd, rev = self.any.get((src, dst)), self.any.get((dst, src))
        if fwd is not None and not fwd.empty:
            return fwd
        return rev if rev is not None else self.empty


def _nixl_figures(rates: pd.DataFrame, start_ns: int, end_ns: int) -> dict[str, float]:
    """NIXL rates of one host for the counter window a transfer ran in (NaN: none)."""
    out = dict.fromkeys(NIXL_FIELDS, np.nan)
    r = rates[(rates["t_ns"] >= start_ns) & (rates["t_ns"] <= end_ns)]
    if r.empty:
        return out
    first = r.sort_values("t_ns").drop_duplicates(["device", "name"], keep="first")
    per = first.groupby("name")["rate"].sum()
    nbytes, n = per.get("bytes", np.nan), per.get("transfers", np.nan)
    busy = per.get("xfer_time_us", np.nan) / 1e6  # transfer seconds per second
    out["nixl_bytes_per_s"] = float(nbytes)
    out["nixl_transfers_per_s"] = float(n)
    out["nixl_errors_per_s"] = float(per.get("errors", np.nan))
    if n and n > 0:
        out["nixl_mean_bytes"] = float(nbytes / n)
        out["nixl_mean_xfer_s"] = float(busy / n)
    if busy and busy > 0:
        out["nixl_speed_bytes_per_s"] = float(nbytes / busy)
    return out


def split_kv(kv: pd.DataFrame) -> pd.DataFrame:
    """The three parts of each KV wait (collector/kvparts.py: kv_wait_s, fabric_s,
    transfer_stack_s, engine_wait_s, the bytes used and where each figure came from)
    and kv_speed_above_path. NaN where a figure a part needs is unknown."""
    out = split_parts(kv)
    if kv.empty:
        return out.assign(kv_speed_above_path=[])
    speed = out["nixl_speed_bytes_per_s"]
    bw = out["bandwidth_bytes_per_s"]
    above = (speed > bw * SPEED_SLACK).where(speed.notna() & bw.notna())
    return out.assign(kv_speed_above_path=above)


# A probe's RTT holds the prober's and the responder's host delay beside the network's.
# Each agent measures its own: the same TCP probe against its own responder, turned
# around in the loopback device (no NIC, no wire). What that reference takes beyond its
# quietest window is this host's stack and scheduling delay for a prober and a
# responder both, so a path's share is half of each end's. RDMA probes measure their
# prober's delay themselves, on the path (software-timed: UD from the last empty poll of
# the receive CQ to the poll that found the answer, probes/rdma/ud.py; RC from a clock
# read the wait took before its answer came, probes/rdma/rc.py): where a path's windows carry
# it, what it takes beyond the path's quietest prober delay is the prober end's estimate
# in full, in place of half the prober's reference; the responder end keeps half its
# reference (a UD RTT has the responder's processing taken out already, but not the time
# its loop took to see the probe). A window is host-bound when the estimate is at least
# HOST_SHARE of what the path's RTT rose above its own floor at its median, or when the
# prober's own delay, measured on the path, is that share of its p99's rise (a prober
# spinning on a shared CPU sees most answers at once and loses a slice now and then:
# its tail is the host's while its median is the path's). A reference's tail is no
# such measure: a quiet host's loopback TCP has tens of µs of it, an RDMA path's p99 a
# few.
HOST_SHARE = 0.5
HOST_FLOOR_S = 20e-6  # host delay below this is noise of the reference itself
HOST_FIELDS = ["host_delay_s", "rtt_p50_net_s", "rtt_p99_net_s", "host_bound"]
PROBER_FIELDS = ["prober_delay_min_s", "prober_delay_p50_s", "prober_delay_p99_s"]


def _dominates(delay: float, rise: float) -> bool:
    """Whether the hosts' DELAY accounts for a rise of RISE above the path's floor (and is
    more than the reference's own noise)."""
    return bool(delay >= HOST_FLOOR_S and delay >= HOST_SHARE * rise)


def _windows_over(
    frame: pd.DataFrame, start_ns: int, end_ns: int, slack: int, horizon: int
) -> pd.DataFrame:
    """FRAME's windows overlapping [START, END] (SLACK either side); with none, the first
    that ended after END, within HORIZON (a gap, or a first window's estimated start)."""
    w = frame[(frame["start_ns"] <= end_ns + slack) & (frame["end_ns"] >= start_ns - slack)]
    if w.empty and not frame.empty:
        later = frame[(frame["end_ns"] >= end_ns) & (frame["end_ns"] <= end_ns + horizon)]
        w = later.sort_values("end_ns").head(1)
    return w


def _host_excess(
    paths: _PathIndex, host: str, start_ns: int, end_ns: int, slack: int, horizon: int
) -> tuple[float, float]:
    """(p50, p99) of HOST's reference over [START, END] beyond its floor; NaN if none."""
    key = (host, host, "tcp")
    ref = paths.exact.get(key)
    if ref is None or ref.empty:
        return np.nan, np.nan
    w = _windows_over(ref, start_ns, end_ns, slack, horizon)
    if w.empty:
        return np.nan, np.nan
    floor = paths.floor(key)
    return (
        max(0.0, float(w["rtt_p50_s"].mean()) - floor),
        max(0.0, float(w["rtt_p99_s"].max()) - floor),
    )


def _prober_excess(paths: _PathIndex, w: pd.DataFrame) -> tuple[str, float, float]:
    """(prober host, p50, p99) of the prober's own delay in windows W (one path) beyond
    the path's quietest prober delay; NaN figures when W carries none."""
    if w.empty:
        return "", np.nan, np.nan
    first = w.iloc[0]
    prober = str(first["src"])
    own = w["prober_delay_p50_s"].dropna()
    floor = paths.prober_floor((prober, str(first["dst"]))) if len(own) else np.nan
    if np.isnan(floor):
        return prober, np.nan, np.nan
    return (
        prober,
        max(0.0, float(own.mean()) - floor),
        max(0.0, float(w["prober_delay_p99_s"].max()) - floor),
    )


def join_fabric(
    stages: pd.DataFrame,
    windows: pd.DataFrame,
    rates: pd.DataFrame,
    *,
    slack_s: float = 1.0,
    horizon_s: float = 30.0,
    bandwidth: dict[tuple[str, str], float] | None = None,
    model_bytes: dict[str, float] | None = None,
) -> pd.DataFrame:
    """Fabric stages with the figures of their path over their time, and the parts of
    each KV wait (split_kv). MODEL_BYTES: the KV bytes the model's shape gives a
    request (by request id), used where the span gives none.

    Adds rtt_min_s (min over the overlapping windows), rtt_p50_s (mean), rtt_p99_s (max),
    loss_ratio
    (mean), fabric_windows (how many matched), and for each end and counter category the
    rate (per second) of the first reading at or after the stage started, within
    HORIZON_S: the counter window the stage ran in. A stage no window overlaps takes
    the first window of its path that ended after it, within HORIZON_S."""
    # only transfers whose path is known cross a path; the others stay in the breakdown
    fab = stages[
        stages["stage"].isin(FABRIC_STAGES) & (stages["src"] != "") & (stages["dst"] != "")
    ].copy()
    bandwidth = bandwidth or {}
    slack = int(slack_s * 1e9)
    horizon = int(horizon_s * 1e9)
    rmin: list[float] = []
    p50: list[float] = []
    p99: list[float] = []
    loss: list[float] = []
    matched: list[int] = []
    rate_cols: dict[str, list[float]] = {c: [] for c in RATE_FIELDS}
    nixl_cols: dict[str, list[float]] = {c: [] for c in NIXL_FIELDS}
    bw_col: list[float] = []
    host_cols: dict[str, list[float]] = {c: [] for c in HOST_FIELDS}
    # windows without a prober delay (TCP, RC, older frames) hold NaN there
    windows = windows.assign(
        **{
            c: pd.to_numeric(windows[c], errors="coerce") if c in windows else np.nan
            for c in PROBER_FIELDS
        }
    )
    paths = _PathIndex(windows)
    is_nixl = rates["category"] == NIXL_CATEGORY
    by_host = {h: g for h, g in rates[~is_nixl].groupby("host", sort=False)}
    nixl_by_host = {h: g for h, g in rates[is_nixl].groupby("host", sort=False)}
    no_rates = rates.iloc[0:0]
    for row in fab.itertuples(index=False):
        bw = bandwidth.get((row.src, row.dst)) or bandwidth.get((row.dst, row.src))
        bw_col.append(float(bw) if bw else np.nan)
        # NIXL counts a transfer where it is posted: the decode side reads remote KV
        nx = dict.fromkeys(NIXL_FIELDS, np.nan)
        for host in (row.dst, row.src):
            nr = nixl_by_host.get(host)
            if nr is not None:
                nx = _nixl_figures(nr, row.start_ns, row.end_ns + horizon)
                if not np.isnan(nx["nixl_bytes_per_s"]):
                    break
        for c in NIXL_FIELDS:
            nixl_cols[c].append(nx[c])
        pw = paths.get(row.src, row.dst, row.transport)
        w = _windows_over(pw, row.start_ns, row.end_ns, slack, horizon)
        matched.append(len(w))
        rmin.append(float(w["rtt_min_s"].min()) if len(w) else np.nan)
        p50.append(float(w["rtt_p50_s"].mean()) if len(w) else np.nan)
        p99.append(float(w["rtt_p99_s"].max()) if len(w) else np.nan)
        loss.append(float(w["loss_ratio"].mean()) if len(w) else np.nan)
        # each end's share: the prober's own delay where its windows carry one, else
        # half its reference
        prober, own50, own99 = _prober_excess(paths, w)
        ends = []
        measured99 = np.nan  # the prober's own tail, where it measured it on the path
        for h in (row.src, row.dst):
            if h == prober and not np.isnan(own50):
                ends.append((own50, own99))
                measured99 = own99
            else:
                e = _host_excess(paths, h, row.start_ns, row.end_ns, slack, horizon)
                ends.append((e[0] / 2, e[1] / 2))
        known = [e for e in ends if not np.isnan(e[0])]
        delay = sum(e[0] for e in known) if known else np.nan
        delay99 = sum(e[1] for e in known) if known else np.nan
        floor = float(pw["rtt_min_s"].min()) if len(pw) else np.nan
        rise = p50[-1] - floor
        rise99 = p99[-1] - floor
        host_cols["host_delay_s"].append(delay)
        host_cols["rtt_p50_net_s"].append(
            max(rmin[-1], p50[-1] - delay) if known and len(w) else p50[-1]
        )
        host_cols["rtt_p99_net_s"].append(
            max(rmin[-1], p99[-1] - delay99) if known and len(w) else p99[-1]
        )
        host_cols["host_bound"].append(
            float(_dominates(delay, rise) or _dominates(measured99, rise99))
            if known and len(w) and not np.isnan(rise)
            else np.nan
        )
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
    fab["bandwidth_bytes_per_s"] = bw_col
    for col, values in host_cols.items():
        fab[col] = values
    for col, values in nixl_cols.items():
        fab[col] = values
    fab["model_bytes"] = fab["request_id"].map(model_bytes or {}).astype(float)
    return split_kv(fab.reset_index(drop=True))


PER_REQUEST_SUMS = [
    "kv_wait_s",
    "fabric_s",
    "transfer_stack_s",
    "engine_wait_s",
    "over_explained_s",
    "kv_bytes_used",
]
PER_REQUEST_SOURCES = ["kv_bytes_source", "fabric_source", "transfer_stack_source"]


def _parts_per_request(kv: pd.DataFrame) -> pd.DataFrame:
    """The KV parts of each request (summed over its transfers; NaN stays NaN)."""
    cols = [c for c in PART_COLUMNS if c in kv]
    if kv.empty or len(cols) < len(PART_COLUMNS):
        return pd.DataFrame(columns=PER_REQUEST_SUMS + PER_REQUEST_SOURCES)
    g = kv.groupby("request_id")
    sums = g[PER_REQUEST_SUMS].sum(min_count=1)
    return sums.join(g[PER_REQUEST_SOURCES].first())


def request_breakdown(
    stages: pd.DataFrame,
    requests: pd.DataFrame,
    paths: pd.DataFrame | None = None,
    kv: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per request: seconds per stage, TTFT, ITL, e2e, the KV path, the parts of
    its KV wait (KV: join_fabric's frame) and their shares.

    kv_share_ttft is the whole KV wait over TTFT (in disaggregated serving the KV cache
    must arrive before decode can produce the first token); fabric_share_ttft is the
    part the fabric explains (fabric_s) over TTFT; the *_e2e shares are over the whole
    request. All are NaN when the request's path is unknown (PATHS says which and why:
    `path` is "unknown" and `path_reason` the reason), and fabric_s's when the path's
    figures are."""
    st = measured_first(stages)
    per = st.pivot_table(
        index="request_id", columns="stage", values="duration_s", aggfunc="sum"
    ).reindex(columns=list(STAGES))
    per.columns = [f"{c}_s" for c in per.columns]
    crossed = st[st["stage"].isin(FABRIC_STAGES) & (st["src"] != "") & (st["dst"] != "")]
    path = crossed.groupby("request_id").agg(
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
    if paths is not None and len(paths):
        out = out.join(paths.set_index("request_id"), how="left")
    else:
        out = out.assign(**{c: None for c in PATH_COLUMNS[1:]})
    # a path is known from a KV stage with both hosts, or from the engines' link (which
    # may know the hosts without a KV time: Dynamo, llm-d alone); otherwise the path is
    # unknown and the fabric figures are NaN (unknown is not zero)
    from_kv = out["src"].notna() & (out["src"].astype(str) != "")
    linked = out["path_src"].notna() & (out["path_src"].astype(str) != "")
    out["src"] = out["src"].where(from_kv, out["path_src"].where(linked))
    out["dst"] = out["dst"].where(from_kv, out["path_dst"].where(linked))
    has_path = from_kv | linked
    out["path_known"] = has_path
    reason = out["path_reason"].where(out["path_reason"].notna() & (out["path_reason"] != ""))
    out["path_reason"] = reason.where(~has_path, "").fillna("no KV transfer seen")
    out["path"] = (out["src"].astype(str) + "->" + out["dst"].astype(str)).where(
        has_path, "unknown"
    )
    parts = _parts_per_request(kv if kv is not None else pd.DataFrame())
    out = out.join(parts, how="left")
    kv_s = out["kv_transfer_s"].where(from_kv)
    out["kv_wait_s"] = kv_s
    got = pd.to_numeric(out["kv_bytes_used"], errors="coerce")
    out["kv_bytes"] = got.where(got > 0, out["kv_bytes"].where(out["kv_bytes"] > 0))
    out["kv_bytes_source"] = out["kv_bytes_source"].where(out["kv_bytes"].notna(), "")
    fabric = pd.to_numeric(out["fabric_s"], errors="coerce").where(from_kv)
    ttft = out["ttft_s"].where(out["ttft_s"] > 0)
    e2e = out["e2e_s"].where(out["e2e_s"] > 0)
    out["kv_share_ttft"] = kv_s / ttft
    out["kv_share_e2e"] = kv_s / e2e
    out["fabric_share_ttft"] = fabric / ttft
    out["fabric_share_e2e"] = fabric / e2e
    return out.drop(columns=["kv_bytes_used"]).reset_index().rename(columns={"index": "request_id"})
