"""HostView: everything the RoCE checks read, from one place that tests can replace.

Inputs come from the sysfs root, the configfs root (`rdma_cm` defaults) and tools run
through an injectable runner (`ip`, `ibv_devinfo`, `dcb`, `mlnx_qos`, `lldptool`,
`ethtool`). `ReplayRunner` answers from captured outputs, so a host's configuration can
be examined away from it: the tests feed it real-looking captures.
"""

from __future__ import annotations

import os
import subprocess
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from fabricprobe.core.errors import ParseError
from fabricprobe.probes.counters import PortCounters, read_port_counters
from fabricprobe.probes.ethtool import (
    CommandResult,
    EcnConfig,
    Runner,
    parse_ethtool_stats,
    read_ecn_config,
    run_command,
)
from fabricprobe.probes.numbers import U32_MAX, uint_or_none
from fabricprobe.probes.roce.tools import NetdevAddrs, parse_ip_addr
from fabricprobe.probes.sysfs import RdmaDevice, list_device_names, read_device, read_optional

_DENIED = ("Operation not permitted", "Permission denied", "must be root", "root privileges")
_UNSUPPORTED = ("Operation not supported", "not supported", "No such device")

SOFT_DRIVERS = frozenset({"rdma_rxe", "siw"})


@dataclass(frozen=True)
class ToolRun:
    """How one tool invocation went."""

    argv: tuple[str, ...]
    status: str  # "ok", "missing", "denied", "unsupported", "failed", "timeout"
    stdout: str = ""
    detail: str = ""  # first line of the error, for evidence

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def command(self) -> str:
        return " ".join(self.argv)

    def describe(self) -> str:
        """`command: status (detail)` for evidence lines."""
        if self.ok:
            return f"{self.command}: ok"
        what = {
            "missing": "not installed",
            "denied": "needs root",
            "unsupported": "not supported on this device",
            "timeout": "timed out",
        }.get(self.status, "failed")
        return f"{self.command}: {what}" + (f" ({self.detail})" if self.detail else "")


def classify(argv: Sequence[str], res: CommandResult) -> ToolRun:
    """Turn a finished command into a ToolRun, recognising permission and support errors."""
    if res.returncode == 0:
        return ToolRun(tuple(argv), "ok", res.stdout)
    text = (res.stderr + "\n" + res.stdout).strip()
    first = text.splitlines()[0][:160] if text else f"exit {res.returncode}"
    if any(s in text for s in _DENIED):
        return ToolRun(tuple(argv), "denied", res.stdout, first)
    if any(s in text for s in _UNSUPPORTED):
        return ToolRun(tuple(argv), "unsupported", res.stdout, first)
    return ToolRun(tuple(argv), "failed", res.stdout, first)


@dataclass(frozen=True)
class RdmaCmDefaults:
    """rdma_cm defaults for one device port from configfs."""

    state: str  # "ok", "no_device_dir" (kernel defaults), "no_rdma_cm", "unmounted"
    path: Path  # CONFIGFS/rdma_cm/DEV/ports/N
    roce_mode: str | None  # default_roce_mode, e.g. "RoCE v2"
    tos: int | None  # default_roce_tos


# Without a configfs entry rdma_cm prefers RoCE v2 and sends ToS 0 (drivers/infiniband/core/cma.c).
KERNEL_DEFAULT_ROCE_MODE = "RoCE v2"
KERNEL_DEFAULT_TOS = 0


@dataclass(frozen=True)
class CounterSample:
    """hw_counters and ethtool counters read at one instant."""

    t: float
    hw: Mapping[str, int]
    ethtool: Mapping[str, int] | None  # None: ethtool unavailable (see note)
    note: str | None = None


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


@dataclass
class HostView:
    """Read-only view of a host's RoCE configuration, with caching of tool runs."""

    sysfs_root: Path = Path("/sys")
    configfs_root: Path | None = None  # default: SYSFS/kernel/config
    runner: Runner = run_command
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    is_root: bool = field(default_factory=_is_root)
    timeout: float = 5.0
    _runs: dict[tuple[str, ...], ToolRun] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.sysfs_root = Path(self.sysfs_root)
        if self.configfs_root is None:
            self.configfs_root = self.sysfs_root / "kernel" / "config"
        self.configfs_root = Path(self.configfs_root)

    # -- tools ---------------------------------------------------------------------------
    def run(self, *argv: str, cache: bool = True) -> ToolRun:
        """Run a tool through the runner; missing tools and timeouts become statuses."""
        key = tuple(argv)
        if cache and key in self._runs:
            return self._runs[key]
        try:
            out = classify(argv, self.runner(argv, self.timeout))
        except FileNotFoundError:
            out = ToolRun(key, "missing")
        except subprocess.TimeoutExpired:
            out = ToolRun(key, "timeout", detail=f"no answer in {self.timeout:g} s")
        except OSError as e:
            out = ToolRun(key, "failed", detail=str(e))
        if cache:
            self._runs[key] = out
        return out

    # -- sysfs ---------------------------------------------------------------------------
    def device_names(self) -> list[str]:
        return list_device_names(self.sysfs_root)

    def device(self, name: str) -> RdmaDevice:
        """Read one device (SysfsError when it does not exist or is unreadable)."""
        return read_device(self.sysfs_root, name)

    def netdev_dir(self, ifname: str) -> Path:
        return self.sysfs_root / "class" / "net" / ifname

    def netdev_exists(self, ifname: str) -> bool:
        return self.netdev_dir(ifname).is_dir()

    def netdev_mtu(self, ifname: str) -> int | None:
        """SYSFS/class/net/IF/mtu."""
        return uint_or_none(read_optional(self.netdev_dir(ifname) / "mtu"), U32_MAX)

    def candidate_netdev(self) -> str | None:
        """A netdev to suggest for soft-RoCE: the first up one that is not loopback."""
        net = self.sysfs_root / "class" / "net"
        if not net.is_dir():
            return None
        names = sorted(p.name for p in net.iterdir() if p.name != "lo")
        up = [n for n in names if read_optional(net / n / "operstate") == "up"]
        pick = up or names
        return pick[0] if pick else None

    def netdev_of(self, device: RdmaDevice, port: int) -> str | None:
        """The netdev under a RoCE port: rxe's parent, else the port's GID netdevs."""
        if device.parent_netdev:
            return device.parent_netdev
        p = device.port(port)
        names = p.netdevs() if p is not None else ()
        return names[0] if names else None

    def addresses(self, ifname: str) -> tuple[NetdevAddrs | None, ToolRun]:
        """`ip -j addr show dev IF`, parsed; None when ip failed or printed nonsense."""
        run = self.run("ip", "-j", "addr", "show", "dev", ifname)
        if not run.ok:
            return None, run
        try:
            return parse_ip_addr(run.stdout), run
        except ParseError as e:
            return None, ToolRun(run.argv, "failed", run.stdout, str(e))

    def ecn(self, ifname: str) -> EcnConfig | None:
        return read_ecn_config(self.sysfs_root, ifname)

    def rdma_cm(self, device: str, port: int) -> RdmaCmDefaults:
        """CONFIGFS/rdma_cm/DEV/ports/N/default_roce_{mode,tos}."""
        assert self.configfs_root is not None
        cm = self.configfs_root / "rdma_cm"
        pdir = cm / device / "ports" / str(port)
        if not cm.is_dir():
            mounted = self.configfs_root.is_dir() and any(self.configfs_root.iterdir())
            return RdmaCmDefaults("no_rdma_cm" if mounted else "unmounted", pdir, None, None)
        if not (cm / device).is_dir():
            return RdmaCmDefaults(
                "no_device_dir", pdir, KERNEL_DEFAULT_ROCE_MODE, KERNEL_DEFAULT_TOS
            )
        tos = read_optional(pdir / "default_roce_tos")
        return RdmaCmDefaults(
            "ok",
            pdir,
            read_optional(pdir / "default_roce_mode"),
            uint_or_none(tos, 255),  # an 8-bit ToS byte
        )

    def port_counters(self, device: str, port: int) -> PortCounters:
        return read_port_counters(self.sysfs_root, device, port)

    def sample(self, device: str, port: int, netdev: str | None) -> CounterSample:
        """Read hw_counters and `ethtool -S` once (never cached)."""
        t = self.clock()
        pc = self.port_counters(device, port)
        hw = dict(pc.hw.values) if pc.hw is not None else {}
        if netdev is None:
            return CounterSample(t, MappingProxyType(hw), None, "no netdev for ethtool")
        run = self.run("ethtool", "-S", netdev, cache=False)
        if not run.ok:
            return CounterSample(t, MappingProxyType(hw), None, run.describe())
        try:
            stats = parse_ethtool_stats(run.stdout)
        except ParseError as e:
            return CounterSample(t, MappingProxyType(hw), None, str(e))
        return CounterSample(t, MappingProxyType(hw), stats.values)


def is_soft(device: RdmaDevice) -> bool:
    """Software RDMA (soft-RoCE rxe, soft-iWARP siw): no NIC, no PFC, no ECN."""
    return device.driver in SOFT_DRIVERS or device.name.startswith(("rxe", "siw"))


@dataclass(frozen=True)
class _Reply:
    stdout: tuple[str, ...]  # successive outputs; the last repeats
    returncode: int = 0
    stderr: str = ""
    missing: bool = False


class ReplayRunner:
    """A runner that answers from captured outputs instead of running anything.

    A capture directory holds `commands.toml`, one table per command line:

        ["dcb pfc show dev ens1f0np0"]
        stdout = "dcb_pfc_show.txt"                # file next to commands.toml
        ["ethtool -S ens1f0np0"]
        stdout = ["ethtool_t0.txt", "ethtool_t1.txt"]  # one per call, last repeats
        ["mlnx_qos -i ens1f0np0"]
        returncode = 1
        stderr = "Operation not permitted"
        ["lldptool -t -i ens1f0np0 -V PFC"]
        missing = true                             # as if not installed

    Later directories override earlier ones command by command, so a misconfigured host
    is a small overlay on a good one. Commands not listed are reported as not installed.
    """

    def __init__(self, *capture_dirs: Path | str) -> None:
        self.replies: dict[str, _Reply] = {}
        self.calls: list[str] = []
        self._served: dict[str, int] = {}
        for d in capture_dirs:
            self._load(Path(d))

    def _load(self, directory: Path) -> None:
        manifest = directory / "commands.toml"
        try:
            doc = tomllib.loads(manifest.read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ParseError(f"cannot load {manifest}: {e}") from e
        for command, spec in doc.items():
            if not isinstance(spec, dict):
                raise ParseError(f"{manifest}: [{command!r}] must be a table")
            files = spec.get("stdout", [])
            files = [files] if isinstance(files, str) else list(files)
            self.replies[" ".join(command.split())] = _Reply(
                stdout=tuple((directory / f).read_text() for f in files) or ("",),
                returncode=int(spec.get("returncode", 0)),
                stderr=str(spec.get("stderr", "")),
                missing=bool(spec.get("missing", False)),
            )

    def __call__(self, argv: Sequence[str], timeout: float) -> CommandResult:
        command = " ".join(argv)
        self.calls.append(command)
        reply = self.replies.get(command)
        if reply is None or reply.missing:
            raise FileNotFoundError(argv[0])
        n = self._served.get(command, 0)
        self._served[command] = n + 1
        out = reply.stdout[min(n, len(reply.stdout) - 1)]
        return CommandResult(reply.returncode, out, reply.stderr)
