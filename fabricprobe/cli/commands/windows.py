"""`probe windows`: drill down into the raw per-path windows a collector keeps as Parquet."""

from __future__ import annotations

import math
import re
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from fabricprobe.cli.options import EXISTING_DIR, fail, print_json, shown_option

DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """`90s`, `15m`, `6h`, `7d` -> seconds."""
    m = DURATION.match(text.strip())
    if not m or float(m.group(1)) <= 0:
        raise click.BadParameter(f"{text!r}: expected a duration such as 15m, 6h or 7d")
    return float(m.group(1)) * SECONDS[m.group(2)]


def _us(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{float(v) / 1e3:,.1f}"


def summary_table(rows: list[dict[str, Any]], since: str) -> Table:
    t = Table(title=f"Paths over the last {since}, worst window p99 first (RTT in µs)")
    for c in ("path", "op", "size", "windows", "probes", "loss", "min", "p50 (median)",
              "p99 (worst)", "max"):  # fmt: skip
        t.add_column(c, justify="left" if c in ("path", "op") else "right", no_wrap=c == "path")
    for r in rows:
        loss = r.get("loss_ratio")
        t.add_row(
            f"{r['src']}->{r['dst']} {r['transport']}",
            str(r["op"]),
            f"{int(r['size']):,}",
            f"{int(r['windows']):,}",
            f"{int(r['probes'] or 0):,}",
            "-" if loss is None or math.isnan(loss) else f"{loss:.2%}",
            _us(r.get("min_ns")),
            _us(r.get("p50_median_ns")),
            _us(r.get("p99_worst_ns")),
            _us(r.get("max_ns")),
        )
    return t


@click.command(
    epilog="""\b
Examples:
  probe windows --dir /var/lib/fabricprobe-collector/windows --since 6h
  probe windows --dir DIR --src gpu-a12-3 --transport rdma --json
  probe windows --dir DIR --sql "SELECT src, dst, max(p99_ns) FROM windows GROUP BY ALL"
  probe windows --dir DIR --sql "SELECT * FROM rates WHERE name = 'rx_prio3_pause'" """,
)
@click.option(
    "--dir", "directory", required=True, type=EXISTING_DIR, help="The collector's --windows-dir."
)
@click.option("--since", default="1h", show_default=True, help="Time range, e.g. 15m, 6h, 7d.")
@click.option("--src", help="Only paths from this host.")
@click.option("--dst", help="Only paths to this host.")
@click.option("--transport", type=click.Choice(["rdma", "tcp"]), help="Only this transport.")
@shown_option("--limit", click.IntRange(1, 100_000), 50)
@click.option("--sql", help="Run this query instead (views: windows, rates).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def windows(
    directory: str,
    since: str,
    src: str | None,
    dst: str | None,
    transport: str | None,
    limit: int,
    sql: str | None,
    as_json: bool,
) -> None:
    """Summarise or query the raw windows a collector keeps (`probe collector --windows-dir`).

    Without --sql: one line per path over the time range, worst window p99 first, with
    windows, probes, loss, the exact minimum, the median of the windows' p50 and the
    worst p99 and maximum. With --sql: any DuckDB query over the views `windows` (one row
    per path window) and `rates` (one row per counter rate).
    """
    from fabricprobe.collector.rawquery import RawQueryError, path_summary, run_sql

    try:
        seconds = parse_duration(since)
        if sql:
            frame = run_sql(directory, sql, limit=limit)
        else:
            frame = path_summary(directory, seconds, src, dst, transport, limit=limit)
    except click.BadParameter as e:
        fail(f"--since: {e.message}")
    except RawQueryError as e:
        fail(str(e), 1)
    rows = frame.astype(object).where(frame.notna(), None).to_dict("records")
    if as_json:
        print_json(rows)
        return
    console = Console()
    if sql:
        t = Table(title=f"{len(rows)} rows")
        for c in frame.columns:
            t.add_column(str(c))
        for r in rows:
            t.add_row(*("-" if v is None else str(v) for v in r.values()))
        console.print(t)
    elif not rows:
        console.print(f"no windows in the last {since} match")
    else:
        console.print(summary_table(rows, since))
