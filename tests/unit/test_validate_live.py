"""The live check: measured RDMA/TCP figures against the policy thresholds."""

from __future__ import annotations

import pytest

from fabricprobe.probes.roce import LiveMeasurement, PathFigures, Policy, Status
from fabricprobe.probes.roce.live import check_live, evaluate_live
from fabricprobe.probes.roce.policy import Thresholds

GOOD_RDMA = PathFigures(rtt_p50_us=4.2, rtt_p99_us=7.9, gbps=362.0)
TCP = PathFigures(rtt_p50_us=24.0, rtt_p99_us=61.0, gbps=38.5)


@pytest.mark.parametrize(
    ("rdma", "tcp", "status", "text"),
    [
        (GOOD_RDMA, TCP, Status.PASS, "RDMA RTT p50 4.2 µs"),
        (GOOD_RDMA, None, Status.PASS, "362.0 Gb/s"),
        (PathFigures(35.0, 60.0, 90.0), TCP, Status.WARN, "RDMA RTT p50 35.0 µs > 20"),
        (PathFigures(9.0, 450.0, 90.0), TCP, Status.WARN, "RDMA RTT p99 450.0 µs > 100"),
        (
            PathFigures(15.0, 40.0, 10.0),
            PathFigures(12.0, 30.0, 9.0),
            Status.WARN,
            "worse than TCP",
        ),
        (PathFigures(error="peer stopped answering"), TCP, Status.FAIL, "peer stopped answering"),
        (None, TCP, Status.SKIP, "live check not available: pyverbs missing"),
    ],
)
def test_evaluate_live(
    rdma: PathFigures | None, tcp: PathFigures | None, status: Status, text: str
) -> None:
    m = LiveMeasurement("10.0.0.2", rdma, tcp, rdma_unavailable="pyverbs missing")
    r = evaluate_live(m, Policy())
    assert r.status is status and text in r.message
    assert r.check == "live" and "peer 10.0.0.2" in r.evidence
    if status in (Status.WARN, Status.FAIL):
        assert r.fix


def test_bandwidth_threshold_only_when_set() -> None:
    m = LiveMeasurement("h", PathFigures(3.0, 6.0, 80.0), None)
    assert evaluate_live(m, Policy()).status is Status.PASS
    strict = Policy().with_overrides(thresholds=Thresholds(rdma_gbps_min=100.0))
    r = evaluate_live(m, strict)
    assert r.status is Status.WARN and "80.0 Gb/s < 100" in r.message


def test_check_live_without_a_measurer() -> None:
    r = check_live("h", None, Policy(), "fabricprobe.probes.tcp is not installed")
    assert r.status is Status.SKIP
    assert r.message == "live check not available: fabricprobe.probes.tcp is not installed"


def test_check_live_measure_raises() -> None:
    def boom(peer: str) -> LiveMeasurement:
        raise ConnectionRefusedError(111, "Connection refused")

    r = check_live("10.0.0.9", boom, Policy())
    assert r.status is Status.FAIL and "Connection refused" in r.message


def test_check_live_calls_the_measurer() -> None:
    seen: list[str] = []

    def measure(peer: str) -> LiveMeasurement:
        seen.append(peer)
        return LiveMeasurement(peer, GOOD_RDMA, TCP)

    assert check_live("10.0.0.2:4793", measure, Policy()).status is Status.PASS
    assert seen == ["10.0.0.2:4793"]
