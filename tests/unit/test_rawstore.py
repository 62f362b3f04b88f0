"""Raw windows in Parquet: what the collector writes, the disk budget, and the DuckDB
queries behind `probe windows`."""

from __future__ import annotations

import json
import os
import time
import tomllib
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from fabricprobe.cli import main
from fabricprobe.collector.rawquery import RawQueryError, path_summary, run_sql
from fabricprobe.collector.rawstore import RawStoreCollector, RawStoreConfig, RawWindowWriter
from fabricprobe.collector.service import CollectorServer, ServerConfig
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.sketchwire import MergedSketch, to_wire
from fabricprobe.core.stats import LatencySketch

ROOT = Path(__file__).resolve().parents[2]
NOW = float(int(time.time()))  # file ages are judged against the files' real mtimes


def merged(values_ns: list[int], lost: int = 0) -> MergedSketch:
    sk = LatencySketch()
    for v in values_ns:
        sk.record(v)
    wire = to_wire(sk)
    m = MergedSketch(kind="rtt", lost=lost)
    from fabricprobe.core.sketchwire import from_wire

    m.merge(from_wire(wire))
    m.lost = lost
    return m


def writer(tmp_path: Path, **kw: object) -> RawWindowWriter:
    return RawWindowWriter(RawStoreConfig(str(tmp_path / "raw"), **kw), clock=lambda: NOW)  # type: ignore[arg-type]


def feed(w: RawWindowWriter, windows: int = 5) -> None:
    for i in range(windows):
        end = int((NOW - 60 * (windows - i)) * 1e9)
        w.report_taken(
            end,
            [
                (("a", "b", "rdma", "send", 64), merged([4_000 + i * 100] * 50, lost=i)),
                (("a", "c", "tcp", "pingpong", 64), merged([30_000] * 20)),
            ],
            [(("a", "pfc", "", 0, "ens1f0np0", 3, "rx_prio3_pause"), 12.5 * i)],
        )


def test_rows_reach_parquet_with_exact_figures(tmp_path: Path) -> None:
    w = writer(tmp_path)
    feed(w)
    assert w.flush() == 15
    (wfile,) = (tmp_path / "raw" / "windows").glob("*.parquet")
    table = pq.read_table(wfile).to_pandas()
    assert len(table) == 10 and set(table["src"]) == {"a"}
    send = table[table["op"] == "send"].sort_values("window_end_unix_ns")
    assert list(send["min_ns"]) == [4_000, 4_100, 4_200, 4_300, 4_400]
    assert list(send["lost"]) == [0, 1, 2, 3, 4]
    assert (send["p99_ns"] >= send["min_ns"]).all()
    (rfile,) = (tmp_path / "raw" / "rates").glob("*.parquet")
    assert pq.read_table(rfile).to_pandas()["per_second"].max() == 50.0
    assert w.flush() == 0  # nothing new, no empty file
    assert len(list((tmp_path / "raw" / "windows").glob("*.parquet"))) == 1


def test_buffer_bound_drops_oldest_and_counts(tmp_path: Path) -> None:
    w = writer(tmp_path, max_rows=7)
    feed(w, windows=5)  # 15 rows offered
    assert w.rows_dropped == 8
    assert w.flush() == 7


def test_disk_budget_and_age_remove_oldest_files(tmp_path: Path) -> None:
    w = writer(tmp_path, max_bytes=10**9)
    for _ in range(4):
        feed(w)
        w.flush()
    files = w.files()
    assert len(files) == 8
    old = files[0]
    os.utime(old, (NOW - 30 * 86400, NOW - 30 * 86400))  # past the 7-day age limit
    w.enforce_budget()
    assert not old.exists() and w.files_removed == 1
    w.cfg = RawStoreConfig(w.cfg.directory, max_bytes=w.disk_bytes() // 2)
    w.enforce_budget()
    assert w.disk_bytes() <= w.cfg.max_bytes and w.bytes_removed > 0


def test_a_failed_write_is_counted_and_the_writer_goes_on(tmp_path: Path) -> None:
    w = writer(tmp_path)
    feed(w, windows=2)
    (tmp_path / "raw" / "windows").rename(tmp_path / "gone")
    (tmp_path / "raw" / "windows").write_text("not a directory")
    w.flush()
    assert w.write_errors == 1 and w.rows_dropped == 4
    (tmp_path / "raw" / "windows").unlink()
    (tmp_path / "raw" / "windows").mkdir()
    feed(w, windows=1)
    assert w.flush() == 3


def test_path_summary(tmp_path: Path) -> None:
    w = writer(tmp_path)
    feed(w)
    w.flush()
    df = path_summary(tmp_path / "raw", since_s=3600, now_s=NOW)
    assert list(df["op"]) == ["pingpong", "send"]  # worst p99 first
    send = df[df["op"] == "send"].iloc[0]
    assert send["windows"] == 5 and send["probes"] == 250 and send["lost"] == 10
    assert send["min_ns"] == 4_000
    assert send["loss_ratio"] == pytest.approx(10 / 260)
    assert send["p99_worst_at_ns"] == int((NOW - 60) * 1e9)
    assert len(path_summary(tmp_path / "raw", since_s=150, now_s=NOW).query("op == 'send'")) == 1
    assert path_summary(tmp_path / "raw", 150, now_s=NOW).iloc[0]["windows"] == 2
    assert path_summary(tmp_path / "raw", 3600, transport="rdma", now_s=NOW)["op"].tolist() == [
        "send"
    ]
    assert path_summary(tmp_path / "raw", 3600, src="nobody", now_s=NOW).empty


def test_sql_is_read_only_over_the_views(tmp_path: Path) -> None:
    w = writer(tmp_path)
    feed(w)
    w.flush()
    got = run_sql(tmp_path / "raw", "SELECT count(*) AS n FROM rates")
    assert int(got["n"][0]) == 5
    for bad in (
        "SELECT * FROM read_csv('/etc/passwd')",
        "COPY windows TO '/tmp/fabricprobe-leak.csv'",
        "SET enable_external_access = true",
        "SELECT FROM nowhere",
    ):
        with pytest.raises(RawQueryError):
            run_sql(tmp_path / "raw", bad)
    assert not Path("/tmp/fabricprobe-leak.csv").exists()


def test_no_files_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RawQueryError, match="no raw window files"):
        path_summary(tmp_path)


def test_exporter_matches_its_catalogue(tmp_path: Path) -> None:
    cat = tomllib.loads((ROOT / "collector" / "metrics.toml").read_text())["rawstore_metric"]
    w = writer(tmp_path)
    feed(w)
    w.flush()
    fams = RawStoreCollector(w).collect()
    got = {f.name + ("_total" if f.type == "counter" else ""): f for f in fams}
    assert sorted(got) == sorted(m["name"] for m in cat)
    for m in cat:
        f = got[m["name"]]
        assert f.type == m["type"] and f.documentation == m["help"] and f.samples
        assert sorted({k for s in f.samples for k in s.labels}) == sorted(m["labels"])
    assert [f.name for f in RawStoreCollector(w).describe()] == [f.name for f in fams]


def test_collector_keeps_windows_and_probe_windows_reads_them(tmp_path: Path) -> None:
    raw = tmp_path / "windows"
    server = CollectorServer(
        ServerConfig(
            listen="127.0.0.1:0", metrics_listen="", raw=RawStoreConfig(str(raw), flush_s=60)
        )
    )
    server.start()
    try:
        for host in ("h1", "h2"):
            server.api.register(pb.HostInfo(host=host, addresses=["127.0.0.1"]))
        now = time.time_ns()
        sk = LatencySketch()
        for v in range(5_000, 6_000, 10):
            sk.record(v)
        report = pb.WindowReport(
            host="h1", epoch=1, seq=1, window_start_unix_ns=now - 10**9, window_end_unix_ns=now
        )
        report.probes.add(dst="h2", transport="rdma", op="send", size=64, rtt=to_wire(sk))
        server.api.report(report)
    finally:
        server.stop(0)  # flushes
    res = CliRunner().invoke(main, ["windows", "--dir", str(raw), "--json"])
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.output)
    assert (row["src"], row["dst"], row["transport"], row["windows"]) == ("h1", "h2", "rdma", 1)
    assert row["min_ns"] == 5_000 and row["probes"] == 100
    table = CliRunner().invoke(main, ["windows", "--dir", str(raw)], env={"COLUMNS": "160"})
    assert table.exit_code == 0 and "h1->h2 rdma" in table.output
    bad = CliRunner().invoke(main, ["windows", "--dir", str(raw), "--since", "soon"])
    assert bad.exit_code == 2 and "--since" in bad.output
