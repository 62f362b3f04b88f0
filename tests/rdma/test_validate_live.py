"""`probe validate` on a soft-RoCE host of the lane, with a live check against another."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

from tests.rdma.conftest import start_responder

PORT = 4796


def test_validate_rxe_with_a_live_peer(lane_hosts) -> None:
    a, b = lane_hosts[0], lane_hosts[1]
    proc = start_responder(lane_hosts, PORT)
    try:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "fabricprobe",
                "validate",
                "--device",
                a.device,
                "--json",
                "--window",
                "1",
                "--peer",
                f"{b.ip}:{PORT}",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    report = json.loads(out.stdout)
    status = {r["check"]: r["status"] for r in report["results"]}
    print(f"\nprobe validate --device {a.device} --peer {b.ip}: exit {out.returncode}, {status}")
    assert out.returncode == 0, out.stderr
    assert status["device"] == "PASS" and status["gid"] == "PASS"
    # soft-RoCE has no PFC, DSCP trust, ECN, ETS, buffers, FEC or PCIe link: skipped with a
    # reason, never failed
    for check in ("pfc", "trust", "ecn_rp", "ecn_np", "cnp", "ets", "buffers", "fec", "pcie"):
        assert status[check] == "SKIP", check
    live = [r for r in report["results"] if r["check"] == "live"]
    assert live and live[0]["status"] in ("PASS", "WARN")
    assert any("rdma" in line.lower() for line in live[0]["evidence"])
