"""The report's fabric sections, from the collector's Rtt reply (report/rtt.py): RTT per
path (CDFs and a table at the sketches' resolution), each host's own delay apart from
the paths, src x dst heatmaps and the ToR matrix. Pure: frames in, sections and
pictures out."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

import pandas as pd

from fabricprobe.report import figures, frames, rtt
from fabricprobe.report.page import Picture, Section, esc, number, para, table

MAX_PATHS = 12  # paths (and host references) drawn in one CDF figure
MAX_HOSTS = 40  # hosts per heatmap axis
MAX_CLASSES = 3  # (transport, op, size) heatmaps
HEADS = ["exchanges", "loss", "min µs", "p50 µs", "p90 µs", "p99 µs", "p99.9 µs", "max µs"]


def _us(v: object) -> str:
    f = pd.to_numeric(v, errors="coerce")
    return number(None if pd.isna(f) else float(f) * 1e6, "{:,.1f}")


def _figures(r: dict[str, object]) -> list[str]:
    return [
        number(r.get("exchanges")),
        number(r.get("loss"), "{:.2%}"),
        *(_us(r.get(f)) for f in ("min_s", "p50_s", "p90_s", "p99_s", "p999_s", "max_s")),
    ]


def own_delay_name(row: Mapping[str, object]) -> str:
    """A host reference as what it is: the host's own delay, by the probe that measured it."""
    size = row.get("size", "")
    return (
        f"{frames.clip(row.get('src'), 40)}: own delay ({frames.clip(row.get('transport'), 8)} "
        f"{frames.clip(row.get('op'), 16)}" + (f" {frames.clip(size, 10)} B" if size else "") + ")"
    )


def _since(got: rtt.RttFrames) -> str:
    first = pd.concat([got.paths["since_ns"], got.references["since_ns"]]).dropna()
    if first.empty:
        return ""
    when = datetime.fromtimestamp(float(first.min()) / 1e9, UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f" Figures count every window since the collector first saw each path (the oldest: {when})."
    )


def rtt_sections(got: rtt.RttFrames) -> tuple[list[Section], list[Picture]]:
    """RTT per path and each host's own delay."""
    res = rtt.resolution(got.cdf)
    pics: list[Picture] = []
    parts: list[str] = []
    with_cdf = _with_cdf(got.cdf)
    shown = got.paths[[tuple(k) in with_cdf for k in got.paths[frames.PATH_KEYS].to_numpy()]]
    shown = shown.head(MAX_PATHS)
    if len(shown):
        data, drawn = figures.rtt_cdfs(
            got.cdf, shown.to_dict("records"), "RTT CDF per path (the highest p99 first)", res
        )
        more = max(0, got.paths_total - len(shown))
        pics.append(
            Picture(
                "rtt_cdf.png",
                data,
                "RTT CDF per path",
                f"Paths drawn ({len(drawn)}): "
                + "; ".join(drawn)
                + "."
                + (f" {more} more paths not drawn." if more else ""),
            )
        )
        parts.append(pics[-1].tag())
    else:
        parts.append(para("No path has RTTs yet: no probe window has arrived."))
    rows = [[frames.path_name(r), *_figures(r)] for r in got.paths.to_dict("records")]
    parts.append(table(["path", *HEADS], rows, limit=60))
    left = got.paths_total - len(got.paths)
    parts.append(
        para(
            "From the collector's per-path sketches (Query API, Rtt): count, loss, min and max "
            "exact; percentiles the middle of the bucket that holds the rank, within 0.54 % of "
            "the agents' sketches. A host's probe of its own responder is not a path: it is "
            "listed below as the host's own delay."
            + _since(got)
            + (f" The collector holds {left} more paths than it sent." if left > 0 else "")
        )
    )
    refs = got.references
    ref_parts: list[str] = [
        para(
            "Each agent probes its own responder too. The kernel turns that probe around in the "
            "loopback device: no NIC, no wire, only the host's stack and the scheduling of a "
            "prober and a responder. It is what the host itself adds to the probes it sends "
            "and answers (a path's RTT holds half of each end's), not a path of the fabric."
        )
    ]
    drawn_refs = refs[[tuple(k) in with_cdf for k in refs[frames.PATH_KEYS].to_numpy()]]
    if len(drawn_refs):
        data, _ = figures.rtt_cdfs(
            got.cdf,
            drawn_refs.head(MAX_PATHS).to_dict("records"),
            "Each host's own delay: its probe of its own responder (the highest p99 first)",
            res,
            own_delay_name,
        )
        pics.append(
            Picture(
                "own_delay_cdf.png",
                data,
                "each host's own delay",
                "Hosts drawn: "
                + "; ".join(str(h) for h in drawn_refs.head(MAX_PATHS)["src"])
                + ".",
            )
        )
        ref_parts.append(pics[-1].tag())
    rows = [[frames.clip(r["src"], 60), own_delay_name(r).split(": ", 1)[1], *_figures(r)]
            for r in refs.to_dict("records")]  # fmt: skip
    ref_parts.append(table(["host", "measured by", *HEADS], rows, left=2, limit=200))
    if refs.empty:
        ref_parts.append(para("No host reference reported yet."))
    return [
        Section("RTT per path", parts),
        Section("Each host's own delay (its reference, not a path)", ref_parts),
    ], pics


def _with_cdf(cdf: pd.DataFrame) -> set[tuple[str, ...]]:
    return {tuple(str(v) for v in k) for k in cdf[frames.PATH_KEYS].drop_duplicates().to_numpy()}


def matrix_sections(got: rtt.RttFrames, topo: pd.DataFrame) -> tuple[list[Section], list[Picture]]:
    """src x dst heatmaps per probe kind, and the ToR matrix of the busiest kind."""
    pics: list[Picture] = []
    heat_parts: list[str] = []
    paths = got.paths
    kinds = rtt.classes(paths)
    width = "percentiles within 0.54 % of the agents' sketches"
    for i, (transport, op, size) in enumerate(kinds[:MAX_CLASSES]):
        sub = paths[(paths["transport"] == transport) & (paths["op"] == op)]
        sub = sub[sub["size"] == size]  # the diagonal stays empty: no host reference here
        p50, left = frames.matrix(sub, "p50_s", limit=MAX_HOSTS)
        p99, _ = frames.matrix(sub, "p99_s", limit=MAX_HOSTS)
        lossm, _ = frames.matrix(sub, "loss", limit=MAX_HOSTS)
        title = f"src × dst, {transport} {op}" + (f" {size} B" if size else "")
        pics.append(
            Picture(
                f"heatmap_{i}.png",
                figures.heatmaps(p50, p99, lossm, title, left),
                title,
                f"Grey cells: pair not probed (the diagonal: a host's own delay is shown apart). "
                f"Each panel on its own colour scale; {width}."
                + (f" {left} more hosts not shown." if left else ""),
            )
        )
        heat_parts.append(f"<h3>{esc(title)}</h3>{pics[-1].tag()}")
    if len(kinds) > MAX_CLASSES:
        heat_parts.append(para(f"{len(kinds) - MAX_CLASSES} more probe kinds not shown."))
    if not kinds:
        heat_parts.append(para("No path measured yet."))

    tor_parts: list[str] = []
    if kinds:
        transport, op, size = kinds[0]
        sub = paths[(paths["transport"] == transport) & (paths["op"] == op)]
        tor = rtt.tor_table(frames.with_tor(sub[sub["size"] == size], topo))
        grids = [
            frames.matrix(tor, v, rows="src_tor", cols="dst_tor", limit=MAX_HOSTS)
            for v in ("p50_s", "p99_s", "loss")
        ]
        title = f"ToR × ToR, {transport} {op}" + (f" {size} B" if size else "")
        pics.append(
            Picture(
                "tor_matrix.png",
                figures.heatmaps(grids[0][0], grids[1][0], grids[2][0], title, grids[0][1]),
                title,
                "p50: the median of the host pairs' p50; p99: the worst host pair's p99; loss "
                f"over all their exchanges; {width}. Topology labels from "
                "fabricprobe_host_info; hosts without one under (none).",
            )
        )
        tor_parts.append(pics[-1].tag())
        labels = sorted(set(topo["topology"]) - {""})
        tor_parts.append(
            para(f"{len(topo)} hosts, {len(labels)} topology labels: " + ", ".join(labels[:40]))
        )
    else:
        tor_parts.append(para("No path measured yet."))
    return [Section("Heatmaps: src × dst", heat_parts), Section("ToR matrix", tor_parts)], pics
