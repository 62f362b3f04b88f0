"""What a RoCE check returns, and the report that collects them."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any


class Status(enum.Enum):
    """Outcome of one check; the order is by severity."""

    PASS = "PASS"
    SKIP = "SKIP"
    WARN = "WARN"
    FAIL = "FAIL"

    @property
    def rank(self) -> int:
        return ["PASS", "SKIP", "WARN", "FAIL"].index(self.value)


@dataclass(frozen=True)
class CheckResult:
    """One check on one device port: the verdict, what it read, and how to fix it."""

    check: str  # short id: "device", "gid", "pfc", "ecn_rp", "ets", "fec", "pause", ...
    title: str  # what was checked, for the table
    status: Status
    message: str  # one line: what is right or wrong
    device: str | None = None
    port: int | None = None
    netdev: str | None = None
    evidence: tuple[str, ...] = ()  # "source: value" lines that were read
    fix: str | None = None  # the command(s) that fix a WARN/FAIL, or enable a SKIP
    needs_root: bool = False  # SKIP because reading the input needs root
    # The setting this check compared, normalised so that two hosts configured alike give
    # the same text ("pfc 3", "mtu 9000/4096"): what fleet drift compares. None where the
    # verdict is about state rather than configuration (counters, live probes).
    value: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "title": self.title,
            "status": self.status.value,
            "message": self.message,
            "device": self.device,
            "port": self.port,
            "netdev": self.netdev,
            "evidence": list(self.evidence),
            "fix": self.fix,
            "needs_root": self.needs_root,
            "value": self.value,
        }


@dataclass(frozen=True)
class NicPlace:
    """Where one validated NIC sits: its rail and the GPU it serves (absent: None)."""

    device: str
    rail: int | None  # fabricprobe.probes.rails
    gpu: str | None  # "GPU3" (fabricprobe.probes.pcie)
    gpu_address: str | None
    gpu_link: str | None  # PIX, PXB, PHB, NODE or SYS

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Report:
    """Every check result of one `probe validate` run, and where its NICs sit (only
    those with a rail or a GPU: none on a host without either)."""

    results: tuple[CheckResult, ...]
    policy: dict[str, Any] = field(default_factory=dict)
    nics: tuple[NicPlace, ...] = ()

    @classmethod
    def of(
        cls,
        results: Iterable[CheckResult],
        policy: dict[str, Any] | None = None,
        nics: Iterable[NicPlace] = (),
    ) -> Report:
        return cls(tuple(results), policy or {}, tuple(nics))

    def worst(self, device: str) -> tuple[int, int]:
        """(FAILs, WARNs) among DEVICE's results."""
        mine = [r.status for r in self.results if r.device == device]
        return mine.count(Status.FAIL), mine.count(Status.WARN)

    def count(self, status: Status) -> int:
        return sum(1 for r in self.results if r.status is status)

    @property
    def failed(self) -> bool:
        return self.count(Status.FAIL) > 0

    @property
    def exit_code(self) -> int:
        """0 when nothing failed, 1 on any FAIL (2 is left for bad usage)."""
        return 1 if self.failed else 0

    @property
    def skipped_for_root(self) -> tuple[CheckResult, ...]:
        return tuple(r for r in self.results if r.status is Status.SKIP and r.needs_root)

    def summary(self) -> str:
        """One line: counts, and which checks were skipped for want of root."""
        parts = [
            f"{self.count(s)} {s.value.lower()}"
            for s in (Status.PASS, Status.WARN, Status.FAIL, Status.SKIP)
        ]
        line = ", ".join(parts)
        root = sorted({r.check for r in self.skipped_for_root})
        if root:
            line += f"; needed root and skipped: {', '.join(root)}"
        verdict = "FAIL" if self.failed else ("WARN" if self.count(Status.WARN) else "OK")
        return f"{verdict}: {line}"

    def to_dict(self) -> dict[str, Any]:
        out = {
            "ok": not self.failed,
            "summary": {s.value.lower(): self.count(s) for s in Status},
            "needs_root": sorted({r.check for r in self.skipped_for_root}),
            "policy": self.policy,
            "results": [r.to_dict() for r in self.results],
        }
        if self.nics:  # a host with no rail and no GPU answers as it always did
            out["nics"] = [n.to_dict() for n in self.nics]
        return out
