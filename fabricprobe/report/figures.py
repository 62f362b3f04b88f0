"""The report's pictures: frames from report.frames in, PNG bytes out (matplotlib, Agg).

Figures are made with matplotlib's object API (no pyplot state), so drawing needs no
display and is safe to repeat. Every label reaches matplotlib through `tx()`, which
bounds it and escapes `$` (else a host name could switch on mathtext and fail the draw).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.colors import LogNorm, Normalize
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
from matplotlib.figure import Figure
from matplotlib.image import AxesImage
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from fabricprobe.collector.attribution.stages import STAGES
from fabricprobe.report.frames import PATH_KEYS, clip, path_name

DPI = 100
STAGE_COLOURS = {
    "queue": "#9e9e9e",
    "prefill": "#1f77b4",
    "kv_transfer": "#d62728",
    "decode": "#2ca02c",
    "detokenize": "#9467bd",
    "deliver": "#ff7f0e",
}


def tx(text: object, limit: int = 64) -> str:
    return clip(text, limit).replace("$", r"\$")


def png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    # a constrained layout already fits its labels; "tight" would draw the figure twice
    tight = None if fig.get_layout_engine() is not None else "tight"
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches=tight)
    return buf.getvalue()


def _sig(v: float) -> str:
    """Three significant digits, thousands separated: 48.7, 1,450, 125,000."""
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"


def rtt_cdfs(cdf: pd.DataFrame, order: Sequence[tuple[str, ...]], resolution: str) -> bytes:
    """One CDF line per path (in ORDER, already bounded), points at the bucket bounds."""
    fig = Figure(figsize=(11, 5.5), layout="constrained")
    ax = fig.add_subplot()
    groups = {k: g for k, g in cdf.groupby(PATH_KEYS, sort=False)}
    for key in order:
        g = groups.get(tuple(key))
        if g is None:
            continue
        label = path_name(dict(zip(PATH_KEYS, key, strict=True)))
        ax.plot(g["le"], g["fraction"], marker="o", markersize=3, label=tx(label, 90))
    ax.set_xscale("log")
    moving = cdf[(cdf["fraction"] > 0) & (cdf["fraction"] < 1)]["le"]
    if len(moving):
        ax.set_xlim(float(moving.min()) / 3, float(moving.max()) * 3)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("RTT (s, log scale; points at the exported bucket bounds)")
    ax.set_ylabel("fraction of exchanges ≤ RTT")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(tx(f"RTT CDF per path — {resolution}", 400), fontsize=9, wrap=True)
    if order:
        ax.legend(fontsize=7, loc="lower right")
    return png(fig)


def _grid(
    ax: Axes,
    grid: pd.DataFrame,
    title: str,
    norm: Normalize,
    fmt: str,
    cmap: str,
    ylabel: str = "",
    xlabel: str = "",
) -> AxesImage:
    values = grid.to_numpy(dtype=float)
    im = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, norm=norm, aspect="auto")
    ax.set_facecolor("#eeeeee")  # not measured
    ax.set_xticks(range(len(grid.columns)), [tx(c, 24) for c in grid.columns], rotation=60,
                  ha="right", fontsize=7)  # fmt: skip
    ax.set_yticks(range(len(grid.index)), [tx(r, 24) for r in grid.index], fontsize=7)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    if values.size <= 144:  # values written in the cells of a small fleet
        colours = im.cmap(norm(np.nan_to_num(values, nan=0.0)))
        for (i, j), v in np.ndenumerate(values):
            if math.isfinite(v):
                r, g, b = colours[i, j, :3]
                ink = "white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.5 else "black"
                ax.text(j, i, _sig(v) if fmt == "sig" else fmt.format(v), ha="center",
                        va="center", fontsize=7, color=ink)  # fmt: skip
    return im


def _lognorm(*grids: pd.DataFrame) -> Normalize:
    vals = np.concatenate([g.to_numpy(dtype=float).ravel() for g in grids])
    vals = vals[np.isfinite(vals) & (vals > 0)]
    if len(vals) == 0:
        return Normalize(0, 1)
    lo, hi = float(vals.min()), float(vals.max())
    if hi < 2 * lo:  # span at least a factor of 2 (a bucket step): no colour for noise
        mid = math.sqrt(lo * hi)
        lo, hi = mid / math.sqrt(2), mid * math.sqrt(2)
    return LogNorm(lo, hi)


def heatmaps(
    p50: pd.DataFrame, p99: pd.DataFrame, loss: pd.DataFrame, title: str, left_out: int
) -> bytes:
    """src x dst: p50 and p99 RTT (µs, one log colour scale) and loss (%)."""
    n = max(len(p50.index), 1)
    side = min(max(3.5, 0.28 * n + 2), 12)
    fig = Figure(figsize=(3 * side + 1.5, side + 1), layout="constrained")
    axes = fig.subplots(1, 3)
    # each percentile on its own log scale: a p99 tail ms high would flatten the p50 µs
    for ax, grid, what, ylabel in ((axes[0], p50, "p50", "src"), (axes[1], p99, "p99", "")):
        im = _grid(ax, grid * 1e6, f"{what} RTT (µs)", _lognorm(grid * 1e6), "sig", "viridis",
                   ylabel, "dst")  # fmt: skip
        bar = fig.colorbar(im, ax=ax, shrink=0.8, label=f"{what} RTT (µs, log scale)")
        plain = FuncFormatter(lambda v, _: _sig(v))
        bar.ax.yaxis.set_major_formatter(plain)
        # 1-2-5 ticks, the in-between ones labelled unless the scale spans two decades
        lo, hi = bar.ax.get_ylim()
        bar.ax.yaxis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
        bar.ax.yaxis.set_minor_formatter(NullFormatter() if hi > 100 * lo else plain)
    lim = float(np.nanmax(loss.to_numpy(dtype=float))) if loss.notna().to_numpy().any() else 0.0
    im2 = _grid(axes[2], loss * 100, "loss (%)", Normalize(0, max(lim * 100, 1.0)), "{:.1f}",
                "Reds", xlabel="dst")  # fmt: skip
    fig.colorbar(im2, ax=axes[2], shrink=0.8, label="loss (%)")
    more = f" — {left_out} more hosts not shown" if left_out else ""
    fig.suptitle(tx(title, 200) + more, fontsize=10)
    return png(fig)


def waterfalls(frame: pd.DataFrame, order: Sequence[str]) -> bytes:
    """One bar per request (ORDER, slowest first), its stages end to end, in ms."""
    fig = Figure(figsize=(11, max(2.5, 0.45 * len(order) + 1.5)), layout="constrained")
    ax = fig.add_subplot()
    seen: set[str] = set()
    for i, rid in enumerate(order):
        for _, r in frame[frame["request_id"] == rid].iterrows():
            stage = str(r["stage"])
            ax.barh(
                i,
                r["duration_s"] * 1e3,
                left=r["start_s"] * 1e3,
                color=STAGE_COLOURS.get(stage, "#333333"),
                label=stage if stage not in seen else None,
                edgecolor="white",
                linewidth=0.5,
            )
            seen.add(stage)
    ax.set_yticks(range(len(order)), [tx(r, 32) for r in order], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the request's first stage (stages laid end to end)")
    ax.set_title("Slowest requests, stage by stage", fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    ranked = sorted(zip(labels, handles, strict=True), key=lambda lh: STAGES.index(lh[0]))
    if ranked:
        ax.legend([h for _, h in ranked], [lb for lb, _ in ranked], fontsize=7, ncol=6,
                  loc="upper center", bbox_to_anchor=(0.5, -0.18))  # fmt: skip
    ax.grid(True, axis="x", alpha=0.3)
    return png(fig)


def rtt_over_time(series: pd.DataFrame, order: Sequence[tuple[str, str, str]], what: str) -> bytes:
    """RTT over time per path (ORDER, bounded) from Prometheus range queries."""
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    ax = fig.add_subplot()
    groups = {k: g for k, g in series.groupby(["src", "dst", "transport"], sort=False)}
    for key in order:
        g = groups.get(key)
        if g is None:
            continue
        t = pd.to_datetime(g["t"], unit="s")
        ax.plot(t, g["value"] * 1e6, label=tx(f"{key[0]} → {key[1]} {key[2]}", 90))
    ax.set_yscale("log")
    locator = AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))
    ax.set_ylabel(f"{what} RTT (µs)")
    ax.set_xlabel("time (UTC)")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(f"{what} RTT over time per path (Prometheus)", fontsize=10)
    if order:
        ax.legend(fontsize=7, loc="upper left")
    return png(fig)
