"""The live check: measure RDMA and TCP to a peer and hold them to the policy.

Measuring is somebody else's job: the check takes a callable that returns a
LiveMeasurement, so the probe libraries plug in from the command line and tests pass
fixed figures.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fabricprobe.probes.roce.policy import Policy
from fabricprobe.probes.roce.result import CheckResult, Status

TITLE_LIVE = "live RDMA and TCP to the peer"


@dataclass(frozen=True)
class PathFigures:
    """RTT percentiles and throughput of one transport to the peer."""

    rtt_p50_us: float | None = None
    rtt_p99_us: float | None = None
    gbps: float | None = None
    error: str | None = None  # the measurement failed; the figures may be partial

    def describe(self) -> str:
        parts = [
            f"RTT p50 {self.rtt_p50_us:.1f} µs" if self.rtt_p50_us is not None else None,
            f"p99 {self.rtt_p99_us:.1f} µs" if self.rtt_p99_us is not None else None,
            f"{self.gbps:.1f} Gb/s" if self.gbps is not None else None,
            f"error: {self.error}" if self.error else None,
        ]
        return ", ".join(p for p in parts if p) or "no figures"


@dataclass(frozen=True)
class LiveMeasurement:
    """What a measurement against PEER found; None for a transport that was not run."""

    peer: str
    rdma: PathFigures | None
    tcp: PathFigures | None
    rdma_unavailable: str | None = None  # why RDMA was not measured, when it was not


Measure = Callable[[str], LiveMeasurement]


def evaluate_live(m: LiveMeasurement, policy: Policy) -> CheckResult:
    """Compare measured figures with the policy thresholds (pure)."""
    th = policy.thresholds
    ev = [f"peer {m.peer}"]
    if m.tcp is not None:
        ev.append(f"tcp: {m.tcp.describe()}")
    if m.rdma is not None:
        ev.append(f"rdma: {m.rdma.describe()}")

    def result(status: Status, message: str, fix: str | None = None) -> CheckResult:
        return CheckResult("live", TITLE_LIVE, status, message, evidence=tuple(ev), fix=fix)

    if m.rdma is None:
        return result(
            Status.SKIP,
            f"live check not available: {m.rdma_unavailable or 'RDMA was not measured'}",
        )
    if m.rdma.error:
        return result(
            Status.FAIL,
            f"RDMA to {m.peer} failed: {m.rdma.error}",
            fix=f"on {m.peer}: run the responder (probe serve); check the path with "
            f"`ping {m.peer}` and the GID/MTU checks on both hosts",
        )
    problems: list[str] = []
    r = m.rdma
    if r.rtt_p50_us is not None and r.rtt_p50_us > th.rdma_rtt_p50_us_max:
        problems.append(f"RDMA RTT p50 {r.rtt_p50_us:.1f} µs > {th.rdma_rtt_p50_us_max:g}")
    if r.rtt_p99_us is not None and r.rtt_p99_us > th.rdma_rtt_p99_us_max:
        problems.append(f"RDMA RTT p99 {r.rtt_p99_us:.1f} µs > {th.rdma_rtt_p99_us_max:g}")
    if th.rdma_gbps_min > 0 and r.gbps is not None and r.gbps < th.rdma_gbps_min:
        problems.append(f"RDMA {r.gbps:.1f} Gb/s < {th.rdma_gbps_min:g}")
    t = m.tcp
    if (
        t is not None
        and not t.error
        and t.rtt_p50_us
        and r.rtt_p50_us
        and r.rtt_p50_us > t.rtt_p50_us
    ):
        problems.append(
            f"RDMA RTT p50 {r.rtt_p50_us:.1f} µs is worse than TCP's {t.rtt_p50_us:.1f}"
        )
    if problems:
        return result(
            Status.WARN,
            "; ".join(problems),
            fix="look at the counters check on both hosts; `probe validate --window 10` "
            "while the workload runs shows pauses and retransmissions",
        )
    return result(Status.PASS, f"RDMA {r.describe()}" + (f"; TCP {t.describe()}" if t else ""))


def check_live(
    peer: str, measure: Measure | None, policy: Policy, unavailable: str = ""
) -> CheckResult:
    """Run MEASURE against PEER and judge it; SKIP with the reason when it cannot run."""
    if measure is None:
        return CheckResult(
            "live",
            TITLE_LIVE,
            Status.SKIP,
            f"live check not available: {unavailable or 'no measurement library'}",
            evidence=(f"peer {peer}",),
        )
    try:
        m = measure(peer)
    except Exception as e:  # a probe library failing must not take the report down
        return CheckResult(
            "live",
            TITLE_LIVE,
            Status.FAIL,
            f"measuring {peer} failed: {e}",
            evidence=(f"peer {peer}",),
            fix=f"on {peer}: run the responder (probe serve); check `ping {peer}`",
        )
    return evaluate_live(m, policy)
