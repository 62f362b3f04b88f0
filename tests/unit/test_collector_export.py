"""Exporter: every emitted family is in collector/metrics.toml and vice versa; promtool clean."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from fabricprobe.collector.exporter import FabricCollector
from fabricprobe.collector.families import sketch_histogram
from fabricprobe.collector.rpcstats import RpcStats
from fabricprobe.collector.store import WindowStore
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.cumulative import RTT_BUCKETS_S
from fabricprobe.core.sketchwire import from_wire, merged, to_wire
from fabricprobe.core.stats import LatencySketch

CATALOGUE = Path(__file__).resolve().parents[2] / "collector" / "metrics.toml"
S = 1_000_000_000


def _sketch(*ns: int, lost: int = 0) -> pb.Sketch:
    s = LatencySketch()
    s.record_many(list(ns))
    s.record_lost(lost)
    return to_wire(s)


def full_store() -> WindowStore:
    """A store holding one of everything the exporter can show."""
    store = WindowStore()
    store.register(pb.HostInfo(host="a", topology="tor1", version="0.1.0"))
    for seq in (1, 2):
        r = pb.WindowReport(
            host="a", epoch=1, seq=seq, window_start_unix_ns=0, window_end_unix_ns=seq * 10 * S
        )
        r.probes.add(
            dst="b",
            transport="tcp",
            op="pingpong",
            size=64,
            rtt=_sketch(40_000, 50_000, lost=1),
        )
        r.probes.add(dst="b", transport="rdma", op="send", size=64, rtt=_sketch(5_000))
        ud = r.probes.add(dst="b", transport="rdma", op="ud", size=20, rtt=_sketch(9_000))
        delay = LatencySketch("delay")
        delay.record(1_000)
        ud.prober_delay.CopyFrom(to_wire(delay))
        r.probes.add(
            dst="b", transport="tcp", op="stream", size=65536, bytes_moved=10**9, busy_seconds=1.0
        )
        r.counters.add(
            kind="rdma",
            device="mlx5_0",
            port=1,
            priority=-1,
            name="out_of_buffer",
            value=seq * 100,
            width=32,
        )
        r.counters.add(
            kind="netdev", netdev="eth0", priority=-1, name="rx_ecn_mark", value=seq * 7, width=64
        )
        for field in (
            "rx_pause",
            "tx_pause",
            "rx_pause_transitions",
            "tx_pause_transitions",
            "rx_discards",
            "rx_pause_duration_us",
            "tx_pause_duration_us",
        ):
            r.counters.add(
                kind="pfc", netdev="eth0", priority=3, name=field, value=seq * 1000, width=64
            )
        r.agent.CopyFrom(
            pb.AgentStats(
                cpu_seconds=1.5,
                rss_bytes=30 << 20,
                probes=10,
                probe_rate=0.5,
                spool_depth=2,
                spool_bytes=900,
                spool_dropped=1,
                links=96,
                sessions=97,
                sessions_refused=3,
                spool_write_failures=4,
                spool_quarantined=5,
                spool_memory_windows=6,
                thread_failures=7,
                sessions_refused_by_reason={"source": 2, "memory": 1, "x" * 3000: 9},
            )
        )
        store.take(r)
    return store


def catalogue() -> dict[str, dict[str, object]]:
    data = tomllib.loads(CATALOGUE.read_text())
    return {m["name"]: m for m in data["metric"]}


def rpc_stats() -> RpcStats:
    rpc = RpcStats()
    rpc.observe("Report", "OK", 0.002)
    rpc.observe("Register", "PERMISSION_DENIED", 0.0001)
    return rpc


def emitted(store: WindowStore) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for fam in FabricCollector(store, rpc_stats()).collect():
        name = fam.name + ("_total" if fam.type == "counter" else "")
        labels = sorted({k for s in fam.samples for k in s.labels if k != "le"})
        out[name] = {
            "type": fam.type,
            "help": fam.documentation,
            "labels": labels,
            "n": len(fam.samples),
        }
    return out


def test_catalogue_matches_what_is_emitted() -> None:
    cat = catalogue()
    got = emitted(full_store())
    assert sorted(got) == sorted(cat), "collector/metrics.toml and collect() disagree"
    for name, m in cat.items():
        g = got[name]
        assert g["type"] == m["type"], name
        assert g["help"] == m["help"], name
        assert g["n"], f"{name}: no samples in a full store"
        assert g["labels"] == sorted(m["labels"]), name  # type: ignore[call-overload]
        assert name.startswith("fabricprobe_")
        assert (m["type"] == "counter") == name.endswith("_total"), name


def test_describe_touches_nothing_and_lists_the_catalogue() -> None:
    names = {f.name for f in FabricCollector(WindowStore()).describe()}
    bases = {n.removesuffix("_total") for n in catalogue()}
    assert names <= bases


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_exposition_passes_promtool() -> None:
    reg = CollectorRegistry()
    reg.register(FabricCollector(full_store(), rpc_stats()))
    text = generate_latest(reg)
    res = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True)
    assert res.returncode == 0, res.stdout.decode() + res.stderr.decode()
    assert b'fabricprobe_rdma_tcp_rtt_ratio{dst="b",op="send",size="64",src="a"}' in text


def test_histogram_buckets_resolve_microseconds_to_seconds() -> None:
    assert RTT_BUCKETS_S[0] == pytest.approx(1e-6) and RTT_BUCKETS_S[-1] == pytest.approx(10.0)
    s = LatencySketch()
    s.record_many([1_500, 40_000, 3_000_000_000])
    buckets, total = sketch_histogram(merged(from_wire(to_wire(s))))
    le = dict(buckets)
    assert le["2e-6"] == 1 and le["5e-5"] == 2 and le["1e-3"] == 2 and le["5e0"] == 3
    assert le["+Inf"] == 3 and total == pytest.approx(3.0000415)


def test_pfc_duration_is_exported_in_seconds() -> None:
    reg = CollectorRegistry()
    reg.register(FabricCollector(full_store()))
    v = reg.get_sample_value(
        "fabricprobe_pfc_rx_pause_seconds_total", {"src": "a", "netdev": "eth0", "priority": "3"}
    )
    assert v == pytest.approx(0.001)  # 1000 µs between the two readings


def test_stale_host_is_marked_down() -> None:
    now = [100 * S]
    store = WindowStore(stale_after=30, clock=lambda: now[0])
    store.register(pb.HostInfo(host="a"))
    reg = CollectorRegistry()
    reg.register(FabricCollector(store))
    assert reg.get_sample_value("fabricprobe_host_up", {"src": "a"}) == 1.0
    now[0] += 31 * S
    assert reg.get_sample_value("fabricprobe_host_up", {"src": "a"}) == 0.0


def test_agent_links_and_sessions_are_exported() -> None:
    reg = CollectorRegistry()
    reg.register(FabricCollector(full_store()))
    src = {"src": "a"}
    assert reg.get_sample_value("fabricprobe_agent_probe_links", src) == 96
    assert reg.get_sample_value("fabricprobe_agent_probe_sessions", src) == 97
    assert reg.get_sample_value("fabricprobe_agent_probe_sessions_refused_total", src) == 3
    by = "fabricprobe_agent_probe_sessions_refused_by_reason_total"
    assert reg.get_sample_value(by, {**src, "reason": "source"}) == 2
    assert reg.get_sample_value(by, {**src, "reason": "busy"}) == 0
    assert reg.get_sample_value(by, {**src, "reason": "x" * 3000}) is None  # no new labels


def test_agent_fault_counters_are_exported() -> None:
    reg = CollectorRegistry()
    reg.register(FabricCollector(full_store()))
    src = {"src": "a"}
    assert reg.get_sample_value("fabricprobe_agent_spool_write_failures_total", src) == 4
    assert reg.get_sample_value("fabricprobe_agent_spool_quarantined_total", src) == 5
    assert reg.get_sample_value("fabricprobe_agent_spool_memory_windows", src) == 6
    assert reg.get_sample_value("fabricprobe_agent_thread_failures_total", src) == 7
