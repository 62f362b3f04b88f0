"""A laptop user's soft-RoCE sequence through the real `probe` command, inside the VM lane.

On a spare veth pair that this test adds (fprxa <-> fprxb, TEST-NET-2, apart from the
lane's own fabric): `probe rxe up` on each end, `probe rxe status`, `probe validate` with
a live check to the other end, `probe lat` from one rxe device to the other, the same
probe against peers that go silent (it must end within its --timeout), `probe rxe down`,
and then nothing left behind: `rdma link show`, the links, the rules and the network
namespaces are as they were.

Why no network namespace for the second end: on the lane's kernel (6.1) rdma_rxe's UDP
socket lives only in the initial namespace, so both rxe devices sit there, and a rule per
address sends packets between the two local addresses out of their own veth, as
lane/guest-fabric.sh does for its hosts (the lane has moved the `local` table behind
those rules). Outside the lane this test fails, never skips.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fabricprobe.cli.commands.serve import open_serve_argv
from fabricprobe.probes.control import wait_listening

PROBE = str(Path(sys.executable).with_name("probe"))  # the console script a user runs
A_IF, B_IF = "fprxa", "fprxb"
A_IP, B_IP = "198.51.100.1", "198.51.100.2"  # TEST-NET-2: never routed
A_NAME = "fprxe_a"  # named: soft-RoCE all the same; the second takes the default name
PORT, SILENT_PORT = 4797, 4798
TABLES = (150, 151)
# A stopped or silent peer must end the probe within --timeout; the slack covers the
# interpreter's exit and verbs teardown under TCG emulation on a loaded machine.
DEADLINE_SLACK_S = 2.0


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=check)


def probe(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    t0 = time.monotonic()
    res = subprocess.run(
        [PROBE, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    print(f"$ probe {' '.join(args)}  -> exit {res.returncode} in {time.monotonic() - t0:.1f} s")
    return res


def snapshot() -> dict[str, str]:
    """What must be the same before and after: RDMA links, net links, rules, namespaces."""
    links = sh("ip", "-o", "link", "show").stdout
    return {
        "rdma": sh("rdma", "link", "show").stdout,
        "links": "\n".join(sorted(line.split(":")[1].strip() for line in links.splitlines())),
        "rules": sh("ip", "rule", "show").stdout,
        "netns": sh("ip", "netns", "list").stdout,
    }


def add_veth() -> None:
    batch = [
        f"link add {A_IF} type veth peer name {B_IF}",
        f"addr add {A_IP}/24 dev {A_IF}",
        f"addr add {B_IP}/24 dev {B_IF}",
    ]
    subprocess.run(["ip", "-batch", "-"], input="\n".join(batch), text=True, check=True)
    for netdev in (A_IF, B_IF):
        conf = Path("/proc/sys/net/ipv4/conf") / netdev
        for knob, value in (("accept_local", 1), ("rp_filter", 0), ("arp_ignore", 1)):
            (conf / knob).write_text(f"{value}\n")
        (conf / "arp_announce").write_text("2\n")
    batch = [f"link set {A_IF} up", f"link set {B_IF} up"]
    ends = ((A_IP, B_IP, A_IF), (B_IP, A_IP, B_IF))
    for (src, dst, dev), table in zip(ends, TABLES, strict=True):
        batch += [
            f"rule add pref {table - 130} from {src} iif lo lookup {table}",
            f"route add {dst} dev {dev} src {src} table {table}",
        ]
    subprocess.run(["ip", "-batch", "-"], input="\n".join(batch), text=True, check=True)


def remove_veth() -> None:
    """Best effort: the veth pair (deleting one end takes the other) and our rules."""
    sh("ip", "link", "del", A_IF, check=False)
    for table in TABLES:
        sh("ip", "rule", "del", "pref", str(table - 130), check=False)
        sh("ip", "route", "flush", "table", str(table), check=False)


def rxe_status() -> list[dict[str, Any]]:
    res = probe("rxe", "status", "--json")
    assert res.returncode == 0, res.stderr
    devices: list[dict[str, Any]] = json.loads(res.stdout)
    return devices


def on(devices: list[dict[str, Any]], netdev: str) -> dict[str, Any]:
    found = [d for d in devices if d["netdev"] == netdev]
    assert len(found) == 1, f"expected one soft-RoCE device on {netdev}: {devices}"
    return found[0]


def v2_gid(dev: dict[str, Any], ip: str) -> bool:
    """Whether DEV has the RoCE v2 GID of IP (sysfs spells it in full: 0000:...:ffff:c633:6401)."""
    return any(
        ipaddress.IPv6Address(g["gid"]).ipv4_mapped == ipaddress.IPv4Address(ip)
        and g["type"] == "RoCE v2"
        for p in dev["ports"]
        for g in p["gids"]
    )


def counter(device: str, name: str) -> int:
    return int(Path(f"/sys/class/infiniband/{device}/ports/1/hw_counters/{name}").read_text())


@pytest.fixture
def lane() -> Iterator[dict[str, str]]:
    """The lane VM (root, rdma_rxe, the `rdma` tool), with a spare veth pair added and
    removed again; yields what the host looked like before."""
    if not os.environ.get("LANE_FILE") or os.geteuid() != 0:
        pytest.fail("no soft-RoCE lane: run this test through lane/run.sh", pytrace=False)
    before = snapshot()
    add_veth()
    try:
        yield before
    finally:
        # the test's own `probe rxe down` ran already unless it failed half-way
        for d in rxe_status():
            if d["netdev"] in (A_IF, B_IF):
                sh("rdma", "link", "delete", d["device"], check=False)
        remove_veth()


@pytest.fixture
def responder() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(open_serve_argv(f"{B_IP}:{PORT}", "--log-level", "warning"))
    try:
        wait_listening(B_IP, PORT, timeout=120)
        yield proc
    finally:
        os.kill(proc.pid, signal.SIGCONT)  # a test that stopped it
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


@pytest.mark.timeout(1500)  # some twenty `probe` runs, 15-30 s each under TCG
def test_rxe_laptop_sequence(lane: dict[str, str], responder: subprocess.Popen[bytes]) -> None:
    t_start = time.monotonic()
    # up: the first named, the second with the default name (the first free rxeN)
    res = probe("rxe", "up", "--netdev", A_IF, "--name", A_NAME)
    assert res.returncode == 0, res.stderr
    assert A_NAME in res.stdout
    res = probe("rxe", "up", "--netdev", B_IF)
    assert res.returncode == 0, res.stderr
    again = probe("rxe", "up", "--netdev", A_IF)
    assert again.returncode == 2 and "already exists" in again.stderr, again.stderr

    # status shows both, each with the RoCE v2 GID of its address
    devices = rxe_status()
    a, b = on(devices, A_IF), on(devices, B_IF)
    assert a["device"] == A_NAME and b["device"].startswith("rxe")
    # a device named by the user is soft-RoCE all the same: validate holds it to no NIC's
    # PFC and ECN checks below
    assert a["driver"] == b["driver"] == "rdma_rxe", devices
    assert a["device"] in probe("rxe", "status").stdout
    assert v2_gid(a, A_IP) and v2_gid(b, B_IP), devices
    assert all(p["state"] == "ACTIVE" for d in (a, b) for p in d["ports"]), devices
    dev_a, dev_b = a["device"], b["device"]

    # validate the first, with a live check to the second (soft-RoCE: no DCB to check)
    res = probe(
        "validate", "--device", dev_a, "--json", "--window", "1", "--peer", f"{B_IP}:{PORT}"
    )
    report = json.loads(res.stdout)
    status = {r["check"]: r["status"] for r in report["results"]}
    print(f"validate {dev_a}: {status}")
    assert res.returncode == 0, res.stderr
    assert status["device"] == "PASS" and status["gid"] == "PASS", status
    for check in ("pfc", "trust", "ecn_rp", "ecn_np", "cnp", "ets", "buffers", "fec", "pcie"):
        assert status[check] == "SKIP", check
    live = next(r for r in report["results"] if r["check"] == "live")
    assert live["status"] in ("PASS", "WARN"), live

    # lat from the first rxe device to the second: the second's counters see it
    rcvd = counter(dev_b, "rcvd_pkts")
    res = probe("lat", f"{B_IP}:{PORT}", "--bind", A_IP, "--iters", "300", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)["rdma"]
    print(f"lat {dev_a} -> {dev_b}: p50 {out['rtt']['p50_us']} us, error {out['error']}")
    assert out["device"] == dev_a and out["error"] is None
    assert out["rtt"]["count"] == 300 and out["rtt"]["lost"] == 0, out["rtt"]
    assert counter(dev_b, "rcvd_pkts") - rcvd >= 300

    check_silent_peers(responder, dev_b)

    # down, one by one, and nothing of ours is left
    for dev in (dev_a, dev_b):
        res = probe("rxe", "down", "--device", dev)
        assert res.returncode == 0 and f"removed: {dev}" in res.stdout, res.stderr
    assert not [d for d in rxe_status() if d["netdev"] in (A_IF, B_IF)]
    remove_veth()
    assert snapshot() == lane
    print(f"the sequence took {time.monotonic() - t_start:.0f} s")


def check_silent_peers(responder: subprocess.Popen[bytes], dev_b: str) -> None:
    """`probe lat --timeout T` ends within T (+ slack) of the peer's last word: against a
    listener that accepts and never answers, and against a responder stopped mid-run."""
    timeout = 3.0
    with socket.create_server((B_IP, SILENT_PORT)) as silent:
        proc = subprocess.Popen(
            [PROBE, "lat", f"{B_IP}:{SILENT_PORT}", "--bind", A_IP, "--timeout", f"{timeout:g}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        silent.settimeout(120)
        conn, _ = silent.accept()  # taken, never answered
        t_accept = time.monotonic()
        _, err = proc.communicate(timeout=120)
        waited = time.monotonic() - t_accept
        conn.close()
    print(f"lat to a silent listener, --timeout {timeout:g}: exit {proc.returncode}, {waited:.2f}s")
    assert proc.returncode == 1 and "within 3 s" in err, err
    assert waited <= timeout + DEADLINE_SLACK_S

    long_run = ["--iters", "2000000", "--warmup", "0", "--timeout", f"{timeout:g}", "--json"]
    proc = subprocess.Popen(
        [PROBE, "lat", f"{B_IP}:{PORT}", "--bind", A_IP, *long_run],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    rcvd = counter(dev_b, "rcvd_pkts")
    give_up = time.monotonic() + 300
    while counter(dev_b, "rcvd_pkts") - rcvd < 200:  # the rounds are running
        assert proc.poll() is None and time.monotonic() < give_up, "the run never started"
        time.sleep(0.1)
    os.kill(responder.pid, signal.SIGSTOP)
    t_stop = time.monotonic()
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        os.kill(responder.pid, signal.SIGCONT)
    waited = time.monotonic() - t_stop
    rtt = json.loads(out)["rdma"]["rtt"]
    print(f"lat to a responder stopped mid-run: exit {proc.returncode}, {waited:.2f} s, {rtt}")
    assert proc.returncode == 1 and "run ended early" in err and "within 3 s" in err, err
    assert rtt["count"] > 0 and rtt["lost"] > 0
    assert waited <= timeout + DEADLINE_SLACK_S
