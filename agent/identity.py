"""Who this host is: name, addresses, RDMA devices with GIDs and netdevs, topology label."""

from __future__ import annotations

import ipaddress
import logging
import socket

import psutil

from fabricprobe import __version__
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.errors import ProbeError
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


def device_messages(devices: list[RdmaDevice]) -> list[pb.RdmaDevice]:
    return [
        pb.RdmaDevice(
            name=d.name,
            driver=d.driver or "",
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
) -> pb.HostInfo:
    return pb.HostInfo(
        host=host,
        addresses=addresses,
        devices=device_messages(devices),
        topology=topology,
        probe_port=probe_port,
        probe_kinds=sorted(probe_kinds),
        version=__version__,
        role=role,
    )
