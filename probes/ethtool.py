"""Parse `ethtool -S IF` and pull the flow-control story out of it; read ECN settings.

`ethtool -S` prints `NIC statistics:` and then one `     name: value` line per driver
counter. Names are the driver's own and differ between vendors, so the PFC view below
knows each naming scheme:

* mlx5_core: `rx_prio3_pause`, `rx_prio3_pause_duration` (µs), `rx_prio3_pause_transition`,
  `tx_pause_storm_warning_events`, `rx_discards_phy`, `rx_prio3_discards`, `rx_ecn_mark`
  (Documentation/networking/device_drivers/ethernet/mellanox/mlx5/counters.rst);
* bnxt_en: `rx_pfc_ena_frames_pri3`, `pfc_pri3_rx_duration_us`, `pfc_pri3_rx_transitions`,
  `continuous_roce_pause_events`; older firmware `rx_pfc_xon2xoff_frames_pri3`;
* ice: `rx_priority_3_xoff.nic`, `rx_priority_3_xon.nic`, `link_xoff_rx.nic`;
* veth, virtio_net (soft-RoCE hosts): no flow-control counters at all.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from types import MappingProxyType

from fabricprobe.core.errors import NotSupported, ParseError, ProbeError, ToolMissing
from fabricprobe.probes.numbers import parse_uint, uint_or_none
from fabricprobe.probes.sysfs import read_optional

HEADER = "NIC statistics:"
PRIORITIES = range(8)
ETHTOOL_TIMEOUT = 5.0


@dataclass(frozen=True)
class EthtoolStats:
    """Counters from one `ethtool -S` run, named as the driver prints them."""

    values: Mapping[str, int]
    skipped: tuple[str, ...] = ()  # one message per line that could not be used

    def get(self, name: str) -> int | None:
        return self.values.get(name)


def parse_ethtool_stats(text: str, *, strict: bool = False) -> EthtoolStats:
    """Parse `ethtool -S` output (pure).

    Raises ParseError when the text is not ethtool statistics at all. A single bad line
    (no `name: value`, a value that is not a non-negative integer or is over 2**64 - 1,
    which no driver's counter reaches, a repeated name) is skipped with a message, or
    raises ParseError when STRICT. Any line end (LF, CRLF, CR) is taken.
    """
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.strip() == HEADER), None)
    if start is None:
        head = text.strip().splitlines()[0][:80] if text.strip() else "empty output"
        raise ParseError(f"not `ethtool -S` output (no {HEADER!r} line): {head!r}")
    values: dict[str, int] = {}
    skipped: list[str] = []
    for lineno, line in enumerate(lines[start + 1 :], start=start + 2):
        if not line.strip():
            continue
        # rpartition: bnxt_en ring counters are named "[0]: rx_ucast_packets".
        name, sep, raw = line.strip().rpartition(":")
        name, raw = name.strip(), raw.strip()
        problem = value = None
        if not sep or not name:
            problem = f"line {lineno}: not 'name: value': {line.strip()[:60]!r}"
        elif raw.startswith("-"):
            problem = f"line {lineno}: {name[:60]}: value {raw[:30]!r} is negative"
        elif name in values:
            problem = f"line {lineno}: {name[:60]}: repeated, keeping the first value"
        else:
            try:
                value = parse_uint(raw, f"line {lineno}: {name[:60]}: value")
            except ParseError as e:
                problem = str(e)
        if value is None:
            if strict:
                raise ParseError(problem)
            skipped.append(str(problem))
            continue
        values[name] = value
    return EthtoolStats(MappingProxyType(values), tuple(skipped))


@dataclass(frozen=True)
class PriorityPause:
    """Flow-control counters of one 802.1p priority (None: this driver has no such one)."""

    priority: int
    rx_pause: int | None  # PFC XOFF frames received (peer asked us to stop)
    tx_pause: int | None  # PFC XOFF frames sent (we asked the peer to stop)
    rx_pause_duration_us: int | None  # time we were paused, µs (mlx5, bnxt_en)
    tx_pause_duration_us: int | None  # time we held the peer paused, µs (mlx5, bnxt_en)
    rx_pause_transitions: int | None  # XOFF -> XON transitions received
    tx_pause_transitions: int | None  # XOFF -> XON transitions sent (bnxt_en)
    rx_xon: int | None  # XON frames received (ice)
    tx_xon: int | None  # XON frames sent (ice)
    rx_discards: int | None  # drops for lack of receive buffer on this priority (mlx5)


@dataclass(frozen=True)
class PfcStats:
    """The flow-control and congestion view of one `ethtool -S` output."""

    scheme: str | None  # naming scheme that matched: "mlx5", "bnxt_en", "ice"; None: no PFC
    priorities: tuple[PriorityPause, ...]  # eight entries, or none when scheme is None
    tx_pause_storm_warning_events: int | None  # mlx5: long pause sending began
    tx_pause_storm_error_events: int | None  # mlx5: pause sending cut off by the watchdog
    continuous_pause_events: int | None  # bnxt_en: continuous_roce_pause_events
    rx_discards_phy: int | None  # mlx5: drops for lack of port buffer
    rx_ecn_mark: int | None  # mlx5: received packets with CE set
    rx_link_pause: int | None  # global 802.3x pause received (mlx5/bnxt_en/ice)
    tx_link_pause: int | None  # global 802.3x pause sent

    def priority(self, n: int) -> PriorityPause | None:
        return next((p for p in self.priorities if p.priority == n), None)

    @property
    def has_pfc(self) -> bool:
        return self.scheme is not None


# The counters' names as the dataclasses spell them (the agent reports them by these names).
PRIORITY_COUNTERS = tuple(f.name for f in fields(PriorityPause) if f.name != "priority")
NETDEV_COUNTERS = tuple(f.name for f in fields(PfcStats) if f.name not in ("scheme", "priorities"))


# Per-priority names, one template per field, for each driver. {p} is the priority.
_SCHEMES: dict[str, dict[str, tuple[str, ...]]] = {
    "mlx5": {
        "rx_pause": ("rx_prio{p}_pause",),
        "tx_pause": ("tx_prio{p}_pause",),
        "rx_pause_duration_us": ("rx_prio{p}_pause_duration",),
        "tx_pause_duration_us": ("tx_prio{p}_pause_duration",),
        "rx_pause_transitions": ("rx_prio{p}_pause_transition",),
        "rx_discards": ("rx_prio{p}_discards",),
    },
    "bnxt_en": {
        "rx_pause": ("rx_pfc_ena_frames_pri{p}",),
        "tx_pause": ("tx_pfc_ena_frames_pri{p}",),
        "rx_pause_duration_us": ("pfc_pri{p}_rx_duration_us",),
        "tx_pause_duration_us": ("pfc_pri{p}_tx_duration_us",),
        "rx_pause_transitions": ("pfc_pri{p}_rx_transitions", "rx_pfc_xon2xoff_frames_pri{p}"),
        "tx_pause_transitions": ("pfc_pri{p}_tx_transitions",),
    },
    "ice": {
        "rx_pause": ("rx_priority_{p}_xoff.nic",),
        "tx_pause": ("tx_priority_{p}_xoff.nic",),
        "rx_xon": ("rx_priority_{p}_xon.nic",),
        "tx_xon": ("tx_priority_{p}_xon.nic",),
    },
}
_MARKERS = {
    "mlx5": re.compile(r"^[rt]x_prio\d_pause$"),
    "bnxt_en": re.compile(r"^[rt]x_pfc_ena_frames_pri\d$"),
    "ice": re.compile(r"^[rt]x_priority_\d_xoff\.nic$"),
}


def _first(stats: Mapping[str, int], *names: str) -> int | None:
    return next((stats[n] for n in names if n in stats), None)


def parse_pfc_stats(stats: Mapping[str, int] | EthtoolStats) -> PfcStats:
    """Per-priority pause counters and pause-storm/discard counters (pure)."""
    values = stats.values if isinstance(stats, EthtoolStats) else stats
    scheme = next((s for s, rx in _MARKERS.items() if any(rx.match(n) for n in values)), None)
    priorities: tuple[PriorityPause, ...] = ()
    if scheme is not None:
        templates = _SCHEMES[scheme]
        priorities = tuple(
            PriorityPause(
                priority=p,
                **{
                    fld: _first(values, *(t.format(p=p) for t in templates.get(fld, ())))
                    for fld in PRIORITY_COUNTERS
                },
            )
            for p in PRIORITIES
        )
    return PfcStats(
        scheme=scheme,
        priorities=priorities,
        tx_pause_storm_warning_events=values.get("tx_pause_storm_warning_events"),
        tx_pause_storm_error_events=values.get("tx_pause_storm_error_events"),
        continuous_pause_events=values.get("continuous_roce_pause_events"),
        rx_discards_phy=values.get("rx_discards_phy"),
        rx_ecn_mark=values.get("rx_ecn_mark"),
        rx_link_pause=_first(values, "rx_pause_ctrl_phy", "rx_pause_frames", "link_xoff_rx.nic"),
        tx_link_pause=_first(values, "tx_pause_ctrl_phy", "tx_pause_frames", "link_xoff_tx.nic"),
    )


@dataclass(frozen=True)
class CommandResult:
    """What a command printed and how it ended."""

    returncode: int
    stdout: str
    stderr: str = ""


# A runner takes argv and a timeout; it raises FileNotFoundError when the program is
# missing and subprocess.TimeoutExpired on timeout, like subprocess.run does.
Runner = Callable[[Sequence[str], float], CommandResult]


def run_command(argv: Sequence[str], timeout: float) -> CommandResult:
    """The default runner: subprocess.run with a timeout, C locale, no shell."""
    proc = subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        errors="replace",  # a tool's bytes are not always UTF-8 (a driver's own names)
        timeout=timeout,
        check=False,
        env={"LC_ALL": "C", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )
    return CommandResult(proc.returncode, proc.stdout, proc.stderr)


def run_tool(argv: Sequence[str], runner: Runner, timeout: float, package: str) -> CommandResult:
    """ARGV run by RUNNER: ToolMissing (install PACKAGE) when its program is not there,
    ProbeError when it does not finish in TIMEOUT seconds."""
    try:
        return runner(argv, timeout)
    except FileNotFoundError as e:
        raise ToolMissing(argv[0], package) from e
    except subprocess.TimeoutExpired as e:
        raise ProbeError(f"`{' '.join(argv)}` did not finish in {timeout:g} s") from e


def read_ethtool_stats(
    netdev: str, runner: Runner = run_command, timeout: float = ETHTOOL_TIMEOUT
) -> EthtoolStats:
    """Run `ethtool -S NETDEV` and parse it.

    Raises NotSupported when ethtool is missing or the device offers no statistics, and
    ProbeError when the device does not exist, ethtool times out or fails otherwise.
    """
    res = run_tool(["ethtool", "-S", netdev], runner, timeout, "ethtool")
    out = (res.stdout + res.stderr).strip()
    if res.returncode != 0 or HEADER not in res.stdout:
        if "no stats available" in out or "Operation not supported" in out:
            raise NotSupported(f"{netdev} has no ethtool statistics")
        if "No such device" in out:
            raise ProbeError(f"no network device {netdev!r}")
        raise ProbeError(
            f"`ethtool -S {netdev}` failed (exit {res.returncode}): {out[:200] or 'no output'}"
        )
    return parse_ethtool_stats(res.stdout)


@dataclass(frozen=True)
class EcnConfig:
    """ECN (DCQCN) enablement per priority from SYSFS/class/net/IF/ecn/ (mlx5 only).

    The reaction point (roce_rp) is the sender that slows down on CNPs; the notification
    point (roce_np) is the receiver that turns CE marks into CNPs. Both must be on for
    the RoCE priority or congestion control does nothing.
    """

    netdev: str
    rp_enabled: Mapping[int, bool]  # ecn/roce_rp/enable/N
    np_enabled: Mapping[int, bool]  # ecn/roce_np/enable/N
    cnp_dscp: int | None  # ecn/roce_np/cnp_dscp
    cnp_802p_prio: int | None  # ecn/roce_np/cnp_802p_prio


def _read_enable_dir(directory: Path) -> dict[int, bool]:
    out: dict[int, bool] = {}
    if not directory.is_dir():
        return out
    for entry in directory.iterdir():
        prio = uint_or_none(entry.name, 7)
        if prio is None:
            continue
        text = read_optional(entry)
        if text is not None and text.strip() in ("0", "1"):
            out[prio] = text.strip() == "1"
    return out


def _read_int(path: Path) -> int | None:
    return uint_or_none(read_optional(path), 255)  # cnp_dscp (0..63), cnp_802p_prio (0..7)


def read_ecn_config(sysfs_root: Path | str, netdev: str) -> EcnConfig | None:
    """Read SYSFS/class/net/NETDEV/ecn/roce_{rp,np}/; None where the driver has no ecn/.

    Only mlx5 (with the out-of-tree driver) exposes this directory; elsewhere ECN is set
    through vendor tools and this returns None.
    """
    ecn = Path(sysfs_root) / "class" / "net" / netdev / "ecn"
    if not ecn.is_dir():
        return None
    return EcnConfig(
        netdev=netdev,
        rp_enabled=MappingProxyType(_read_enable_dir(ecn / "roce_rp" / "enable")),
        np_enabled=MappingProxyType(_read_enable_dir(ecn / "roce_np" / "enable")),
        cnp_dscp=_read_int(ecn / "roce_np" / "cnp_dscp"),
        cnp_802p_prio=_read_int(ecn / "roce_np" / "cnp_802p_prio"),
    )
