"""Checks of the NIC's QoS, link and PCIe path: ETS, global pause, receive buffers,
DCBX and the RoCE APP TLV, link speed and lanes, FEC and bit-error rates, PCIe link,
ACS/ATS on the NIC-GPU path, and firmware and driver versions.

Same contract as fabricprobe.probes.roce.checks: one CheckResult per check, evidence
and a fix, SKIP with the reason when the data cannot exist on this host (software RDMA,
a driver without the interface, no GPU) or needs root.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Mapping
from itertools import takewhile
from pathlib import Path
from typing import NamedTuple, TypeVar

from fabricprobe.core.errors import ParseError
from fabricprobe.probes.pcie import read_gpus
from fabricprobe.probes.roce.checks import (
    Target,
    _soft_skip,
    _unavailable,
    first_answer,
    parsed_output,
)
from fabricprobe.probes.roce.host import HostView, ToolRun
from fabricprobe.probes.roce.hwtools import (
    ROCE_UDP_PORT,
    BufferConfig,
    DcbxMode,
    EtsConfig,
    FecInfo,
    parse_dcb_app_ports,
    parse_dcb_buffer,
    parse_dcb_dcbx,
    parse_dcb_ets,
    parse_ethtool_driver,
    parse_ethtool_fec,
    parse_ethtool_link,
    parse_ethtool_pause,
    parse_link_speed,
    parse_link_width,
    parse_lldptool_app,
    parse_lspci_caps,
    parse_mlnx_qos_buffers,
    parse_mlnx_qos_dcbx,
    parse_mlnx_qos_ets,
    parse_mlxlink,
)
from fabricprobe.probes.roce.policy import Policy
from fabricprobe.probes.roce.result import CheckResult, Status
from fabricprobe.probes.sysfs import read_optional

T = TypeVar("T")
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def _dcb_or_mlnx_qos(
    view: HostView, nd: str, obj: str, dcb: Callable[[str], T], mlnx_qos: Callable[[str], T]
) -> tuple[T | None, list[str], list[ToolRun]]:
    """OBJ of netdev ND as `dcb OBJ show dev ND` gives it (iproute2), else as `mlnx_qos -i
    ND` does (Mellanox's tool, for drivers dcb cannot speak to): see first_answer."""
    return first_answer(
        view, [(("dcb", obj, "show", "dev", nd), dcb), (("mlnx_qos", "-i", nd), mlnx_qos)]
    )


def _judge_dcb(
    view: HostView,
    t: Target,
    policy: Policy,
    c: _Check,
    obj: str,
    dcb: Callable[[str], T],
    mlnx_qos: Callable[[str], T],
    what: str,
    judge: Callable[[Target, Policy, T, list[str]], CheckResult],
) -> CheckResult:
    """JUDGE's verdict on the OBJ of C's netdev as dcb or mlnx_qos read it
    (_dcb_or_mlnx_qos); SKIP when neither can, WHAT naming it."""
    found, ev, runs = _dcb_or_mlnx_qos(view, c.nd, obj, dcb, mlnx_qos)
    if found is None:
        return _skip_unreadable(t, c.name, c.title, what, ev, runs, "apt install iproute2")
    return judge(t, policy, found, ev)


def _skip_unreadable(
    t: Target, check: str, title: str, what: str, ev: list[str], runs: list[ToolRun], fix: str
) -> CheckResult:
    why, root = _unavailable(runs)
    # EOPNOTSUPP from the one tool that speaks to this driver (the others not installed)
    unsupported = any(r.status == "unsupported" for r in runs) and all(
        r.status in ("unsupported", "missing") for r in runs
    )
    reason = (
        "needs root"
        if root
        else f"{t.device.driver or 'the driver'} does not support it"
        if unsupported
        else "no tool answered"
    )
    return t.result(
        check,
        title,
        Status.SKIP,
        f"{what} not readable: {reason}",
        [*ev, why],
        fix=None if unsupported else fix,
        needs_root=root,
    )


Finding = tuple[Status, str, str | None]  # a status, its message, its fix


def _worst(
    t: Target, check: str, title: str, found: list[Finding], ev: list[str], value: str
) -> CheckResult:
    """One result of several FOUND: the worst status, every message, each fix of what did
    not PASS (once)."""
    worst = max((s for s, _, _ in found), key=lambda s: s.rank)
    msg = "; ".join(m for _, m, _ in found)
    fixes = [f for s, _, f in found if f and s is not Status.PASS]
    return t.result(
        check, title, worst, msg, ev, "; ".join(dict.fromkeys(fixes)) or None, value=value
    )


class _Check(NamedTuple):
    """What the body of a NIC check is given besides the host: its title and name, and the
    netdev it asks about ('' for a check that asks about none)."""

    title: str
    name: str
    nd: str


CheckBody = Callable[[HostView, Target, Policy, _Check], CheckResult]
Check = Callable[[HostView, Target, Policy], CheckResult]


def _nic_check(
    name: str, title: str, *, soft: str, netdev: str | None = None
) -> Callable[[CheckBody], Check]:
    """The preamble every NIC check shares, once: SKIP on software RDMA (which has no SOFT:
    no traffic classes, no PCIe link, ...) and, for a check that asks a tool about the
    netdev, SKIP when the port has none (NETDEV names what it would have asked about)."""

    def wrap(body: CheckBody) -> Check:
        @functools.wraps(body)
        def check(view: HostView, t: Target, policy: Policy) -> CheckResult:
            if t.soft:
                return _soft_skip(t, name, title, soft)
            if netdev is not None and t.netdev is None:
                return t.result(name, title, Status.SKIP, f"no netdev to ask about {netdev}")
            return body(view, t, policy, _Check(title, name, t.netdev or ""))

        return check

    return wrap


# --------------------------------------------------------------------------- ETS

TITLE_ETS = "ETS: the RoCE traffic class's share"


@_nic_check("ets", TITLE_ETS, soft="traffic classes", netdev="ETS")
def check_ets(view: HostView, t: Target, policy: Policy, c: _Check) -> CheckResult:
    """The RoCE priority's traffic class gets at least roce_bw_min_pct under ETS, and the
    CNP class is not starved."""
    return _judge_dcb(
        view, t, policy, c, "ets", parse_dcb_ets, parse_mlnx_qos_ets, "ETS configuration", judge_ets
    )


def _ets_fix(nd: str, policy: Policy) -> str:
    p, c, bw = policy.priority, policy.cnp_priority, max(policy.roce_bw_min_pct, 1)
    return (
        f"dcb ets set dev {nd} prio-tc {p}:{p} {c}:{c} tc-tsa all:ets {c}:strict "
        f"tc-bw all:0 0:{100 - bw} {p}:{bw}"
    )


def judge_ets(t: Target, policy: Policy, ets: EtsConfig, ev: list[str]) -> CheckResult:
    """(pure) The verdict on one EtsConfig."""
    nd = t.netdev or "IF"
    p, c = policy.priority, policy.cnp_priority
    tc = ets.prio_tc.get(p, p)
    ctc = ets.prio_tc.get(c, c)
    ev = [
        *ev,
        f"{ets.source}: prio-tc {' '.join(f'{k}:{v}' for k, v in sorted(ets.prio_tc.items()))}",
        f"{ets.source}: tc-tsa {' '.join(f'{k}:{v}' for k, v in sorted(ets.tsa.items()))}",
        f"{ets.source}: tc-bw {' '.join(f'{k}:{v}' for k, v in sorted(ets.bw.items()))}",
    ]
    fix = _ets_fix(nd, policy)
    found: list[Finding] = []
    tsa = ets.tsa.get(tc)
    bw = ets.bw.get(tc, 0)
    v = f"tc {tc} {tsa} {bw}%"
    if tsa == "ets" and bw == 0:
        found.append((Status.FAIL, f"RoCE TC {tc} gets 0% under ETS: it only runs when idle", fix))
    elif tsa == "ets" and bw < policy.roce_bw_min_pct:
        found.append(
            (
                Status.WARN,
                f"RoCE TC {tc} gets {bw}% under ETS (policy {policy.roce_bw_min_pct}%)",
                fix,
            )
        )
    elif tsa == "strict":
        found.append(
            (Status.WARN, f"RoCE TC {tc} is strict priority: it can starve every other class", fix)
        )
    elif tsa not in ("ets", None):
        found.append((Status.WARN, f"RoCE TC {tc} uses scheduler {tsa!r}, not ETS", fix))
    if ets.tsa.get(ctc) == "ets" and ets.bw.get(ctc, 0) == 0:
        found.append((Status.WARN, f"CNP TC {ctc} gets 0% under ETS: CNPs wait behind data", fix))
    if not found:
        share = "strict" if tsa == "strict" else f"{bw}%"
        return t.result(
            "ets", TITLE_ETS, Status.PASS, f"RoCE priority {p} -> TC {tc} with {share}", ev, value=v
        )
    return _worst(t, "ets", TITLE_ETS, found, ev, v)


# --------------------------------------------------------------------------- global pause

TITLE_PAUSE_GLOBAL = "802.3x global pause off"


@_nic_check("global_pause", TITLE_PAUSE_GLOBAL, soft="link pause", netdev="pause")
def check_global_pause(view: HostView, t: Target, policy: Policy, c: _Check) -> CheckResult:
    """Link-level pause must be off: it stops every priority, and PFC replaces it."""
    title, check, nd = c
    pp, ev, runs = first_answer(view, [(("ethtool", "-a", nd), parse_ethtool_pause)])
    if pp is None:
        return _skip_unreadable(
            t, check, title, "pause parameters", ev, runs, "apt install ethtool"
        )
    ev.append(f"ethtool -a {nd}: autoneg {pp.autoneg}, rx {pp.rx}, tx {pp.tx}")
    v = f"rx {'on' if pp.rx else 'off'} tx {'on' if pp.tx else 'off'}"
    if pp.rx or pp.tx:
        on = " and ".join(d for d, v in (("RX", pp.rx), ("TX", pp.tx)) if v)
        return t.result(
            check,
            title,
            Status.FAIL if policy.lossless else Status.WARN,
            f"global pause {on} on: one congested priority pauses the whole link, "
            "and PFC cannot run beside it",
            ev,
            f"ethtool -A {nd} autoneg off rx off tx off",
            value=v,
        )
    return t.result(check, title, Status.PASS, "global pause off (RX and TX)", ev, value=v)


# --------------------------------------------------------------------------- buffers

TITLE_BUFFERS = "prio2buffer and receive buffer sizes"


@_nic_check("buffers", TITLE_BUFFERS, soft="receive buffers", netdev="buffers")
def check_buffers(view: HostView, t: Target, policy: Policy, c: _Check) -> CheckResult:
    """The RoCE priority has a receive buffer of its own, with room in it."""
    what = "receive buffer configuration"
    return _judge_dcb(
        view, t, policy, c, "buffer", parse_dcb_buffer, parse_mlnx_qos_buffers, what, judge_buffers
    )


def judge_buffers(t: Target, policy: Policy, buf: BufferConfig, ev: list[str]) -> CheckResult:
    """(pure) The verdict on one BufferConfig."""
    nd, p = t.netdev or "IF", policy.priority
    title, check = TITLE_BUFFERS, "buffers"
    ev = [
        *ev,
        f"{buf.source}: prio-buffer "
        + " ".join(f"{k}:{v}" for k, v in sorted(buf.prio_buffer.items())),
        f"{buf.source}: buffer-size " + " ".join(f"{k}:{v}" for k, v in sorted(buf.size.items())),
    ]
    b = buf.prio_buffer.get(p)
    if b is None:
        return t.result(check, title, Status.SKIP, f"no buffer listed for priority {p}", ev)
    others = sorted(q for q, bb in buf.prio_buffer.items() if bb == b and q != p)
    v = f"buffer {b} size {buf.size.get(b)} shared {','.join(map(str, others)) or 'no'}"
    flags = ",".join("1" if q == p else "0" for q in range(8))
    fix = (
        f"dcb buffer set dev {nd} prio-buffer all:0 {p}:1"
        f"  # or: mlnx_qos -i {nd} --prio2buffer {flags}"
    )
    size = buf.size.get(b)
    if size == 0:
        return t.result(
            check,
            title,
            Status.FAIL,
            f"priority {p} uses buffer {b}, which has 0 bytes: no headroom to absorb "
            "traffic in flight after a pause, so lossless frames drop",
            ev,
            fix + f"; dcb buffer set dev {nd} buffer-size all:0 0:256K 1:256K",
            value=v,
        )
    if others:
        return t.result(
            check,
            title,
            Status.WARN,
            f"priority {p} shares buffer {b} with priorities {', '.join(map(str, others))}: "
            "lossy traffic fills the lossless headroom",
            ev,
            fix,
            value=v,
        )
    shown = f"{size} bytes" if size is not None else "size not shown"
    return t.result(
        check, title, Status.PASS, f"priority {p} has buffer {b} to itself ({shown})", ev, value=v
    )


# --------------------------------------------------------------------------- DCBX / APP TLV

TITLE_DCBX = "DCBX mode and the APP TLV for UDP 4791"


@_nic_check("dcbx", TITLE_DCBX, soft="DCBX", netdev="DCBX")
def check_dcbx(view: HostView, t: Target, policy: Policy, c: _Check) -> CheckResult:
    """Who runs DCBX, and whether an APP entry maps RoCEv2 (UDP 4791) to the RoCE priority."""
    title, check, nd = c
    mode, ev, runs = _dcb_or_mlnx_qos(view, nd, "dcbx", parse_dcb_dcbx, parse_mlnx_qos_dcbx)
    apps, ev2, runs2 = first_answer(
        view,
        [
            (("dcb", "app", "show", "dev", nd), parse_dcb_app_ports),
            (("lldptool", "-t", "-i", nd, "-V", "APP", "-c", "app"), parse_lldptool_app),
        ],
    )
    ev += ev2
    if mode is None and apps is None:
        return _skip_unreadable(
            t, check, title, "DCBX state", ev, runs + runs2, "apt install iproute2"
        )
    return judge_dcbx(t, policy, mode, apps, ev)


def judge_dcbx(
    t: Target,
    policy: Policy,
    mode: DcbxMode | None,
    apps: Mapping[int, tuple[int, ...]] | None,
    ev: list[str],
) -> CheckResult:
    """(pure) The verdict on the DCBX mode and the UDP-port APP table."""
    title, check = TITLE_DCBX, "dcbx"
    nd, p = t.netdev or "IF", policy.priority
    found: list[Finding] = []
    if mode is not None:
        ev = [*ev, f"{mode.source}: DCBX managed by {mode.managed_by} {' '.join(mode.versions)}"]
        if policy.dcbx != "any" and mode.managed_by != policy.dcbx:
            fix = (
                f"dcb dcbx set dev {nd} host ieee"
                if policy.dcbx == "host"
                else f"mlxconfig -d {t.device.name} set LLDP_NB_DCBX_P{t.port.number}=1"
                " (then reboot)"
            )
            found.append(
                (Status.WARN, f"DCBX run by {mode.managed_by}, policy wants {policy.dcbx}", fix)
            )
    else:
        ev = [*ev, "DCBX mode: not readable"]
    fix_app = (
        f"dcb app add dev {nd} dgram-port-prio {ROCE_UDP_PORT}:{p}"
        f"  # or: lldptool -T -i {nd} -V APP app={p},3,{ROCE_UDP_PORT}"
    )
    if apps is not None:
        prios = tuple(apps.get(ROCE_UDP_PORT, ()))
        ev.append(f"APP UDP {ROCE_UDP_PORT}: priorities {list(prios) or 'none'}")
        if not prios:
            found.append(
                (
                    Status.WARN,
                    f"no APP entry maps UDP {ROCE_UDP_PORT} to priority {p}: a DCBX peer "
                    "cannot learn the RoCE priority from this host",
                    fix_app,
                )
            )
        elif p not in prios or len(set(prios)) > 1:
            found.append(
                (
                    Status.FAIL,
                    f"APP entry maps UDP {ROCE_UDP_PORT} to priority {sorted(set(prios))}, "
                    f"not {p}: a willing peer moves RoCE off the lossless priority",
                    f"dcb app del dev {nd} dgram-port-prio "
                    + " ".join(f"{ROCE_UDP_PORT}:{q}" for q in sorted(set(prios)) if q != p)
                    + f"; {fix_app}",
                )
            )
    else:
        ev.append("APP table: not readable")
    v = (
        f"{mode.managed_by if mode is not None else 'unknown'} "
        f"app {','.join(map(str, sorted(set(apps.get(ROCE_UDP_PORT, ()))))) if apps else '-'}"
    )
    if not found:
        managed = mode.managed_by if mode is not None else "unknown"
        return t.result(
            check,
            title,
            Status.PASS,
            f"DCBX by {managed}; APP maps UDP {ROCE_UDP_PORT} to priority {p}"
            if apps is not None
            else f"DCBX by {managed}",
            ev,
            value=v,
        )
    return _worst(t, check, title, found, ev, v)


# --------------------------------------------------------------------------- link

TITLE_LINK = "link speed and lanes"


@_nic_check("link", TITLE_LINK, soft="physical link", netdev="the link")
def check_link(view: HostView, t: Target, policy: Policy, c: _Check) -> CheckResult:
    """The link runs at the expected speed (policy, else the port's fastest mode) and lanes."""
    title, check, nd = c
    info, ev, runs = first_answer(view, [(("ethtool", nd), parse_ethtool_link)])
    ev.append(
        f"{view.sysfs_root}/class/infiniband/{t.device.name}/ports/{t.port.number}/rate: "
        f"{t.port.rate}"
    )
    if info is None:
        return _skip_unreadable(t, check, title, "link settings", ev, runs, "apt install ethtool")
    ev.append(
        f"ethtool {nd}: speed {info.speed_mbps} Mb/s, lanes {info.lanes}, "
        f"fastest supported {info.max_supported_mbps} Mb/s"
    )
    if info.speed_mbps is None:
        return t.result(
            check,
            title,
            Status.FAIL,
            "link speed unknown: the link is down",
            ev,
            f"ip link set dev {nd} up; check the cable, transceiver and switch port",
        )
    gbps = info.speed_mbps / 1000
    v = f"{gbps:g}G x{info.lanes}" if info.lanes else f"{gbps:g}G"
    want = policy.link_speed_gbps or (
        info.max_supported_mbps / 1000 if info.max_supported_mbps else None
    )
    found: list[Finding] = []
    if want is not None and gbps < want:
        status = Status.FAIL if policy.link_speed_gbps else Status.WARN
        src = "policy" if policy.link_speed_gbps else "the port's fastest mode"
        found.append(
            (
                status,
                f"link at {gbps:g} Gb/s, {src} is {want:g} Gb/s",
                f"ethtool {nd}  # check the cable or transceiver rating and the switch port "
                f"speed; ethtool -s {nd} autoneg on",
            )
        )
    if policy.link_lanes and info.lanes is not None and info.lanes != policy.link_lanes:
        found.append(
            (
                Status.FAIL,
                f"{info.lanes} lanes, policy expects {policy.link_lanes}",
                f"ethtool -s {nd} lanes {policy.link_lanes}  # or reseat / replace the cable",
            )
        )
    if not found:
        lanes = f", {info.lanes} lanes" if info.lanes else ""
        return t.result(check, title, Status.PASS, f"link at {gbps:g} Gb/s{lanes}", ev, value=v)
    return _worst(t, check, title, found, ev, v)


# --------------------------------------------------------------------------- FEC

TITLE_FEC = "FEC mode and bit-error rates"


@_nic_check("fec", TITLE_FEC, soft="FEC", netdev="FEC")
def check_fec(view: HostView, t: Target, policy: Policy, c: _Check) -> CheckResult:
    """FEC on where the speed needs it; pre-FEC BER within margin; no post-FEC errors."""
    title, check, nd = c
    fec, ev, runs = first_answer(view, [(("ethtool", "-I", "--show-fec", nd), parse_ethtool_fec)])
    ml, ev2, runs2 = first_answer(view, [(("mlxlink", "-d", t.device.name, "-c"), parse_mlxlink)])
    ev += ev2
    if fec is None and ml is None:
        return _skip_unreadable(
            t, check, title, "FEC state", ev, runs + runs2, "apt install ethtool"
        )
    info, _, _ = first_answer(view, [(("ethtool", nd), parse_ethtool_link)])
    speed = info.speed_mbps if info is not None else None
    return judge_fec(t, policy, fec, ml, speed, ev)


def judge_fec(
    t: Target,
    policy: Policy,
    fec: FecInfo | None,
    ml: FecInfo | None,
    speed_mbps: int | None,
    ev: list[str],
) -> CheckResult:
    """(pure) The verdict on FEC figures from ethtool and/or mlxlink."""
    title, check = TITLE_FEC, "fec"
    nd = t.netdev or "IF"
    th = policy.thresholds
    ev = list(ev)
    for f in (fec, ml):
        if f is not None:
            ev.append(
                f"{f.source}: FEC {f.active}, corrected {f.corrected_blocks}, uncorrectable "
                f"{f.uncorrectable_blocks}, raw BER {f.raw_ber}, effective BER {f.effective_ber}"
            )
    active = (fec.active if fec is not None else None) or (ml.active if ml is not None else None)
    v = active or "unknown"  # the mode only: error counts differ from host to host
    found: list[Finding] = []
    off = active is not None and active.split()[0].lower() in ("off", "none", "no")
    if off and speed_mbps is not None and speed_mbps >= 50_000:
        found.append(
            (
                Status.FAIL,
                f"FEC is {active} at {speed_mbps // 1000} Gb/s: links this fast need RS-FEC",
                f"ethtool --set-fec {nd} encoding rs  # and the same FEC on the switch port",
            )
        )
    unc = fec.uncorrectable_blocks if fec is not None else None
    if unc:
        found.append(
            (
                Status.WARN,
                f"{unc} uncorrectable FEC blocks since the counters started: frames were lost",
                "check the cable and transceiver; mlxlink -d DEV -c shows the BER",
            )
        )
    if ml is not None and ml.effective_ber is not None and ml.effective_ber > th.post_fec_ber_fail:
        found.append(
            (
                Status.FAIL,
                f"effective (post-FEC) BER {ml.effective_ber:.1e} above {th.post_fec_ber_fail:.0e}",
                "replace the cable or transceiver; clean the fibre",
            )
        )
    if ml is not None and ml.raw_ber is not None and ml.raw_ber > th.pre_fec_ber_warn:
        found.append(
            (
                Status.WARN,
                f"raw (pre-FEC) BER {ml.raw_ber:.1e} above {th.pre_fec_ber_warn:.0e}: "
                "the link lives on its FEC margin",
                "check the cable and transceiver; mlxlink -d DEV -c --rx_fec_histogram",
            )
        )
    if not found:
        ber = f", raw BER {ml.raw_ber:.1e}" if ml is not None and ml.raw_ber is not None else ""
        return t.result(check, title, Status.PASS, f"FEC {active or 'unknown'}{ber}", ev, value=v)
    return _worst(t, check, title, found, ev, v)


# --------------------------------------------------------------------------- PCIe

TITLE_PCIE = "PCIe link width and speed against the device maximum"


def _pci_dir(view: HostView, t: Target) -> Path:
    return view.sysfs_root / "class" / "infiniband" / t.device.name / "device"


@_nic_check("pcie", TITLE_PCIE, soft="PCIe link")
def check_pcie(view: HostView, t: Target, policy: Policy, c: _Check) -> CheckResult:
    """The NIC's PCIe link trained at its full width and speed."""
    title, check, _ = c
    d = _pci_dir(view, t)
    raw = {
        name: read_optional(d / name)
        for name in ("current_link_speed", "max_link_speed", "current_link_width", "max_link_width")
    }
    ev = [f"{d}/{k}: {v}" for k, v in raw.items()]
    if raw["current_link_width"] is None or raw["max_link_width"] is None:
        return t.result(
            check,
            title,
            Status.SKIP,
            "no PCIe link attributes in sysfs (a virtual function, or not a PCIe device)",
            ev,
        )
    try:
        cw, mw = (
            parse_link_width(raw["current_link_width"]),
            parse_link_width(raw["max_link_width"]),
        )
        cs = parse_link_speed(raw["current_link_speed"] or "Unknown")
        ms = parse_link_speed(raw["max_link_speed"] or "Unknown")
    except ParseError as e:
        return t.result(check, title, Status.SKIP, f"PCIe link attributes unreadable: {e}", ev)
    v = f"x{cw} {cs:g}GT/s" if cs is not None else f"x{cw}"
    found: list[Finding] = []
    if cw is not None and mw is not None and cw < mw:
        found.append(
            (
                Status.FAIL,
                f"PCIe link x{cw} of x{mw}: the NIC gets {cw * 100 // mw}% of its host bandwidth",
                "reseat the NIC in a full-width slot; check the riser and the BIOS bifurcation",
            )
        )
    if cs is not None and ms is not None and cs < ms:
        found.append(
            (
                Status.WARN,
                f"PCIe link at {cs:g} GT/s of {ms:g} GT/s: the slot or the BIOS limits it",
                "check the slot generation and the BIOS PCIe speed setting",
            )
        )
    if not found:
        return t.result(
            check, title, Status.PASS, f"PCIe x{cw} at {cs:g} GT/s (the maximum)", ev, value=v
        )
    return _worst(t, check, title, found, ev, v)


# --------------------------------------------------------------------------- ACS / ATS

TITLE_ACS = "ACS on the NIC-GPU path, and ATS (GPUDirect RDMA)"


def _pci_path(view: HostView, bdf: str) -> list[str]:
    """BDFs from the root port down to BDF itself, from the sysfs device path."""
    real = os.path.realpath(view.sysfs_root / "bus" / "pci" / "devices" / bdf)
    return [part for part in Path(real).parts if _BDF.match(part)]


def find_gpus(view: HostView) -> list[tuple[str, str]]:
    """(BDF, vendor) of every GPU under SYSFS/bus/pci/devices (fabricprobe.probes.pcie)."""
    return [(g.function.address, g.vendor) for g in read_gpus(view.sysfs_root)]


@_nic_check("acs", TITLE_ACS, soft="PCIe path")
def check_acs(view: HostView, t: Target, policy: Policy, c: _Check) -> CheckResult:
    """PCIe switches between the NIC and a GPU must not redirect P2P (ACS), unless ATS
    lets translated requests go direct."""
    title, check, _ = c
    gpus = find_gpus(view)
    if not gpus:
        return t.result(
            check,
            title,
            Status.SKIP,
            "no GPU on this host: GPUDirect RDMA (NIC-GPU P2P) does not apply",
            [
                f"{view.sysfs_root}/bus/pci/devices: no GPU (class 0x0300/0x0302, or an AMD "
                "accelerator) from NVIDIA or AMD"
            ],
        )
    nic = os.path.basename(os.path.realpath(_pci_dir(view, t)))
    if not _BDF.match(nic):
        return t.result(check, title, Status.SKIP, "the NIC's PCI address is unknown in sysfs")
    nic_path = _pci_path(view, nic)
    ev = [f"NIC {nic}: path {' > '.join(nic_path)}"]
    bridges: set[str] = set()
    shared = []
    for gpu, vendor in gpus:
        gpu_path = _pci_path(view, gpu)
        ev.append(f"GPU {gpu} ({vendor}): path {' > '.join(gpu_path)}")
        common = [
            a
            for a, _ in takewhile(lambda ab: ab[0] == ab[1], zip(nic_path, gpu_path, strict=False))
        ]
        if not common:
            continue  # different root ports: P2P crosses the root complex, ACS not involved
        shared.append(gpu)
        n = len(common)
        bridges.update(nic_path[n:-1] + gpu_path[n:-1] + common[-1:])
    if not shared:
        return t.result(
            check,
            title,
            Status.PASS,
            "no PCIe switch shared by the NIC and a GPU: P2P goes through the root complex "
            "(NCCL topology PHB/SYS), ACS is not on the path",
            ev,
        )
    runs: list[ToolRun] = []
    ats = None
    denied = False
    caps = parsed_output(view, ("lspci", "-vvv", "-s", nic), parse_lspci_caps, runs, ev)
    if caps is not None:
        ats, denied = caps.ats_enabled, caps.denied
    ev.append(f"NIC ATS: {'enabled' if ats else 'disabled' if ats is False else 'unknown'}")
    redirecting = []
    for br in sorted(bridges):
        caps = parsed_output(view, ("lspci", "-vvv", "-s", br), parse_lspci_caps, runs, ev)
        if caps is None:
            continue
        denied = denied or caps.denied
        ev.append(
            f"bridge {br}: ACS redirect {caps.acs_redirect}, "
            f"DirectTrans {caps.acs_direct_translated}"
        )
        if caps.acs_redirect and not (ats and caps.acs_direct_translated):
            redirecting.append(br)
    if denied and not redirecting:
        return t.result(
            check,
            title,
            Status.SKIP,
            "PCIe capabilities need root (lspci: access denied)",
            ev,
            fix="sudo probe validate",
            needs_root=True,
        )
    if not any(r.ok for r in runs):
        why, root = _unavailable(runs)
        return t.result(
            check,
            title,
            Status.SKIP,
            "lspci unavailable: ACS and ATS not readable",
            [*ev, why],
            fix="apt install pciutils",
            needs_root=root,
        )
    if redirecting:
        return t.result(
            check,
            title,
            Status.WARN,
            f"ACS redirects P2P at {', '.join(redirecting)} between the NIC and GPU "
            f"{', '.join(shared)}: GPUDirect RDMA detours through the root complex",
            ev,
            "; ".join(f"setpci -s {br} ECAP_ACS+0x6.w=0000" for br in redirecting)
            + "  # until reboot; or turn ACS off in the BIOS, or enable ATS",
        )
    return t.result(
        check,
        title,
        Status.PASS,
        f"P2P between the NIC and GPU {', '.join(shared)} stays below the PCIe switch",
        ev,
    )


# --------------------------------------------------------------------------- firmware

TITLE_FIRMWARE = "firmware and driver versions"


def _version(text: str) -> tuple[int, ...] | None:
    m = re.match(r"^(\d{1,9}(?:\.\d{1,9}){0,5})", text.strip())
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


@_nic_check("firmware", TITLE_FIRMWARE, soft="firmware")
def check_firmware(view: HostView, t: Target, policy: Policy, c: _Check) -> CheckResult:
    """Report the firmware and driver; FAIL below the policy's firmware_min."""
    title, check, _ = c
    ev = [f"{view.sysfs_root}/class/infiniband/{t.device.name}/fw_ver: {t.device.fw_ver}"]
    drv = None
    if t.netdev is not None:
        drv, ev2, _ = first_answer(view, [(("ethtool", "-i", t.netdev), parse_ethtool_driver)])
        ev += ev2
        if drv is not None:
            ev.append(
                f"ethtool -i {t.netdev}: driver {drv.driver} {drv.version}, firmware "
                f"{drv.firmware}, bus {drv.bus_info}"
            )
    fw = t.device.fw_ver or (drv.firmware if drv is not None else None)
    if fw is None:
        return t.result(check, title, Status.SKIP, "no firmware version in sysfs or ethtool -i", ev)
    driver = f"{drv.driver} {drv.version}" if drv is not None else (t.device.driver or "unknown")
    v = f"{fw} {driver}"
    if policy.firmware_min:
        have, want = _version(fw), _version(policy.firmware_min)
        if have is None:
            return t.result(
                check, title, Status.WARN, f"firmware {fw!r} is not a dotted version", ev, value=v
            )
        if want is not None and have < want:
            return t.result(
                check,
                title,
                Status.FAIL,
                f"firmware {fw} is older than the policy's {policy.firmware_min}",
                ev,
                "update the NIC firmware with the vendor's tool (mlxfwmanager --online -u, "
                "bnxtnvm, ...), then reboot or reset the NIC",
                value=v,
            )
    floor = f" (policy minimum {policy.firmware_min})" if policy.firmware_min else ""
    return t.result(
        check, title, Status.PASS, f"firmware {fw}{floor}, driver {driver}", ev, value=v
    )


HW_CHECKS = (
    check_ets,
    check_global_pause,
    check_buffers,
    check_dcbx,
    check_link,
    check_fec,
    check_pcie,
    check_acs,
    check_firmware,
)
