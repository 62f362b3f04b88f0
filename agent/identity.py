"""Who this host is: name, addresses, RDMA devices with GIDs and netdevs, topology label."""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

import psutil

from fabricprobe import __version__
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.errors import ProbeError
from fabricprobe.probes.pcie import NicGpu, read_nic_gpus
from fabricprobe.probes.rails import RailMap, device_addresses
from fabricprobe.probes.sysfs import RdmaDevice, read_devices

log = logging.getLogger("fabricprobe.agent")


def discover_devices(sysfs_root: str) -> list[RdmaDevice]:
    """RDMA devices under SYSFS; none (with a log line) when they cannot be read."""
    try:
        return read_devices(sysfs_root)
    except (ProbeError, OSError) as e:
        log.warning("RDMA devices not read from %s: %s", sysfs_root, e)
        return []


def discover_addresses(devices: list[RdmaDevice]) -> list[str]:
    """IPv4 addresses of RoCE GIDs first, then every non-loopback IPv4 address."""
    out: list[str] = []
    for d in devices:
        for p in d.ports:
            for g in p.gids:
                if g.ipv4 and g.ipv4 not in out:
                    out.append(g.ipv4)
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if (
                a.family == socket.AF_INET
                and not ipaddress.ip_address(a.address).is_loopback
                and a.address not in out
            ):
                out.append(a.address)
    return out


def discover_gpus(sysfs_root: str, devices: list[RdmaDevice]) -> dict[str, NicGpu]:
    """Each device's GPU (fabricprobe.probes.pcie); none, with a log line, when the PCI
    tree cannot be read: a host without GPUs, or a tree that says nothing, is no error."""
    try:
        return read_nic_gpus(sysfs_root, [d.name for d in devices])
    except (ProbeError, OSError) as e:
        log.warning("the NICs' GPUs not read from %s: %s", sysfs_root, e)
        return {}


@dataclass(frozen=True)
class Rails:
    """Where this host's devices sit: each one's rail and GPU, and the address each rail
    device's probes leave from (its first IPv4 RoCE v2 address)."""

    rail: Mapping[str, int] = field(default_factory=dict)  # device -> rail
    gpu: Mapping[str, NicGpu] = field(default_factory=dict)  # device -> its GPU
    source: Mapping[str, str] = field(default_factory=dict)  # rail device -> its address

    @classmethod
    def of(cls, rule: RailMap, devices: list[RdmaDevice], gpus: Mapping[str, NicGpu]) -> Rails:
        rail = rule.rails(devices, gpus)
        source = {}
        for d in devices:
            v4 = [a for a in device_addresses(d) if a.version == 4]
            if d.name in rail and v4:
                source[d.name] = str(v4[0])
        return cls(rail, dict(gpus), source)

    def addresses(self) -> list[str]:
        """The rail devices' addresses, by device name: peers probe each rail on its own."""
        return [self.source[n] for n in sorted(self.source)]

    def rail_sources(self) -> dict[int, str]:
        """Rail -> this host's address on it (the first device by name, of several)."""
        out: dict[int, str] = {}
        for name in sorted(self.source):
            out.setdefault(self.rail[name], self.source[name])
        return out

    def served_at(self, listen_host: str) -> Rails:
        """The rails a responder listening on LISTEN_HOST answers on: all of them when it
        listens on every address; else only the device at that address (a peer's probe to
        another rail address would find no responder, and read as a fault of the rail)."""
        if listen_host in ("0.0.0.0", "::"):
            return self
        kept = {n: a for n, a in self.source.items() if a == listen_host}
        for name in sorted(set(self.rail) - set(kept)):
            log.warning(
                "rail device %s not probed on its rail: the responder listens on %s only "
                "(listen on 0.0.0.0 to answer every rail)",
                name,
                listen_host,
            )
        return Rails({n: self.rail[n] for n in kept}, self.gpu, kept)


def device_messages(devices: list[RdmaDevice], rails: Rails | None = None) -> list[pb.RdmaDevice]:
    where = rails or Rails()
    return [
        pb.RdmaDevice(
            name=d.name,
            driver=d.driver or "",
            rail=where.rail.get(d.name),
            gpu=g.gpu.name if (g := where.gpu.get(d.name)) else "",
            gpu_address=g.gpu.function.address if g else "",
            gpu_link=g.link.name if g else "",
            ports=[
                pb.RdmaPort(
                    number=p.number,
                    state=p.state,
                    link_layer=p.link_layer or "",
                    gids=[
                        pb.Gid(index=g.index, gid=g.gid, type=g.type or "", netdev=g.netdev or "")
                        for g in p.gids
                    ],
                )
                for p in d.ports
            ],
        )
        for d in devices
    ]


def host_info(
    host: str,
    addresses: list[str],
    devices: list[RdmaDevice],
    topology: str,
    probe_port: int,
    probe_kinds: list[str],
    role: str = "",
    rails: Rails | None = None,
) -> pb.HostInfo:
    return pb.HostInfo(
        host=host,
        addresses=addresses,
        devices=device_messages(devices, rails),
        topology=topology,
        probe_port=probe_port,
        probe_kinds=sorted(probe_kinds),
        version=__version__,
        role=role,
    )
