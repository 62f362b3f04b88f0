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

import pandas as pd

from fabricprobe.collector.attribution.fabricjoin import (
    HOST_FIELDS,
    HOST_FLOOR_S,
    JOIN_FIELDS,
    NIXL_FIELDS,
    RATE_FIELDS,
    FabricIndex,
    join_transfer,
)
from fabricprobe.collector.attribution.linking import PathInfo
from fabricprobe.collector.attribution.stages import (
    FABRIC_STAGES,
    STAGES,
    RequestRecord,
    StageRecord,
)
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
    "library_s",
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
SPEED_SLACK = 1.1  # a KV speed this far above the measured bandwidth is flagged
__all__ = ["HOST_FIELDS", "HOST_FLOOR_S", "NIXL_FIELDS", "RATE_FIELDS"]  # fabricjoin's, here too


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
    ]
    index = FabricIndex.from_frames(windows, rates)
    return join_indexed(
        fab, index, slack_s=slack_s, horizon_s=horizon_s, bandwidth=bandwidth,
        model_bytes=model_bytes,
    )  # fmt: skip


def join_indexed(
    fab: pd.DataFrame,
    index: FabricIndex,
    *,
    slack_s: float = 1.0,
    horizon_s: float = 30.0,
    bandwidth: dict[tuple[str, str], float] | None = None,
    model_bytes: dict[str, float] | None = None,
) -> pd.DataFrame:
    """join_fabric over an index of the fabric history (attribution/fabricjoin.py) and the
    fabric stages FAB whose path is known: each joined on its own (join_transfer)."""
    bandwidth = bandwidth or {}
    slack, horizon = int(slack_s * 1e9), int(horizon_s * 1e9)
    rows = [
        join_transfer(
            index, row, slack=slack, horizon=horizon,
            bandwidth=bandwidth.get((row.src, row.dst)) or bandwidth.get((row.dst, row.src)),
        )
        for row in fab.itertuples(index=False)
    ]  # fmt: skip
    joined = pd.DataFrame(rows, columns=JOIN_FIELDS, index=fab.index, dtype=float)
    joined["fabric_windows"] = joined["fabric_windows"].astype("int64")
    out = pd.concat([fab, joined], axis=1)
    out["model_bytes"] = out["request_id"].map(model_bytes or {}).astype(float)
    return split_kv(out.reset_index(drop=True))


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
