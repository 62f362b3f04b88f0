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

Numbers go through `parse_uint` (bounded before int()), any line end is taken, and the
JSON of `ip -j` is checked for shape at every level: whatever the text, a parser returns
or raises ParseError.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from fabricprobe.core.errors import ParseError
from fabricprobe.probes.numbers import U32_MAX, parse_uint

PRIOS = range(8)
MAX_TEXT = 1 << 20  # no tool prints this much about one port
MAX_MTU = 65535


@dataclass(frozen=True)
class PfcConfig:
    """Which priorities have PFC on, and where that was read."""

    enabled: frozenset[int]
    source: str  # "dcb", "mlnx_qos", "lldptool"


def bounded_lines(text: str, tool: str) -> str:
    """TEXT after a bound on its size, with every line end (CRLF, CR, LF) as LF, so that
    line-anchored patterns see one line at a time."""
    if len(text) > MAX_TEXT:
        raise ParseError(f"{tool}: {len(text)} characters of output, more than any port has")
    return "\n".join(text.splitlines())


def search_mlnx_qos(
    text: str, parts: tuple[re.Pattern[str], ...], missing: str
) -> tuple[str, list[re.Match[str] | None]]:
    """`mlnx_qos -i IF` output TEXT (bounded_lines) and each of PARTS found in it, None
    where one is not; ParseError saying MISSING when none is there."""
    text = bounded_lines(text, "mlnx_qos")
    found = [p.search(text) for p in parts]
    if all(m is None for m in found):
        raise ParseError(f"mlnx_qos: {missing} in the output")
    return text, found


def entries(
    words: Iterable[str], where: str, *, last: bool = False
) -> Iterator[tuple[str, str, str]]:
    """Each `A:B` of WORDS as (A, B, why), WHY naming the word for a ParseError (WHERE
    and the word); split at the last ':' with LAST. A word without ':' is a ParseError."""
    for item in words:
        a, sep, b = item.rpartition(":") if last else item.partition(":")
        why = f"{where} {item[:40]!r}"
        if not sep:
            raise ParseError(why)
        yield a, b, why


def _prio(text: str, where: str) -> int:
    """An 802.1p priority, 0..7; the ParseError names WHERE it was read."""
    try:
        return parse_uint(text, "priority", max(PRIOS))
    except ParseError as e:
        raise ParseError(f"{where} ({e})") from None


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
            for prio, state, where in entries(words[1:], "dcb pfc: bad priority entry"):
                n = _prio(prio, where)
                if _on_off(state):
                    enabled.add(n)
            return PfcConfig(frozenset(enabled), "dcb")
    raise ParseError("dcb pfc: no prio-pfc line in the output")


# rt_dsfield names dcb prints for DSCP keys: CSn = 8n, AFxy = 8x + 2y, EF = 46.
_DSCP_NAMES = {"default": 0, "EF": 46, **{f"CS{n}": 8 * n for n in range(8)}}
_DSCP_NAMES.update({f"AF{x}{y}": 8 * x + 2 * y for x in range(1, 5) for y in range(1, 4)})


def dscp_value(key: str) -> int:
    """A DSCP as dcb prints it: a number (decimal or 0x hex) or an rt_dsfield name."""
    if key in _DSCP_NAMES:
        return _DSCP_NAMES[key]
    if len(key) > 8:  # "0x3f" is the longest DSCP; int() of a long one costs and may fail
        raise ParseError(f"unknown DSCP {key[:20]!r}")
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
        for key, prio, where in entries(words[1:], "dcb app: bad dscp-prio entry", last=True):
            n = _prio(prio, where)
            out.setdefault(dscp_value(key), []).append(n)
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


_TRUST = re.compile(r"^[ \t]*Priority trust (?:state|mode):[ \t]*(\w+)", re.M)
# [ \t] and not \s inside a line: \s also matches the line end, and a list would run on
# into the next line. Lines are split first (any line end), then matched one by one.
_DSCP2PRIO = re.compile(r"^[ \t]*prio:[ \t]*([0-7])[ \t]+dscp:[ \t]*([0-9, \t]*)$")
_ENABLED_ROW = re.compile(r"^[ \t]*enabled[ \t]+([01](?:[ \t]+[01]){7})[ \t]*$", re.M)


def parse_mlnx_qos(text: str) -> MlnxQos:
    """`mlnx_qos -i IF` -> trust state, DSCP map, PFC priorities."""
    text, (trust_m, pfc_m) = search_mlnx_qos(
        text, (_TRUST, _ENABLED_ROW), "neither a trust state nor a PFC configuration"
    )
    dscp_prio: dict[int, int] = {}
    for line in text.split("\n"):
        m = _DSCP2PRIO.match(line)
        if m is None:
            continue
        prio = int(m.group(1))
        for item in re.split(r"[, \t]+", m.group(2)):
            if item:
                dscp_prio[parse_uint(item, "mlnx_qos: DSCP", 63)] = prio
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
    m = re.search(r"PFC enabled:[ \t]*(.*)$", bounded_lines(text, "lldptool"), re.M)
    if m is None:
        raise ParseError("lldptool: no 'PFC enabled:' line in the output")
    value = m.group(1).strip()
    if value in ("", "none"):
        return PfcConfig(frozenset(), "lldptool")
    where = f"lldptool: bad PFC enabled list {value[:40]!r}"
    return PfcConfig(frozenset(_prio(w, where) for w in value.split()), "lldptool")


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
    for line in bounded_lines(text, "ibv_devinfo").split("\n"):
        m = re.match(r"^\s*port:\s*(\S+)\s*$", line)
        if m:
            port = parse_uint(m.group(1), "ibv_devinfo: port", 255)
            current = ports.setdefault(port, {})
            continue
        f = _IBV_FIELD.match(line)
        if f and current is not None:
            key, value = f.groups()
            if key.endswith("mtu"):
                current[key] = parse_uint(value, f"ibv_devinfo: {key}", MAX_MTU)
            else:
                current[key] = value[:64]
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


def _json_int(text: str) -> int:
    """json.loads' parse_int: a bounded integer (a negative one is kept, bounded too)."""
    return (
        -parse_uint(text[1:], "ip -j: number")
        if text.startswith("-")
        else parse_uint(text, "ip -j: number")
    )


def _addresses(infos: list[Any], family: str) -> tuple[str, ...]:
    """The `local` addresses of FAMILY; an entry that is not an object with a string
    `local` is left out (one bad entry does not cost the others)."""
    return tuple(
        a["local"][:64]
        for a in infos
        if isinstance(a, dict) and a.get("family") == family and isinstance(a.get("local"), str)
    )


def parse_ip_addr(text: str) -> NetdevAddrs:
    """`ip -j addr show dev IF` -> NetdevAddrs (the first interface in the list).

    ParseError when the text is not JSON, nests deeper than Python recurses, holds a
    number of more than 20 digits, or is not a list whose first element is an object
    with a list (or no) addr_info; fields of the wrong type read as absent.
    """
    if len(text) > MAX_TEXT:
        raise ParseError(f"ip -j addr: {len(text)} characters of output")
    try:
        doc = json.loads(text, parse_int=_json_int)
    except json.JSONDecodeError as e:
        raise ParseError(f"ip -j addr: not JSON: {e}") from e
    except RecursionError:
        raise ParseError("ip -j addr: JSON nested too deep") from None
    if not isinstance(doc, list) or not doc or not isinstance(doc[0], dict):
        raise ParseError("ip -j addr: expected a non-empty list of interfaces")
    link = doc[0]
    infos = link.get("addr_info", [])
    if not isinstance(infos, list):
        raise ParseError("ip -j addr: addr_info is not a list")
    mtu = link.get("mtu")
    ifname = link.get("ifname")
    operstate = link.get("operstate")
    return NetdevAddrs(
        ifname=ifname[:64] if isinstance(ifname, str) else "",
        mtu=mtu
        if isinstance(mtu, int) and not isinstance(mtu, bool) and 0 <= mtu <= U32_MAX
        else None,
        operstate=operstate[:32] if isinstance(operstate, str) else None,
        ipv4=_addresses(infos, "inet"),
        ipv6=_addresses(infos, "inet6"),
    )
