"""Rails on the collector's side: what a host registers of its rail devices becomes the
planner's rail NICs (at registered addresses only), assignments carry each target's rail
and source device, each rail's windows are kept apart from the pair's, a rail that
stands out from its pair's other rails is named by its rail in `probe why`, and its
/metrics families (one series per rail) are the catalogue's."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from rich.console import Console

from fabricprobe.cli.commands.why import rail_dict, rails_table
from fabricprobe.collector.assign import PlanConfig, Planner, RailNic
from fabricprobe.collector.rails import RailCollector, rail_nics, why_rails
from fabricprobe.collector.railtable import RailTable
from fabricprobe.collector.service import AgentApi, ApiConfig, host_spec
from fabricprobe.collector.store import ReportError, WindowStore
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.sketchwire import to_wire
from fabricprobe.core.stats import SlotTally

ROOT = Path(__file__).resolve().parents[2]
S = 1_000_000_000
KINDS = ["tcp_lat", "rdma_ud"]


def gid(ip: str) -> str:
    a, b, c, d = (int(x) for x in ip.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"


def gpu_host(name: str, i: int, rails: range = range(4), registered: bool = True) -> pb.HostInfo:
    """A host with mlx5_r on rail r at 10.100.r.I (registered, or not), and a frontend
    NIC at 192.0.2.I on no rail."""
    devices = [
        pb.RdmaDevice(
            name=f"mlx5_{r}",
            rail=r,
            gpu=f"GPU{r}",
            gpu_link="PIX",
            ports=[
                pb.RdmaPort(
                    number=1,
                    gids=[pb.Gid(index=3, gid=gid(f"10.100.{r}.{i}"), type="RoCE v2")],
                )
            ],
        )
        for r in rails
    ]
    devices.append(
        pb.RdmaDevice(
            name="mlx5_8",
            ports=[pb.RdmaPort(number=1, gids=[pb.Gid(gid=gid(f"192.0.2.{i}"), type="RoCE v2")])],
        )
    )
    rail_addrs = [f"10.100.{r}.{i}" for r in rails] if registered else []
    return pb.HostInfo(
        host=name,
        addresses=[f"192.0.2.{i}", *rail_addrs],
        devices=devices,
        probe_port=4793,
        probe_kinds=KINDS,
    )


def test_rail_nics_are_planned_at_registered_addresses_only() -> None:
    assert rail_nics(gpu_host("a", 1)) == tuple(
        RailNic(r, f"mlx5_{r}", gid(f"10.100.{r}.1"), f"10.100.{r}.1") for r in range(4)
    )
    # a GID's address the host did not register (and the collector did not check) is
    # never a probe target
    assert rail_nics(gpu_host("a", 1, registered=False)) == ()
    assert rail_nics(pb.HostInfo(host="laptop", addresses=["192.0.2.9"])) == ()
    spec = host_spec(gpu_host("a", 1))
    assert spec.device == "mlx5_8" and spec.address == "192.0.2.1"  # as before rails


def test_assignments_carry_each_targets_rail_and_source_device() -> None:
    api = AgentApi(WindowStore(), Planner(PlanConfig(kinds=tuple(KINDS)), pace=0), ApiConfig())
    api.register(gpu_host("a", 1))
    api.register(gpu_host("b", 2, range(1, 3)))  # b is on rails 1 and 2 only
    targets = api.assignments("a").targets
    rdma = sorted(
        (t.rail, t.src_device, t.device, t.address) for t in targets if t.HasField("rail")
    )
    assert rdma == [(1, "mlx5_1", "mlx5_1", "10.100.1.2"), (2, "mlx5_2", "mlx5_2", "10.100.2.2")]
    (tcp,) = [t for t in targets if t.kind == "tcp_lat"]
    assert not tcp.HasField("rail") and tcp.address == "192.0.2.2"


@pytest.mark.parametrize(
    "device",
    [
        pb.RdmaDevice(name="x", rail=64),
        pb.RdmaDevice(name="x", gpu_link="FAR"),
        pb.RdmaDevice(name="x", gpu="G" * 17),
    ],
)
def test_a_registration_with_bad_rail_fields_is_refused(device: pb.RdmaDevice) -> None:
    api = AgentApi(WindowStore(), Planner(pace=0), ApiConfig())
    with pytest.raises(ReportError, match="device"):
        api.register(pb.HostInfo(host="h", devices=[device]))


# ------------------------------------------------------------------ rail windows


def rail_window(dst: str, rail: int | None, rtt_us: int, lost: int = 0) -> pb.ProbeWindow:
    t = SlotTally()
    t.record_many([rtt_us * 1000] * 20)
    t.record_lost(lost)
    return pb.ProbeWindow(dst=dst, transport="rdma", op="ud", size=64, rtt=to_wire(t), rail=rail)


def store_with(*windows: pb.ProbeWindow, seq: int = 1, now: int = 1000 * S) -> WindowStore:
    store = WindowStore(clock=lambda: now)
    for h in ("a", "b", "c"):
        store.register(pb.HostInfo(host=h))
    report = pb.WindowReport(
        host="a", epoch=1, seq=seq, window_start_unix_ns=now - S, window_end_unix_ns=now
    )
    report.rail_windows.extend(windows)
    store.take(report)
    return store


def test_a_slow_rail_stands_out_from_its_pairs_other_rails() -> None:
    store = store_with(
        *(rail_window("b", r, 3000 if r == 1 else 40) for r in range(8)),
        *(rail_window("c", r, 40, lost=2 if r == 5 else 0) for r in range(8)),
    )
    got = store.rail_view().paths
    out = [(m.dst, m.rail) for m in got if m.stands_out]
    assert out == [("b", 1), ("c", 5)]  # listed first
    assert [(m.dst, m.rail) for m in got[:2]] == out
    assert len(got) == 16
    b1 = next(m for m in got if (m.dst, m.rail) == ("b", 1))
    assert b1.rtt_p50_s == pytest.approx(3e-3, rel=0.02) and b1.loss == 0.0
    rails, windows = store.rail_view()[1:]
    assert (rails[1].paths, rails[1].standing_out) == (2, 1)
    assert rails[5].lost == 2 and windows["taken"] == 16
    # the pair's own figures are as before: no rail window is a path
    assert store.paths == {}


def test_nothing_stands_out_alone_or_within_noise() -> None:
    store = store_with(
        rail_window("b", 0, 3000), *(rail_window("c", r, 40 + 5 * r) for r in range(4))
    )
    assert not any(m.stands_out for m in store.rail_view().paths)


def test_bad_rail_windows_are_refused_and_the_rest_taken() -> None:
    no_rail = rail_window("b", None, 40)
    bad_rail = rail_window("b", 64, 40)
    no_rtt = pb.ProbeWindow(dst="b", transport="rdma", op="ud", size=64, rail=2)
    bad_kind = rail_window("b", 3, 40)
    bad_kind.transport = "smoke"
    store = store_with(no_rail, bad_rail, no_rtt, bad_kind, rail_window("b", 1, 40))
    windows = store.rail_view().windows
    assert windows == {"taken": 1, "refused": 4, "dropped": 0, "evicted": 0}


def test_the_table_is_bounded_per_host_and_in_all() -> None:
    t = RailTable(max_per_host=3, max_paths=5)
    t.take("a", 10, 10, [rail_window(f"p{i}", 0, 40) for i in range(5)])
    assert t.windows["dropped"] == 2 and t.per_host == {"a": 3}
    t.take("b", 10, 10, [rail_window(f"p{i}", 0, 40) for i in range(3)])
    assert t.windows["evicted"] == 1 and len(t.by_key) == 5
    assert sum(t.per_host.values()) == 5
    t.forget({"a"}, idle_ns=0)
    assert {k.src for k in t.by_key} == {"b"} and t.per_host == {"b": 3}
    t.forget(set(), idle_ns=11)
    assert not t.by_key and not t.per_host


def test_a_replayed_older_window_leaves_the_newest() -> None:
    t = RailTable()
    t.take("a", 20, 20, [rail_window("b", 0, 40)])
    t.take("a", 10, 21, [rail_window("b", 0, 9000)])
    (m,) = t.paths(0)
    assert m.rtt_p50_s == pytest.approx(40e-6, rel=0.02) and m.newest_unix_ns == 20


def test_why_names_the_rails_of_ranked_pairs_and_every_rail_standing_out() -> None:
    store = store_with(
        *(rail_window("b", r, 40) for r in range(2)),
        *(rail_window("c", r, 3000 if r == 1 else 40) for r in range(2)),
    )
    ranked = [pb.PathRank(rank=1, src="b", dst="a", transport="rdma")]
    got = [(m.dst, m.rail, m.stands_out) for m in why_rails(store, ranked)]
    assert got == [("c", 1, True), ("b", 0, False), ("b", 1, False)]
    assert [(m.dst, m.rail) for m in why_rails(store, [])] == [("c", 1)]
    rows = [rail_dict(m) for m in why_rails(store, ranked)]
    assert rows[0]["rail"] == 1 and rows[1]["rail"] == 0 and rows[1]["loss"] == 0.0
    console = Console(width=200, record=True)
    console.print(rails_table(rows))
    text = console.export_text()
    assert "rail 1" in text and "STANDS OUT" in text and "a->c" in text


def test_rail_families_are_the_catalogues_one_series_per_rail() -> None:
    store = store_with(*(rail_window(d, r, 3000 if r == 1 else 40) for d in "bc" for r in range(8)))
    reg = CollectorRegistry()
    reg.register(RailCollector(store))
    cat = tomllib.loads((ROOT / "collector" / "metrics.toml").read_text())["rail_metric"]
    families = {m.name: m for m in reg.collect()}
    assert len(families) == len(cat)
    for row in cat:
        fam = families[row["name"].removesuffix("_total")]
        assert fam.type == row["type"], row["name"]
        assert sorted({k for s in fam.samples for k in s.labels}) == sorted(row["labels"])
    stand = families["fabricprobe_rail_paths_standing_out"].samples
    assert len(stand) == 8 and {s.labels["rail"]: s.value for s in stand}["1"] == 2
    assert reg.get_sample_value("fabricprobe_rail_paths", {"rail": "0"}) == 2
