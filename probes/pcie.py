"""The PCI topology of a GPU host from sysfs: its GPUs, the PCI function under each RDMA
device, how far each NIC is from each GPU, and which GPU each NIC serves.

Kernel ABI: Documentation/ABI/testing/sysfs-bus-pci (`class`, `vendor`, `numa_node`) and
Documentation/ABI/stable/sysfs-class-infiniband (`device`, the link to the parent bus
device). A PCI function's directory under `devices/` names its way from the CPU:
`devices/pci0000:17/0000:17:01.0/0000:18:00.0/0000:19:02.0/0000:1c:00.0` is host bridge
(root complex) `pci0000:17`, root port 17:01.0, a switch's upstream port 18:00.0 and
downstream port 19:02.0, and the device 1c:00.0. `class/infiniband/DEV/device` and
`bus/pci/devices/BDF` are relative symlinks into that tree; they are followed inside the
sysfs root only (`resolve_in_root`), so a fixture tree, or a hostile one, never sends a
reader elsewhere.

Distances are nvidia-smi topo's (its `nvidia-smi topo -m` legend), nearest first:

    PIX   at most a single PCIe bridge (one switch: up to it and down again)
    PXB   several PCIe bridges, without the host bridge
    PHB   through a PCIe host bridge (the CPU), one root complex
    NODE  between PCIe host bridges of one NUMA node
    SYS   across the SMP interconnect between NUMA nodes (QPI/UPI, xGMI)

Here a PCIe switch (its upstream port and the downstream ports under it) counts as one
bridge, as nvidia-smi counts it: a GPU and a NIC on two downstream ports of one switch
are PIX. NCCL names its PCIe path types with the same words (PIX, PXB, PHB, SYS in
src/graph/topo.cc), without NODE.
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from fabricprobe.core.errors import ParseError
from fabricprobe.probes.numbers import parse_uint
from fabricprobe.probes.sysfs import list_device_names, read_optional

# PCI class codes (base class, subclass) of GPUs: 0x0300 VGA controller, 0x0302 3D
# controller (NVIDIA's data-centre GPUs), 0x0380 display controller (AMD Instinct up to
# MI250X), 0x1200 processing accelerator (AMD Instinct MI300); the programming interface
# byte after them is ignored. Counted only from these vendors: an integrated GPU from the
# CPU's maker does not take part in GPUDirect RDMA.
GPU_CLASSES = frozenset({0x0300, 0x0302})
AMD_ACCEL_CLASSES = frozenset({0x0380, 0x1200})
GPU_VENDORS = {0x10DE: "NVIDIA", 0x1002: "AMD"}

# Domains past 0xffff exist (Intel VMD puts its NVMe behind 10000:e0), so up to 8 digits.
_BDF = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]")
_HOST_BRIDGE = re.compile(r"pci[0-9a-f]{4,8}:[0-9a-f]{2}")
MAX_SYMLINKS = 40  # as the kernel's ELOOP bound on one lookup
MAX_DEPTH = 64  # path components of a device path: PCI trees are a dozen deep at most
MAX_NUMA_NODE = 1023  # the kernel's MAX_NUMNODES is at most 1 << 10
MAX_FUNCTIONS = 4096  # entries of bus/pci/devices read: a host has a few hundred


class Link(enum.IntEnum):
    """How far apart two PCI functions are, nearest first (nvidia-smi topo's terms)."""

    PIX = 1
    PXB = 2
    PHB = 3
    NODE = 4
    SYS = 5


@dataclass(frozen=True)
class PciFunction:
    """One PCI function and its way up to the CPU."""

    address: str  # its BDF, "0000:1c:00.0"
    host_bridge: str  # the root complex it hangs off, "pci0000:17"
    bridges: tuple[str, ...]  # BDFs from the root port down to it, itself excluded
    numa_node: int | None  # numa_node; None when the kernel says -1 or nothing


@dataclass(frozen=True)
class Gpu:
    index: int  # its place in PCI address order, as nvidia-smi numbers GPUs by default
    vendor: str  # "NVIDIA" or "AMD"
    function: PciFunction

    @property
    def name(self) -> str:
        return f"GPU{self.index}"


@dataclass(frozen=True)
class NicGpu:
    """The GPU an RDMA device serves: the nearest one, and how near it is."""

    device: str  # RDMA device, "mlx5_0"
    nic: str  # its PCI address
    gpu: Gpu
    link: Link


# ----------------------------------------------------------------------- parsers


def parse_pci_address(text: str) -> str:
    """A PCI address (domain:bus:device.function, `0000:1c:00.0`) in lower case;
    ParseError for anything else."""
    s = text.strip().lower()
    if not _BDF.fullmatch(s):
        raise ParseError(f"not a PCI address (DDDD:BB:DD.F): {text.strip()[:40]!r}")
    return s


def parse_pci_id(text: str, what: str, digits: int) -> int:
    """A sysfs id in hex (`class` 0x030200, `vendor` 0x10de) of at most DIGITS digits."""
    s = text.strip().lower()
    body = s[2:] if s.startswith("0x") else ""
    if not body or len(body) > digits or not all(c in "0123456789abcdef" for c in body):
        raise ParseError(f"{what} {s[:30]!r} is not 0x and at most {digits} hex digits")
    return int(body, 16)


def parse_numa_node(text: str) -> int | None:
    """`numa_node`: the node, or None for -1 (the platform does not say)."""
    s = text.strip()
    if s == "-1":
        return None
    return parse_uint(s, "numa_node", MAX_NUMA_NODE)


def parse_device_path(text: str) -> tuple[str, tuple[str, ...], str]:
    """A resolved device path inside sysfs (`devices/pci0000:17/0000:17:01.0/.../BDF`,
    relative to the root) -> (host bridge, bridges from the root port down, BDF).

    ParseError when it is not a PCI function under a host bridge: a software device, a
    virtual bus, or a tree that says something else.
    """
    parts = [p for p in text.strip().split("/") if p]
    if len(parts) > MAX_DEPTH:
        raise ParseError(f"device path over {MAX_DEPTH} components")
    if len(parts) < 3 or parts[0] != "devices" or not _HOST_BRIDGE.fullmatch(parts[1]):
        raise ParseError(f"not under devices/pciDDDD:BB: {text.strip()[:80]!r}")
    chain = parts[2:]
    if not all(_BDF.fullmatch(p) for p in chain):
        raise ParseError(f"not a chain of PCI addresses: {text.strip()[:80]!r}")
    return parts[1], tuple(chain[:-1]), chain[-1]


# ------------------------------------------------------------------- distances


def link_between(a: PciFunction, b: PciFunction, single_node: bool = False) -> Link:
    """How far A is from B (symmetric). SINGLE_NODE: the host has one NUMA node, so two
    host bridges whose node the kernel does not say are still on one node."""
    if a.host_bridge != b.host_bridge:
        if a.numa_node is not None and a.numa_node == b.numa_node:
            return Link.NODE
        if a.numa_node is None and b.numa_node is None and single_node:
            return Link.NODE
        return Link.SYS
    common = 0
    for x, y in zip(a.bridges, b.bridges, strict=False):
        if x != y:
            break
        common += 1
    if common == 0:
        return Link.PHB  # different root ports of one root complex
    # The bridges each side crosses below the deepest one they share: one each (the
    # downstream ports of one switch) or none is a single switch; more is a second one.
    if len(a.bridges) - common <= 1 and len(b.bridges) - common <= 1:
        return Link.PIX
    return Link.PXB


def attribute(
    nics: Mapping[str, PciFunction], gpus: Iterable[Gpu], single_node: bool = False
) -> dict[str, NicGpu]:
    """Each RDMA device's GPU: the nearest one. Where several are equally near, the NICs
    that share the same nearest GPUs take them in turn, each in PCI address order (the
    first NIC of a switch the first GPU, the second NIC the second): on a rail-optimized
    host (HGX, two GPUs and two NICs a switch) NIC i then serves GPU i. No GPU: {}."""
    gpu_list = sorted(gpus, key=lambda g: g.function.address)
    if not gpu_list:
        return {}
    groups: dict[tuple[Link, tuple[int, ...]], list[tuple[str, PciFunction]]] = {}
    for device, fn in nics.items():
        links = [link_between(fn, g.function, single_node) for g in gpu_list]
        best = min(links)
        nearest = tuple(i for i, link in enumerate(links) if link == best)
        groups.setdefault((best, nearest), []).append((device, fn))
    out: dict[str, NicGpu] = {}
    for (best, nearest), members in groups.items():
        members.sort(key=lambda m: (m[1].address, m[0]))
        for k, (device, fn) in enumerate(members):
            out[device] = NicGpu(device, fn.address, gpu_list[nearest[k % len(nearest)]], best)
    return dict(sorted(out.items()))


# ------------------------------------------------------------------------- reads


def resolve_in_root(root: Path, rel: str) -> str | None:
    """REL (a path inside ROOT that may cross symlinks) resolved inside ROOT, as a path
    relative to it; None when a link is absolute, climbs out of ROOT, loops, or the path
    does not exist. sysfs's own links are relative (`../../../devices/...`)."""
    todo = [p for p in rel.split("/") if p]
    parts: list[str] = []
    hops = 0
    while todo:
        part = todo.pop(0)
        if part == ".":
            continue
        if part == "..":
            if not parts:
                return None  # above the root
            parts.pop()
            continue
        here = root.joinpath(*parts, part)
        if os.path.islink(here):
            hops += 1
            try:
                target = os.readlink(here)
            except OSError:
                return None
            if hops > MAX_SYMLINKS or target.startswith("/"):
                return None
            todo[:0] = [p for p in target.split("/") if p]
            continue
        if not os.path.lexists(here) or len(parts) >= MAX_DEPTH:
            return None
        parts.append(part)
    return "/".join(parts)


def read_numa_node(fn_dir: Path) -> int | None:
    """DEV/numa_node (absent, unreadable or not a number: unknown, as -1 is)."""
    text = read_optional(fn_dir / "numa_node")
    if text is None:
        return None
    try:
        return parse_numa_node(text)
    except ParseError:
        return None


def read_pci_function(root: Path, rel: str) -> PciFunction | None:
    """The PCI function at ROOT/REL (a link or a path into devices/), None when it is
    not one (a software RDMA device has no `device` link at all)."""
    real = resolve_in_root(root, rel)
    if real is None:
        return None
    try:
        host_bridge, bridges, address = parse_device_path(real)
    except ParseError:
        return None
    return PciFunction(address, host_bridge, bridges, read_numa_node(root / real))


def read_gpus(root: Path | str) -> list[Gpu]:
    """Every GPU under ROOT/bus/pci/devices (by `class` and `vendor`), in PCI address
    order, numbered in it; [] on a host without one."""
    base = Path(root)
    pci = base / "bus" / "pci" / "devices"
    if not pci.is_dir():
        return []
    found: list[PciFunction] = []
    vendors: dict[str, str] = {}
    names = sorted(p.name for p in pci.iterdir())[:MAX_FUNCTIONS]
    for name in names:
        vendor = _gpu_vendor(pci / name)
        if vendor is None:
            continue
        fn = read_pci_function(base, f"bus/pci/devices/{name}")
        if fn is not None:
            found.append(fn)
            vendors[fn.address] = vendor
    found.sort(key=lambda f: f.address)
    return [Gpu(i, vendors[f.address], f) for i, f in enumerate(found)]


def _gpu_vendor(fn_dir: Path) -> str | None:
    """The vendor's name when FN_DIR is a GPU, else None (unreadable ids included)."""
    cls, ven = read_optional(fn_dir / "class"), read_optional(fn_dir / "vendor")
    if cls is None or ven is None:
        return None
    try:
        code = parse_pci_id(cls, "class", 6) >> 8
        vendor = GPU_VENDORS.get(parse_pci_id(ven, "vendor", 4))
    except ParseError:
        return None
    if vendor is None:
        return None
    if code in GPU_CLASSES or (vendor == "AMD" and code in AMD_ACCEL_CLASSES):
        return vendor
    return None


def read_nic_functions(root: Path | str, devices: Iterable[str] = ()) -> dict[str, PciFunction]:
    """RDMA device -> the PCI function under it (class/infiniband/DEV/device), for
    DEVICES (all when empty); software devices (rxe, siw) have none and are left out."""
    base = Path(root)
    names = list(devices) or list_device_names(base)
    out = {}
    for name in names:
        if "/" in name or name in (".", ".."):
            continue
        fn = read_pci_function(base, f"class/infiniband/{name}/device")
        if fn is not None:
            out[name] = fn
    return out


def single_numa_node(root: Path | str) -> bool:
    """Whether the host has at most one NUMA node (devices/system/node/nodeN)."""
    nodes = Path(root) / "devices" / "system" / "node"
    if not nodes.is_dir():
        return True  # a kernel without NUMA: one node
    return sum(1 for p in nodes.iterdir() if re.fullmatch(r"node[0-9]+", p.name)) <= 1


def read_nic_gpus(root: Path | str, devices: Iterable[str] = ()) -> dict[str, NicGpu]:
    """Each RDMA device's GPU on the host under ROOT (see attribute()), for DEVICES (all
    when empty); {} on a host with no GPU or no PCI RDMA device. The GPUs are shared out
    among all the host's NICs whichever are asked for, so a NIC's GPU never depends on
    which others were named."""
    gpus = read_gpus(root)
    if not gpus:
        return {}
    every = attribute(read_nic_functions(root), gpus, single_numa_node(root))
    wanted = set(devices)
    return {d: g for d, g in every.items() if not wanted or d in wanted}
