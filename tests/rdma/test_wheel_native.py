"""The installed wheel on soft-RoCE: `probe serve` and `probe lat --engine native` from the
venv that tests/integration/test_wheel.py built outside the checkout, so the native loop a
user gets from `pip install` is the one that runs, and the output says so."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from fabricprobe.probes.control import wait_listening

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "build" / "wheel-venv" / "bin" / "probe"
PORT = 4797


def test_wheel_probe_lat_runs_the_native_loop(lane_hosts) -> None:
    if not PROBE.exists():
        pytest.fail(f"no installed wheel at {PROBE}: tests/integration/test_wheel.py makes it")
    a, b = lane_hosts[0], lane_hosts[1]
    serve = subprocess.Popen(
        [PROBE, "serve", "--insecure", "--listen", f"{b.ip}:{PORT}", "--log-level", "warning"],
        cwd="/",
    )
    try:
        wait_listening(b.ip, PORT, timeout=120)
        res = subprocess.run(
            [
                PROBE,
                "lat",
                f"{b.ip}:{PORT}",
                "--engine",
                "native",
                "--device",
                a.device,
                "--bind",  # every lane host is in one VM: say which one probes
                a.ip,
                "--iters",
                "200",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            cwd="/",
        )
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=30)
    print(f"\nwheel probe lat: exit {res.returncode}\n{res.stdout}{res.stderr}")
    assert res.returncode == 0, res.stderr
    assert "native loop" in res.stdout
