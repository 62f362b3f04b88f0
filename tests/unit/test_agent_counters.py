"""Counter sampling from fixture sysfs trees and real `ethtool -S` text of four drivers."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from fabricprobe.agent.counters import CounterSampler, netdevs_of
from fabricprobe.probes.ethtool import CommandResult
from fabricprobe.probes.sysfs import read_devices

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def runner_for(texts: dict[str, str], calls: list[str]):  # type: ignore[no-untyped-def]
    def run(argv: Sequence[str], timeout: float) -> CommandResult:
        calls.append(argv[-1])
        text = texts.get(argv[-1])
        if text is None:
            return CommandResult(94, "", "no stats available")
        return CommandResult(0, text)

    return run


def sampler(tree: str, texts: dict[str, str], calls: list[str]) -> CounterSampler:
    root = str(FIXTURES / "sys" / tree)
    devices = read_devices(root)
    return CounterSampler(root, devices, netdevs_of(devices), runner_for(texts, calls))


def by_name(readings, kind: str):  # type: ignore[no-untyped-def]
    return {(r.device or r.netdev, r.priority, r.name): r for r in readings if r.kind == kind}


def test_mlx5_port_counters_and_pfc() -> None:
    calls: list[str] = []
    text = (FIXTURES / "ethtool" / "mlx5_core.txt").read_text()
    s = sampler("mlx5", {"ens1f0np0": text}, calls)
    readings = s.sample()
    rdma = by_name(readings, "rdma")
    oob = rdma[("mlx5_0", -1, "out_of_buffer")]
    assert oob.width == 32 and oob.port == 1  # mlx5 Q counter: wraps at 2**32
    assert rdma[("mlx5_0", -1, "port_rcv_data")].width == 64
    assert ("mlx5_0", -1, "lifespan") not in rdma
    pfc = by_name(readings, "pfc")
    assert pfc[("ens1f0np0", 3, "rx_pause")].value == 18233
    assert pfc[("ens1f0np0", 3, "rx_pause_duration_us")].value == 90412
    netdev = by_name(readings, "netdev")
    assert netdev[("ens1f0np0", -1, "rx_ecn_mark")].value == 190422
    assert calls == ["ens1f0np0"]


@pytest.mark.parametrize(
    ("fixture", "field"), [("bnxt_en.txt", "rx_pause_duration_us"), ("ice.txt", "rx_pause")]
)
def test_other_drivers_pfc(fixture: str, field: str) -> None:
    calls: list[str] = []
    s = sampler("bnxt_re", {}, calls)
    s.netdevs = ["eth9"]
    s.runner = runner_for({"eth9": (FIXTURES / "ethtool" / fixture).read_text()}, calls)
    pfc = by_name(s.sample(), "pfc")
    assert ("eth9", 3, field) in pfc
    assert all(0 <= r.priority < 8 for r in pfc.values())


def test_rxe_has_hw_counters_and_veth_is_asked_once() -> None:
    calls: list[str] = []
    veth = (FIXTURES / "ethtool" / "veth.txt").read_text()
    s = sampler("rxe", {}, calls)
    s.netdevs = ["veth0", "gone0"]
    s.runner = runner_for({"veth0": veth}, calls)
    first = s.sample()
    rdma = by_name(first, "rdma")
    assert any(name == "rcvd_pkts" for (_, _, name) in rdma)
    assert not by_name(first, "pfc")  # veth has no flow-control counters
    s.sample()
    assert calls.count("gone0") == 1  # "no stats available": not asked again
    assert calls.count("veth0") == 2


def test_unreadable_sysfs_is_skipped_not_fatal(tmp_path: Path) -> None:
    s = CounterSampler(str(tmp_path), [], [], ethtool=False)
    assert s.sample() == []


def test_change_filter_sends_moved_counters_and_periodic_keyframes() -> None:
    from fabricprobe.agent.counters import ChangeFilter
    from fabricprobe.core.api import fabricprobe_pb2 as pb

    def r(name: str, v: int) -> pb.CounterReading:
        return pb.CounterReading(kind="rdma", device="d", port=1, priority=-1, name=name, value=v)

    f = ChangeFilter(keyframe_every=3)
    assert [x.name for x in f([r("a", 1), r("b", 5)])] == ["a", "b"]  # first: everything
    assert [x.name for x in f([r("a", 2), r("b", 5)])] == ["a"]
    assert [x.name for x in f([r("a", 2), r("b", 5)])] == []
    assert [x.name for x in f([r("a", 2), r("b", 5)])] == ["a", "b"]  # keyframe
    f.force(2)  # a new collector shard: the next two windows carry everything
    assert [x.name for x in f([r("a", 2), r("b", 5)])] == ["a", "b"]
    assert [x.name for x in f([r("a", 2), r("b", 5)])] == ["a", "b"]
    assert [x.name for x in f([r("a", 2), r("b", 5)])] == ["a", "b"]  # the periodic one
    assert [x.name for x in f([r("a", 2), r("b", 5)])] == []
