"""Soft-RoCE (rdma_rxe) control: load the module, add or remove an rxe link, report state.

Every precondition is checked before anything is changed, so a user sees one clear
reason (not root, module not available, no such interface, already exists) instead of
a half-done setup. Commands run through an injectable runner so tests need no root.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fabricprobe.core.errors import ProbeError
from fabricprobe.probes.sysfs import RdmaDevice, find_gid, read_device, read_devices, read_optional

Runner = Callable[[Sequence[str]], subprocess.CompletedProcess[str]]
MODULE = "rdma_rxe"


class RxeError(ProbeError):
    """A soft-RoCE operation cannot be done; the message says why and what to do."""


def run_command(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Run a short system command with a deadline; output captured as text."""
    return subprocess.run(
        list(argv), capture_output=True, text=True, errors="replace", timeout=30, check=False
    )


@dataclass(frozen=True)
class Host:
    """Where to look: roots for sysfs, /lib/modules and /etc/os-release, and who we are."""

    sysfs_root: Path = Path("/sys")
    modules_root: Path = Path("/lib/modules")
    os_release: Path = Path("/etc/os-release")
    kernel: str = field(default_factory=platform.release)
    euid: int = field(default_factory=os.geteuid)


def is_soft_roce(device: RdmaDevice) -> bool:
    """rxe devices are virtual and name their netdev in `parent`; hardware has device/driver."""
    return device.driver == "rdma_rxe" or (
        device.parent_netdev is not None and device.driver is None
    )


def rxe_devices(sysfs_root: Path) -> list[RdmaDevice]:
    return [d for d in read_devices(sysfs_root) if is_soft_roce(d)]


def module_available(host: Host) -> bool:
    """True when rdma_rxe is loaded, built in, or has a .ko under /lib/modules/KERNEL."""
    if (host.sysfs_root / "module" / MODULE).is_dir():
        return True
    kdir = host.modules_root / host.kernel
    builtin = read_optional(kdir / "modules.builtin")
    if builtin and any(line.endswith(f"/{MODULE}.ko") for line in builtin.splitlines()):
        return True
    return kdir.is_dir() and any(kdir.rglob(f"{MODULE}.ko*"))


def module_hint(host: Host) -> str:
    """Which package brings rdma_rxe on this distribution."""
    text = read_optional(host.os_release) or ""
    fields = dict(
        line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#")
    )
    ids = " ".join(fields.get(k, "").strip('"').lower() for k in ("ID", "ID_LIKE"))
    if "ubuntu" in ids:
        return f"apt-get install linux-modules-extra-{host.kernel}"
    if "debian" in ids:
        return (
            "apt-get install linux-image-amd64 (Debian's generic kernel; "
            "cloud kernels lack it) and reboot into it"
        )
    if any(x in ids for x in ("rhel", "fedora", "centos")):
        return "dnf install kernel-modules-extra"
    return "install your distribution's kernel modules package that ships rdma_rxe.ko"


def check_up(host: Host, netdev: str) -> None:
    """Raise RxeError with the first reason `rxe up --netdev NETDEV` cannot work."""
    if host.euid != 0:
        raise RxeError("soft-RoCE setup needs root (modprobe and `rdma link add`): run with sudo")
    if not module_available(host):
        raise RxeError(
            f"kernel {host.kernel} has no {MODULE} module: {module_hint(host)}; "
            "or run the soft-RoCE VM lane (make lane)"
        )
    if not (host.sysfs_root / "class" / "net" / netdev).exists():
        raise RxeError(f"no network interface {netdev!r} (see `ip link show`)")
    for dev in rxe_devices(host.sysfs_root):
        if dev.parent_netdev == netdev:
            raise RxeError(
                f"{dev.name} already exists on {netdev}; "
                f"remove it with `probe rxe down --device {dev.name}`"
            )
    if shutil.which("rdma") is None:
        raise RxeError(
            "the `rdma` tool is missing: apt-get install iproute2 (or dnf install iproute)"
        )


def free_name(sysfs_root: Path) -> str:
    taken = {p.name for p in (sysfs_root / "class" / "infiniband").glob("*")}
    return next(f"rxe{i}" for i in range(len(taken) + 1) if f"rxe{i}" not in taken)


def _checked(runner: Runner, argv: Sequence[str]) -> None:
    res = runner(argv)
    if res.returncode != 0:
        reason = (res.stderr or res.stdout).strip().splitlines()
        raise RxeError(
            f"`{' '.join(argv)}` failed: {reason[-1] if reason else f'exit {res.returncode}'}"
        )


def up(
    host: Host,
    netdev: str,
    name: str | None = None,
    runner: Runner = run_command,
    gid_wait_s: float = 5.0,
) -> RdmaDevice:
    """Load rdma_rxe and add an rxe device on NETDEV; wait until it has a RoCE v2 GID."""
    check_up(host, netdev)
    if name is not None and (host.sysfs_root / "class" / "infiniband" / name).exists():
        raise RxeError(f"an RDMA device named {name!r} already exists")
    name = name or free_name(host.sysfs_root)
    _checked(runner, ["modprobe", MODULE])
    _checked(runner, ["rdma", "link", "add", name, "type", "rxe", "netdev", netdev])
    deadline = time.monotonic() + gid_wait_s
    while True:  # GIDs are filled in asynchronously after the link is added
        dev = read_device(host.sysfs_root, name)
        if find_gid(dev) is not None or time.monotonic() >= deadline:
            return dev
        time.sleep(0.05)


def down(host: Host, device: str | None = None, runner: Runner = run_command) -> list[str]:
    """Remove DEVICE (or every rxe device); returns the names removed."""
    if host.euid != 0:
        raise RxeError("removing a soft-RoCE device needs root: run with sudo")
    devices = rxe_devices(host.sysfs_root)
    if device is not None:
        if not any(d.name == device for d in devices):
            known = ", ".join(d.name for d in devices) or "none"
            raise RxeError(f"no soft-RoCE device {device!r} (soft-RoCE devices here: {known})")
        devices = [d for d in devices if d.name == device]
    for d in devices:
        _checked(runner, ["rdma", "link", "delete", d.name])
    return [d.name for d in devices]
