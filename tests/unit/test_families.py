"""The metric families as data (collector/families.py), the service's families
(collector/serverfamilies.py) and the exporter's fills by group (collector/exporter.py)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from fabricprobe.collector.auth import Gate, Insecure, Policy
from fabricprobe.collector.exporter import fill_counters, fill_hosts, fill_store
from fabricprobe.collector.exposition import ScrapeStats
from fabricprobe.collector.families import (
    AGENT_FAMILIES,
    COUNTER_FAMILIES,
    GATE_FAMILIES,
    HTTP_FAMILIES,
    PFC_DURATIONS,
    PREFIX,
    RPC_FAMILIES,
    SCRAPE_DURATION,
    STORE_FAMILIES,
    TOTAL_FAMILIES,
    Family,
    new_families,
    sketch_histogram,
)
from fabricprobe.collector.rpcstats import RpcStats
from fabricprobe.collector.serverfamilies import ServerFamilies
from fabricprobe.collector.store import StoreSnapshot, WindowStore
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.cumulative import CumulativeSketch
from fabricprobe.core.promproto import SketchHistogramFamily
from fabricprobe.core.sketchwire import from_wire, to_wire
from fabricprobe.core.stats import LatencySketch
from fabricprobe.core.web import WebStats

CATALOGUE = Path(__file__).resolve().parents[2] / "collector" / "metrics.toml"
EVERY = (*STORE_FAMILIES, *RPC_FAMILIES, *GATE_FAMILIES, *HTTP_FAMILIES, SCRAPE_DURATION)
S = 1_000_000_000


def samples(fam: object) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for s in fam.samples}  # type: ignore[attr-defined]


def test_every_row_is_in_the_catalogue_once() -> None:
    names = {m["name"] for m in tomllib.loads(CATALOGUE.read_text())["metric"]}
    keys = [row.key for row in EVERY]
    assert len(set(keys)) == len(keys)
    assert len({row.name for row in EVERY}) == len(EVERY)
    for row in EVERY:
        assert row.kind in ("counter", "gauge", "histogram", "sketch")
        assert not row.name.endswith("_total")  # the exposition adds it
        full = PREFIX + row.name
        assert full in names or full + "_total" in names, full


def test_a_row_builds_a_fresh_family_of_its_type() -> None:
    kinds = {
        "counter": CounterMetricFamily,
        "gauge": GaugeMetricFamily,
        "histogram": HistogramMetricFamily,
        "sketch": SketchHistogramFamily,
    }
    for row in EVERY:
        fam = row.new()
        assert type(fam) is kinds[row.kind]
        assert fam.name == PREFIX + row.name and fam.documentation == row.help
        assert row.new() is not fam
    got = new_families(STORE_FAMILIES)
    assert list(got) == [row.key for row in STORE_FAMILIES]


def test_fields_name_real_figures() -> None:
    agent = pb.AgentStats()
    for row in AGENT_FAMILIES:
        if row.field:
            assert hasattr(agent, row.field), row
    snapshot_fields = StoreSnapshot.__dataclass_fields__
    assert all(row.field in snapshot_fields for row in TOTAL_FAMILIES if row.field)
    pfc = {row.key.removeprefix("pfc:") for row in COUNTER_FAMILIES if row.key.startswith("pfc:")}
    assert pfc >= PFC_DURATIONS


def test_sketch_histogram_is_cumulative_in_seconds() -> None:
    s = LatencySketch()
    s.record_many([3_000, 40_000, 40_000])
    buckets, total = sketch_histogram(from_wire(to_wire(s)))
    assert dict(buckets)["5e-6"] == 1.0 and dict(buckets)["5e-5"] == 3.0
    assert buckets[-1] == ("+Inf", 3.0) and total == pytest.approx(83e-6, rel=0.02)
    assert sketch_histogram(CumulativeSketch())[0][-1] == ("+Inf", 0.0)


def test_server_families_read_their_owners() -> None:
    rpc = RpcStats()
    rpc.observe("Report", "OK", 0.002)
    gate = Gate(Insecure(), Policy(roles={}))
    gate.limits.refuse("rate")
    scrapes = ScrapeStats()
    scrapes.count("render")
    scrapes.count("busy")
    web = WebStats()
    web.refuse("too_large")
    got = {f.name: f for f in ServerFamilies(rpc, gate, scrapes, {"otlp": web}).collect()}
    assert [f.name for f in got.values()] == [
        PREFIX + r.name for r in (*RPC_FAMILIES, *GATE_FAMILIES, *HTTP_FAMILIES)
    ]
    p = PREFIX + "collector_"
    assert samples(got[p + "rpcs"]) == {(("code", "OK"), ("method", "Report")): 1.0}
    assert samples(got[p + "calls_refused"])[(("reason", "rate"),)] == 1.0
    assert samples(got[p + "scrape_renders"]) == {(): 1.0}
    assert samples(got[p + "scrapes_refused"])[(("reason", "busy"),)] == 1.0
    refused = samples(got[p + "http_refused"])
    assert refused[(("listener", "otlp"), ("reason", "too_large"))] == 1.0
    assert refused[(("listener", "metrics"), ("reason", "too_large"))] == 0.0  # not serving
    # without a gate: every refusal reason at 0, nothing tracked
    bare = {f.name: f for f in ServerFamilies(RpcStats(), None, ScrapeStats(), {}).gate_families()}
    assert set(samples(bare[p + "calls_refused"]).values()) == {0.0}


RDMA = {"kind": "rdma", "device": "mlx5_0", "port": 1, "priority": -1, "name": "out_of_buffer"}
PAUSE = {"kind": "pfc", "netdev": "eth0", "priority": 3, "name": "rx_pause_duration_us"}


def report_store() -> WindowStore:
    """Host a with two windows (an RDMA counter read twice, a PFC one once, agent
    figures), host b registered only."""
    store = WindowStore(clock=lambda: 100 * S)
    store.register(pb.HostInfo(host="a", topology="t1", version="9"))
    store.register(pb.HostInfo(host="b"))
    r = pb.WindowReport(host="a", epoch=1, seq=1, window_end_unix_ns=90 * S)
    r.counters.add(**RDMA, value=2_000_000, width=64)  # type: ignore[arg-type]
    r.counters.add(**PAUSE, value=2_000_000, width=64)  # type: ignore[arg-type]
    r.agent.CopyFrom(pb.AgentStats(cpu_seconds=2.0, spool_depth=4, self_throttle=0.0))
    store.take(r)
    r2 = pb.WindowReport(host="a", epoch=1, seq=2, window_end_unix_ns=100 * S)
    r2.counters.add(**RDMA, value=3_000_000, width=64)  # type: ignore[arg-type]
    store.take(r2)
    return store


def test_fill_counters_by_kind() -> None:
    f = new_families(STORE_FAMILIES)
    fill_counters(report_store().snapshot(), f)
    labels = (("counter", "out_of_buffer"), ("device", "mlx5_0"), ("port", "1"), ("src", "a"))
    assert samples(f["rdma"]) == {labels: 1_000_000.0}
    assert samples(f["rdma_rate"]) == {labels: pytest.approx(100_000.0)}
    # the pause duration came in µs, is exported in seconds (its first reading: total 0)
    pause = (("netdev", "eth0"), ("priority", "3"), ("src", "a"))
    assert samples(f["pfc:rx_pause_duration_us"]) == {pause: 0.0}


def test_fill_hosts_shows_agent_figures_of_the_chosen_hosts_only() -> None:
    snap = report_store().snapshot()
    f = new_families(STORE_FAMILIES)
    fill_hosts(snap, f, shown={"b": "fill"})
    assert set(samples(f["up"])) == {(("src", "a"),), (("src", "b"),)}
    assert samples(f["cpu"]) == {}  # a is not shown; b has no agent figures
    f = new_families(STORE_FAMILIES)
    fill_store(snap, f)
    assert samples(f["cpu"]) == {(("src", "a"),): 2.0}
    assert samples(f["spool"]) == {(("src", "a"),): 4.0}
    assert samples(f["throttle"]) == {(("src", "a"),): 1.0}  # 0 is an agent too old to say
    assert samples(f["reports"]) == {(): 2.0} and samples(f["hosts"]) == {(): 2.0}


def test_a_family_row_is_frozen() -> None:
    row = Family("x", "gauge", "x", "X.")
    with pytest.raises(AttributeError):
        row.name = "y"  # type: ignore[misc]
