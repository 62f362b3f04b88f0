"""Rails on the agent's side: the rule that places each RDMA device on its rail, what the
agent registers of its devices (rail and GPU), the targets it runs from each rail's own
device, its windows per rail, and its traces from each rail's own address."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from fabricprobe.agent.agent import Agent, assigned_specs
from fabricprobe.agent.config import AgentConfig
from fabricprobe.agent.exporter import AgentCollector
from fabricprobe.agent.identity import Rails, device_messages
from fabricprobe.agent.probing import ProbeOutcome, ProbeSpec
from fabricprobe.agent.tracing import ClassTracer
from fabricprobe.agent.window import WindowAggregator
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.errors import ConfigError, ParseError
from fabricprobe.probes.pcie import read_nic_gpus
from fabricprobe.probes.rails import NO_RAILS, parse_rails
from fabricprobe.probes.sysfs import read_devices
from fabricprobe.probes.trace import ClassTrace, Hop, TraceConfig, TraceResult
from tests.support.agentview import agent_view

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sys"
GPU8, LAPTOP = FIXTURES / "gpu8", FIXTURES / "laptop"
BY_NETWORK = [",".join(f"10.100.{r}.0/24={r}" for r in range(8))]


def gpu8() -> Rails:
    devices = read_devices(GPU8)
    return Rails.of(parse_rails(BY_NETWORK), devices, read_nic_gpus(GPU8))


# ------------------------------------------------------------------ the rule


@pytest.mark.parametrize(
    "entries",
    [
        BY_NETWORK,  # the fleet-wide list of the rails' networks
        ["gpu"],  # the NIC of GPU i on rail i
        [f"mlx5_{r}={r}" for r in range(8)],  # by name
    ],
)
def test_every_way_places_the_gpu8_host_nic_i_on_rail_i(entries: list[str]) -> None:
    devices = read_devices(GPU8)
    rails = parse_rails(entries).rails(devices, read_nic_gpus(GPU8))
    # the frontend NIC (mlx5_8) is on no rail: nearest GPU0, but through the CPU (NODE)
    assert rails == {f"mlx5_{r}": r for r in range(8)}


def test_a_name_wins_over_a_network_and_the_first_network_wins() -> None:
    devices = {d.name: d for d in read_devices(GPU8)}
    rule = parse_rails(["mlx5_3=7", "10.100.0.0/16=5", *BY_NETWORK])
    assert rule.rail_of(devices["mlx5_3"]) == 7
    assert rule.rail_of(devices["mlx5_1"]) == 5  # 10.100.0.0/16 holds every rail's address
    assert rule.rail_of(devices["mlx5_8"]) is None  # the frontend network: no rail
    assert rule.describe().startswith("mlx5_3=7,10.100.0.0/16=5,10.100.0.0/24=0")


def test_no_rule_no_rails_and_a_laptop_has_none_even_by_gpu() -> None:
    assert not NO_RAILS and NO_RAILS.rails(read_devices(GPU8)) == {}
    assert parse_rails([]) == NO_RAILS
    laptop = read_devices(LAPTOP)
    assert parse_rails(["gpu"]).rails(laptop, read_nic_gpus(LAPTOP)) == {}
    assert parse_rails(["192.0.2.0/24=0"]).rails(laptop) == {"rxe0": 0}


@pytest.mark.parametrize(
    "bad",
    [
        "mlx5_0",
        "mlx5_0=64",
        "mlx5_0=-1",
        "mlx5_0=x",
        "10.100.1.5/24=1",  # host bits set: not a network
        "10.100.1.0/33=1",
        "mlx5_0=1,mlx5_0=2",
        "10.0.0.0/8=1,10.0.0.0/8=2",
        "a b=1",
        "=1",
        "GPU",
    ],
)
def test_bad_entries_say_what_is_wrong(bad: str) -> None:
    with pytest.raises(ParseError, match="rails"):
        parse_rails([bad])


def test_the_agent_refuses_a_bad_rule_at_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="rail"):
        agent_on(tmp_path, GPU8, rails=["mlx5_0=99"])
    with pytest.raises(ConfigError, match="given twice"):  # each entry fine, not together
        agent_on(tmp_path, GPU8, rails=["mlx5_0=1", "mlx5_0=2"])


# ------------------------------------------------------------------ what it registers


def agent_on(tmp: Path, sysfs: Path, **kw: object) -> Agent:
    cfg = AgentConfig(
        host="gpu-1",
        spool_dir=str(tmp / "spool"),
        sysfs_root=str(sysfs),
        insecure=True,
        validate_interval_s=0,
        **kw,  # type: ignore[arg-type]
    )
    return Agent(cfg, runners={})


def test_a_gpu_host_registers_each_nics_rail_and_gpu(tmp_path: Path) -> None:
    agent = agent_on(tmp_path, GPU8, rails=BY_NETWORK, probe_listen="0.0.0.0:0")
    info = agent.host_info()
    devices = {d.name: d for d in info.devices}
    for r in range(8):
        d = devices[f"mlx5_{r}"]
        assert d.HasField("rail") and d.rail == r
        assert (d.gpu, d.gpu_link) == (f"GPU{r}", "PIX")
    front = devices["mlx5_8"]
    assert not front.HasField("rail") and (front.gpu, front.gpu_link) == ("GPU0", "NODE")
    # peers probe each rail at the rail device's own address, which the agent registers
    assert {f"10.100.{r}.17" for r in range(8)} <= set(info.addresses)
    assert agent.tracer.rail_sources == {r: f"10.100.{r}.17" for r in range(8)}


def test_without_rails_a_host_registers_as_before(tmp_path: Path) -> None:
    """No rule: no rail anywhere, nothing added to the addresses; a laptop has no GPU."""
    agent = agent_on(tmp_path, GPU8, probe_listen="0.0.0.0:0", addresses=["192.0.2.17"])
    info = agent.host_info()
    assert list(info.addresses) == ["192.0.2.17"]
    assert not any(d.HasField("rail") for d in info.devices)
    assert agent.tracer.rail_sources == {}
    laptop = agent_on(tmp_path, LAPTOP, probe_listen="127.0.0.1:0").host_info()
    assert [(d.name, d.HasField("rail"), d.gpu, d.gpu_link) for d in laptop.devices] == [
        ("rxe0", False, "", "")
    ]


def test_a_responder_on_one_address_serves_only_that_rail(tmp_path: Path) -> None:
    agent = agent_on(tmp_path, GPU8, rails=BY_NETWORK, probe_listen="10.100.3.17:0")
    assert dict(agent.rails.rail) == {"mlx5_3": 3}
    assert [d.name for d in agent.host_info().devices if d.HasField("rail")] == ["mlx5_3"]


def test_rails_of_devices_and_their_sources() -> None:
    rails = gpu8()
    assert rails.rail_sources() == {r: f"10.100.{r}.17" for r in range(8)}
    assert rails.served_at("::") is rails
    msgs = {d.name: d for d in device_messages(read_devices(GPU8), rails)}
    assert msgs["mlx5_5"].gpu_address == "0000:9a:00.0"


def test_metrics_say_each_devices_rail_and_gpu() -> None:
    view = agent_view(nics=device_messages(read_devices(GPU8), gpu8()))
    reg = CollectorRegistry()
    reg.register(AgentCollector(view))  # type: ignore[arg-type]
    text = generate_latest(reg).decode()
    assert (
        'fabricprobe_rdma_device_info{device="mlx5_2",gpu="GPU2",gpu_link="PIX",rail="2"} 1.0'
        in text
    )
    assert (
        'fabricprobe_rdma_device_info{device="mlx5_8",gpu="GPU0",gpu_link="NODE",rail=""} 1.0'
        in text
    )


# ------------------------------------------------------------------ probing on a rail


def assignments(*targets: pb.ProbeTarget) -> pb.Assignments:
    return pb.Assignments(host="a", generation=1, targets=list(targets))


def test_a_rail_target_leaves_from_the_rails_own_device() -> None:
    rail = pb.ProbeTarget(
        dst="b", address="10.100.1.2", port=4793, kind="rdma_ud", size=64, interval_ms=1000,
        count=8, device="mlx5_1", gid="g", rail=1, src_device="mlx5_1",
    )  # fmt: skip
    plain = pb.ProbeTarget(dst="b", address="192.0.2.2", port=4793, kind="tcp_lat", count=4)
    lost = pb.ProbeTarget(dst="b", address="10.100.6.2", kind="rdma_ud", rail=6, src_device="x")
    specs = assigned_specs(assignments(rail, plain, lost), "a", {"mlx5_1": "10.100.1.17"})
    assert [(s.kind, s.rail, s.local_device, s.bind) for s in specs] == [
        ("rdma_ud", 1, "mlx5_1", "10.100.1.17"),  # from the rail's own address and device
        ("tcp_lat", None, "", ""),  # as before: the agent's own source
    ]  # a device this host has no rail address for: not run at all


def test_windows_come_per_rail_beside_the_pairs() -> None:
    agg = WindowAggregator()
    for rail, rtt in ((0, 20_000), (1, 900_000), (None, 30_000)):
        spec = ProbeSpec("b", "x", 1, "rdma_ud", 64, 2, 1.0, rail=rail)
        agg.add(spec, ProbeOutcome("rdma", "ud", rtt_ns=[rtt, rtt], sport=0xC001))
    cut = agg.cut_all()
    (pair,) = cut.pairs  # the pair's window mixes the rails, as before
    assert pair.rtt.count == 6 and not pair.HasField("rail")
    assert [(w.rail, w.rtt.count) for w in cut.rails] == [(0, 2), (1, 2)]
    # one source port on two rails is two classes
    assert sorted(w.rail if w.HasField("rail") else -1 for w in cut.classes) == [-1, 0, 1]


def test_a_rails_classes_are_traced_from_the_rails_address() -> None:
    calls: list[tuple[str, str]] = []

    def tracer(
        source: str, peer: str, sports: list[int], cfg: TraceConfig, why: str
    ) -> TraceResult:
        calls.append((source, peer))
        hops = [ClassTrace(s, [Hop(1, "203.0.113.1", 0.001)], True) for s in sports]
        return TraceResult(source, peer, "udp", "", hops)

    t = ClassTracer("192.0.2.17", trace=tracer, rail_sources={1: "10.100.1.17"})
    windows = [
        pb.ProbeWindow(dst="b", sport=0xC001, rail=1),
        pb.ProbeWindow(dst="b", sport=0xC001),
        pb.ProbeWindow(dst="b", sport=0xC002, rail=4),  # a rail this host is not on
    ]
    peers = {("b", 1): "10.100.1.2", ("b", None): "192.0.2.2", ("b", 4): "10.100.4.2"}
    t.window(windows, peers)
    t.asked([pb.Retrace(dst="c", address="10.100.1.3", sport=0xC003, rail=1)])
    assert t.round() == 3
    assert sorted(calls) == [
        ("10.100.1.17", "10.100.1.2"),
        ("10.100.1.17", "10.100.1.3"),
        ("192.0.2.17", "192.0.2.2"),
    ]
    paths = t.window([], peers)
    assert sorted((p.dst, p.src_ip, p.rail if p.HasField("rail") else None) for p in paths) == [
        ("b", "10.100.1.17", 1),
        ("b", "192.0.2.17", None),
        ("c", "10.100.1.17", 1),
    ]
