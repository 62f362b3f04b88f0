"""Fake sysfs trees of GPU hosts, as the kernel lays them out: an HGX-like 8-GPU / 8-NIC
host and a laptop with no GPU of its own. The checked-in copies under tests/fixtures/sys
(`gpu8`, `laptop`) are this module's output; tests/unit/test_pcie.py holds them to it.

    .venv/bin/python -m tests.support.pcitree     # rewrite tests/fixtures/sys/{gpu8,laptop}

gpu8: two sockets (NUMA nodes 0 and 1), each with two PCIe switches on root complexes of
their own; each switch holds two GPUs and two ConnectX NICs (mlx5_0..mlx5_7, NIC i on rail
i, 10.100.i.17/24), as an HGX H100 board is laid out. A ninth NIC, mlx5_8 (the frontend
network, 192.0.2.17), sits on socket 0's first root complex with no GPU near it.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sys"
NVIDIA, MELLANOX, BROADCOM, INTEL = "0x10de", "0x15b3", "0x1000", "0x8086"
GPU_CLASS, NIC_CLASS, BRIDGE_CLASS = "0x030200", "0x020000", "0x060400"
# (host bridge bus, NUMA node) of the four switches; the frontend NIC's root complex is 00
SWITCHES = ((0x15, 0), (0x37, 0), (0x95, 1), (0xB7, 1))
HOST = 17  # the host part of every address


@dataclass(frozen=True)
class Fn:
    """One PCI function to write: its path under devices/ and its ids."""

    path: str  # "pci0000:15/0000:15:01.0/..."
    cls: str
    vendor: str
    numa: int

    @property
    def bdf(self) -> str:
        return self.path.rsplit("/", 1)[-1]


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _link(link: Path, target: Path) -> None:
    """A relative symlink LINK -> TARGET, as sysfs makes them."""
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(target, link.parent), link)


def add_function(root: Path, fn: Fn, driver: str = "") -> Path:
    d = root / "devices" / fn.path
    _write(d / "class", fn.cls)
    _write(d / "vendor", fn.vendor)
    _write(d / "numa_node", str(fn.numa))
    if fn.cls == NIC_CLASS:
        for name, value in (
            ("current_link_speed", "32.0 GT/s PCIe"),
            ("max_link_speed", "32.0 GT/s PCIe"),
            ("current_link_width", "16"),
            ("max_link_width", "16"),
        ):
            _write(d / name, value)
    if driver:
        drv = root / "bus" / "pci" / "drivers" / driver
        _write(drv / "uevent", f"DRIVER={driver}")
        _link(d / "driver", drv)
    _link(root / "bus" / "pci" / "devices" / fn.bdf, d)
    return d


def _gid(ipv4: str) -> str:
    a, b, c, d = (int(x) for x in ipv4.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"


def add_rdma_nic(root: Path, name: str, fn_dir: Path | None, netdev: str, ipv4: str) -> None:
    """class/infiniband/NAME (port 1 up, a link-local and an IPv4 GID of each RoCE
    version on NETDEV) and class/net/NETDEV; `device` links to FN_DIR when given."""
    dev = root / "class" / "infiniband" / name
    port = dev / "ports" / "1"
    _write(dev / "node_type", "1: CA")
    if fn_dir is None:
        _write(dev / "parent", netdev)  # soft-RoCE names its netdev
    else:
        _link(dev / "device", fn_dir)
        _write(dev / "fw_ver", "28.39.1002")
    _write(port / "state", "4: ACTIVE")
    _write(port / "phys_state", "5: LinkUp")
    _write(port / "link_layer", "Ethernet")
    _write(port / "rate", "400 Gb/sec (4X NDR)" if fn_dir else "10 Gb/sec (1X QDR)")
    gids = [
        ("fe80:0000:0000:0000:0000:0000:0000:0011", "IB/RoCE v1"),
        ("fe80:0000:0000:0000:0000:0000:0000:0011", "RoCE v2"),
        (_gid(ipv4), "IB/RoCE v1"),
        (_gid(ipv4), "RoCE v2"),
    ]
    for i, (gid, kind) in enumerate(gids):
        _write(port / "gids" / str(i), gid)
        _write(port / "gid_attrs" / "types" / str(i), kind)
        _write(port / "gid_attrs" / "ndevs" / str(i), netdev)
    nd = root / "class" / "net" / netdev
    _write(nd / "mtu", "9000" if fn_dir else "1500")
    _write(nd / "operstate", "up")
    if fn_dir is not None:
        _link(nd / "device", fn_dir)


def build_gpu8(root: Path) -> None:
    for node in (0, 1):  # (every directory holds a file: git keeps no empty one)
        _write(
            root / "devices" / "system" / "node" / f"node{node}" / "cpulist",
            f"{node * 64}-{node * 64 + 63}",
        )
    nic = 0
    for bus, numa in SWITCHES:
        hb = f"pci0000:{bus:02x}"
        rp = f"{hb}/0000:{bus:02x}:01.0"
        up = f"{rp}/0000:{bus + 1:02x}:00.0"
        for f in (rp, up):
            add_function(root, Fn(f, BRIDGE_CLASS, BROADCOM if f == up else INTEL, numa))
        for slot in range(4):  # GPU, NIC, GPU, NIC on the switch's downstream ports
            down = f"{up}/0000:{bus + 2:02x}:{slot:02x}.0"
            add_function(root, Fn(down, BRIDGE_CLASS, BROADCOM, numa))
            ep = f"{down}/0000:{bus + 3 + slot:02x}:00.0"
            if slot % 2 == 0:
                add_function(root, Fn(ep, GPU_CLASS, NVIDIA, numa), "nvidia")
                continue
            fn_dir = add_function(root, Fn(ep, NIC_CLASS, MELLANOX, numa), "mlx5_core")
            netdev = f"enp{bus + 3 + slot}s0np0"
            add_rdma_nic(root, f"mlx5_{nic}", fn_dir, netdev, f"10.100.{nic}.{HOST}")
            nic += 1
    rp = "pci0000:00/0000:00:02.0"
    add_function(root, Fn(rp, BRIDGE_CLASS, INTEL, 0))
    fn_dir = add_function(root, Fn(f"{rp}/0000:01:00.0", NIC_CLASS, MELLANOX, 0), "mlx5_core")
    add_rdma_nic(root, "mlx5_8", fn_dir, "enp1s0f0np0", f"192.0.2.{HOST}")


def build_laptop(root: Path) -> None:
    """One socket, an Intel GPU in the CPU, Wi-Fi, an NVMe drive, and soft-RoCE (rxe0)
    on the Wi-Fi netdev; numa_node -1 everywhere, as a kernel without NUMA says."""
    _write(root / "devices" / "system" / "node" / "node0" / "cpulist", "0-7")
    hb = "pci0000:00"
    for path, cls in (
        (f"{hb}/0000:00:02.0", "0x030000"),  # the CPU's own GPU: not NVIDIA or AMD
        (f"{hb}/0000:00:14.3", "0x028000"),  # Wi-Fi
        (f"{hb}/0000:00:1d.0", BRIDGE_CLASS),
        (f"{hb}/0000:00:1d.0/0000:03:00.0", "0x010802"),  # NVMe
    ):
        add_function(root, Fn(path, cls, INTEL, -1))
    add_rdma_nic(root, "rxe0", None, "wlp0s20f3", "192.0.2.10")


BUILDERS = {"gpu8": build_gpu8, "laptop": build_laptop}


def main() -> None:
    for name, build in BUILDERS.items():
        out = FIXTURES / name
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        build(out)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
