"""Pure parsers for the QoS, link and PCIe tools the hardware checks read.

Each takes the text the tool prints and returns a small frozen dataclass; text of the
wrong shape raises ParseError. Formats (iproute2's dcb-ets(8), dcb-buffer(8),
dcb-dcbx(8), dcb-app(8); ethtool(8); lldptool-app(8); NVIDIA's mlnx_qos and mlxlink;
pciutils' lspci -vvv):

* `dcb ets show dev IF`: `tc-bw 0:50 1:0 ...`, `tc-tsa 0:ets 1:strict ...`, `prio-tc 0:0 ...`;
* `mlnx_qos -i IF`: `tc: 3 ratelimit: unlimited, tsa: ets, bw: 50%` then `priority:  3`
  lines; `Receive buffer size (bytes): 130944,...`; a `buffer 0 0 0 1 ...` row under
  `PFC configuration:`; `DCBX mode: OS controlled`;
* `dcb buffer show dev IF`: `prio-buffer 0:0 ... 3:1 ...`, `buffer-size 0:256Kb 1:...`,
  `total-size 1Mb`;
* `dcb dcbx show dev IF`: flags such as `host ieee` or `lld-managed ieee`;
* `dcb app show dev IF`: `dgram-port-prio 4791:3` (RoCEv2 is UDP 4791);
* `lldptool -t -i IF -V APP -c app`: `app=3,3,4791` style entries (priority,selector,pid);
* `ethtool -a IF`: `RX: off`, `TX: off`; `ethtool IF`: `Speed: 100000Mb/s`, `Lanes: 4`,
  `Supported link modes:`; `ethtool -i IF`: `driver:`, `version:`, `firmware-version:`,
  `bus-info:`; `ethtool -I --show-fec IF`: `Active FEC encoding: RS`, statistics
  `corrected_blocks:` / `uncorrectable_blocks:`;
* `mlxlink -d DEV -c`: `FEC : Standard RS-FEC - RS(528,514)`, `Raw Physical BER : 1E-12`,
  `Effective Physical BER : 15E-255`;
* `lspci -vvv -s BDF`: `ACSCtl: SrcValid+ ... ReqRedir+ CmpltRedir+ ...`, `ATSCtl: Enable+`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from fabricprobe.core.errors import ParseError
from fabricprobe.probes.numbers import parse_uint
from fabricprobe.probes.roce.tools import PRIOS, bounded_lines, entries, search_mlnx_qos


def _pairs(words: list[str], tool: str, key: str) -> dict[int, str]:
    """`0:50 1:0 ...` -> {0: "50", 1: "0"}; the index must be a priority or TC 0..7."""
    out: dict[int, str] = {}
    for idx, value, where in entries(words, f"{tool}: bad {key} entry"):
        if not value:
            raise ParseError(where)
        try:
            out[parse_uint(idx, "index", max(PRIOS))] = value
        except ParseError as e:
            raise ParseError(f"{where} ({e})") from None
    return out


def _int(value: str, tool: str, what: str) -> int:
    """A bounded integer (no field here comes near 10**18; int() is not fed more)."""
    return parse_uint(value, f"{tool}: {what}", 10**18)


# --------------------------------------------------------------------------- ETS


@dataclass(frozen=True)
class EtsConfig:
    """Which traffic class each priority uses, and each class's scheduler and share."""

    prio_tc: Mapping[int, int]
    tsa: Mapping[int, str]  # tc -> "ets", "strict", "vendor", ...
    bw: Mapping[int, int]  # tc -> % of the link under ETS
    source: str


def parse_dcb_ets(text: str) -> EtsConfig:
    """`dcb ets show dev IF` -> EtsConfig."""
    fields: dict[str, dict[int, str]] = {}
    for line in bounded_lines(text, "dcb ets").splitlines():
        words = line.split()
        if words[:1] and words[0] in ("tc-bw", "tc-tsa", "prio-tc"):
            fields[words[0]] = _pairs(words[1:], "dcb ets", words[0])
    if "tc-tsa" not in fields and "tc-bw" not in fields:
        raise ParseError("dcb ets: neither tc-tsa nor tc-bw in the output")
    bw = {k: _int(v, "dcb ets", "tc-bw") for k, v in fields.get("tc-bw", {}).items()}
    prio_tc = {k: _int(v, "dcb ets", "prio-tc") for k, v in fields.get("prio-tc", {}).items()}
    if any(v not in PRIOS for v in prio_tc.values()) or any(v > 100 for v in bw.values()):
        raise ParseError("dcb ets: traffic class or bandwidth out of range")
    return EtsConfig(
        MappingProxyType(prio_tc),
        MappingProxyType(dict(fields.get("tc-tsa", {}))),
        MappingProxyType(bw),
        "dcb",
    )


_MLNX_TC = re.compile(r"^\s*tc:\s*(\d)\s+ratelimit:[^,]*,\s*tsa:\s*(\w+)(?:,\s*bw:\s*(\d{1,3})%)?")
_MLNX_PRIO = re.compile(r"^\s*priority:\s*(\d)\s*$")


def parse_mlnx_qos_ets(text: str) -> EtsConfig:
    """The `tc: N ... tsa: ... bw: N%` blocks of `mlnx_qos -i IF` -> EtsConfig."""
    prio_tc: dict[int, int] = {}
    tsa: dict[int, str] = {}
    bw: dict[int, int] = {}
    tc: int | None = None
    for line in bounded_lines(text, "mlnx_qos").splitlines():
        m = _MLNX_TC.match(line)
        if m:
            tc = int(m.group(1))
            if tc not in PRIOS:
                raise ParseError(f"mlnx_qos: traffic class {tc} out of range")
            tsa[tc] = m.group(2).lower()
            if m.group(3) is not None:
                bw[tc] = int(m.group(3))
            continue
        p = _MLNX_PRIO.match(line)
        if p and tc is not None:
            if int(p.group(1)) not in PRIOS:
                raise ParseError(f"mlnx_qos: priority {p.group(1)} out of range")
            prio_tc[int(p.group(1))] = tc
    if not tsa:
        raise ParseError("mlnx_qos: no `tc:` lines in the output")
    if any(v > 100 for v in bw.values()):
        raise ParseError("mlnx_qos: a bandwidth share over 100%")
    return EtsConfig(
        MappingProxyType(prio_tc), MappingProxyType(tsa), MappingProxyType(bw), "mlnx_qos"
    )


# --------------------------------------------------------------------------- buffers


@dataclass(frozen=True)
class BufferConfig:
    """Receive buffers: which buffer each priority uses, and each buffer's size in bytes."""

    prio_buffer: Mapping[int, int]
    size: Mapping[int, int]  # buffer -> bytes
    total: int | None
    source: str


_SIZE = re.compile(r"^(\d{1,15}(?:\.\d{1,3})?)([KMG]?)(b?)$", re.I)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _bytes(value: str, tool: str) -> int:
    """`262016`, `256Kb`, `1Mb` (dcb prints sizes with binary units) -> bytes."""
    m = _SIZE.match(value)
    if m is None:
        raise ParseError(f"{tool}: bad buffer size {value!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def parse_dcb_buffer(text: str) -> BufferConfig:
    """`dcb buffer show dev IF` -> BufferConfig."""
    prio_buffer: dict[int, int] = {}
    size: dict[int, int] = {}
    total = None
    seen = False
    for line in bounded_lines(text, "dcb buffer").splitlines():
        words = line.split()
        if words[:1] == ["prio-buffer"]:
            seen = True
            for k, v in _pairs(words[1:], "dcb buffer", "prio-buffer").items():
                prio_buffer[k] = _int(v, "dcb buffer", "buffer index")
        elif words[:1] == ["buffer-size"]:
            seen = True
            for k, v in _pairs(words[1:], "dcb buffer", "buffer-size").items():
                size[k] = _bytes(v, "dcb buffer")
        elif words[:1] == ["total-size"] and len(words) == 2:
            total = _bytes(words[1], "dcb buffer")
    if not seen:
        raise ParseError("dcb buffer: no prio-buffer or buffer-size line in the output")
    if any(v not in PRIOS for v in prio_buffer.values()):
        raise ParseError("dcb buffer: a buffer index out of range")
    return BufferConfig(MappingProxyType(prio_buffer), MappingProxyType(size), total, "dcb")


# [ \t] inside a line: \s matches line ends too, and a list would run on into the next line
_MLNX_BUFSIZE = re.compile(r"^[ \t]*Receive buffer size \(bytes\):[ \t]*([0-9, \t]*)$", re.M)
_MLNX_BUFROW = re.compile(r"^[ \t]*buffer[ \t]+([0-9](?:[ \t]+[0-9]){7})[ \t]*$", re.M)


def parse_mlnx_qos_buffers(text: str) -> BufferConfig:
    """`Receive buffer size (bytes):` and the PFC table's `buffer` row of `mlnx_qos -i IF`."""
    _, (sizes_m, row_m) = search_mlnx_qos(
        text, (_MLNX_BUFSIZE, _MLNX_BUFROW), "no receive buffer configuration"
    )
    size: dict[int, int] = {}
    if sizes_m is not None:
        items = [i for i in re.split(r"[, \t]+", sizes_m.group(1)) if i]
        if len(items) > 8:
            raise ParseError("mlnx_qos: more than 8 receive buffers")
        size = {i: _int(v, "mlnx_qos", "buffer size") for i, v in enumerate(items)}
    prio_buffer: dict[int, int] = {}
    if row_m is not None:
        prio_buffer = {i: int(v) for i, v in enumerate(row_m.group(1).split())}
        if any(v not in PRIOS for v in prio_buffer.values()):
            raise ParseError("mlnx_qos: a buffer index out of range")
    return BufferConfig(MappingProxyType(prio_buffer), MappingProxyType(size), None, "mlnx_qos")


# --------------------------------------------------------------------------- DCBX / APP


@dataclass(frozen=True)
class DcbxMode:
    """Who runs DCBX: the host's LLDP agent ("host") or the NIC firmware ("firmware")."""

    managed_by: str  # "host", "firmware" or "unknown"
    versions: tuple[str, ...]  # "ieee", "cee"
    source: str


def parse_dcb_dcbx(text: str) -> DcbxMode:
    """`dcb dcbx show dev IF` -> DcbxMode (DCB_CAP_DCBX_HOST / _LLD_MANAGED flags)."""
    words = set(bounded_lines(text, "dcb dcbx").split())
    known = {"host", "lld-managed", "ieee", "cee", "static"}
    if not words & known:
        raise ParseError("dcb dcbx: no DCBX flags in the output")
    managed = "host" if "host" in words else "firmware" if "lld-managed" in words else "unknown"
    versions = tuple(v for v in ("ieee", "cee") if v in words)
    return DcbxMode(managed, versions, "dcb")


def parse_mlnx_qos_dcbx(text: str) -> DcbxMode:
    """`DCBX mode: OS controlled` / `Firmware controlled` of `mlnx_qos -i IF`."""
    m = re.search(r"^\s*DCBX mode:\s*(.+?)\s*$", bounded_lines(text, "mlnx_qos"), re.M)
    if m is None:
        raise ParseError("mlnx_qos: no `DCBX mode:` line in the output")
    value = m.group(1).lower()
    managed = "host" if value.startswith("os") else "firmware" if "firmware" in value else "unknown"
    return DcbxMode(managed, (), "mlnx_qos")


ROCE_UDP_PORT = 4791
SEL_DGRAM = 3  # IEEE 802.1Qaz APP selector 3: UDP (and DCCP) destination port


def parse_dcb_app_ports(text: str) -> Mapping[int, tuple[int, ...]]:
    """The `dgram-port-prio PORT:PRIO` entries of `dcb app show dev IF` -> port -> prios."""
    out: dict[int, list[int]] = {}
    for line in bounded_lines(text, "dcb app").splitlines():
        words = line.split()
        if words[:1] != ["dgram-port-prio"]:
            continue
        for port, prio, where in entries(
            words[1:], "dcb app: bad dgram-port-prio entry", last=True
        ):
            try:
                udp = parse_uint(port, "UDP port", 65535)
                n = parse_uint(prio, "priority", max(PRIOS))
            except ParseError as e:
                raise ParseError(f"{where} ({e})") from None
            out.setdefault(udp, []).append(n)
    return MappingProxyType({k: tuple(v) for k, v in out.items()})


_LLDP_APP = re.compile(r"app\s*=\s*\(?\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\)?")


def parse_lldptool_app(text: str) -> Mapping[int, tuple[int, ...]]:
    """`lldptool -t -i IF -V APP -c app` -> UDP port -> prios (selector 3 entries only)."""
    text = bounded_lines(text, "lldptool")
    if "app" not in text.lower():
        raise ParseError("lldptool: no APP entries in the output")
    out: dict[int, list[int]] = {}
    for m in _LLDP_APP.finditer(text):
        prio, sel, pid = (int(g) if len(g) < 8 else -1 for g in m.groups())
        if prio not in PRIOS or not 0 <= pid <= 65535:
            raise ParseError(f"lldptool: bad APP entry {m.group(0)!r}")
        if sel == SEL_DGRAM:
            out.setdefault(pid, []).append(prio)
    return MappingProxyType({k: tuple(v) for k, v in out.items()})


# --------------------------------------------------------------------------- ethtool


@dataclass(frozen=True)
class PauseParams:
    """`ethtool -a IF`: 802.3x link-level (global) pause."""

    autoneg: bool | None
    rx: bool
    tx: bool


def _onoff(value: str, tool: str) -> bool:
    v = value.strip().lower()
    if v in ("on", "yes"):
        return True
    if v in ("off", "no"):
        return False
    raise ParseError(f"{tool}: expected on/off, got {value.strip()[:20]!r}")


def parse_ethtool_pause(text: str) -> PauseParams:
    fields: dict[str, str] = {}
    for line in bounded_lines(text, "ethtool -a").splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("Autonegotiate", "RX", "TX"):
            fields[key.strip()] = value
    if "RX" not in fields or "TX" not in fields:
        raise ParseError("ethtool -a: no RX/TX pause lines in the output")
    auto = fields.get("Autonegotiate")
    return PauseParams(
        _onoff(auto, "ethtool -a") if auto is not None else None,
        _onoff(fields["RX"], "ethtool -a"),
        _onoff(fields["TX"], "ethtool -a"),
    )


@dataclass(frozen=True)
class LinkInfo:
    """`ethtool IF`: the negotiated link and the fastest mode the port supports."""

    speed_mbps: int | None  # None: Unknown! (link down)
    lanes: int | None
    max_supported_mbps: int | None
    link_detected: bool | None


_MODE = re.compile(r"(\d{2,7})base", re.I)


def parse_ethtool_link(text: str) -> LinkInfo:
    text = bounded_lines(text, "ethtool")
    if not re.search(r"^Settings for \S+:", text, re.M):
        raise ParseError("ethtool: no `Settings for IF:` header in the output")
    speed = lanes = None
    detected = None
    modes: list[int] = []
    in_supported = False
    for line in text.splitlines():
        key, sep, value = line.strip().partition(":")
        if sep:
            in_supported = key == "Supported link modes"
        if in_supported:
            modes += [int(m) for m in _MODE.findall(value if sep else line)]
        if not sep:
            continue
        v = value.strip()
        if key == "Speed":
            m = re.fullmatch(r"(\d{1,9})Mb/s", v)
            if m:
                speed = int(m.group(1))
            elif not v.startswith("Unknown"):
                raise ParseError(f"ethtool: bad Speed {v[:30]!r}")
        elif key == "Lanes":
            lanes = _int(v, "ethtool", "Lanes")
        elif key == "Link detected":
            detected = _onoff(v, "ethtool")
    return LinkInfo(speed, lanes, max(modes) if modes else None, detected)


@dataclass(frozen=True)
class DriverInfo:
    """`ethtool -i IF`."""

    driver: str
    version: str | None
    firmware: str | None
    bus_info: str | None


def parse_ethtool_driver(text: str) -> DriverInfo:
    fields: dict[str, str] = {}
    for line in bounded_lines(text, "ethtool -i").splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()[:200]
    if not fields.get("driver"):
        raise ParseError("ethtool -i: no driver line in the output")
    return DriverInfo(
        fields["driver"],
        fields.get("version") or None,
        fields.get("firmware-version") or None,
        fields.get("bus-info") or None,
    )


@dataclass(frozen=True)
class FecInfo:
    """FEC mode and error figures from `ethtool -I --show-fec IF` or `mlxlink -c`."""

    active: str | None  # "RS", "BaseR", "Off", "None", ... as the tool names it
    corrected_blocks: int | None
    uncorrectable_blocks: int | None
    raw_ber: float | None  # pre-FEC bit-error rate (mlxlink)
    effective_ber: float | None  # post-FEC bit-error rate (mlxlink)
    source: str


def parse_ethtool_fec(text: str) -> FecInfo:
    text = bounded_lines(text, "ethtool --show-fec")
    m = re.search(r"^\s*Active FEC encodings?:\s*(.*?)\s*$", text, re.M)
    if m is None:
        raise ParseError("ethtool --show-fec: no `Active FEC encoding:` line in the output")
    counts: dict[str, int] = {}
    for name in ("corrected_blocks", "uncorrectable_blocks"):
        c = re.search(rf"^\s*{name}:\s*(\S+)", text, re.M)
        if c is not None:
            counts[name] = _int(c.group(1), "ethtool --show-fec", name)
    return FecInfo(
        m.group(1) or None,
        counts.get("corrected_blocks"),
        counts.get("uncorrectable_blocks"),
        None,
        None,
        "ethtool",
    )


def _ber(value: str, tool: str) -> float:
    """`1.5E-12`, `15E-255` (mlxlink prints the mantissa as an integer) -> float."""
    m = re.fullmatch(r"(\d{1,6}(?:\.\d{1,6})?)E-?(\d{1,3})", value.strip(), re.I)
    if m is None:
        raise ParseError(f"{tool}: bad BER {value.strip()[:30]!r}")
    v = float(m.group(1)) * 10.0 ** -int(m.group(2))
    if not math.isfinite(v):
        raise ParseError(f"{tool}: BER {value.strip()[:30]!r} out of range")
    return v


def parse_mlxlink(text: str) -> FecInfo:
    fields: dict[str, str] = {}
    for line in bounded_lines(text, "mlxlink").splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[" ".join(key.split())] = value.strip()
    if "FEC" not in fields and "Raw Physical BER" not in fields:
        raise ParseError("mlxlink: neither FEC nor Raw Physical BER in the output")
    raw = fields.get("Raw Physical BER")
    eff = fields.get("Effective Physical BER")
    return FecInfo(
        fields.get("FEC") or None,
        None,
        None,
        _ber(raw, "mlxlink") if raw else None,
        _ber(eff, "mlxlink") if eff else None,
        "mlxlink",
    )


# --------------------------------------------------------------------------- PCIe


def parse_link_speed(text: str) -> float | None:
    """sysfs `current_link_speed` / `max_link_speed`: `16.0 GT/s PCIe` -> 16.0; None for
    `Unknown` (some platforms print that for a link in power saving)."""
    t = text.strip()
    if t.startswith("Unknown"):
        return None
    m = re.match(r"^(\d{1,3}(?:\.\d{1,2})?) GT/s", t)
    if m is None:
        raise ParseError(f"PCIe link speed: {t[:30]!r} is not `N GT/s`")
    return float(m.group(1))


def parse_link_width(text: str) -> int | None:
    """sysfs `current_link_width` / `max_link_width`: `16` -> 16 (`0`: unknown)."""
    t = text.strip()
    if not t.isdecimal() or len(t) > 3:
        raise ParseError(f"PCIe link width: {t[:30]!r} is not a number")
    return int(t) or None


@dataclass(frozen=True)
class PciCaps:
    """ACS control and ATS enable of one PCI function, from `lspci -vvv -s BDF`."""

    acs_redirect: bool | None  # ACSCtl ReqRedir+ or CmpltRedir+: P2P is sent upstream
    acs_direct_translated: bool | None  # ACSCtl DirectTrans+: ATS-translated P2P goes direct
    ats_enabled: bool | None  # ATSCtl Enable+
    denied: bool  # "Capabilities: <access denied>": lspci needs root for these


def _flag(line: str, name: str) -> bool | None:
    m = re.search(rf"\b{name}([+-])", line)
    return None if m is None else m.group(1) == "+"


def parse_lspci_caps(text: str) -> PciCaps:
    text = bounded_lines(text, "lspci")
    if not re.search(r"^[0-9a-f]{2,4}:[0-9a-f]{2}(?::[0-9a-f]{2})?\.[0-7] ", text, re.M | re.I):
        raise ParseError("lspci: no device header line in the output")
    acs = re.search(r"^\s*ACSCtl:(.*)$", text, re.M)
    ats = re.search(r"^\s*ATSCtl:(.*)$", text, re.M)
    redirect = None
    direct = None
    if acs is not None:
        req, cmp_ = _flag(acs.group(1), "ReqRedir"), _flag(acs.group(1), "CmpltRedir")
        redirect = None if req is None and cmp_ is None else bool(req or cmp_)
        direct = _flag(acs.group(1), "DirectTrans")
    return PciCaps(
        redirect,
        direct,
        _flag(ats.group(1), "Enable") if ats is not None else None,
        "<access denied>" in text,
    )
