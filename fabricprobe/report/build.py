"""`probe report` end to end: gather the sources, build the frames, draw, write the page.

`gather()` does all the I/O; `sections()` turns what was gathered into page sections and
pictures without any; `write()` puts report.html and the PNGs in the output folder.
A source that fails (the Why query, Prometheus) leaves its section saying why; only an
unreadable /metrics ends the report, since every other section leans on it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from fabricprobe.core.deadline import Deadline
from fabricprobe.report import figures, frames
from fabricprobe.report.page import Picture, Section, esc, number, page, para, table
from fabricprobe.report.sources import HttpAuth, SourceError, fetch_metrics, prometheus_range

MAX_PATHS = 12  # paths drawn in one CDF or over-time figure
MAX_HOSTS = 40  # hosts per heatmap axis
MAX_CLASSES = 3  # (transport, op, size) heatmaps
MAX_REQUESTS = 10  # slow requests drawn
RANGE_POINTS = 240  # points per Prometheus series


@dataclass(frozen=True)
class ReportOptions:
    collector: str
    metrics_url: str
    out_dir: Path
    auth: HttpAuth
    window_s: float = 600.0
    prometheus: str = ""
    timeout: float = 30.0
    slowest: int = MAX_REQUESTS


@dataclass(frozen=True)
class Gathered:
    """What the sources answered (an error text where one could not answer)."""

    metrics_text: str
    why: dict[str, Any] | None
    why_error: str
    prom: dict[str, pd.DataFrame] = field(default_factory=dict)
    prom_error: str = ""
    generated: float = 0.0


def rtt_query(q: float, rate_s: float) -> str:
    """The RTT quantile from whichever form the server keeps: the native histogram
    (a server scraping protobuf) or the classic `le` buckets (see grafana/README.md)."""
    return (
        f"histogram_quantile({q}, sum by (src, dst, transport) "
        f"(rate(fabricprobe_rtt_seconds[{rate_s:g}s]))) or "
        f"histogram_quantile({q}, sum by (le, src, dst, transport) "
        f"(rate(fabricprobe_rtt_seconds_bucket[{rate_s:g}s])))"
    )


WhyQuery = Callable[[int, float, float], dict[str, Any]]  # (slowest, window_s, timeout)


def gather(opts: ReportOptions, why_query: WhyQuery) -> Gathered:
    """Read every source; SourceError when /metrics cannot be read. WHY_QUERY asks the
    collector for its Why report (the slowest requests with their paths' figures, as
    `probe why --json` prints it) and raises SourceError when it cannot. All the sources
    share one deadline, opts.timeout: a silent one leaves the others what is left."""
    now = time.time()
    deadline = Deadline(opts.timeout)
    text = fetch_metrics(opts.metrics_url, opts.auth, timeout=deadline)
    why: dict[str, Any] | None = None
    why_error = ""
    try:
        if deadline.expired:
            raise SourceError(f"no time left for the Why query ({opts.timeout:g} s spent)")
        why = why_query(min(opts.slowest, 200), opts.window_s, deadline.remaining())
    except SourceError as e:
        why_error = str(e)
    prom: dict[str, pd.DataFrame] = {}
    prom_error = ""
    if opts.prometheus:
        step = max(1.0, round(opts.window_s / RANGE_POINTS))
        rate_s = max(4 * step, 5.0)  # several scrapes per rate() even at a short interval
        try:
            for what, q in (("p50", 0.5), ("p99", 0.99)):
                result = prometheus_range(
                    opts.prometheus,
                    rtt_query(q, rate_s),
                    start=now - opts.window_s,
                    end=now,
                    step=step,
                    auth=opts.auth,
                    timeout=deadline,
                )
                prom[what] = frames.range_frame(result)
        except SourceError as e:
            prom_error = str(e)
    return Gathered(text, why, why_error, prom, prom_error, now)


def _path_rows(table_: pd.DataFrame) -> list[list[str]]:
    return [
        [
            frames.path_name(r),
            number(r.get("exchanges")),
            number(r.get("p50_s") * 1e6 if pd.notna(r.get("p50_s")) else None, "{:,.1f}"),
            number(r.get("p99_s") * 1e6 if pd.notna(r.get("p99_s")) else None, "{:,.1f}"),
            number(r.get("loss"), "{:.2%}"),
        ]
        for r in table_.to_dict("records")
    ]


def fabric_sections(expo: frames.Exposition) -> tuple[list[Section], list[Picture]]:
    """RTT CDFs, src x dst heatmaps, the ToR matrix and the path table."""
    pics: list[Picture] = []
    buckets = frames.rtt_buckets(expo)
    resolution = frames.bucket_resolution(buckets)
    loss = frames.path_loss(expo)
    paths = frames.path_table(buckets, loss)
    cdf = frames.rtt_cdf(buckets)
    measured = paths[paths["exchanges"].fillna(0) > 0]
    order = [tuple(str(v) for v in k) for k in measured[frames.PATH_KEYS].to_numpy()]
    shown, more = order[:MAX_PATHS], max(0, len(order) - MAX_PATHS)
    cdf_parts = []
    if shown:
        pics.append(
            Picture(
                "rtt_cdf.png",
                figures.rtt_cdfs(cdf, shown, resolution),
                "RTT CDF per path",
                f"Slowest p99 first. {resolution}."
                + (f" {more} more paths not shown." if more else ""),
            )
        )
        cdf_parts.append(pics[-1].tag())
    else:
        cdf_parts.append(para("No RTT histogram exported yet: no probe window has arrived."))
    cdf_parts.append(
        table(["path", "exchanges", "p50 µs", "p99 µs", "loss"], _path_rows(paths), limit=60)
    )
    cdf_parts.append(
        para(
            "p50 and p99 are read from the buckets as Prometheus' histogram_quantile() reads "
            "them (linear inside a bucket); loss is lost over attempted exchanges since the "
            "collector started."
        )
    )

    heat_parts: list[str] = []
    classes = frames.path_classes(paths)
    for i, (transport, op, size) in enumerate(classes[:MAX_CLASSES]):
        sub = paths[(paths["transport"] == transport) & (paths["op"] == op)]
        # a host's path to itself is its reference (no NIC, no wire): not a cell of the
        # fabric's matrix, which keeps its diagonal empty
        sub = sub[(sub["size"] == size) & (sub["src"] != sub["dst"])]
        p50, left = frames.matrix(sub, "p50_s", limit=MAX_HOSTS)
        p99, _ = frames.matrix(sub, "p99_s", limit=MAX_HOSTS)
        lossm, _ = frames.matrix(sub, "loss", limit=MAX_HOSTS)
        title = f"src × dst, {transport} {op} {size} B"
        pics.append(
            Picture(
                f"heatmap_{i}.png",
                figures.heatmaps(p50, p99, lossm, title, left),
                title,
                "Grey cells: pair not probed. Colours rank the cells of each panel on its own"
                " scale; the bucket resolution above bounds what a difference means."
                + (f" {left} more hosts not shown." if left else ""),
            )
        )
        heat_parts.append(f"<h3>{esc(title)}</h3>{pics[-1].tag()}")
    if len(classes) > MAX_CLASSES:
        heat_parts.append(para(f"{len(classes) - MAX_CLASSES} more probe kinds not shown."))
    if not classes:
        heat_parts.append(para("No path measured yet."))

    tor_parts: list[str] = []
    topo = frames.host_topology(expo)
    if classes and not buckets.empty:
        transport, op, size = classes[0]
        tb = frames.with_tor(buckets[buckets["src"] != buckets["dst"]], topo)
        tb = tb[(tb["transport"] == transport) & (tb["op"] == op) & (tb["size"] == size)]
        tq = frames.path_quantiles(tb, keys=("src_tor", "dst_tor"))
        tl = frames.with_tor(loss[loss["src"] != loss["dst"]], topo)
        tl = tl[(tl["transport"] == transport) & (tl["op"] == op) & (tl["size"] == size)]
        tl = tl.groupby(["src_tor", "dst_tor"], as_index=False)[["exchanges_total", "lost_total"]]
        tl = tl.sum()
        tl["loss"] = tl["lost_total"] / tl["exchanges_total"].where(tl["exchanges_total"] > 0)
        tor = tq.merge(tl, on=["src_tor", "dst_tor"], how="outer")
        grids = [
            frames.matrix(tor, v, rows="src_tor", cols="dst_tor", limit=MAX_HOSTS)
            for v in ("p50_s", "p99_s", "loss")
        ]
        title = f"ToR × ToR, {transport} {op} {size} B (buckets of every host pair merged)"
        pics.append(
            Picture(
                "tor_matrix.png",
                figures.heatmaps(grids[0][0], grids[1][0], grids[2][0], title, grids[0][1]),
                title,
                "Topology labels from fabricprobe_host_info; hosts without one under (none).",
            )
        )
        tor_parts.append(pics[-1].tag())
        labels = sorted(set(topo["topology"]) - {""})
        tor_parts.append(
            para(f"{len(topo)} hosts, {len(labels)} topology labels: " + ", ".join(labels[:40]))
        )
    else:
        tor_parts.append(para("No path measured yet."))
    return [
        Section("RTT per path", cdf_parts),
        Section("Heatmaps: src × dst", heat_parts),
        Section("ToR matrix", tor_parts),
    ], pics


def requests_section(g: Gathered) -> tuple[Section, list[Picture]]:
    title = "Slowest requests, stage by stage, with their path's fabric at the time"
    if g.why is None:
        return Section(title, [para(f"Why query failed: {g.why_error}", "error")]), []
    slow, more = frames.slowest_frame(g.why.get("slowest") or [], MAX_REQUESTS)
    if slow.empty:
        return Section(title, [para("No request reported in the window.")]), []
    wf = frames.waterfall(slow)
    order = list(slow["request_id"])
    pic = Picture(
        "waterfall.png",
        figures.waterfalls(wf, order),
        "stage waterfalls of the slowest requests",
        "Stage durations from the requests' spans, laid end to end in pipeline order."
        + (f" {more} more requests not shown." if more else ""),
    )
    parts = [pic.tag()]
    for r in slow.to_dict("records"):
        path = f"{r['src']} → {r['dst']} {r['transport']}".strip() if r.get("src") else "no KV path"
        stages = [
            [s, number(r.get(f"{s}_s", float("nan")) * 1e3, "{:,.2f}")]
            for s in frames.STAGES
            if pd.notna(r.get(f"{s}_s"))
        ]
        stages += [
            [k, number(r.get(f"{k}_s", float("nan")) * 1e3, "{:,.2f}")]
            for k in ("ttft", "itl", "e2e")
        ]
        figs, absent = frames.fabric_figures(r), "not measured"
        parts.append(
            '<div class="request">'
            f"<h3>request {esc(r['request_id'], 80)}</h3><p>{esc(path, 120)}</p>"
            + table(["stage", "ms"], stages)
            + table(["KV wait in three parts", "value"], frames.kv_parts(r))
            + table(["fabric at the time", "value"], [f for f in figs if f[1] != absent])
            + (
                para("not measured: " + ", ".join(n for n, v in figs if v == absent))
                if any(v == absent for _, v in figs)
                else ""
            )
            + "</div>"
        )
    return Section(title, parts), [pic]


def hosts_sections(expo: frames.Exposition) -> list[Section]:
    counters = frames.host_counters(expo)
    rows = [
        [
            r["src"],
            {1.0: "up", 0.0: "stale"}.get(r["up"], "-"),
            number(r["pfc_pause_frames"]),
            number(r["pfc_pause_s"], "{:,.3f}"),
            number(r["ecn_marks"]),
            number(r["cnp"]),
            number(r["retransmits"]),
            number(r["discards"]),
        ]
        for r in counters.to_dict("records")
    ]
    heads = ["host", "state", "PFC pause frames", "PFC pause s", "ECN marks", "CNPs",
             "retransmits", "discards"]  # fmt: skip
    parts = [
        table(heads, rows, left=2, limit=200),
        para(
            "Totals since each agent started counting; '-' where the host exports no such "
            "counter (no ethtool, no RDMA device), which is not the same as zero."
        ),
    ]
    verdicts = frames.host_verdicts(expo)
    if verdicts.empty:
        vparts = [para("No verdicts reported: the collector exports no validate results.")]
    else:
        vrows = [[r["src"], r["check"], r["verdict"], number(r["value"], "{:g}")]
                 for r in verdicts.to_dict("records")]  # fmt: skip
        vparts = [table(["host", "check", "verdict", "value"], vrows, left=3, limit=500)]
    return [Section("Counters per host", parts), Section("Validate verdicts per host", vparts)]


def over_time_section(g: Gathered, opts: ReportOptions) -> tuple[Section | None, list[Picture]]:
    if not opts.prometheus:
        return None, []
    title = "RTT over time (Prometheus)"
    if g.prom_error:
        return Section(title, [para(f"Prometheus query failed: {g.prom_error}", "error")]), []
    pics, parts = [], []
    for what, df in g.prom.items():
        if df.empty:
            parts.append(para(f"No {what} RTT series in the window."))
            continue
        last = df.sort_values("t").groupby(["src", "dst", "transport"])["value"].last()
        keys = [(str(s), str(d), str(t)) for s, d, t in last.sort_values(ascending=False).index]
        more = max(0, len(keys) - MAX_PATHS)
        pic = Picture(
            f"rtt_{what}_over_time.png",
            figures.rtt_over_time(df, keys[:MAX_PATHS], what),
            f"{what} RTT over time",
            "histogram_quantile over rate() of the RTT buckets; highest now first."
            + (f" {more} more paths not shown." if more else ""),
        )
        pics.append(pic)
        parts.append(pic.tag())
    return Section(title, parts), pics


def sections(g: Gathered, opts: ReportOptions) -> tuple[list[Section], list[Picture], int]:
    """The page's sections and pictures; and how many /metrics lines could not be read."""
    expo = frames.parse_exposition(g.metrics_text)
    fabric, pics = fabric_sections(expo)
    req, req_pics = requests_section(g)
    timed, timed_pics = over_time_section(g, opts)
    out = [*([timed] if timed else []), *fabric, req, *hosts_sections(expo)]
    return out, [*timed_pics, *pics, *req_pics], expo.dropped


def write(g: Gathered, opts: ReportOptions) -> Path:
    """report.html and its PNGs in opts.out_dir; the page's path."""
    secs, pics, dropped = sections(g, opts)
    when = datetime.fromtimestamp(g.generated, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    meta = [
        ("generated", when),
        ("collector", opts.collector),
        ("metrics", opts.metrics_url),
        ("prometheus", opts.prometheus or "not asked"),
        ("window", f"{opts.window_s:g} s"),
    ]
    if dropped:
        meta.append(("unreadable", f"{dropped} /metrics lines skipped"))
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    for p in pics:
        (opts.out_dir / p.file).write_bytes(p.data)
    out = opts.out_dir / "report.html"
    out.write_text(page("fabricprobe report", meta, secs), encoding="utf-8")
    return out
