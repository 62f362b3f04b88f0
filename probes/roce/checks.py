"""The RoCEv2 configuration checks, one function each.

Every check takes the HostView, the device port it is about (a Target) and the Policy,
and returns one CheckResult: PASS / WARN / FAIL / SKIP, the evidence it read, and the
command that fixes what it found. Checks never raise for a missing input: they SKIP and
say why (and whether root would have helped).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from fabricprobe.core.errors import ParseError
from fabricprobe.probes.counters import counter_delta, counter_width
from fabricprobe.probes.ethtool import EcnConfig
from fabricprobe.probes.roce.host import CounterSample, HostView, ToolRun, is_soft
from fabricprobe.probes.roce.policy import IB_MTUS, Policy
from fabricprobe.probes.roce.result import CheckResult, Status
from fabricprobe.probes.roce.tools import (
    parse_dcb_app,
    parse_dcb_apptrust,
    parse_dcb_pfc,
    parse_ibv_devinfo,
    parse_lldptool_pfc,
    parse_mlnx_qos,
)
from fabricprobe.probes.sysfs import Port, RdmaDevice, find_gid

# IB MTU overhead the kernel subtracts from the netdev MTU for RoCE (iboe_get_mtu):
# GRH 40 + UDP 8 + BTH 12 + XRC 4 + AtomicETH 28 + ICRC 4.
IBOE_OVERHEAD = 96
T = TypeVar("T")


@dataclass(frozen=True)
class Target:
    """One RoCE port to validate and the netdev beneath it."""

    device: RdmaDevice
    port: Port
    netdev: str | None

    @property
    def soft(self) -> bool:
        return is_soft(self.device)

    def result(
        self,
        check: str,
        title: str,
        status: Status,
        message: str,
        evidence: list[str] | tuple[str, ...] = (),
        fix: str | None = None,
        needs_root: bool = False,
        value: str | None = None,
    ) -> CheckResult:
        return CheckResult(
            check=check,
            title=title,
            status=status,
            message=message,
            device=self.device.name,
            port=self.port.number,
            netdev=self.netdev,
            evidence=tuple(evidence),
            fix=fix,
            needs_root=needs_root,
            value=value,
        )


def iboe_mtu(netdev_mtu: int) -> int:
    """The IB MTU a RoCE port gets from its netdev MTU (largest that fits)."""
    room = netdev_mtu - IBOE_OVERHEAD
    fitting = [m for m in IB_MTUS if m <= room]
    return fitting[-1] if fitting else IB_MTUS[0]


def _soft_skip(t: Target, check: str, title: str, what: str) -> CheckResult:
    return t.result(
        check,
        title,
        Status.SKIP,
        f"{t.device.name} is software RDMA ({t.device.driver or 'rxe'}) over lossy Ethernet: "
        f"no {what} to configure",
    )


# --------------------------------------------------------------------------- device / port

TITLE_DEVICE = "port state and link layer"


def check_device_port(view: HostView, t: Target, policy: Policy) -> CheckResult:
    """The port is ACTIVE and LinkUp, its link layer Ethernet, and it has a netdev."""
    p, name = t.port, t.device.name
    pdir = f"{view.sysfs_root}/class/infiniband/{name}/ports/{p.number}"
    ev = [
        f"{pdir}/state: {p.state}",
        f"{pdir}/phys_state: {p.phys_state}",
        f"{pdir}/link_layer: {p.link_layer}",
        f"{pdir}/rate: {p.rate}",
        f"driver: {t.device.driver}",
        f"netdev: {t.netdev}",
    ]
    if p.link_layer != "Ethernet":
        return t.result(
            "device",
            TITLE_DEVICE,
            Status.SKIP,
            f"link layer is {p.link_layer}: not a RoCE port, RoCE checks do not apply",
            ev,
            fix="on a VPI card, set the port to Ethernet: "
            f"mlxconfig -d {name} set LINK_TYPE_P{p.number}=2 (then reboot)",
        )
    if p.state != "ACTIVE" or (p.phys_state is not None and p.phys_state != "LinkUp"):
        fix = f"ip link set dev {t.netdev} up" if t.netdev else None
        if p.phys_state not in (None, "LinkUp"):
            fix = (fix + "; " if fix else "") + "check the cable, transceiver and switch port"
        return t.result(
            "device",
            TITLE_DEVICE,
            Status.FAIL,
            f"port {p.number} is {p.state} / {p.phys_state}, not ACTIVE / LinkUp",
            ev,
            fix=fix,
            value=f"{p.state}/{p.phys_state}",
        )
    if t.netdev is None:
        return t.result(
            "device",
            TITLE_DEVICE,
            Status.WARN,
            "ACTIVE, but no netdev found for this port (no GID names one): pass --netdev",
            ev,
            fix=f"probe validate --device {name} --netdev IF",
        )
    if not view.netdev_exists(t.netdev):
        return t.result(
            "device",
            TITLE_DEVICE,
            Status.FAIL,
            f"netdev {t.netdev} does not exist",
            ev,
            fix="ip -br link  # pick the netdev under this RDMA device and pass --netdev",
        )
    return t.result(
        "device",
        TITLE_DEVICE,
        Status.PASS,
        f"ACTIVE / LinkUp, Ethernet, {p.rate}",
        ev,
        value=p.rate,
    )


# --------------------------------------------------------------------------- GIDs

TITLE_GID = "RoCE v2 GID for the netdev's address"


def check_gid(view: HostView, t: Target, policy: Policy) -> CheckResult:
    """A RoCE v2 GID exists for each IPv4 address, and says which index tools should use."""
    ev = [f"gid {g.index}: {g.gid} {g.type} {g.netdev}" for g in t.port.gids]
    v2 = [g for g in t.port.gids if g.is_roce_v2 and (t.netdev is None or g.netdev == t.netdev)]
    fix_v2 = (
        "RoCE v2 GIDs appear by themselves on a RoCE v2 capable driver once the netdev has an "
        "IP address; check `ip addr show dev IF`, and for mlx4 set `options mlx4_core roce_mode=2`"
    )
    if not v2:
        return t.result(
            "gid", TITLE_GID, Status.FAIL, "no RoCE v2 GID: only IB/RoCE v1 entries", ev, fix_v2
        )
    addrs, run = (None, None) if t.netdev is None else view.addresses(t.netdev)
    if run is not None:
        ev.append(run.describe())
    if addrs is not None:
        ipv4 = list(addrs.ipv4)
        ev.append(f"{t.netdev} IPv4: {', '.join(ipv4) or 'none'}")
    else:
        ipv4 = sorted({g.ipv4 for g in v2 if g.ipv4})
        ev.append("netdev addresses unknown (ip failed): using the IPv4 GIDs")
    if not ipv4:
        if any(not g.gid.startswith("fe80") for g in v2):
            return t.result("gid", TITLE_GID, Status.PASS, "RoCE v2 GIDs for IPv6 only", ev)
        return t.result(
            "gid",
            TITLE_GID,
            Status.FAIL,
            f"{t.netdev} has no IP address: RoCE v2 needs one (rdma_cm and NCCL pick GIDs by IP)",
            ev,
            fix=f"ip addr add ADDR/PREFIX dev {t.netdev}",
        )
    chosen = {a: find_gid(t.device, t.port.number, ipv4=a) for a in ipv4}
    missing = [a for a, g in chosen.items() if g is None]
    found = {a: g for a, g in chosen.items() if g is not None}
    g0 = next((g for g in t.port.gids if g.index == 0), None)
    if g0 is not None and not g0.is_roce_v2:
        ev.append(
            "GID 0 is RoCE v1: tools that default to index 0 (perftest without -x) run RoCE v1"
        )
    if not found:
        return t.result(
            "gid",
            TITLE_GID,
            Status.FAIL,
            f"no RoCE v2 GID maps {', '.join(missing)}: only IB/RoCE v1 entries for it",
            ev,
            fix_v2,
        )
    use = ", ".join(f"{a} -> index {g.index}" for a, g in found.items())
    first = next(iter(found.values()))
    hint = f"use -x {first.index} with perftest, NCCL_IB_GID_INDEX={first.index}"
    if missing:
        return t.result(
            "gid",
            TITLE_GID,
            Status.WARN,
            f"RoCE v2 GID for {use}, none for {', '.join(missing)}",
            ev,
            fix_v2,
            value=f"index {first.index}",
        )
    return t.result(
        "gid",
        TITLE_GID,
        Status.PASS,
        f"RoCE v2 GID {use} ({hint})",
        ev,
        value=f"index {first.index}",
    )


# --------------------------------------------------------------------------- MTU

TITLE_MTU = "active_mtu against the netdev MTU"


def check_mtu(view: HostView, t: Target, policy: Policy) -> CheckResult:
    """active_mtu (ibv_devinfo) against the netdev MTU and the policy MTU."""
    ev: list[str] = []
    mtu = view.netdev_mtu(t.netdev) if t.netdev else None
    ev.append(f"{view.sysfs_root}/class/net/{t.netdev}/mtu: {mtu}")
    run = view.run("ibv_devinfo", "-d", t.device.name)
    active = max_mtu = None
    note = None
    if run.ok:
        try:
            ibv = parse_ibv_devinfo(run.stdout).get(t.port.number)
        except ParseError as e:
            ibv, note = None, f"active_mtu not checked: {e}"
        if ibv is not None:
            active, max_mtu = ibv.active_mtu, ibv.max_mtu
            ev.append(f"ibv_devinfo port {t.port.number}: active_mtu {active}, max_mtu {max_mtu}")
    else:
        ev.append(run.describe())
        note = "active_mtu not checked: " + (
            "ibv_devinfo is not installed (apt install ibverbs-utils)"
            if run.status == "missing"
            else run.describe()
        )
    if note:
        ev.append(note)
    v = f"{mtu}/{active}"  # netdev MTU / active IB MTU
    if mtu is None and active is None:
        return t.result(
            "mtu", TITLE_MTU, Status.SKIP, "neither the netdev MTU nor active_mtu could be read", ev
        )
    if t.soft:
        expect = iboe_mtu(mtu) if mtu else None
        if active is not None and expect is not None and active != expect:
            return t.result(
                "mtu",
                TITLE_MTU,
                Status.WARN,
                f"active_mtu {active}, expected {expect} from netdev MTU {mtu}",
                ev,
                fix=f"rdma link delete {t.device.name}; probe rxe up --netdev {t.netdev}",
                value=v,
            )
        return t.result(
            "mtu",
            TITLE_MTU,
            Status.PASS,
            f"soft-RoCE follows the netdev: MTU {mtu} gives IB MTU {active or expect}"
            f" (policy MTU {policy.mtu} applies to RoCE NICs)",
            ev,
            value=v,
        )
    need = policy.min_netdev_mtu
    fix_mtu = f"ip link set dev {t.netdev} mtu 9000  # and the same jumbo MTU on the switch ports"
    if mtu is not None and mtu < need:
        gets = active if active is not None else iboe_mtu(mtu)
        return t.result(
            "mtu",
            TITLE_MTU,
            Status.FAIL,
            f"netdev MTU {mtu} is below {need}: RoCE runs at IB MTU {gets}, not {policy.mtu}",
            ev,
            fix=fix_mtu,
            value=v,
        )
    if active is not None and active < policy.mtu:
        why = f"the port's max_mtu is {max_mtu}" if max_mtu and max_mtu < policy.mtu else "unknown"
        return t.result(
            "mtu",
            TITLE_MTU,
            Status.WARN,
            f"active_mtu {active} is below the policy's {policy.mtu} though netdev MTU {mtu}"
            f" allows it ({why})",
            ev,
            fix=f"ip link set dev {t.netdev} down && ip link set dev {t.netdev} up",
            value=v,
        )
    msg = f"netdev MTU {mtu} carries IB MTU {policy.mtu}"
    if active is not None:
        msg = f"active_mtu {active}, netdev MTU {mtu}"
    return t.result("mtu", TITLE_MTU, Status.PASS, msg + (f"; {note}" if note else ""), ev, value=v)


# --------------------------------------------------------------------------- PFC

TITLE_PFC = "PFC on the RoCE priority only"


def _pfc_fix(netdev: str, prio: int) -> str:
    flags = ",".join("1" if i == prio else "0" for i in range(8))
    return (
        f"dcb pfc set dev {netdev} prio-pfc all:off {prio}:on"
        f"  # or: mlnx_qos -i {netdev} --pfc {flags}"
    )


def _unavailable(runs: list[ToolRun]) -> tuple[str, bool]:
    needs_root = any(r.status == "denied" for r in runs)
    return "; ".join(r.describe() for r in runs), needs_root


def parsed_output(
    view: HostView,
    argv: tuple[str, ...],
    parse: Callable[[str], T],
    runs: list[ToolRun],
    ev: list[str],
) -> T | None:
    """What PARSE makes of the output of tool ARGV; None when the tool did not run or its
    output did not parse. The run is added to RUNS, a parse error to EV."""
    run = view.run(*argv)
    runs.append(run)
    if not run.ok:
        return None
    try:
        return parse(run.stdout)
    except ParseError as e:
        ev.append(f"{run.command}: {e}")
        return None


def first_answer(
    view: HostView, sources: Sequence[tuple[tuple[str, ...], Callable[[str], T | None]]]
) -> tuple[T | None, list[str], list[ToolRun]]:
    """The first of SOURCES (a tool's argv and its parser) whose output parses into an
    answer (not None): (the answer, evidence, every run tried, the last one its own)."""
    ev: list[str] = []
    runs: list[ToolRun] = []
    for argv, parse in sources:
        value = parsed_output(view, argv, parse, runs, ev)
        if value is not None:
            return value, ev, runs
    return None, ev, runs


DCB_FIX = "apt install iproute2  # provides dcb; or run as root for mlnx_qos"


def _dcb_unreadable(
    t: Target, check: str, title: str, what: str, nobody: str, ev: list[str], runs: list[ToolRun]
) -> CheckResult:
    """SKIP: the DCB tools tried (RUNS) gave no answer; root would help, or NOBODY says why."""
    why, root = _unavailable(runs)
    return t.result(
        check,
        title,
        Status.SKIP,
        f"{what} not readable: " + ("needs root" if root else nobody),
        [*ev, why],
        fix=DCB_FIX,
        needs_root=root,
    )


def check_pfc(view: HostView, t: Target, policy: Policy) -> CheckResult:
    """PFC enabled on the RoCE priority and no other (dcb, mlnx_qos or lldptool)."""
    if t.soft:
        return _soft_skip(t, "pfc", TITLE_PFC, "PFC")
    if t.netdev is None:
        return t.result("pfc", TITLE_PFC, Status.SKIP, "no netdev to ask about PFC")
    nd, prio = t.netdev, policy.priority
    sources: list[tuple[tuple[str, ...], Callable[[str], frozenset[int] | None]]] = [
        (("dcb", "pfc", "show", "dev", nd), lambda s: parse_dcb_pfc(s).enabled),
        (("mlnx_qos", "-i", nd), lambda s: parse_mlnx_qos(s).pfc_enabled),
        (("lldptool", "-t", "-i", nd, "-V", "PFC"), lambda s: parse_lldptool_pfc(s).enabled),
    ]
    enabled, ev, tried = first_answer(view, sources)
    if enabled is None:
        nobody = "no DCB tool answered"
        return _dcb_unreadable(t, "pfc", TITLE_PFC, "PFC configuration", nobody, ev, tried)
    ev.append(f"{tried[-1].command}: PFC on {sorted(enabled) or 'no priority'}")
    v = ",".join(map(str, sorted(enabled))) or "none"  # the priorities with PFC on
    if prio not in enabled:
        on = f"on {', '.join(map(str, sorted(enabled)))}" if enabled else "on no priority"
        return t.result(
            "pfc",
            TITLE_PFC,
            Status.FAIL,
            f"PFC is off on RoCE priority {prio} ({on}): RoCE traffic is lossy",
            ev,
            _pfc_fix(nd, prio),
            value=v,
        )
    extra = sorted(enabled - {prio})
    if extra:
        return t.result(
            "pfc",
            TITLE_PFC,
            Status.WARN,
            f"PFC on priority {prio}, and also on {', '.join(map(str, extra))}: extra lossless "
            "classes spread pause storms",
            ev,
            _pfc_fix(nd, prio),
            value=v,
        )
    return t.result("pfc", TITLE_PFC, Status.PASS, f"PFC on priority {prio} only", ev, value=v)


# --------------------------------------------------------------------------- trust / DSCP

TITLE_TRUST = "trust DSCP, RoCE DSCP -> PFC priority"


def _read_dscp_map(
    view: HostView, nd: str
) -> tuple[str | None, dict[int, int] | None, list[str], list[ToolRun]]:
    """(trust, dscp->prio, evidence, tool runs) from mlnx_qos, else from dcb."""
    ev: list[str] = []
    runs: list[ToolRun] = []
    q = parsed_output(view, ("mlnx_qos", "-i", nd), parse_mlnx_qos, runs, ev)
    if q is not None:
        ev.append(f"{runs[-1].command}: trust {q.trust}")
        if q.trust is not None:
            return q.trust, dict(q.dscp_prio), ev, runs
    table = parsed_output(view, ("dcb", "app", "show", "dev", nd), parse_dcb_app, runs, ev)
    if table is None:
        return None, None, ev, runs
    app = runs[-1]
    dscp_prio: dict[int, int] = {}
    for dscp, prios in table.items():
        dscp_prio[dscp] = prios[0]
        if len(set(prios)) > 1:
            ev.append(f"{app.command}: DSCP {dscp} listed for priorities {list(prios)}")
    shown = " ".join(f"{d}:{p}" for d, p in sorted(dscp_prio.items()))
    ev.append(f"{app.command}: dscp-prio {shown or 'none'}")
    trust: str | None
    order = parsed_output(
        view, ("dcb", "apptrust", "show", "dev", nd), parse_dcb_apptrust, runs, ev
    )
    if order is not None:
        trust = "dscp" if "dscp" in order else "pcp"
        ev.append(f"{runs[-1].command}: order {' '.join(order)}")
        return trust, dscp_prio, ev, runs
    # mlx5 and bnxt_en classify by DSCP as soon as the APP table holds a DSCP entry.
    trust = "dscp" if dscp_prio else "pcp"
    ev.append(f"trust inferred from the APP table: {trust}")
    return trust, dscp_prio, ev, runs


def check_trust(view: HostView, t: Target, policy: Policy) -> CheckResult:
    """Trust mode DSCP, and DSCP -> priority sends RoCE to the PFC priority (and CNPs to theirs)."""
    if t.soft:
        return _soft_skip(t, "trust", TITLE_TRUST, "DSCP trust")
    if t.netdev is None:
        return t.result("trust", TITLE_TRUST, Status.SKIP, "no netdev to ask about trust mode")
    nd = t.netdev
    trust, dscp_prio, ev, runs = _read_dscp_map(view, nd)
    if trust is None or dscp_prio is None:
        nobody = "no tool answered"
        return _dcb_unreadable(t, "trust", TITLE_TRUST, "trust mode", nobody, ev, runs)
    # trust mode, then where the RoCE and CNP DSCPs go: "dscp 26:3 48:6"
    v = " ".join([trust, *(f"{d}:{dscp_prio.get(d, 0)}" for d in (policy.dscp, policy.cnp_dscp))])

    def result(status: Status, message: str, fix: str | None = None) -> CheckResult:
        return t.result("trust", TITLE_TRUST, status, message, ev, fix=fix, value=v)

    if trust != "dscp":
        return result(
            Status.FAIL,
            f"port trusts {trust.upper()}: untagged RoCE traffic lands on priority 0, outside PFC",
            f"mlnx_qos -i {nd} --trust dscp  # or: dcb apptrust set dev {nd} order dscp",
        )
    got = dscp_prio.get(policy.dscp, 0)
    if got != policy.priority:
        return result(
            Status.FAIL,
            f"DSCP {policy.dscp} maps to priority {got}, not the PFC priority {policy.priority}",
            f"dcb app replace dev {nd} dscp-prio {policy.dscp}:{policy.priority}"
            f"  # or: mlnx_qos -i {nd} --dscp2prio set,{policy.dscp},{policy.priority}",
        )
    cnp = dscp_prio.get(policy.cnp_dscp, 0)
    if cnp != policy.cnp_priority:
        return result(
            Status.WARN,
            f"trust DSCP, DSCP {policy.dscp} -> priority {policy.priority}; but CNP DSCP "
            f"{policy.cnp_dscp} maps to priority {cnp}, not {policy.cnp_priority}",
            f"dcb app replace dev {nd} dscp-prio {policy.cnp_dscp}:{policy.cnp_priority}",
        )
    return result(
        Status.PASS,
        f"trust DSCP; DSCP {policy.dscp} -> priority {policy.priority}, "
        f"CNP DSCP {policy.cnp_dscp} -> priority {policy.cnp_priority}",
    )


# --------------------------------------------------------------------------- ECN

TITLE_ECN_RP = "ECN reaction point (DCQCN rate limiter)"
TITLE_ECN_NP = "ECN notification point (CNP generation)"
TITLE_CNP = "CNP DSCP and priority"


def _ecn_config(
    view: HostView, t: Target, check: str, title: str
) -> tuple[EcnConfig | None, str, CheckResult | None]:
    """The port's ECN sysfs settings, or the SKIP result that says why there are none."""
    if t.soft:
        return None, "", _soft_skip(t, check, title, "ECN / DCQCN")
    if t.netdev is None:
        return None, "", t.result(check, title, Status.SKIP, "no netdev to read ECN settings from")
    base = f"{view.sysfs_root}/class/net/{t.netdev}/ecn"
    cfg = view.ecn(t.netdev)
    if cfg is None:
        return (
            None,
            base,
            t.result(
                check,
                title,
                Status.SKIP,
                f"{t.device.driver or 'this driver'} does not expose ECN enablement in sysfs "
                f"({base} is mlx5-only): check it with the vendor's tool",
                [f"{base}: absent"],
            ),
        )
    return cfg, base, None


def _ecn_point(
    view: HostView, t: Target, policy: Policy, point: str, check: str, title: str
) -> CheckResult:
    cfg, base, skip = _ecn_config(view, t, check, title)
    if skip is not None:
        return skip
    assert cfg is not None
    prio = policy.priority
    on = (cfg.rp_enabled if point == "roce_rp" else cfg.np_enabled).get(prio)
    ev = [f"{base}/{point}/enable/{prio}: {_flag(on)}"]
    what = "reaction point" if point == "roce_rp" else "notification point"
    v = _flag(on)
    if on is None:
        return t.result(check, title, Status.SKIP, f"no {point} setting for priority {prio}", ev)
    if not on:
        effect = (
            "this host ignores CNPs and never slows down: congestion turns into PFC pauses"
            if point == "roce_rp"
            else "this host sends no CNPs for marked packets: senders never slow down"
        )
        return t.result(
            check,
            title,
            Status.FAIL,
            f"ECN is off for priority {prio} at the {what} ({point}): {effect}",
            ev,
            f"echo 1 > {base}/{point}/enable/{prio}",
            value=v,
        )
    return t.result(
        check, title, Status.PASS, f"ECN on for priority {prio} at the {what}", ev, value=v
    )


def check_ecn_rp(view: HostView, t: Target, policy: Policy) -> CheckResult:
    """DCQCN reaction point on for the RoCE priority (the sender slows on CNPs)."""
    return _ecn_point(view, t, policy, "roce_rp", "ecn_rp", TITLE_ECN_RP)


def check_ecn_np(view: HostView, t: Target, policy: Policy) -> CheckResult:
    """DCQCN notification point on for the RoCE priority (the receiver answers CE with CNPs)."""
    return _ecn_point(view, t, policy, "roce_np", "ecn_np", TITLE_ECN_NP)


def check_cnp(view: HostView, t: Target, policy: Policy) -> CheckResult:
    """CNPs leave with the policy's DSCP and 802.1p priority."""
    cfg, base, skip = _ecn_config(view, t, "cnp", TITLE_CNP)
    if skip is not None:
        return skip
    assert cfg is not None
    ev = [
        f"{base}/roce_np/cnp_dscp: {cfg.cnp_dscp}",
        f"{base}/roce_np/cnp_802p_prio: {cfg.cnp_802p_prio}",
    ]
    if cfg.cnp_dscp is None and cfg.cnp_802p_prio is None:
        return t.result("cnp", TITLE_CNP, Status.SKIP, "no CNP DSCP or priority in sysfs", ev)
    v = f"dscp {cfg.cnp_dscp} prio {cfg.cnp_802p_prio}"
    wrong = []
    fixes = []
    if cfg.cnp_dscp is not None and cfg.cnp_dscp != policy.cnp_dscp:
        wrong.append(f"CNP DSCP {cfg.cnp_dscp} (policy {policy.cnp_dscp})")
        fixes.append(f"echo {policy.cnp_dscp} > {base}/roce_np/cnp_dscp")
    if cfg.cnp_802p_prio is not None and cfg.cnp_802p_prio != policy.cnp_priority:
        wrong.append(f"CNP priority {cfg.cnp_802p_prio} (policy {policy.cnp_priority})")
        fixes.append(f"echo {policy.cnp_priority} > {base}/roce_np/cnp_802p_prio")
    if wrong:
        return t.result(
            "cnp",
            TITLE_CNP,
            Status.WARN,
            f"{', '.join(wrong)}: CNPs may queue behind the data they throttle",
            ev,
            "; ".join(fixes),
            value=v,
        )
    return t.result(
        "cnp",
        TITLE_CNP,
        Status.PASS,
        f"CNPs DSCP {cfg.cnp_dscp}, priority {cfg.cnp_802p_prio}",
        ev,
        value=v,
    )


def _flag(v: bool | None) -> str:
    return "absent" if v is None else ("1" if v else "0")


# --------------------------------------------------------------------------- rdma_cm

TITLE_RDMA_CM = "rdma_cm default RoCE mode and ToS"


def check_rdma_cm(view: HostView, t: Target, policy: Policy) -> CheckResult:
    """configfs rdma_cm defaults agree with the policy (RoCE v2, ToS = DSCP << 2 | ECT0)."""
    cm = view.rdma_cm(t.device.name, t.port.number)
    root_dir = view.configfs_root
    dev_dir = f"{root_dir}/rdma_cm/{t.device.name}"
    if cm.state in ("unmounted", "no_rdma_cm"):
        fix = (
            f"mount -t configfs none {root_dir}; modprobe rdma_cm"
            if cm.state == "unmounted"
            else "modprobe rdma_cm"
        )
        what = "configfs is not mounted" if cm.state == "unmounted" else "rdma_cm is not loaded"
        return t.result(
            "rdma_cm",
            TITLE_RDMA_CM,
            Status.SKIP,
            f"{what} ({root_dir}/rdma_cm absent): rdma_cm defaults cannot be read"
            + ("" if view.is_root else "; setting that up needs root"),
            [f"{root_dir}/rdma_cm: absent"],
            fix=fix + f"; mkdir {dev_dir}",
            needs_root=not view.is_root,
        )
    ev = [f"{cm.path}/default_roce_mode: {cm.roce_mode}", f"{cm.path}/default_roce_tos: {cm.tos}"]
    v = f"{cm.roce_mode} tos {cm.tos}"
    mkdir = ""
    if cm.state == "no_device_dir":
        ev.insert(0, f"{dev_dir}: absent, kernel defaults apply")
        mkdir = f"mkdir {dev_dir}; "
    if cm.roce_mode != policy.roce_mode:
        return t.result(
            "rdma_cm",
            TITLE_RDMA_CM,
            Status.FAIL,
            f"rdma_cm connects with {cm.roce_mode} by default, not {policy.roce_mode}",
            ev,
            fix=f"{mkdir}echo '{policy.roce_mode}' > {cm.path}/default_roce_mode",
            value=v,
        )
    if t.soft:
        return t.result(
            "rdma_cm",
            TITLE_RDMA_CM,
            Status.PASS,
            f"{cm.roce_mode} (ToS not checked: soft-RoCE has no lossless class)",
            ev,
            value=v,
        )
    if cm.tos is None or cm.tos >> 2 != policy.dscp:
        dscp = "unknown" if cm.tos is None else cm.tos >> 2
        # A connection that sets no ToS of its own leaves with this DSCP. When that DSCP
        # maps to another priority than the lossless one, its RoCE traffic runs lossy:
        # under a lossless policy that is a FAIL. An unreadable ToS stays a WARN.
        status = Status.FAIL if cm.tos is not None and policy.lossless else Status.WARN
        return t.result(
            "rdma_cm",
            TITLE_RDMA_CM,
            status,
            f"default ToS {cm.tos} (DSCP {dscp}): rdma_cm connections that set no ToS "
            f"miss DSCP {policy.dscp} and land outside lossless priority {policy.priority}",
            ev,
            fix=f"{mkdir}echo {policy.tos} > {cm.path}/default_roce_tos",
            value=v,
        )
    return t.result(
        "rdma_cm",
        TITLE_RDMA_CM,
        Status.PASS,
        f"{cm.roce_mode}, ToS {cm.tos} (DSCP {policy.dscp})",
        ev,
        value=v,
    )


# --------------------------------------------------------------------------- counters

_STORM_ERR = ("tx_pause_storm_error_events",)
_STORM_WARN = ("tx_pause_storm_warning_events", "continuous_roce_pause_events")
_DISCARDS_ETH = ("rx_discards_phy", "rx_dropped.nic")
_DISCARDS_HW = ("rx_roce_discards",)
_OOB_HW = ("out_of_buffer", "rx_out_of_buffer")
_TIMEOUTS_HW = (
    "local_ack_timeout_err",
    "req_transport_retries_exceeded",
    "to_retransmits",
    "max_retry_exceeded",
    "retry_exceeded_err",
    "completer_retry_err",
)
_RETRANS_HW = (
    "roce_adp_retrans",
    "packet_seq_err",
    "implied_nak_seq_err",
    "out_of_sequence",
    "seq_err_naks_rcvd",
    "rcvd_seq_err",
    "out_of_seq_request",
    "duplicate_request",
)
_PAUSE_DURATION = (
    "rx_prio{p}_pause_duration",
    "tx_prio{p}_pause_duration",
    "pfc_pri{p}_rx_duration_us",
    "pfc_pri{p}_tx_duration_us",
)
_PAUSE_FRAMES = (
    "rx_prio{p}_pause",
    "tx_prio{p}_pause",
    "rx_pfc_ena_frames_pri{p}",
    "tx_pfc_ena_frames_pri{p}",
    "rx_priority_{p}_xoff.nic",
    "tx_priority_{p}_xoff.nic",
)


def _rates(
    s0: Mapping[str, int], s1: Mapping[str, int], dt: float, driver: str | None, resets: list[str]
) -> dict[str, tuple[int, float]]:
    out: dict[str, tuple[int, float]] = {}
    for name in s0.keys() & s1.keys():
        d = counter_delta(s0[name], s1[name], counter_width(name, driver))
        if d.reset:
            resets.append(name)
        out[name] = (d.delta, d.delta / dt)
    return out


TITLE_PAUSE = "pause storms and PFC pause time"
TITLE_DISCARDS = "discards and receive buffer exhaustion"
TITLE_RDMA_ERRORS = "RDMA transport errors (timeouts, retransmissions)"
COUNTER_CHECKS = ("pause", "discards", "rdma_errors")


def check_counters(view: HostView, t: Target, policy: Policy, window: float) -> list[CheckResult]:
    """Sample counters twice WINDOW seconds apart; judge pauses, discards and RDMA errors."""
    if window <= 0:
        return [
            t.result(c, title, Status.SKIP, "no sample window (--window 0)")
            for c, title in zip(
                COUNTER_CHECKS, (TITLE_PAUSE, TITLE_DISCARDS, TITLE_RDMA_ERRORS), strict=True
            )
        ]
    s0 = view.sample(t.device.name, t.port.number, t.netdev)
    view.sleep(window)
    s1 = view.sample(t.device.name, t.port.number, t.netdev)
    return evaluate_counters(t, policy, s0, s1, window)


def evaluate_counters(
    t: Target, policy: Policy, s0: CounterSample, s1: CounterSample, window: float
) -> list[CheckResult]:
    """Judge two counter samples (pure): one result each for pause, discards, rdma_errors."""
    dt = s1.t - s0.t if s1.t > s0.t else window
    th = policy.thresholds
    ev: list[str] = [f"window {dt:.2f} s"]
    if s1.note:
        ev.append(f"ethtool: {s1.note}")
    titles = (TITLE_PAUSE, TITLE_DISCARDS, TITLE_RDMA_ERRORS)
    if not s0.hw and s0.ethtool is None:
        return [
            t.result(
                c, title, Status.SKIP, "no counters to sample (no hw_counters, no ethtool)", ev
            )
            for c, title in zip(COUNTER_CHECKS, titles, strict=True)
        ]
    resets: list[str] = []
    hw = _rates(s0.hw, s1.hw, dt, t.device.driver, resets)
    eth = _rates(s0.ethtool or {}, s1.ethtool or {}, dt, None, resets)
    if resets:
        ev.append(
            "counters reset during the window (rates count from 0): " + ", ".join(sorted(resets))
        )

    def rising(
        table: dict[str, tuple[int, float]], names: tuple[str, ...], limit: float
    ) -> list[str]:
        return [
            f"{n} +{table[n][0]} ({table[n][1]:.1f}/s)"
            for n in names
            if n in table and table[n][0] > 0 and table[n][1] > limit
        ]

    def moving(table: dict[str, tuple[int, float]], words: tuple[str, ...]) -> list[str]:
        out = sorted(
            f"{n} {r:.1f}/s" for n, (d, r) in table.items() if d > 0 and any(w in n for w in words)
        )
        return ["rising: " + ", ".join(out[:12]) + (" ..." if len(out) > 12 else "")] if out else []

    pause: list[tuple[Status, str]] = []
    storm = rising(eth, _STORM_ERR, 0.0)
    if storm:
        pause.append(
            (Status.FAIL, "pause storm: PFC watchdog cut pause sending: " + ", ".join(storm))
        )
    storm_w = rising(eth, _STORM_WARN, 0.0)
    if storm_w:
        pause.append((Status.WARN, "long pause episodes: " + ", ".join(storm_w)))
    for p in range(8):
        paused_us = [eth[n.format(p=p)][0] for n in _PAUSE_DURATION if n.format(p=p) in eth]
        if paused_us:
            pct = max(paused_us) / (dt * 1e6) * 100
            if pct > th.pause_duration_fail_pct:
                pause.append((Status.FAIL, f"priority {p} paused {pct:.0f}% of the window"))
            elif pct > th.pause_duration_warn_pct:
                pause.append((Status.WARN, f"priority {p} paused {pct:.1f}% of the window"))
        frames = sum(eth[n.format(p=p)][1] for n in _PAUSE_FRAMES if n.format(p=p) in eth)
        if frames > th.pause_frames_warn_per_s:
            pause.append((Status.WARN, f"priority {p}: {frames:.0f} PFC frames/s"))
    drops: list[tuple[Status, str]] = []
    discards = rising(
        eth, _DISCARDS_ETH + tuple(f"rx_prio{p}_discards" for p in range(8)), th.discards_warn_per_s
    )
    discards += rising(hw, _DISCARDS_HW, th.discards_warn_per_s)
    if discards:
        drops.append((Status.WARN, "discards: " + ", ".join(discards)))
    oob = rising(hw, _OOB_HW, th.out_of_buffer_warn_per_s)
    if oob:
        drops.append((Status.WARN, "receive queues ran dry: " + ", ".join(oob)))
    errors: list[tuple[Status, str]] = []
    timeouts = rising(hw, _TIMEOUTS_HW, th.timeouts_warn_per_s)
    if timeouts:
        errors.append((Status.WARN, "transport timeouts: " + ", ".join(timeouts)))
    retrans = rising(hw, _RETRANS_HW, th.retransmits_warn_per_s)
    if retrans:
        errors.append((Status.WARN, "retransmissions: " + ", ".join(retrans)))
    nd, dev = t.netdev, f"{t.device.name}/{t.port.number}"
    spec = [
        (
            "pause",
            TITLE_PAUSE,
            pause,
            f"no pause storm, no priority paused over {th.pause_duration_warn_pct:g}%",
            moving(eth, ("pause", "storm")),
            f"watch `ethtool -S {nd} | grep -E 'pause|storm'`; a storm or long pauses on the "
            "lossless priority point at a stuck receiver or a congested switch port without "
            "ECN (see the ecn_rp, ecn_np and pfc checks)",
        ),
        (
            "discards",
            TITLE_DISCARDS,
            drops,
            "no discards, receive queues never ran dry",
            moving(eth, ("discard", "drop")) + moving(hw, ("discard", "buffer")),
            f"watch `ethtool -S {nd} | grep -E 'discard|drop'`; discards on the lossless "
            "priority mean PFC is not honoured on this hop (see the pfc, trust and buffers "
            "checks); out_of_buffer means the receiver posts too few receive WQEs",
        ),
        (
            "rdma_errors",
            TITLE_RDMA_ERRORS,
            errors,
            "no transport timeouts or retransmissions",
            moving(hw, ("err", "retrans", "timeout", "seq")),
            f"rdma statistic show link {dev}  # timeouts and retransmissions follow loss: "
            "check the discards and pause results and the switch ports on the path",
        ),
    ]
    out = []
    for check, title, found, ok, rising_ev, fix in spec:
        if not found:
            out.append(
                t.result(check, title, Status.PASS, f"{ok} in {dt:.1f} s", [*ev, *rising_ev])
            )
            continue
        worst = max((st for st, _ in found), key=lambda st: st.rank)
        out.append(
            t.result(
                check,
                title,
                worst,
                "; ".join(msg for _, msg in found),
                [*ev, *rising_ev],
                fix=fix,
            )
        )
    return out


# --------------------------------------------------------------------------- registry

Check = Callable[[HostView, Target, Policy], CheckResult]

PORT_CHECKS: tuple[Check, ...] = (
    check_gid,
    check_mtu,
    check_pfc,
    check_trust,
    check_ecn_rp,
    check_ecn_np,
    check_cnp,
    check_rdma_cm,
)
