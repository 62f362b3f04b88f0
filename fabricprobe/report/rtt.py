"""The collector's Rtt reply as frames: pure pandas, plain data in, DataFrames out, no I/O.

Every path's figures come from its sketch in the collector (Query API, `Rtt`;
collector/rttquery.py): exact count, loss, min, max and mean; p50 to p99.9 within 0.54 %
of the agents' own sketches; and the CDF as native histogram buckets, bucket i of schema s
holding the RTTs in (2^((i-1)/2^s), 2^(i/2^s)] seconds (schema 6: 1.09 % wide). A host's
probe of its own responder (src == dst) is its reference, the host's own delay: it goes
with the references whichever list it came in, never among the paths. The reply comes
from outside: a row or a CDF that cannot be read is left out and counted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from fabricprobe.report.frames import PATH_KEYS, clip

FIGURES = ["min_s", "p50_s", "p90_s", "p99_s", "p999_s", "max_s", "mean_s"]
COLUMNS = [*PATH_KEYS, "exchanges", "lost", "loss", *FIGURES, "since_ns", "newest_ns"]
# a row per bucket; each row carries its path's exact min and max, which bound the
# percentiles read from the buckets (cdf_quantile)
CDF_COLUMNS = [*PATH_KEYS, "lower_s", "upper_s", "count", "cumulative", "fraction", "total",
               "schema", "min_s", "max_s"]  # fmt: skip
MAX_ROWS = 4096  # rows read from one reply (the collector sends at most 2,000 of each)
MAX_BUCKETS = 4096  # CDF buckets read for one path (the collector sends at most 1,024)
MIN_SCHEMA, MAX_SCHEMA = -4, 8  # the native histogram's schemas
SKETCH_SCHEMA = 6  # the collector's per-path buckets (core/cumulative.py): 1.09 % wide
MAX_INDEX = 1 << 20  # a bucket index further out is no RTT (schema 8: 2^4096 s)


@dataclass(frozen=True)
class RttFrames:
    paths: pd.DataFrame  # COLUMNS, src != dst, the highest p99 first
    references: pd.DataFrame  # COLUMNS, src == dst: each host's own delay
    cdf: pd.DataFrame  # CDF_COLUMNS, for the paths and references that came with one
    paths_total: int  # paths the collector holds (those it did not send included)
    references_total: int
    dropped: int  # rows and CDFs that could not be read


def _number(v: Any) -> float:
    if isinstance(v, bool):
        return math.nan
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):
        return math.nan
    return f if math.isfinite(f) and f >= 0 else math.nan


def _total(v: Any) -> int:
    f = _number(v)
    return int(f) if f < 2**63 else 0  # NaN compares false


def _row(r: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {k: clip(r.get(k, ""), 253) for k in PATH_KEYS}
    out["size"] = "" if out["size"] in ("", "0") else out["size"]
    n, lost = _number(r.get("count", 0)), _number(r.get("lost", 0))
    out["exchanges"], out["lost"] = n, lost
    out["loss"] = lost / (n + lost) if n + lost > 0 else math.nan
    for f in FIGURES:
        out[f] = _number(r.get(f))
    out["since_ns"], out["newest_ns"] = (
        _number(r.get("since_unix_ns")),
        _number(r.get("newest_unix_ns")),
    )
    return out


def _cdf(r: Mapping[str, Any], key: dict[str, Any]) -> list[dict[str, Any]] | None:
    """One path's CDF rows; None when it came without one; ValueError when unreadable."""
    buckets, counts, schema = r.get("buckets"), r.get("counts"), r.get("schema")
    if not buckets:
        return None
    if not isinstance(buckets, list | tuple) or not isinstance(counts, list | tuple):
        raise ValueError("buckets and counts must be lists")
    if len(buckets) != len(counts) or len(buckets) > MAX_BUCKETS:
        raise ValueError("buckets and counts differ in length, or too many")
    if isinstance(schema, bool) or not isinstance(schema, int):
        raise ValueError("no schema")
    if not MIN_SCHEMA <= schema <= MAX_SCHEMA:
        raise ValueError("schema out of range")
    idx = [int(i) for i in buckets]
    n = [int(c) for c in counts]
    if idx != sorted(set(idx)) or abs(idx[0]) > MAX_INDEX or abs(idx[-1]) > MAX_INDEX:
        raise ValueError("bucket indices not ascending, or out of range")
    if min(n) < 0:
        raise ValueError("negative count")
    zero = int(r.get("zero_count") or 0)
    total = zero + sum(n)
    if total <= 0:
        raise ValueError("an empty CDF")
    width = 2.0**-schema if schema <= 0 else 1.0 / (1 << schema)
    rows, running = [], zero
    for i, c in zip(idx, n, strict=True):
        running += c
        rows.append(
            {
                **key,
                "lower_s": 2.0 ** ((i - 1) * width),
                "upper_s": 2.0 ** (i * width),
                "count": c,
                "cumulative": running,
                "fraction": running / total,
                "total": total,
                "schema": schema,
            }
        )
    return rows


def rtt_frames(doc: Mapping[str, Any] | None) -> RttFrames:
    """The Rtt reply DOC (as report.sources.rtt_dict gives it) as frames."""
    doc = doc or {}
    rows: list[dict[str, Any]] = []
    cdf: list[dict[str, Any]] = []
    dropped = 0
    for field in ("paths", "host_references"):
        listed = doc.get(field)
        for r in (listed if isinstance(listed, list) else [])[:MAX_ROWS]:
            if not isinstance(r, Mapping):
                dropped += 1
                continue
            row = _row(r)
            rows.append(row)
            try:
                got = _cdf(r, {k: row[k] for k in [*PATH_KEYS, "min_s", "max_s"]})
            except (TypeError, ValueError, OverflowError):
                dropped += 1
                continue
            cdf.extend(got or [])
    table = pd.DataFrame(rows, columns=COLUMNS)
    table = table.sort_values("p99_s", ascending=False, na_position="first", kind="stable")
    own = table["src"] == table["dst"]
    return RttFrames(
        paths=table[~own].reset_index(drop=True),
        references=table[own].reset_index(drop=True),
        cdf=pd.DataFrame(cdf, columns=CDF_COLUMNS),
        paths_total=_total(doc.get("paths_total")),
        references_total=_total(doc.get("host_references_total")),
        dropped=dropped,
    )


def bucket_width(schema: int) -> float:
    """How much wider a native bucket's upper bound is than its lower: 2^(2^-schema)."""
    return float(2.0 ** (2.0**-schema))


def resolution(cdf: pd.DataFrame) -> str:
    """What the CDFs and percentiles can tell apart, in words."""
    if cdf.empty:
        return "no CDF sent"
    schemas = cdf.groupby(PATH_KEYS)["schema"].first()
    finest = int(schemas.max())
    at = "at the sketches' resolution" if finest >= SKETCH_SCHEMA else "coarser than the sketches"
    text = (
        f"CDF {at}: native buckets of schema {finest}, each "
        f"{(bucket_width(finest) - 1) * 100:.2f} % wide; percentiles within 0.54 % of the "
        "agents' sketches, min and max exact"
    )
    coarse = schemas[schemas < SKETCH_SCHEMA]
    if len(coarse):
        worst = int(coarse.min())
        text += (
            f"; {len(coarse)} CDF(s) merged to a coarser schema (down to {worst}, "
            f"{(bucket_width(worst) - 1) * 100:.1f} % wide) to stay within the bucket bound"
        )
    return text


def classes(paths: pd.DataFrame) -> list[tuple[str, str, str]]:
    """(transport, op, size) probed, the most exchanges first: one heatmap each."""
    if paths.empty:
        return []
    n = paths.assign(n=paths["exchanges"].fillna(0)).groupby(["transport", "op", "size"])["n"]
    order = n.sum().sort_values(ascending=False, kind="stable")
    return [(str(t), str(o), str(s)) for t, o, s in order.index]


def tor_table(paths: pd.DataFrame) -> pd.DataFrame:
    """Per (src_tor, dst_tor) of PATHS (with_tor'd): the median of the host pairs' p50,
    the worst pair's p99, the loss over all their exchanges and how many pairs."""
    cols = ["src_tor", "dst_tor", "p50_s", "p99_s", "loss", "pairs", "exchanges"]
    if paths.empty:
        return pd.DataFrame(columns=cols)
    g = paths.groupby(["src_tor", "dst_tor"])
    out = g.agg(
        p50_s=("p50_s", "median"),
        p99_s=("p99_s", "max"),
        pairs=("src", "size"),
        exchanges=("exchanges", "sum"),
        lost=("lost", "sum"),
    ).reset_index()
    sent = out["exchanges"] + out["lost"]
    out["loss"] = out["lost"] / sent.where(sent > 0)
    return out[cols]


def cdf_quantile(path_cdf: pd.DataFrame, q: float, lo: float, hi: float) -> float:
    """The value at quantile Q of one path's CDF rows, read as the collector reads its
    sketch: the geometric middle of the bucket that holds the rank, within [LO, HI]."""
    if path_cdf.empty or not 0 <= q <= 1:
        return math.nan
    total = float(path_cdf["total"].iloc[0])
    want = max(1, int(total * q + 0.5))
    at = np.searchsorted(path_cdf["cumulative"].to_numpy(), want, side="left")
    if at >= len(path_cdf):
        return hi
    r = path_cdf.iloc[int(at)]
    if want <= r["cumulative"] - r["count"]:
        return 0.0  # in the zero bucket, below the first
    return max(lo, min(math.sqrt(r["lower_s"] * r["upper_s"]), hi))
