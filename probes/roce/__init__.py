"""RoCEv2 configuration checks: is this host going to deliver lossless RoCE, and how to fix it.

`validate(HostView(...), Policy())` runs every check and returns a Report; each check is
a function in `fabricprobe.probes.roce.checks` (host configuration and counters) or
`fabricprobe.probes.roce.hwchecks` (QoS, link, PCIe path, firmware) that returns a
CheckResult.
"""

from __future__ import annotations

from fabricprobe.probes.roce.host import HostView, ReplayRunner
from fabricprobe.probes.roce.live import LiveMeasurement, PathFigures
from fabricprobe.probes.roce.policy import (
    Policy,
    PolicyError,
    Thresholds,
    load_policy,
    parse_policy,
)
from fabricprobe.probes.roce.result import CheckResult, Report, Status
from fabricprobe.probes.roce.validate import validate

__all__ = [
    "CheckResult",
    "HostView",
    "LiveMeasurement",
    "PathFigures",
    "Policy",
    "PolicyError",
    "ReplayRunner",
    "Report",
    "Status",
    "Thresholds",
    "load_policy",
    "parse_policy",
    "validate",
]
