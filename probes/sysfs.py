"""Read RDMA devices, ports and GIDs from sysfs (`/sys/class/infiniband`).

Every reader takes the sysfs root (normally `/sys`) so tests can point it at a fixture
tree. Kernel ABI: Documentation/ABI/stable/sysfs-class-infiniband.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path

from fabricprobe.core.errors import ParseError, SysfsError
from fabricprobe.probes.numbers import uint_or_none

# One bounded read per file: a few drivers return EAGAIN forever or huge blobs.
_MAX_READ = 4096
# Errors that mean "this optional attribute is not offered here", not "broken".
_ABSENT_ERRNOS = {
    errno.ENOENT,
    errno.EPERM,
    errno.EACCES,
    errno.EOPNOTSUPP,
    errno.EINVAL,
    errno.ENODEV,
    errno.EAGAIN,
}
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
_HEX = frozenset("0123456789abcdefABCDEF")
MAX_INDEX = 1 << 16  # GID table and port numbers: the kernel's are far smaller


def parse_gid(text: str) -> bytes:
    """A GID as sysfs prints it (8 colon-separated groups of 4 hex digits) -> 16 bytes.

    ParseError for anything else: the text comes from a driver, or from a peer.
    """
    groups = text.strip().split(":")
    if len(groups) != 8 or not all(len(g) == 4 and _HEX.issuperset(g) for g in groups):
        raise ParseError(f"not a GID (8 groups of 4 hex digits): {text.strip()[:60]!r}")
    return bytes.fromhex("".join(groups))


def read_small(path: Path) -> str:
    """Read a small sysfs file with one bounded read; raises OSError as the kernel does."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        return os.read(fd, _MAX_READ).decode("ascii", "replace").strip()
    finally:
        os.close(fd)


def read_required(path: Path) -> str:
    """Read a file that must exist; a failure is a SysfsError naming the path."""
    try:
        return read_small(path)
    except OSError as e:
        raise SysfsError(f"cannot read {path}: {e.strerror or e}") from e


def read_optional(path: Path) -> str | None:
    """Read a file that may be absent or unsupported; None when it is."""
    try:
        return read_small(path)
    except OSError as e:
        if e.errno in _ABSENT_ERRNOS or isinstance(e, IsADirectoryError):
            return None
        raise SysfsError(f"cannot read {path}: {e.strerror or e}") from e


@dataclass(frozen=True)
class Gid:
    index: int
    gid: str  # ports/N/gids/I, colon-separated 16 bytes
    type: str | None  # ports/N/gid_attrs/types/I: "RoCE v2" or "IB/RoCE v1"
    netdev: str | None  # ports/N/gid_attrs/ndevs/I

    @property
    def is_roce_v2(self) -> bool:
        return self.type == "RoCE v2"

    @property
    def ipv4(self) -> str | None:
        """The IPv4 address of an IPv4-mapped GID (::ffff:a.b.c.d), else None (an IPv6
        GID, or text that is not a GID at all)."""
        try:
            raw = parse_gid(self.gid)
        except ParseError:
            return None
        if raw[:12] != bytes(10) + b"\xff\xff":
            return None
        return ".".join(str(b) for b in raw[12:])


@dataclass(frozen=True)
class Port:
    number: int
    state: str  # ports/N/state, e.g. "4: ACTIVE" -> "ACTIVE"
    phys_state: str | None  # ports/N/phys_state, e.g. "5: LinkUp" -> "LinkUp"
    link_layer: str | None  # ports/N/link_layer: "Ethernet" or "InfiniBand"
    rate: str | None  # ports/N/rate, e.g. "100 Gb/sec (4X EDR)"
    gids: tuple[Gid, ...]
    skipped: tuple[str, ...] = ()  # one message per gids/I file that held no GID

    def netdevs(self) -> tuple[str, ...]:
        return tuple(sorted({g.netdev for g in self.gids if g.netdev}))


@dataclass(frozen=True)
class RdmaDevice:
    name: str
    node_type: str | None  # node_type, e.g. "1: CA"
    fw_ver: str | None  # fw_ver
    node_guid: str | None  # node_guid
    driver: str | None  # basename of device/driver link; soft-RoCE has no device/ link
    parent_netdev: str | None  # parent (rxe, siw) or None
    ports: tuple[Port, ...]

    def port(self, number: int) -> Port | None:
        return next((p for p in self.ports if p.number == number), None)


def _after_colon(text: str | None) -> str | None:
    """`4: ACTIVE` -> `ACTIVE` (sysfs prints the numeric enum and its name)."""
    if text is None:
        return None
    return text.split(":", 1)[1].strip() if ":" in text else text


def _read_gids(port_dir: Path) -> tuple[tuple[Gid, ...], tuple[str, ...]]:
    """The port's GIDs in index order, and a message for each entry that was not a GID
    (skipped, as a bad counter file is)."""
    gids_dir = port_dir / "gids"
    if not gids_dir.is_dir():
        return (), ()
    indexed = ((uint_or_none(p.name, MAX_INDEX), p) for p in gids_dir.iterdir())
    out = []
    skipped = []
    for index, entry in sorted((i, p) for i, p in indexed if i is not None):
        gid = read_optional(entry)
        if not gid or gid == ZERO_GID:
            continue
        try:
            parse_gid(gid)
        except ParseError as e:
            skipped.append(f"gids/{index}: {e}")
            continue
        gtype = read_optional(port_dir / "gid_attrs" / "types" / entry.name)
        ndev = read_optional(port_dir / "gid_attrs" / "ndevs" / entry.name)
        out.append(Gid(index=index, gid=gid, type=gtype, netdev=ndev))
    return tuple(out), tuple(skipped)


def read_port(device_dir: Path, number: int) -> Port:
    """Read /sys/class/infiniband/DEV/ports/N (state is required, the rest optional)."""
    pdir = device_dir / "ports" / str(number)
    gids, skipped = _read_gids(pdir)
    return Port(
        number=number,
        state=_after_colon(read_required(pdir / "state")) or "",
        phys_state=_after_colon(read_optional(pdir / "phys_state")),
        link_layer=read_optional(pdir / "link_layer"),
        rate=read_optional(pdir / "rate"),
        gids=gids,
        skipped=skipped,
    )


def read_device(sysfs_root: Path | str, name: str) -> RdmaDevice:
    """Read one device from SYSFS/class/infiniband/NAME."""
    ddir = Path(sysfs_root) / "class" / "infiniband" / name
    if not ddir.is_dir():
        raise SysfsError(f"no RDMA device {name!r}: {ddir} does not exist")
    ports_dir = ddir / "ports"
    if not ports_dir.is_dir():
        raise SysfsError(f"cannot read {ports_dir}: no ports directory")
    numbers = sorted(
        n for n in (uint_or_none(p.name, MAX_INDEX) for p in ports_dir.iterdir()) if n is not None
    )
    driver_link = ddir / "device" / "driver"
    driver = os.path.basename(os.readlink(driver_link)) if driver_link.is_symlink() else None
    node_type = read_optional(ddir / "node_type")
    if driver is None:
        driver = _soft_driver(ddir, name, node_type)
    return RdmaDevice(
        name=name,
        node_type=node_type,
        fw_ver=read_optional(ddir / "fw_ver"),
        node_guid=read_optional(ddir / "node_guid"),
        driver=driver,
        parent_netdev=read_optional(ddir / "parent"),
        ports=tuple(read_port(ddir, n) for n in numbers),
    )


def _soft_driver(ddir: Path, name: str, node_type: str | None) -> str | None:
    """The driver of a device with no device/ link (software RDMA has no bus device).

    Soft-RoCE and soft-iWARP name their netdev in `parent`, whatever the device is
    called (`rdma link add roce0 type rxe ...` is as valid as rxe0); they differ in
    node_type: rxe is a CA ("1: CA"), siw an RNIC ("4: RNIC").
    """
    if (ddir / "parent").is_file():
        return "siw" if (node_type or "").startswith("4") else "rdma_rxe"
    return "rdma_rxe" if name.startswith("rxe") else None


def list_device_names(sysfs_root: Path | str) -> list[str]:
    """Names under SYSFS/class/infiniband; empty when the class does not exist."""
    cls = Path(sysfs_root) / "class" / "infiniband"
    if not cls.is_dir():
        return []
    return sorted(p.name for p in cls.iterdir())


def read_devices(sysfs_root: Path | str = "/sys") -> list[RdmaDevice]:
    """Every RDMA device under SYSFS/class/infiniband, sorted by name."""
    return [read_device(sysfs_root, n) for n in list_device_names(sysfs_root)]


def find_gid(device: RdmaDevice, port: int = 1, ipv4: str | None = None) -> Gid | None:
    """The RoCE v2 GID to use: the one mapping IPV4 when given, else the first IPv4 one."""
    p = device.port(port)
    if p is None:
        return None
    v2 = [g for g in p.gids if g.is_roce_v2]
    if ipv4 is not None:
        return next((g for g in v2 if g.ipv4 == ipv4), None)
    return next((g for g in v2 if g.ipv4), v2[0] if v2 else None)
