"""Queries over the raw window files (collector/rawstore.py) with DuckDB.

`path_summary()` answers the drill-down question behind `probe windows`: over a time
range, per path, how many windows and probes, how much was lost, the exact minimum, the
median of the windows' p50, the worst window's p99 and when it was. `run_sql()` runs any
read-only query with the two tables available as views `windows` and `rates`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pandas as pd

from fabricprobe.collector.rawstore import TABLES


class RawQueryError(ValueError):
    """A query that cannot run: no files, or DuckDB refused it (the message says why)."""


def _connect(directory: str | Path) -> Any:
    import duckdb

    root = Path(directory)
    con = duckdb.connect(":memory:")
    found = False
    for table, columns in TABLES.items():
        files = sorted((root / table).glob("*.parquet"))
        if files:
            found = True
            names = ", ".join("'" + str(f).replace("'", "''") + "'" for f in files)
            con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet([{names}])")
        else:  # an empty view of the right shape, so that queries still run
            cols = ", ".join(f"NULL::VARCHAR AS {c}" for c in columns)
            con.execute(f"CREATE VIEW {table} AS SELECT {cols} WHERE false")
    if not found:
        raise RawQueryError(f"{root}: no raw window files (is the collector's --windows-dir?)")
    # Nothing but the views: no other file, no network, no extensions, from here on.
    con.execute("SET allowed_directories = ?", [[str(root.resolve()) + "/"]])
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def path_summary(
    directory: str | Path,
    since_s: float = 3600.0,
    src: str | None = None,
    dst: str | None = None,
    transport: str | None = None,
    limit: int = 50,
    now_s: float | None = None,
) -> pd.DataFrame:
    """Per path over the last SINCE_S seconds, worst p99 first."""
    con = _connect(directory)
    cutoff = int(((now_s if now_s is not None else time.time()) - since_s) * 1e9)
    where = ["window_end_unix_ns >= ?"]
    args: list[Any] = [cutoff]
    for column, value in (("src", src), ("dst", dst), ("transport", transport)):
        if value:
            where.append(f"{column} = ?")
            args.append(value)
    sql = f"""
        SELECT src, dst, transport, op, size,
               count(*) AS windows,
               sum(count) AS probes,
               sum(lost) AS lost,
               sum(lost) / nullif(sum(count) + sum(lost), 0) AS loss_ratio,
               min(min_ns) AS min_ns,
               median(p50_ns) AS p50_median_ns,
               max(p99_ns) AS p99_worst_ns,
               arg_max(window_end_unix_ns, p99_ns) AS p99_worst_at_ns,
               max(max_ns) AS max_ns,
               max(window_end_unix_ns) AS last_ns
        FROM windows
        WHERE {" AND ".join(where)}
        GROUP BY ALL
        ORDER BY p99_worst_ns DESC NULLS LAST, src, dst
        LIMIT ?
    """
    args.append(int(limit))
    try:
        return con.execute(sql, args).df()
    finally:
        con.close()


def run_sql(directory: str | Path, sql: str, limit: int = 10_000) -> pd.DataFrame:
    """Any query over the views `windows` and `rates`; at most LIMIT rows come back."""
    import duckdb

    con = _connect(directory)
    try:
        rel = con.sql(sql)
        if rel is None:
            raise RawQueryError("the statement returned no rows")
        return rel.limit(limit).df()
    except duckdb.Error as err:
        raise RawQueryError(str(err).splitlines()[0]) from None
    finally:
        con.close()
