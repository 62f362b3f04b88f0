"""Fixtures for tests that need real soft-RoCE: they run inside the VM lane (lane/run.sh),
which describes its hosts in $LANE_FILE. Outside the lane these tests fail, never skip."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from fabricprobe.cli.commands.serve import open_serve_argv
from fabricprobe.probes.control import wait_listening
from fabricprobe.probes.sysfs import read_required


@dataclass(frozen=True)
class LaneHost:
    name: str
    device: str
    netdev: str
    ip: str
    gid_index: int

    def hw_counter(self, name: str) -> int:
        return int(
            read_required(Path(f"/sys/class/infiniband/{self.device}/ports/1/hw_counters/{name}"))
        )


@pytest.fixture(scope="session")
def lane_hosts() -> list[LaneHost]:
    path = os.environ.get("LANE_FILE")
    if not path or not Path(path).is_file():
        pytest.fail(
            "no soft-RoCE lane: run these tests through lane/run.sh (make test)", pytrace=False
        )
    hosts = [LaneHost(**h) for h in json.loads(Path(path).read_text())["hosts"]]
    assert len(hosts) >= 3, f"the lane must have at least 3 hosts, it has {len(hosts)}"
    return hosts


def start_responder(
    hosts: list[LaneHost], port: int, cpu: str | None = None
) -> subprocess.Popen[bytes]:
    """A real `probe serve` process answering on every lane host's address (on CPU only,
    every thread of it, when given)."""
    argv = open_serve_argv(f"0.0.0.0:{port}", "--log-level", "warning")
    proc = subprocess.Popen(["taskset", "-c", cpu, *argv] if cpu else argv)
    for h in hosts:
        wait_listening(h.ip, port, timeout=120)
    return proc


def _softirq_threads() -> list[int]:
    """The kernel's per-CPU softirq threads (ksoftirqd/N)."""
    out = []
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().startswith("ksoftirqd/"):
                out.append(int(comm.parent.name))
        except OSError:
            continue
    return out


@contextmanager
def nic_work_apart(cpu: int) -> Iterator[None]:
    """The emulated NIC's work kept apart from busy processes, then put back as it was:
    every packet the lane's netdevs (fp*, the hosts' ends and their bridge ports) receive
    is handled on CPU (receive packet steering), and the softirq threads run ahead of
    ordinary processes (SCHED_FIFO).

    All lane hosts share one kernel, and soft-RoCE does a NIC's work in the kernel's
    softirqs: a veth hands each packet to the far end's rxe on the CPU that sent it, and
    the sender's CPU must run its own softirq to pass a steered packet on. On a busy CPU
    that work is deferred to ksoftirqd, which then queues behind the busy processes: the
    far end and the wire become busy too, which a busy prober host with a hardware NIC
    does not make them. (The send work inside a prober's post stays on its CPU: soft-RoCE
    runs it in the poster's context.)"""
    queues = sorted(Path("/sys/class/net").glob("fp*/queues/rx-*/rps_cpus"))
    assert queues, "no lane netdevs (fp*) with receive queues"
    before = {q: q.read_text().strip() for q in queues}
    threads = _softirq_threads()
    assert threads, "no ksoftirqd threads"
    try:
        for q in queues:
            q.write_text(f"{1 << cpu:x}\n")
        for pid in threads:
            os.sched_setscheduler(pid, os.SCHED_FIFO, os.sched_param(10))
        yield
    finally:
        for pid in threads:
            os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))
        for q, mask in before.items():
            q.write_text(mask + "\n")


RESOURCE = re.compile(r"(\w+) (\d+)")


def rdma_resources() -> dict[str, dict[str, int]]:
    """{device: {pd, cq, qp, cm_id, mr, ctx, srq: count}} from `rdma res show`."""
    out = subprocess.run(["rdma", "res", "show"], capture_output=True, text=True, check=True)
    table = {}
    for line in out.stdout.splitlines():
        dev, _, rest = line.partition(": ")[2].partition(": ")
        table[dev] = {k: int(v) for k, v in RESOURCE.findall(rest)}
    return table
