"""Run every RoCE check on the chosen devices and collect a Report."""

from __future__ import annotations

from collections.abc import Sequence

from fabricprobe.core.errors import ProbeError, SysfsError
from fabricprobe.probes.pcie import read_nic_gpus
from fabricprobe.probes.rails import NO_RAILS, RailMap
from fabricprobe.probes.roce.checks import PORT_CHECKS, Target, check_counters, check_device_port
from fabricprobe.probes.roce.host import HostView
from fabricprobe.probes.roce.hwchecks import HW_CHECKS
from fabricprobe.probes.roce.live import Measure, check_live
from fabricprobe.probes.roce.policy import Policy
from fabricprobe.probes.roce.result import CheckResult, NicPlace, Report, Status
from fabricprobe.probes.sysfs import RdmaDevice

TITLE_PRESENT = "RDMA device present"


def _rxe_hint(view: HostView, netdev: str | None) -> str:
    nd = netdev or view.candidate_netdev() or "IF"
    return f"probe rxe up --netdev {nd}  # soft-RoCE (as root), or install the NIC's RDMA driver"


def _targets(
    view: HostView, devices: Sequence[str], netdev: str | None
) -> tuple[list[Target], list[CheckResult]]:
    """Ports to validate, and FAIL results for devices that are missing or unreadable."""
    present = view.device_names()
    problems: list[CheckResult] = []
    if not present:
        problems.append(
            CheckResult(
                "device",
                TITLE_PRESENT,
                Status.FAIL,
                f"no RDMA device on this host ({view.sysfs_root}/class/infiniband is empty "
                "or absent): nothing can use RoCE",
                evidence=(f"{view.sysfs_root}/class/infiniband: no devices",),
                fix=_rxe_hint(view, netdev),
            )
        )
        return [], problems
    names = list(devices) or present
    targets: list[Target] = []
    for name in names:
        if name not in present:
            problems.append(
                CheckResult(
                    "device",
                    TITLE_PRESENT,
                    Status.FAIL,
                    f"no RDMA device {name!r} (present: {', '.join(present)})",
                    device=name,
                    evidence=(f"{view.sysfs_root}/class/infiniband/{name}: absent",),
                    fix="rdma link show  # lists the devices; pass one with --device",
                )
            )
            continue
        try:
            dev = view.device(name)
        except SysfsError as e:
            problems.append(CheckResult("device", TITLE_PRESENT, Status.FAIL, str(e), device=name))
            continue
        for port in dev.ports:
            nd = netdev or view.netdev_of(dev, port.number)
            if netdev and not devices and view.netdev_of(dev, port.number) not in (netdev, None):
                continue  # --netdev alone selects the ports on that netdev
            targets.append(Target(dev, port, nd))
    if netdev and not devices and not targets and not problems:
        problems.append(
            CheckResult(
                "device",
                TITLE_PRESENT,
                Status.FAIL,
                f"no RDMA device on netdev {netdev} (devices: {', '.join(present)})",
                netdev=netdev,
                fix=_rxe_hint(view, netdev),
            )
        )
    return targets, problems


def validate(
    view: HostView,
    policy: Policy,
    *,
    devices: Sequence[str] = (),
    netdev: str | None = None,
    window: float = 2.0,
    peer: str | None = None,
    measure: Measure | None = None,
    measure_unavailable: str = "",
    rails: RailMap = NO_RAILS,
) -> Report:
    """Validate DEVICES (all when empty) against POLICY, NIC by NIC, and say where each
    NIC sits (its rail by RAILS, its GPU by PCIe distance); never raises for host
    problems."""
    targets, results = _targets(view, devices, netdev)
    for t in targets:
        first = check_device_port(view, t, policy)
        results.append(first)
        if first.status is Status.SKIP:  # not a RoCE port
            continue
        results.extend(check(view, t, policy) for check in (*PORT_CHECKS, *HW_CHECKS))
        results.extend(check_counters(view, t, policy, window))
    if peer is not None:
        results.append(check_live(peer, measure, policy, measure_unavailable))
    nics = {t.device.name: t.device for t in targets}
    return Report.of(results, policy.to_dict(), places(view, list(nics.values()), rails))


def places(view: HostView, devices: list[RdmaDevice], rails: RailMap) -> list[NicPlace]:
    """Each of DEVICES with a rail or a GPU, by name; a PCI tree that cannot be read
    places no GPU (the checks say what is wrong with the host, not this)."""
    try:
        gpus = read_nic_gpus(view.sysfs_root, [d.name for d in devices])
    except (ProbeError, OSError):
        gpus = {}
    on = rails.rails(devices, gpus)
    out = []
    for d in sorted(devices, key=lambda d: d.name):
        g = gpus.get(d.name)
        if g is None and d.name not in on:
            continue
        out.append(
            NicPlace(
                d.name,
                on.get(d.name),
                g.gpu.name if g else None,
                g.gpu.function.address if g else None,
                g.link.name if g else None,
            )
        )
    return out
