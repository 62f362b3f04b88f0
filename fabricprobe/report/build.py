"""`probe report` end to end: gather the sources, build the frames, draw, write the page.

`gather()` does all the I/O; `sections()` turns what was gathered into page sections and
pictures without any; `write()` puts report.html, the PNGs and the CDFs' data
(rtt_cdf.csv) in the output folder. The paths' RTT figures come from the collector's
sketches (the Rtt query), the slow requests from its Why query, the hosts' labels and
counters from /metrics, and with --prometheus the RTT over time. A query that fails
(Rtt, Why, Prometheus) leaves its sections saying why; only an unreadable /metrics ends
the report.
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
from fabricprobe.report import figures, frames, rtt
from fabricprobe.report.links import links_section
from fabricprobe.report.page import Picture, Section, esc, number, page, para, table
from fabricprobe.report.paths import MAX_HOSTS, MAX_PATHS, matrix_sections, rtt_sections
from fabricprobe.report.sources import HttpAuth, SourceError, fetch_metrics, prometheus_range

MAX_REQUESTS = 10  # slow requests drawn
RANGE_POINTS = 240  # points per Prometheus series
# what the report asks the Rtt query for: every path a heatmap can show, and the CDFs of
# more paths and host references than it draws (rtt_cdf.csv has them all), at the
# collector's full resolution (collector/rttquery.py bounds: 2,000, 100, 1,024)
RTT_PATHS = MAX_HOSTS * (MAX_HOSTS - 1)
RTT_CDF_PATHS = 40
RTT_BUCKETS = 1024


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
    rtt: dict[str, Any] | None = None  # the Rtt reply (report.sources.rtt_dict)
    rtt_error: str = ""
    links: dict[str, Any] | None = None  # the Links query's, as `probe why --links` gives
    links_error: str = ""


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
RttQuery = Callable[[float], dict[str, Any]]  # (timeout)
# (the slowest requests, as the Why query gives them; timeout)
LinksQuery = Callable[[list[dict[str, Any]], float], dict[str, Any]]


def gather(
    opts: ReportOptions,
    why_query: WhyQuery,
    paths_query: RttQuery | None = None,
    links_query: LinksQuery | None = None,
) -> Gathered:
    """Read every source; SourceError when /metrics cannot be read. PATHS_QUERY asks the
    collector for every path's RTT distribution (the Rtt query, as report.sources.rtt_dict
    gives it), WHY_QUERY for its Why report (the slowest requests with their paths'
    figures, as `probe why --json` prints it), LINKS_QUERY for its links ranked and the
    slowest requests' links (as `probe why --links --json`); each raises SourceError when
    it cannot.
    All the sources share one deadline, opts.timeout: a silent one leaves the others
    what is left."""
    now = time.time()
    deadline = Deadline(opts.timeout)
    text = fetch_metrics(opts.metrics_url, opts.auth, timeout=deadline)
    got_rtt, rtt_error = _ask("Rtt", paths_query, deadline, opts.timeout)
    why, why_error = _ask(
        "Why",
        lambda left: why_query(min(opts.slowest, 200), opts.window_s, left),
        deadline,
        opts.timeout,
    )
    links, links_error = _ask(
        "Links",
        None
        if links_query is None
        else lambda left: links_query(list((why or {}).get("slowest") or []), left),
        deadline,
        opts.timeout,
    )
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
    return Gathered(
        text, why, why_error, prom, prom_error, now, got_rtt, rtt_error, links, links_error
    )


def _ask(
    name: str, query: Callable[[float], dict[str, Any]] | None, deadline: Deadline, spent: float
) -> tuple[dict[str, Any] | None, str]:
    """QUERY's answer within what is left of DEADLINE, or None and why not ("not asked"
    without one; SPENT: the whole timeout, for the message)."""
    if query is None:
        return None, "not asked"
    try:
        if deadline.expired:
            raise SourceError(f"no time left for the {name} query ({spent:g} s spent)")
        return query(deadline.remaining()), ""
    except SourceError as e:
        return None, str(e)


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
        "Stage durations from the requests' spans (as finely as the engines time them), "
        "laid end to end in pipeline order."
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
    for what, series in g.prom.items():
        df = series[series["src"] != series["dst"]]  # a host's own delay is not a path
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
            "Prometheus' histogram_quantile over rate(), a point every "
            f"{max(1.0, round(opts.window_s / RANGE_POINTS)):g} s; highest now first. As fine "
            "as the histogram Prometheus keeps: 1.09 % where it scrapes the native one "
            "(protobuf), a factor of 2.5 from the classic buckets. Each host's own delay "
            "(src = dst) is left out, as everywhere among the paths. Paths drawn: "
            + "; ".join(f"{s} → {d} {t}" for s, d, t in keys[:MAX_PATHS])
            + "."
            + (f" {more} more paths not shown." if more else ""),
        )
        pics.append(pic)
        parts.append(pic.tag())
    return Section(title, parts), pics


def sections(g: Gathered, opts: ReportOptions) -> tuple[list[Section], list[Picture], int]:
    """The page's sections and pictures; and how many /metrics lines could not be read."""
    expo = frames.parse_exposition(g.metrics_text)
    fabric, pics = fabric_sections(g, expo)
    req, req_pics = requests_section(g)
    hosts = frames.host_topology(expo)["src"]
    fab, fab_pics = links_section(g.links, g.links_error, hosts)
    timed, timed_pics = over_time_section(g, opts)
    out = [*fabric[:2], req, *fabric[2:], fab, *([timed] if timed else []), *hosts_sections(expo)]
    return out, [*pics, *req_pics, *fab_pics, *timed_pics], expo.dropped


def fabric_sections(g: Gathered, expo: frames.Exposition) -> tuple[list[Section], list[Picture]]:
    """RTT per path, each host's own delay, the heatmaps and the ToR matrix (four
    sections, saying why when the Rtt query failed)."""
    if g.rtt is None:
        failed = para(f"Rtt query failed: {g.rtt_error}", "error")
        titles = ("RTT per path", "Each host's own delay (its reference, not a path)",
                  "Heatmaps: src × dst", "ToR matrix")  # fmt: skip
        return [Section(t, [failed]) for t in titles], []
    got = rtt.rtt_frames(g.rtt)
    secs, pics = rtt_sections(got)
    more, more_pics = matrix_sections(got, frames.host_topology(expo))
    return [*secs, *more], [*pics, *more_pics]


def cdf_csv(g: Gathered) -> str:
    """The CDFs of the Rtt reply as CSV: one row per bucket of each path and host
    reference that came with one (host_reference true for a host's own delay)."""
    cdf = rtt.rtt_frames(g.rtt).cdf if g.rtt is not None else pd.DataFrame()
    if cdf.empty:
        return ",".join(["host_reference", *rtt.CDF_COLUMNS]) + "\n"
    cdf = cdf.assign(host_reference=cdf["src"] == cdf["dst"])
    return cdf[["host_reference", *rtt.CDF_COLUMNS]].to_csv(index=False, float_format="%.9g")


def write(g: Gathered, opts: ReportOptions) -> Path:
    """report.html and its PNGs in opts.out_dir; the page's path."""
    secs, pics, dropped = sections(g, opts)
    when = datetime.fromtimestamp(g.generated, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    meta = [
        ("generated", when),
        ("collector", opts.collector),
        ("metrics", opts.metrics_url),
        (
            "RTT figures",
            "the collector's sketches (Query API, Rtt), since each path's first window",
        ),
        ("prometheus", opts.prometheus or "not asked (used only for RTT over time)"),
        ("window", f"{opts.window_s:g} s"),
    ]
    if dropped:
        meta.append(("unreadable", f"{dropped} /metrics lines skipped"))
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    for p in pics:
        (opts.out_dir / p.file).write_bytes(p.data)
    (opts.out_dir / "rtt_cdf.csv").write_text(cdf_csv(g), encoding="utf-8")
    out = opts.out_dir / "report.html"
    out.write_text(page("fabricprobe report", meta, secs), encoding="utf-8")
    return out
