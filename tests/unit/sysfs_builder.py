"""Build small sysfs trees in a temporary directory for tests of readers."""

from __future__ import annotations

from pathlib import Path


def add_rdma_device(
    root: Path,
    name: str,
    gids: list[tuple[int, str, str, str]],
    parent: str | None = None,
    state: str = "4: ACTIVE",
    driver: str | None = None,
) -> Path:
    """Create class/infiniband/NAME with port 1 and GIDS as (index, gid, type, ndev)."""
    dev = root / "class" / "infiniband" / name
    port = dev / "ports" / "1"
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs", "hw_counters"):
        (port / sub).mkdir(parents=True, exist_ok=True)
    (dev / "node_type").write_text("1: CA\n")
    if parent:
        (dev / "parent").write_text(parent + "\n")
    if driver:
        drv = root / "bus" / "pci" / "drivers" / driver
        drv.mkdir(parents=True, exist_ok=True)
        (dev / "device").mkdir()
        (dev / "device" / "driver").symlink_to(drv)
    (port / "state").write_text(state + "\n")
    (port / "phys_state").write_text("5: LinkUp\n")
    (port / "link_layer").write_text("Ethernet\n")
    for index, gid, gtype, ndev in gids:
        (port / "gids" / str(index)).write_text(gid + "\n")
        (port / "gid_attrs" / "types" / str(index)).write_text(gtype + "\n")
        (port / "gid_attrs" / "ndevs" / str(index)).write_text(ndev + "\n")
    return dev


def add_netdev(root: Path, name: str, mtu: int = 1500) -> Path:
    nd = root / "class" / "net" / name
    nd.mkdir(parents=True, exist_ok=True)
    (nd / "mtu").write_text(f"{mtu}\n")
    return nd
