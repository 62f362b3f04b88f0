"""The known fabric: its routers, the links between them and the hosts' uplinks, read
from a fabric file, and how a traced hop list becomes a list of directed links.

The file is JSON (lane/guest-fabric.sh writes one for its leaf-spine; an operator's
comes from the cabling plan or LLDP):

    {"routers": [{"name": "leaf0", "kind": "leaf", "rail": 0,
                  "interfaces": [{"dev": "l0s0", "ip": "203.0.113.0", "peer": "spine0"}]}],
     "links":   [{"a": "leaf0", "a_dev": "l0s0", "a_ip": "203.0.113.0",
                  "b": "spine0", "b_dev": "s0l0", "b_ip": "203.0.113.1",
                  "rail": 0, "tier": "leaf-spine"}],
     "nics":    [{"name": "h0", "ip": "192.0.2.1", "rail": 0, "leaf": "leaf0"}]}

A link is a cable; each direction is its own directed link, named "leaf0->spine1". A
router answers an expiring probe from the address of the interface the probe came in
on (Linux with icmp_errors_use_inbound_ifaddr, and switches that answer from the
ingress port), so each hop's address names the directed link that led to it. A router
that answers from another address (a loopback) still names itself, and the link is then
the one between it and the hop before, where the file has exactly one.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_FILE_BYTES = 64 << 20
MAX_ITEMS = 1_000_000
NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


class TopologyError(ValueError):
    """A fabric file that cannot be used, with where and why."""


@dataclass(frozen=True)
class Cable:
    a: str
    a_ip: str
    b: str
    b_ip: str
    rail: int | None
    tier: str

    def names(self) -> tuple[str, str]:
        return f"{self.a}->{self.b}", f"{self.b}->{self.a}"


@dataclass(frozen=True)
class HostNic:
    host: str
    ip: str
    rail: int | None
    leaf: str


@dataclass(frozen=True)
class Resolved:
    """A class's links, or why they are not known."""

    links: tuple[str, ...] = ()
    reason: str = ""  # "" when resolved


def _name(v: object, where: str) -> str:
    if not isinstance(v, str) or not NAME.fullmatch(v):
        raise TopologyError(f"{where}: {v!r} is not a name (1-64 of A-Z a-z 0-9 _ . : -)")
    return v


def _ip(v: object, where: str) -> str:
    if not isinstance(v, str):
        raise TopologyError(f"{where}: {v!r} is not an IPv4 address")
    try:
        return str(ipaddress.IPv4Address(v))
    except ValueError:
        raise TopologyError(f"{where}: {v!r} is not an IPv4 address") from None


def _rail(v: object, where: str) -> int | None:
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 64:
        raise TopologyError(f"{where}: rail {v!r} is not 0..63")
    return v


def _list(doc: dict[str, Any], key: str) -> list[Any]:
    v = doc.get(key, [])
    if not isinstance(v, list) or len(v) > MAX_ITEMS:
        raise TopologyError(f"{key}: not a list of at most {MAX_ITEMS:,} items")
    return v


class Topology:
    """Routers, cables and host uplinks, indexed by address and by node pair."""

    def __init__(self, cables: Iterable[Cable], nics: Iterable[HostNic], routers: Iterable[str]):
        self.cables = list(cables)
        self.routers = set(routers)
        self.nics = {n.ip: n for n in nics}
        self._owner: dict[str, tuple[str, str]] = {}  # address -> (node, node at the far end)
        self._between: dict[tuple[str, str], list[Cable]] = {}
        self._rail: dict[str, int | None] = {}
        for c in self.cables:
            self._owner[c.a_ip] = (c.a, c.b)
            self._owner[c.b_ip] = (c.b, c.a)
            self._between.setdefault((c.a, c.b), []).append(c)
            self._between.setdefault((c.b, c.a), []).append(c)
            for n in c.names():
                self._rail[n] = c.rail

    @classmethod
    def from_doc(cls, doc: object) -> Topology:
        if not isinstance(doc, dict):
            raise TopologyError("a fabric file is a JSON object")
        routers: list[str] = []
        for i, r in enumerate(_list(doc, "routers")):
            if not isinstance(r, dict):
                raise TopologyError(f"routers[{i}]: not an object")
            routers.append(_name(r.get("name"), f"routers[{i}].name"))
        cables = []
        for i, c in enumerate(_list(doc, "links")):
            w = f"links[{i}]"
            if not isinstance(c, dict):
                raise TopologyError(f"{w}: not an object")
            tier = c.get("tier", "")
            cables.append(
                Cable(
                    a=_name(c.get("a"), f"{w}.a"),
                    a_ip=_ip(c.get("a_ip"), f"{w}.a_ip"),
                    b=_name(c.get("b"), f"{w}.b"),
                    b_ip=_ip(c.get("b_ip"), f"{w}.b_ip"),
                    rail=_rail(c.get("rail"), w),
                    tier=tier if isinstance(tier, str) and len(tier) <= 32 else "",
                )
            )
        nics = []
        for i, n in enumerate(_list(doc, "nics")):
            w = f"nics[{i}]"
            if not isinstance(n, dict):
                raise TopologyError(f"{w}: not an object")
            nics.append(
                HostNic(
                    host=_name(n.get("name"), f"{w}.name"),
                    ip=_ip(n.get("ip"), f"{w}.ip"),
                    rail=_rail(n.get("rail"), w),
                    leaf=_name(n.get("leaf"), f"{w}.leaf"),
                )
            )
        seen: dict[str, str] = {}
        for c in cables:
            for ip, node in ((c.a_ip, c.a), (c.b_ip, c.b)):
                if seen.setdefault(ip, node) != node:
                    raise TopologyError(f"address {ip} is on both {seen[ip]} and {node}")
        return cls(cables, nics, routers)

    @classmethod
    def load(cls, path: str | Path) -> Topology:
        p = Path(path)
        try:
            size = p.stat().st_size
            if size > MAX_FILE_BYTES:
                raise TopologyError(f"{p}: {size:,} bytes, more than {MAX_FILE_BYTES:,}")
            doc = json.loads(p.read_bytes())
        except OSError as err:
            raise TopologyError(f"{p}: {err.strerror}") from None
        except (ValueError, RecursionError) as err:
            raise TopologyError(f"{p}: not JSON ({err})") from None
        return cls.from_doc(doc)

    def links(self) -> list[str]:
        """Every directed link, in the file's order."""
        return [n for c in self.cables for n in c.names()]

    def rail_of(self, link: str) -> int | None:
        return self._rail.get(link)

    def node_of(self, address: str) -> str | None:
        """The router (or host) an address is on."""
        hit = self._owner.get(address)
        return hit[0] if hit else None

    def _link(self, prev: str, node: str) -> str | None:
        return f"{prev}->{node}" if len(self._between.get((prev, node), [])) == 1 else None

    def resolve(self, src_ip: str, dst_ip: str, hops: Sequence[str | None]) -> Resolved:
        """The directed links a class from SRC_IP to DST_IP crosses, from its traced hop
        addresses (in TTL order, routed hops only), or why they cannot be had."""
        src, dst = self.nics.get(src_ip), self.nics.get(dst_ip)
        if src is None or dst is None:
            return Resolved(reason="host not in the fabric file")
        if not hops:
            return Resolved(reason="no routed hop")
        prev, out = src.host, []
        for hop in hops:
            if hop is None:
                return Resolved(reason="a hop did not answer")
            owner = self._owner.get(hop)
            node = owner[0] if owner else None
            if node is None or node not in self.routers:
                return Resolved(reason="a hop's address is not a router's")
            link = f"{owner[1]}->{node}" if owner and owner[1] == prev else self._link(prev, node)
            if link is None:
                return Resolved(reason=f"no single link {prev}->{node}")
            out.append(link)
            prev = node
        last = self._link(prev, dst.host)
        if last is None:
            return Resolved(reason=f"the last hop {prev} is not {dst.host}'s leaf")
        out.append(last)
        return Resolved(links=tuple(out))
