from __future__ import annotations

from pathlib import Path

import pytest

from fabricprobe.core.errors import SysfsError
from fabricprobe.probes.sysfs import Gid, find_gid, read_device, read_devices
from tests.unit.sysfs_builder import add_rdma_device

V2 = "0000:0000:0000:0000:0000:ffff:c000:0201"
LINK_LOCAL = "fe80:0000:0000:0000:5054:00ff:fe12:3456"


def test_reads_ports_and_gids_with_types(tmp_path: Path) -> None:
    add_rdma_device(
        tmp_path,
        "rxe0",
        [(0, LINK_LOCAL, "IB/RoCE v1", "eth0"), (1, V2, "RoCE v2", "eth0")],
        parent="eth0",
    )
    (dev,) = read_devices(tmp_path)
    assert dev.name == "rxe0" and dev.parent_netdev == "eth0" and dev.driver == "rdma_rxe"
    port = dev.port(1)
    assert port is not None and port.state == "ACTIVE" and port.phys_state == "LinkUp"
    assert [g.index for g in port.gids] == [0, 1]
    gid = find_gid(dev)
    assert gid is not None and gid.index == 1 and gid.ipv4 == "192.0.2.1"


def test_soft_rdma_is_known_by_its_parent_whatever_its_name(tmp_path: Path) -> None:
    # `probe rxe up --name roce0` (or `rdma link add roce0 type rxe`) is soft-RoCE too:
    # validate must not hold it to a NIC's PFC and ECN checks
    add_rdma_device(tmp_path, "roce0", [(1, V2, "RoCE v2", "eth0")], parent="eth0")
    siw = add_rdma_device(tmp_path, "iw0", [], parent="eth1")
    (siw / "node_type").write_text("4: RNIC\n")
    add_rdma_device(tmp_path, "odd0", [])  # no parent, no device/: not known as soft
    drivers = {d.name: d.driver for d in read_devices(tmp_path)}
    assert drivers == {"roce0": "rdma_rxe", "iw0": "siw", "odd0": None}


def test_zero_gids_are_skipped_and_v1_only_has_no_v2(tmp_path: Path) -> None:
    zero = "0000:0000:0000:0000:0000:0000:0000:0000"
    add_rdma_device(
        tmp_path,
        "mlx5_0",
        [(0, LINK_LOCAL, "IB/RoCE v1", "ens1"), (1, V2, "IB/RoCE v1", "ens1"), (2, zero, "", "")],
        driver="mlx5_core",
    )
    dev = read_device(tmp_path, "mlx5_0")
    assert dev.driver == "mlx5_core"
    assert len(dev.ports[0].gids) == 2
    assert find_gid(dev) is None


def test_missing_device_and_missing_state_are_errors_with_the_path(tmp_path: Path) -> None:
    with pytest.raises(SysfsError, match="no RDMA device"):
        read_device(tmp_path, "mlx5_9")
    dev = add_rdma_device(tmp_path, "rxe0", [], parent="eth0")
    (dev / "ports" / "1" / "state").unlink()
    with pytest.raises(SysfsError, match="ports/1/state"):
        read_device(tmp_path, "rxe0")


def test_no_infiniband_class_means_no_devices(tmp_path: Path) -> None:
    assert read_devices(tmp_path) == []


@pytest.mark.parametrize(
    ("gid", "ipv4"),
    [
        (V2, "192.0.2.1"),
        (LINK_LOCAL, None),
        ("garbage", None),
    ],
)
def test_gid_ipv4(gid: str, ipv4: str | None) -> None:
    assert Gid(0, gid, "RoCE v2", None).ipv4 == ipv4
