"""Figures of a workload run per path and transport: what a KV transfer of this model
took on this fabric, and what that did to TTFT."""

from __future__ import annotations

from typing import Any

import pandas as pd

from fabricprobe.workload.pipeline import RequestResult


def results_frame(results: list[RequestResult]) -> pd.DataFrame:
    rows = []
    for r in results:
        row: dict[str, Any] = {
            "request_id": r.request_id,
            "src": r.src.name,
            "dst": r.dst.name,
            "transport": r.transport,
            "kv_bytes": r.kv_bytes,
            "error": r.error,
        }
        if r.error is None:
            row |= {f"{s}_s": r.seconds(s) for s in r.stages}
            row |= {"ttft_s": r.ttft_s, "e2e_s": r.e2e_s}
        rows.append(row)
    return pd.DataFrame(rows)


def summarise(results: list[RequestResult]) -> pd.DataFrame:
    """Per (src, dst, transport): requests, failures, mean KV bytes, KV transfer p50/p99
    seconds, effective bytes/s, TTFT p50/p99."""
    df = results_frame(results)
    cols = [
        "src", "dst", "transport", "requests", "failed", "kv_bytes_mean", "kv_p50_s",
        "kv_p99_s", "kv_bytes_per_s", "ttft_p50_s", "ttft_p99_s",
    ]  # fmt: skip
    if df.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for (src, dst, tr), g in df.groupby(["src", "dst", "transport"], sort=False):
        ok = g[g["error"].isna()]
        kv = ok["kv_transfer_s"] if "kv_transfer_s" in ok else pd.Series(dtype=float)
        ttft = ok["ttft_s"] if "ttft_s" in ok else pd.Series(dtype=float)
        moved = float(ok["kv_bytes"].sum())
        rows.append(
            {
                "src": src,
                "dst": dst,
                "transport": tr,
                "requests": len(g),
                "failed": int(g["error"].notna().sum()),
                "kv_bytes_mean": float(g["kv_bytes"].mean()),
                "kv_p50_s": kv.quantile(0.5) if len(kv) else None,
                "kv_p99_s": kv.quantile(0.99) if len(kv) else None,
                "kv_bytes_per_s": moved / kv.sum() if len(kv) and kv.sum() > 0 else None,
                "ttft_p50_s": ttft.quantile(0.5) if len(ttft) else None,
                "ttft_p99_s": ttft.quantile(0.99) if len(ttft) else None,
            }
        )
    return pd.DataFrame(rows, columns=cols)
