"""A settled request joined with its path's fabric figures once, folded for /metrics
(attribution/kvfold.py), and kept among the newest `keep` for `probe why`.

`probe why` lists requests one by one, so it reads rows: those of the newest settled
requests (a ring of `keep`, the collector's `why_requests` setting), and the requests
still open, joined for the reply with the figures there are so far. /metrics reads only
the fold.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from fabricprobe.collector.attribution.analysis import AnalysisConfig
from fabricprobe.collector.attribution.assembly import Open
from fabricprobe.collector.attribution.fabricjoin import JOIN_FIELDS, FabricIndex
from fabricprobe.collector.attribution.join import (
    STAGE_COLUMNS,
    join_indexed,
    paths_frame,
    requests_frame,
    stages_frame,
)
from fabricprobe.collector.attribution.kvfold import KvFold, RequestFigures, transfer_vector
from fabricprobe.collector.attribution.linking import PathInfo
from fabricprobe.collector.attribution.stages import FABRIC_STAGES, RequestRecord, StageRecord
from fabricprobe.collector.kvparts import PART_COLUMNS
from fabricprobe.collector.kvshape import KvShape, model_bytes

WHY_REQUESTS = 10_000  # settled requests kept for `probe why` (the why_requests setting)
NAN = math.nan
# join_fabric's columns: what `probe why` reads of a KV transfer
KV_COLUMNS = [*STAGE_COLUMNS, *JOIN_FIELDS, "model_bytes", *PART_COLUMNS, "kv_speed_above_path"]


@dataclass(frozen=True)
class Settled:
    """A request as `probe why` reads it: its stages, request figures, path, and its KV
    transfers joined (KV_COLUMNS each)."""

    rid: str
    end_ns: int
    stages: tuple[StageRecord, ...]
    request: RequestRecord | None
    path: PathInfo | None
    kv: tuple[tuple[Any, ...], ...]


def join_open(
    requests: list[Open],
    index: FabricIndex,
    *,
    bandwidth: Mapping[tuple[str, str], float],
    kv_models: Mapping[str, KvShape],
) -> list[list[tuple[Any, ...]]]:
    """Each of REQUESTS' KV transfers (whose path is known) joined with its path's figures
    in INDEX (join_fabric's rule), as rows of KV_COLUMNS, request by request."""
    crossed = [o.crossed() for o in requests]
    flat = [s for c in crossed for s in c]
    if not flat:
        return [[] for _ in requests]
    recs = [r for r in (o.record() for o in requests) if r is not None]
    shaped = model_bytes(((r.request_id, r.model, r.prompt_tokens) for r in recs), kv_models)
    kv = join_indexed(stages_frame(flat), index, bandwidth=dict(bandwidth), model_bytes=shaped)
    rows = list(kv.reindex(columns=KV_COLUMNS).itertuples(index=False, name=None))
    out, at = [], 0
    for c in crossed:
        out.append(rows[at : at + len(c)])
        at += len(c)
    return out


def request_figures(
    o: Open, kv: list[tuple[Any, ...]], cfg: AnalysisConfig
) -> tuple[RequestFigures, Settled]:
    """What the settled request O adds to the fold, and what `probe why` keeps of it (KV:
    its transfers joined)."""
    stages = o.all_stages()
    rec = o.record()
    sums: dict[str, float] = {}
    for s in stages:
        sums[s.stage] = sums.get(s.stage, 0.0) + s.duration_s
    compute = [sums[k] for k in ("prefill", "decode") if k in sums]
    crossed = any(s.stage in FABRIC_STAGES and s.src and s.dst for s in stages)
    ttft = rec.ttft_s if rec is not None and rec.ttft_s and rec.ttft_s > 0 else None
    kv_s = sums.get("kv_transfer", NAN)
    rows = [dict(zip(KV_COLUMNS, r, strict=True)) for r in kv]
    fabric = [f for f in (float(r["fabric_s"]) for r in rows) if f == f]
    goodput = None
    if rec is not None and rec.output_tokens is not None:
        met = (
            rec.ttft_s is not None
            and rec.ttft_s <= cfg.slo_ttft_s
            and (rec.itl_s is None or rec.itl_s <= cfg.slo_itl_s)
        )
        goodput = (float(rec.output_tokens), met)
    ends = [s.end_ns for s in stages] + ([rec.end_ns] if rec is not None else [])
    end = rec.end_ns if rec is not None else max(ends, default=o.newest_end)
    figures = RequestFigures(
        start_ns=min((s.start_ns for s in stages), default=end),
        end_ns=end,
        kv_s=kv_s,
        queue_s=sums.get("queue", NAN),
        compute_s=sum(compute) if compute else NAN,
        kv_share_ttft=kv_s / ttft if crossed and ttft else NAN,
        fabric_share_ttft=sum(fabric) / ttft if crossed and ttft and fabric else NAN,
        goodput=goodput,
        transfers=[
            ((r["src"], r["dst"], r["transport"]), r["start_ns"], r["end_ns"], transfer_vector(r))
            for r in rows
        ],
    )
    path = o.linked.path if o.linked is not None else None
    kept = Settled(o.rid, max(ends, default=o.newest_end), tuple(stages), rec, path, tuple(kv))
    return figures, kept


class Settler:
    """Settled requests into the fold and the ring `probe why` reads, thread-safe."""

    def __init__(self, fold: KvFold, cfg: AnalysisConfig, *, keep: int = WHY_REQUESTS) -> None:
        self.fold, self.cfg = fold, cfg
        self.lock = threading.Lock()
        self.ring: deque[Settled] = deque(maxlen=keep)

    def take(self, requests: list[Open], kv: list[list[tuple[Any, ...]]], now_ns: int) -> None:
        """REQUESTS settled, with their KV transfers joined (join_open)."""
        figures, kept = [], []
        for o, rows in zip(requests, kv, strict=True):
            if not (o.stages or o.request or o.linked):
                continue  # a promise nothing came of
            f, k = request_figures(o, rows, self.cfg)
            figures.append(f)
            kept.append(k)
        self.fold.add(figures, now_ns)
        with self.lock:
            self.ring.extend(kept)

    def since(self, since_ns: int) -> list[Settled]:
        """The settled requests kept that ended after SINCE_NS."""
        with self.lock:
            return [s for s in self.ring if s.end_ns > since_ns]


@dataclass(frozen=True)
class WhyFrames:
    stages: pd.DataFrame
    requests: pd.DataFrame
    paths_found: pd.DataFrame
    kv: pd.DataFrame
    records: list[RequestRecord]


def why_frames(requests: Iterable[Settled]) -> WhyFrames:
    """The frames `probe why`'s analysis reads of REQUESTS (attribution/join.py's)."""
    got = list(requests)
    stages = [s for r in got for s in r.stages]
    records = [r.request for r in got if r.request is not None]
    found = paths_frame([r.path for r in got if r.path is not None], stages)
    kv = pd.DataFrame([row for r in got for row in r.kv], columns=KV_COLUMNS)
    return WhyFrames(stages_frame(stages), requests_frame(records), found, kv, records)
