"""Which rail each RDMA device is on.

A GPU host of a rail-optimized fabric has one NIC per rail (eight on an HGX H100 or H200
host), and each rail is a network of its own: NIC i of every host is cabled to rail i's
leaves, and traffic between rails crosses nothing but the hosts. Probes must then go
device to device within a rail, never across.

Nothing is guessed: a host whose configuration names no rail has none, and every probe
goes as it always did. The rule is a list of entries, tried in this order:

    mlx5_3=3          by device name: exact, for one odd host
    10.100.3.0/24=3   by the network of the device's RoCE v2 addresses (its GIDs): the
                      rail is the network, so a fleet-wide list is right on every host,
                      whatever its NICs are called or in which order they enumerate
    gpu               rail = the index of the device's GPU (fabricprobe.probes.pcie,
                      nvidia-smi's numbering) when the two share a PCIe switch (PIX or
                      PXB): NIC of GPU i on rail i, the rail-optimized convention, with no
                      list of networks to keep; a NIC farther from every GPU (the frontend
                      or storage NIC on the CPU's root complex) is on no rail

A device that no entry places has no rail (the frontend NIC, a storage NIC). Where two
subnet entries hold one of its addresses, the first written wins.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fabricprobe.core.errors import ParseError
from fabricprobe.probes.numbers import parse_uint
from fabricprobe.probes.pcie import Link, NicGpu
from fabricprobe.probes.sysfs import RdmaDevice, parse_gid

MAX_RAIL = 63  # as the fabric file's rails (collector/fabric/topology.py)
MAX_ENTRIES = 256
_DEVICE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class RailMap:
    """The rail rule of one host (see the module docstring); empty: no rails."""

    devices: Mapping[str, int]
    networks: tuple[tuple[Network, int], ...] = ()
    by_gpu: bool = False

    def __bool__(self) -> bool:
        return bool(self.devices or self.networks or self.by_gpu)

    def rail_of(self, device: RdmaDevice, gpu: NicGpu | None = None) -> int | None:
        """DEVICE's rail, None when no entry places it."""
        if device.name in self.devices:
            return self.devices[device.name]
        addresses = device_addresses(device)
        for net, rail in self.networks:
            if any(a.version == net.version and a in net for a in addresses):
                return rail
        if self.by_gpu and gpu is not None and gpu.link <= Link.PXB and gpu.gpu.index <= MAX_RAIL:
            return gpu.gpu.index
        return None

    def rails(
        self, devices: Iterable[RdmaDevice], gpus: Mapping[str, NicGpu] | None = None
    ) -> dict[str, int]:
        """Device name -> rail, for the devices that have one."""
        out = {}
        for d in devices:
            rail = self.rail_of(d, (gpus or {}).get(d.name))
            if rail is not None:
                out[d.name] = rail
        return out

    def describe(self) -> str:
        """The rule as it was given, in its order of precedence."""
        parts = [f"{d}={r}" for d, r in self.devices.items()]
        parts += [f"{n}={r}" for n, r in self.networks]
        parts += ["gpu"] if self.by_gpu else []
        return ",".join(parts)


NO_RAILS = RailMap({})


def parse_rail(text: str) -> int:
    return parse_uint(text, "rail", MAX_RAIL)


def parse_rails(entries: Iterable[str]) -> RailMap:
    """The rule from its entries (each may hold several, comma-separated): `DEV=RAIL`,
    `CIDR=RAIL` or `gpu`. ParseError naming the entry for anything else, or for a device
    or a network given twice."""
    devices: dict[str, int] = {}
    networks: list[tuple[Network, int]] = []
    by_gpu = False
    items = [p.strip() for e in entries for p in e.split(",") if p.strip()]
    if len(items) > MAX_ENTRIES:
        raise ParseError(f"rails: {len(items)} entries, more than {MAX_ENTRIES}")
    for item in items:
        if item == "gpu":
            by_gpu = True
            continue
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq:
            raise ParseError(f"rails: {item[:60]!r} is not DEV=RAIL, CIDR=RAIL or gpu")
        try:
            rail = parse_rail(value)
        except ParseError as e:
            raise ParseError(f"rails: {item[:60]!r}: {e}") from None
        if "/" in key:
            try:
                net = ipaddress.ip_network(key, strict=True)
            except ValueError as e:
                raise ParseError(f"rails: {key[:60]!r} is not a network ({e})") from None
            if any(n == net for n, _ in networks):
                raise ParseError(f"rails: network {net} given twice")
            networks.append((net, rail))
        elif _DEVICE.fullmatch(key):
            if key in devices:
                raise ParseError(f"rails: device {key} given twice")
            devices[key] = rail
        else:
            raise ParseError(f"rails: {key[:60]!r} is neither a device name nor a network")
    return RailMap(devices, tuple(networks), by_gpu)


def check_rails(text: str) -> None:
    """A settings check of one entry: ValueError saying why it cannot be used."""
    try:
        parse_rails([text])
    except ParseError as e:
        raise ValueError(str(e)) from None


def device_addresses(device: RdmaDevice) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The addresses of DEVICE's RoCE v2 GIDs: IPv4 for an IPv4-mapped GID, IPv6 for the
    others but link-local ones (every port has one; it names no network)."""
    out: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []
    for port in device.ports:
        for g in port.gids:
            if not g.is_roce_v2:
                continue
            try:
                v6 = ipaddress.IPv6Address(parse_gid(g.gid))
            except ParseError:
                continue
            ip = v6.ipv4_mapped or v6
            if not ip.is_link_local and ip not in out:
                out.append(ip)
    return out
