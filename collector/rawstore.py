"""Raw per-path windows kept outside Prometheus, as Parquet files for DuckDB or pandas.

Every window the store merges becomes one row (path, window end, count, lost, exact min
and max, mean and the p50/p90/p99/p99.9 of its sketch), and every counter rate one row
of a second table. Prometheus keeps the bounded series; these files keep every path at
full detail for drill-down (`probe windows`).

- `RawWindowWriter` listens to the WindowStore. The listener only appends to a bounded
  in-memory buffer (it runs under the store's lock); a thread writes the buffer out every
  `flush_s` seconds. A full buffer drops the oldest rows and counts them.
- Files: DIR/windows/YYYYMMDDTHH[-N].parquet and DIR/rates/…, one file per flush, named
  by the hour the rows were written in (`-N` when the hour already has files). Each file
  is complete when it appears (written to a temporary name, then renamed).
- A disk budget: after each flush the oldest files go until the directory is under
  `max_bytes`; the bytes removed are counted. Files older than `max_age_s` go too.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fabricprobe.core.sketchwire import MergedSketch

log = logging.getLogger("fabricprobe.collector.rawstore")

PERCENTILES = (50.0, 90.0, 99.0, 99.9)
WINDOW_COLUMNS = (
    "window_end_unix_ns",
    "src",
    "dst",
    "transport",
    "op",
    "size",
    "count",
    "lost",
    "min_ns",
    "mean_ns",
    "p50_ns",
    "p90_ns",
    "p99_ns",
    "p999_ns",
    "max_ns",
)
RATE_COLUMNS = (
    "window_end_unix_ns",
    "src",
    "kind",
    "device",
    "port",
    "netdev",
    "priority",
    "name",
    "per_second",
)
TABLES = {"windows": WINDOW_COLUMNS, "rates": RATE_COLUMNS}
MAX_LABEL = 256  # label values longer than this are cut (the store bounds them as well)


@dataclass(frozen=True)
class RawStoreConfig:
    directory: str
    max_bytes: int = 1 << 30  # disk budget for both tables together
    max_age_s: float = 7 * 86400.0
    flush_s: float = 30.0
    max_rows: int = 200_000  # buffered rows (both tables) before the oldest are dropped


def window_row(end_ns: int, key: tuple[str, str, str, str, int], sk: MergedSketch) -> tuple:
    """One Parquet row of a merged window."""
    src, dst, transport, op, size = key
    pcts = sk.percentiles_ns(PERCENTILES) if sk.count else [None] * len(PERCENTILES)
    mean = sk.sum_ns / sk.count if sk.count else None
    return (
        end_ns,
        src[:MAX_LABEL],
        dst[:MAX_LABEL],
        transport[:MAX_LABEL],
        op[:MAX_LABEL],
        size,
        sk.count,
        sk.lost,
        sk.min_ns,
        mean,
        *pcts,
        sk.max_ns,
    )


def rate_row(end_ns: int, key: tuple[Any, ...], rate: float) -> tuple:
    """One Parquet row of a counter rate (CounterKey: src, kind, device, port, netdev,
    priority, name)."""
    src, kind, device, port, netdev, priority, name = key
    return (
        end_ns,
        str(src)[:MAX_LABEL],
        str(kind)[:MAX_LABEL],
        str(device)[:MAX_LABEL],
        int(port),
        str(netdev)[:MAX_LABEL],
        int(priority),
        str(name)[:MAX_LABEL],
        float(rate),
    )


class RawWindowWriter:
    """A WindowStore listener that keeps every window and rate in rotated Parquet files."""

    def __init__(self, cfg: RawStoreConfig, clock: Any = time.time) -> None:
        self.cfg = cfg
        self.root = Path(cfg.directory)
        self.clock = clock
        self._lock = threading.Lock()
        self._rows: dict[str, deque[tuple]] = {t: deque() for t in TABLES}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.rows_written = 0
        self.rows_dropped = 0
        self.files_removed = 0
        self.bytes_removed = 0
        self.write_errors = 0
        for table in TABLES:
            (self.root / table).mkdir(parents=True, exist_ok=True)

    # -- the listener (under the store's lock: append only) --------------------------------

    def report_taken(
        self,
        end_ns: int,
        windows: list[tuple[Any, MergedSketch]],
        rates: list[tuple[Any, float]],
        prober_delays: Mapping[Any, MergedSketch] | None = None,  # not kept in raw rows
    ) -> None:
        rows = [window_row(end_ns, k, sk) for k, sk in windows]
        rate_rows = [rate_row(end_ns, k, r) for k, r in rates]
        with self._lock:
            self._rows["windows"].extend(rows)
            self._rows["rates"].extend(rate_rows)
            over = sum(len(q) for q in self._rows.values()) - self.cfg.max_rows
            for q in self._rows.values():
                while over > 0 and q:
                    q.popleft()
                    over -= 1
                    self.rows_dropped += 1

    # -- writing ------------------------------------------------------------------------

    def flush(self) -> int:
        """Write what is buffered (one file per table with rows); returns rows written."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        with self._lock:
            taken = {t: list(q) for t, q in self._rows.items()}
            for q in self._rows.values():
                q.clear()
        written = 0
        stamp = time.strftime("%Y%m%dT%H", time.gmtime(self.clock()))
        for table, rows in taken.items():
            if not rows:
                continue
            columns = TABLES[table]
            data = pa.table({c: [r[i] for r in rows] for i, c in enumerate(columns)})
            target = self._free_name(self.root / table, stamp)
            tmp = target.with_suffix(".parquet.tmp")
            try:
                pq.write_table(data, tmp, compression="zstd")
                tmp.rename(target)
            except OSError as err:
                self.write_errors += 1
                self.rows_dropped += len(rows)
                log.warning("raw windows: cannot write %s: %s", target, err)
                with contextlib.suppress(OSError):
                    tmp.unlink(missing_ok=True)
                continue
            written += len(rows)
        self.rows_written += written
        self.enforce_budget()
        return written

    @staticmethod
    def _free_name(directory: Path, stamp: str) -> Path:
        n = 0
        while True:
            name = f"{stamp}.parquet" if n == 0 else f"{stamp}-{n}.parquet"
            if not (directory / name).exists():
                return directory / name
            n += 1

    def files(self) -> list[Path]:
        """Every finished Parquet file, oldest first."""
        found = [p for t in TABLES for p in (self.root / t).glob("*.parquet")]
        return sorted(found, key=lambda p: (p.stat().st_mtime, p.name))

    def disk_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.files())

    def enforce_budget(self) -> None:
        """Remove the oldest files past the age limit or over the byte budget."""
        files = self.files()
        total = sum(p.stat().st_size for p in files)
        cutoff = self.clock() - self.cfg.max_age_s
        for p in files:
            size = p.stat().st_size
            if total <= self.cfg.max_bytes and p.stat().st_mtime >= cutoff:
                break
            p.unlink(missing_ok=True)
            total -= size
            self.files_removed += 1
            self.bytes_removed += size

    # -- the thread ---------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="raw-windows", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.cfg.flush_s):
            try:
                self.flush()
            except Exception:  # a bad flush must not end the writer: log, count, go on
                self.write_errors += 1
                log.exception("raw windows: flush failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.flush()


class RawStoreCollector:
    """Prometheus view of the writer: rows kept and dropped, files and bytes on disk."""

    def __init__(self, writer: RawWindowWriter) -> None:
        self.writer = writer

    def describe(self) -> list[Any]:
        return list(self._families(False))

    def collect(self) -> list[Any]:
        return list(self._families(True))

    def _families(self, fill: bool) -> list[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        p = "fabricprobe_raw_windows_"
        w = self.writer
        rows = CounterMetricFamily(
            p + "rows", "Rows written to the raw window files.", labels=["outcome"]
        )
        removed = CounterMetricFamily(
            p + "removed_bytes", "Bytes of raw window files removed by the disk budget."
        )
        errors = CounterMetricFamily(p + "write_errors", "Raw window flushes that failed.")
        disk = GaugeMetricFamily(p + "disk_bytes", "Bytes the raw window files take on disk.")
        if fill:
            rows.add_metric(["written"], float(w.rows_written))
            rows.add_metric(["dropped"], float(w.rows_dropped))
            removed.add_metric([], float(w.bytes_removed))
            errors.add_metric([], float(w.write_errors))
            disk.add_metric([], float(w.disk_bytes()))
        return [rows, removed, errors, disk]
