"""Counter sampling: RDMA port counters and `ethtool -S` turned into report readings.

The readers live in fabricprobe.probes.counters and fabricprobe.probes.ethtool; this module
only maps what they return to CounterReading messages (raw values and their wrap width:
the collector computes rates). A counter the hardware does not offer is left out, never sent as 0.
A netdev whose driver has no ethtool statistics (veth, virtio_net) is asked once and
then left alone.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.errors import NotSupported, ParseError, ProbeError, ToolMissing
from fabricprobe.core.logs import warn_once
from fabricprobe.probes.counters import PortCounters, counter_width, read_port_counters
from fabricprobe.probes.ethtool import (
    NETDEV_COUNTERS,
    PRIORITY_COUNTERS,
    PfcStats,
    Runner,
    parse_pfc_stats,
    read_ethtool_stats,
    run_command,
)
from fabricprobe.probes.sysfs import RdmaDevice

log = logging.getLogger("fabricprobe.agent")

# What a report carries of probes.ethtool's counters: all of them but the XON frame counts
# (ice), which no metric exports.
PFC_FIELDS = tuple(n for n in PRIORITY_COUNTERS if n not in ("rx_xon", "tx_xon"))
NETDEV_FIELDS = NETDEV_COUNTERS


def port_readings(pc: PortCounters, driver: str | None) -> list[pb.CounterReading]:
    """counters/ and hw_counters/ values of one port, under the kernel's names."""
    values: dict[str, int] = {}
    if pc.pma is not None:
        values.update(pc.pma.values)
    if pc.hw is not None:
        values.update(pc.hw.values)
    return [
        pb.CounterReading(
            kind="rdma",
            device=pc.device,
            port=pc.port,
            priority=-1,
            name=name,
            value=value,
            width=counter_width(name, driver),
        )
        for name, value in sorted(values.items())
    ]


def pfc_readings(netdev: str, pfc: PfcStats) -> list[pb.CounterReading]:
    """Per-priority pause frames, durations, transitions and discards, plus the netdev-wide
    discard, ECN-mark and pause-storm counters."""
    out = []
    for prio in pfc.priorities:
        for name in PFC_FIELDS:
            value = getattr(prio, name)
            if value is not None:
                out.append(
                    pb.CounterReading(
                        kind="pfc",
                        netdev=netdev,
                        priority=prio.priority,
                        name=name,
                        value=value,
                        width=64,
                    )
                )
    for name in NETDEV_FIELDS:
        value = getattr(pfc, name)
        if value is not None:
            out.append(
                pb.CounterReading(
                    kind="netdev", netdev=netdev, priority=-1, name=name, value=value, width=64
                )
            )
    return out


@dataclass
class CounterSampler:
    """Reads every port of DEVICES and every NETDEV once per call to sample()."""

    sysfs_root: str
    devices: list[RdmaDevice]
    netdevs: list[str]
    runner: Runner = run_command
    ethtool: bool = True
    errors: int = 0
    skipped_counters: int = 0  # counter files read but not counters (PortCounters.skipped)
    skipped_lines: int = 0  # `ethtool -S` lines that were not `name: value` (EthtoolStats)
    # tools found missing on the newest sample (ethtool): retried every window, so
    # installing the tool heals it without a restart
    tools_missing: set[str] = field(default_factory=set)
    _no_stats: set[str] = field(default_factory=set)
    _warned: set[str] = field(default_factory=set)

    def sample(self) -> list[pb.CounterReading]:
        out: list[pb.CounterReading] = []
        for dev in self.devices:
            for port in dev.ports:
                try:
                    pc = read_port_counters(self.sysfs_root, dev.name, port.number)
                except (ProbeError, OSError) as e:
                    self._warn(f"{dev.name}/{port.number}", e)
                    continue
                self.skipped_counters += len(pc.skipped)
                out.extend(port_readings(pc, dev.driver))
        if self.ethtool:
            missing: set[str] = set()
            for netdev in self.netdevs:
                if netdev in self._no_stats:
                    continue
                try:
                    stats = read_ethtool_stats(netdev, self.runner)
                except ToolMissing as e:
                    missing.add(e.tool)
                    if e.tool not in self.tools_missing:
                        log.error(
                            "%s: no PFC pause, ECN or discard counters from %s, and the "
                            "PFC pause-storm alert cannot fire until it is installed",
                            e,
                            ", ".join(self.netdevs),
                        )
                    break
                except NotSupported:
                    self._no_stats.add(netdev)
                    continue
                except (ProbeError, ParseError, OSError) as e:
                    self._warn(netdev, e)
                    continue
                self.skipped_lines += len(stats.skipped)
                out.extend(pfc_readings(netdev, parse_pfc_stats(stats)))
            if self.tools_missing - missing:
                log.info("%s found again", ", ".join(sorted(self.tools_missing - missing)))
            self.tools_missing = missing
        return out

    def _warn(self, what: str, e: Exception) -> None:
        self.errors += 1
        warn_once(log, self._warned, what, "counters of %s not read: %s", what, e)


ReadingKey = tuple[str, str, int, str, int, str]  # kind, device, port, netdev, priority, name


class ChangeFilter:
    """Passes a reading only when its value changed since it was last passed, and every
    reading once per KEYFRAME_EVERY windows.

    Most counters of a healthy port (error counters, most priorities' pause counters)
    do not move in a window; leaving them out keeps reports and the collector's work
    small. The collector reads "absent from the newest window" as "unchanged", and the
    periodic full window lets a restarted collector learn every value again.
    """

    def __init__(self, keyframe_every: int = 6) -> None:
        if keyframe_every < 1:
            raise ValueError("keyframe_every must be >= 1")
        self.keyframe_every = keyframe_every
        self._last: dict[ReadingKey, int] = {}
        self._windows = 0
        self._forced = 0

    def force(self, windows: int) -> None:
        """The next WINDOWS windows carry every reading (a new collector shard took this
        host: two full readings give it every counter's rate at once)."""
        self._forced = max(self._forced, windows)

    def __call__(self, readings: list[pb.CounterReading]) -> list[pb.CounterReading]:
        keyframe = self._windows % self.keyframe_every == 0 or self._forced > 0
        self._forced = max(0, self._forced - 1)
        self._windows += 1
        out = []
        last = self._last
        for r in readings:
            key = (r.kind, r.device, r.port, r.netdev, r.priority, r.name)
            if keyframe or last.get(key) != r.value:
                out.append(r)
            last[key] = r.value
        return out


def netdevs_of(devices: Iterable[RdmaDevice]) -> list[str]:
    """Network devices under the RDMA devices (GID netdevs and soft-RoCE parents)."""
    names: set[str] = set()
    for d in devices:
        if d.parent_netdev:
            names.add(d.parent_netdev)
        for p in d.ports:
            names.update(p.netdevs())
    return sorted(names)
