"""Pure parsers for the tools a RoCE host is inspected with.

Each takes the text the tool prints and returns a small frozen dataclass; text of the
wrong shape raises ParseError. Formats:

* `dcb pfc show dev IF` (iproute2): `pfc-cap 8 macsec-bypass off delay 0` then
  `prio-pfc 0:off 1:off 2:off 3:on ...`;
* `dcb app show dev IF`: `dscp-prio AF31:3 CS6:6` (DSCP names from rt_dsfield, or numbers
  with -N), plus `default-prio`, `ethtype-prio` ... lines;
* `dcb apptrust show dev IF`: `order pcp dscp`;
* `mlnx_qos -i IF` (NVIDIA): `Priority trust state: dscp`, `dscp2prio mapping:` lines
  `prio:3 dscp:31,30,...`, and `PFC configuration:` with an `enabled 0 0 0 1 ...` row;
* `lldptool -t -i IF -V PFC` (open-lldp): `PFC enabled: 3` (or `none`);
* `ibv_devinfo -d DEV`: per port `state:`, `max_mtu: 4096 (5)`, `active_mtu: 4096 (5)`;
* `ip -j addr show dev IF`: JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from fabricprobe.core.errors import ParseError

PRIOS = range(8)


@dataclass(frozen=True)
class PfcConfig:
    """Which priorities have PFC on, and where that was read."""

    enabled: frozenset[int]
    source: str  # "dcb", "mlnx_qos", "lldptool"


def _on_off(word: str) -> bool:
    if word in ("on", "1", "true"):
        return True
    if word in ("off", "0", "false"):
        return False
    raise ParseError(f"expected on/off, got {word!r}")


def parse_dcb_pfc(text: str) -> PfcConfig:
    """`dcb pfc show dev IF` -> PfcConfig."""
    for line in text.splitlines():
        words = line.split()
        if words[:1] in (["prio-pfc"], ["pg-pfc"]):  # early iproute2 printed pg-pfc
            enabled = set()
            for item in words[1:]:
                prio, sep, state = item.partition(":")
                if not sep or not prio.isdecimal() or int(prio) not in PRIOS:
                    raise ParseError(f"dcb pfc: bad priority entry {item!r}")
                if _on_off(state):
                    enabled.add(int(prio))
            return PfcConfig(frozenset(enabled), "dcb")
    raise ParseError("dcb pfc: no prio-pfc line in the output")


# rt_dsfield names dcb prints for DSCP keys: CSn = 8n, AFxy = 8x + 2y, EF = 46.
_DSCP_NAMES = {"default": 0, "EF": 46, **{f"CS{n}": 8 * n for n in range(8)}}
_DSCP_NAMES.update({f"AF{x}{y}": 8 * x + 2 * y for x in range(1, 5) for y in range(1, 4)})


def dscp_value(key: str) -> int:
    """A DSCP as dcb prints it: a number (decimal or 0x hex) or an rt_dsfield name."""
    if key in _DSCP_NAMES:
        return _DSCP_NAMES[key]
    try:
        value = int(key, 0)
    except ValueError:
        raise ParseError(f"unknown DSCP {key!r}") from None
    if not 0 <= value <= 63:
        raise ParseError(f"DSCP {value} out of range 0..63")
    return value


def parse_dcb_app(text: str) -> Mapping[int, tuple[int, ...]]:
    """`dcb app show dev IF` -> DSCP -> priorities (more than one is a conflict)."""
    out: dict[int, list[int]] = {}
    for line in text.splitlines():
        words = line.split()
        if words[:1] != ["dscp-prio"]:
            continue
        for item in words[1:]:
            key, sep, prio = item.rpartition(":")
            if not sep or not prio.isdecimal() or int(prio) not in PRIOS:
                raise ParseError(f"dcb app: bad dscp-prio entry {item!r}")
            out.setdefault(dscp_value(key), []).append(int(prio))
    return MappingProxyType({k: tuple(v) for k, v in out.items()})


def parse_dcb_apptrust(text: str) -> tuple[str, ...]:
    """`dcb apptrust show dev IF` -> the trust order, e.g. ("dscp", "pcp")."""
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["order"]:
            return tuple(words[1:])
    raise ParseError("dcb apptrust: no order line in the output")


@dataclass(frozen=True)
class MlnxQos:
    """The parts of `mlnx_qos -i IF` that RoCE depends on."""

    trust: str | None  # "dscp" or "pcp"
    dscp_prio: Mapping[int, int]
    pfc_enabled: frozenset[int] | None


_TRUST = re.compile(r"^\s*Priority trust (?:state|mode):\s*(\w+)", re.M)
_DSCP2PRIO = re.compile(r"^\s*prio:\s*(\d)\s+dscp:\s*([\d,\s]*)$", re.M)
_ENABLED_ROW = re.compile(r"^\s*enabled\s+([01](?:\s+[01]){7})\s*$", re.M)


def parse_mlnx_qos(text: str) -> MlnxQos:
    """`mlnx_qos -i IF` -> trust state, DSCP map, PFC priorities."""
    trust_m = _TRUST.search(text)
    pfc_m = _ENABLED_ROW.search(text)
    if trust_m is None and pfc_m is None:
        raise ParseError("mlnx_qos: neither a trust state nor a PFC configuration in the output")
    dscp_prio: dict[int, int] = {}
    for m in _DSCP2PRIO.finditer(text):
        prio = int(m.group(1))
        for item in m.group(2).replace(" ", "").split(","):
            if item:
                dscp_prio[dscp_value(str(int(item)))] = prio
    pfc = None
    if pfc_m is not None:
        flags = pfc_m.group(1).split()
        pfc = frozenset(i for i, f in enumerate(flags) if f == "1")
    return MlnxQos(
        trust=trust_m.group(1).lower() if trust_m else None,
        dscp_prio=MappingProxyType(dscp_prio),
        pfc_enabled=pfc,
    )


def parse_lldptool_pfc(text: str) -> PfcConfig:
    """`lldptool -t -i IF -V PFC` -> PfcConfig."""
    m = re.search(r"PFC enabled:\s*(.*)$", text, re.M)
    if m is None:
        raise ParseError("lldptool: no 'PFC enabled:' line in the output")
    value = m.group(1).strip()
    if value in ("", "none"):
        return PfcConfig(frozenset(), "lldptool")
    words = value.split()
    if not all(w.isdecimal() and int(w) in PRIOS for w in words):
        raise ParseError(f"lldptool: bad PFC enabled list {value!r}")
    return PfcConfig(frozenset(int(w) for w in words), "lldptool")


@dataclass(frozen=True)
class IbvPort:
    """One port from `ibv_devinfo -d DEV`."""

    port: int
    state: str | None  # "PORT_ACTIVE"
    max_mtu: int | None
    active_mtu: int | None
    link_layer: str | None


_IBV_FIELD = re.compile(r"^\s*(state|max_mtu|active_mtu|link_layer):\s*(\S+)")


def parse_ibv_devinfo(text: str) -> Mapping[int, IbvPort]:
    """`ibv_devinfo -d DEV` -> port number -> IbvPort."""
    ports: dict[int, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for line in text.splitlines():
        m = re.match(r"^\s*port:\s*(\d+)\s*$", line)
        if m:
            current = ports.setdefault(int(m.group(1)), {})
            continue
        f = _IBV_FIELD.match(line)
        if f and current is not None:
            key, value = f.groups()
            if key.endswith("mtu"):
                if not value.isdecimal():
                    raise ParseError(f"ibv_devinfo: {key} {value!r} is not a number")
                current[key] = int(value)
            else:
                current[key] = value
    if not ports:
        raise ParseError("ibv_devinfo: no port section in the output")
    return MappingProxyType(
        {
            n: IbvPort(
                n, d.get("state"), d.get("max_mtu"), d.get("active_mtu"), d.get("link_layer")
            )
            for n, d in ports.items()
        }
    )


@dataclass(frozen=True)
class NetdevAddrs:
    """A netdev's addresses and MTU from `ip -j addr show dev IF`."""

    ifname: str
    mtu: int | None
    operstate: str | None
    ipv4: tuple[str, ...]
    ipv6: tuple[str, ...]  # global and link-local


def parse_ip_addr(text: str) -> NetdevAddrs:
    """`ip -j addr show dev IF` -> NetdevAddrs (the first interface in the list)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ParseError(f"ip -j addr: not JSON: {e}") from e
    if not isinstance(doc, list) or not doc or not isinstance(doc[0], dict):
        raise ParseError("ip -j addr: expected a non-empty list of interfaces")
    link = doc[0]
    infos = link.get("addr_info", [])
    if not isinstance(infos, list):
        raise ParseError("ip -j addr: addr_info is not a list")
    v4 = tuple(a["local"] for a in infos if a.get("family") == "inet" and "local" in a)
    v6 = tuple(a["local"] for a in infos if a.get("family") == "inet6" and "local" in a)
    mtu = link.get("mtu")
    return NetdevAddrs(
        ifname=str(link.get("ifname", "")),
        mtu=mtu if isinstance(mtu, int) else None,
        operstate=link.get("operstate"),
        ipv4=v4,
        ipv6=v6,
    )
