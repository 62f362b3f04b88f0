"""The report's pictures: frames from report.frames in, PNG bytes out (matplotlib, Agg).

Figures are made with matplotlib's object API (no pyplot state), so drawing needs no
display and is safe to repeat. Every label reaches matplotlib through `tx()`, which
bounds it and escapes `$` (else a host name could switch on mathtext and fail the draw).
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Mapping, Sequence

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
from fabricprobe.report.rtt import cdf_quantile

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


def _us(s: float) -> str:
    return "-" if not math.isfinite(s) else f"{_sig(s * 1e6)} µs"


def rtt_cdfs(
    cdf: pd.DataFrame,
    order: Sequence[Mapping[str, object]],
    title: str,
    resolution: str,
    label: Callable[[Mapping[str, object]], str] = path_name,
) -> tuple[bytes, list[str]]:
    """One line per path of ORDER (rows with PATH_KEYS, min_s and max_s; already bounded)
    through its CDF buckets' upper bounds: the CDF on the left, its tail (the fraction of
    exchanges above each RTT, log scale) on the right. Each legend entry has the p50 and
    p99 read off the line drawn. The PNG and the names of the lines drawn."""
    fig = Figure(figsize=(12, 5 + 0.16 * ((len(order) + 1) // 2)), layout="constrained")
    ax, tail = fig.subplots(1, 2)
    groups = {k: g for k, g in cdf.groupby(PATH_KEYS, sort=False)}
    labels: list[str] = []
    floor, lo_x, hi_x = 1.0, math.inf, 0.0
    for i, row in enumerate(order):
        g = groups.get(tuple(str(row.get(k, "")) for k in PATH_KEYS))
        if g is None:
            continue
        lo, hi = (float(pd.to_numeric(row.get(k), errors="coerce")) for k in ("min_s", "max_s"))
        p50, p99 = (cdf_quantile(g, q, lo, hi) for q in (0.5, 0.99))
        labels.append(label(row))
        name = tx(f"{labels[-1]}: p50 {_us(p50)}, p99 {_us(p99)}", 110)
        # microseconds: the first bucket's lower bound at the fraction below it, then
        # each bucket's upper bound at the fraction at or below it
        x = np.concatenate([[g["lower_s"].iloc[0]], g["upper_s"].to_numpy()]) * 1e6
        y = np.concatenate([[(g["cumulative"].iloc[0] - g["count"].iloc[0]) / g["total"].iloc[0]],
                            g["fraction"].to_numpy()])  # fmt: skip
        style = {"color": f"C{i % 10}", "linestyle": "-" if i < 10 else "--", "linewidth": 1.2}
        ax.plot(x, y, label=name, **style)
        above = 1.0 - y
        keep = above > 0
        tail.plot(x[keep], above[keep], **style)
        if keep.any():
            floor = min(floor, float(above[keep].min()))
        lo_x, hi_x = min(lo_x, float(x.min())), max(hi_x, float(x.max()))
    plain = FuncFormatter(lambda v, _: _sig(v))
    for a in (ax, tail):
        a.set_xscale("log")
        a.set_xlabel("RTT (µs, log scale)")
        a.grid(True, which="both", alpha=0.3)
        a.xaxis.set_major_formatter(plain)
        a.xaxis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
        # the 2s and 5s labelled too unless the lines span two decades
        a.xaxis.set_minor_formatter(NullFormatter() if hi_x > 100 * lo_x else plain)
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("fraction of exchanges ≤ RTT")
    ax.set_title("CDF", fontsize=9)
    tail.set_yscale("log")
    tail.set_ylim(max(min(floor, 1e-3) / 2, 1e-7), 1.2)
    tail.set_ylabel("fraction of exchanges > RTT (log scale)")
    tail.set_title("tail: each line crosses p50, p90, p99, p99.9 at the dotted lines", fontsize=9)
    for q, what in ((0.5, "p50"), (0.1, "p90"), (0.01, "p99"), (0.001, "p99.9")):
        tail.axhline(q, color="#999999", linewidth=0.6, linestyle=":")
        tail.annotate(what, (0.01, q), xycoords=("axes fraction", "data"), fontsize=7,
                      color="#666666", ha="left", va="bottom")  # fmt: skip
    fig.suptitle(tx(title, 200) + "\n" + tx(resolution, 400), fontsize=9)
    if labels:
        fig.legend(fontsize=7, loc="outside lower center", ncols=2, frameon=False)
    return png(fig), labels


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
    if hi < 2 * lo:  # span at least a factor of 2: colour for what matters, not for noise
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
        fig.legend([h for _, h in ranked], [lb for lb, _ in ranked], fontsize=7, ncols=6,
                   loc="outside lower center", frameon=False)  # fmt: skip
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


def leaf_spine(
    leaves: Sequence[str],
    spines: Sequence[str],
    cables: Mapping[tuple[str, str], Sequence[Mapping[str, object]]],
    hosts_of: Mapping[str, Sequence[str]],
) -> bytes:
    """The leaf-spine: SPINES on top, LEAVES below (each with its HOSTS_OF), a line per
    cable (leaf, spine) in CABLES, which holds the verdicts of its two directions; a
    cable with a suspect direction is red and labelled with its rise and loss, the others
    grey, darker as more of their classes went bad."""
    width = max(8.0, 0.9 * max(len(leaves), len(spines)) + 2)
    fig = Figure(figsize=(min(width, 30.0), 5.5), layout="constrained")
    ax = fig.add_subplot()

    def xs(names: Sequence[str]) -> dict[str, float]:
        n = len(names)
        return {name: (i + 0.5) / n for i, name in enumerate(names)}

    lx, sx = xs(leaves), xs(spines)
    suspects = 0
    for (leaf, spine), ways in cables.items():
        if leaf not in lx or spine not in sx:
            continue
        x0, x1 = lx[leaf], sx[spine]
        bad = [w for w in ways if w.get("suspect")]
        share = max(
            (float(w["bad_classes"]) / float(w["classes"]) for w in ways if w.get("classes")),  # type: ignore[arg-type]
            default=0.0,
        )
        if bad:
            suspects += len(bad)
            ax.plot([x0, x1], [0, 1], color="#d62728", linewidth=3.5, zorder=3)
            note = "\n".join(
                f"{w['link']}: +{float(w['rtt_rise_s']) * 1e3:,.2f} ms, "  # type: ignore[arg-type]
                f"{float(w['loss']) * 100:.1f} % loss"  # type: ignore[arg-type]
                for w in bad
            )
            ax.annotate(tx(note, 200), ((x0 + x1) / 2, 0.5), fontsize=7, color="#d62728",
                        ha="center", va="center", zorder=5,
                        bbox={"boxstyle": "round", "fc": "white", "ec": "#d62728"})  # fmt: skip
        else:
            grey = 0.8 - 0.6 * min(1.0, share)
            ax.plot([x0, x1], [0, 1], color=(grey, grey, grey), linewidth=1.0, zorder=1)
    for names, pos, y in ((spines, sx, 1.0), (leaves, lx, 0.0)):
        for name in names:
            ax.text(pos[name], y, tx(name, 16), ha="center", va="center", fontsize=8, zorder=4,
                    bbox={"boxstyle": "round", "fc": "#eeeeee", "ec": "#555555"})  # fmt: skip
    for leaf in leaves:
        hs = list(hosts_of.get(leaf, ()))
        if hs:
            more = f" +{len(hs) - 4}" if len(hs) > 4 else ""
            shown = ", ".join(tx(h, 16) for h in hs[:4]) + more
            ax.text(lx[leaf], -0.12, shown, ha="center", va="top", fontsize=6, color="#555555")
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.3, 1.15)
    ax.axis("off")
    ax.set_title(f"Leaf–spine links: {suspects} suspect" + (" (red)" if suspects else ""),
                 fontsize=10)  # fmt: skip
    return png(fig)
