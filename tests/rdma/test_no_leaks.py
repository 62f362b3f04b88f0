"""Many consecutive probe runs leave no QP, CQ, MR, PD, context or file descriptor behind,
in the prober or in the responder (`rdma res show` counts the whole VM): one-shot
sessions, and kept links (as the agent runs them) carrying rounds and then let go."""

from __future__ import annotations

import os
import signal
import time

import pytest

from fabricprobe.probes.measure import LinkParams
from fabricprobe.probes.rdma.rc import RcPingLink, rc_latency
from fabricprobe.probes.rdma.ud import UdLink, ud_probe
from tests.rdma.conftest import rdma_resources, start_responder

PORT = 4795
RUNS = int(os.environ.get("FABRICPROBE_LEAK_RUNS", "10000"))


def fds(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.timeout(4000)  # 10,000 runs take 20-35 minutes under emulation
def test_consecutive_probe_runs_release_everything(lane_hosts) -> None:
    a, b = lane_hosts[0], lane_hosts[1]
    proc = start_responder(lane_hosts, PORT)
    try:
        # one run of each kind first: libraries, providers and caches load once per process
        there = LinkParams(b.ip, PORT, bind=a.ip)
        rc_latency(there, op="send", size=2, iters=1, warmup=0)
        ud_probe(there, probes=1)
        time.sleep(0.5)
        before = (rdma_resources(), fds(), fds(proc.pid))
        t0 = time.monotonic()
        errors = 0
        links: tuple[RcPingLink, UdLink] | None = None
        for i in range(RUNS):
            if i % 500 == 8:  # kept links: new ones every 500 runs, each carrying 50 rounds
                if links is not None:
                    for link in links:
                        link.close()
                links = (
                    RcPingLink(there, size=2, keepalive_s=60),
                    UdLink(there, keepalive_s=60),
                )
            if i % 10 == 8 and links is not None:
                res = links[0].run(1) if i % 20 == 8 else links[1].run(1)
            elif i % 10 == 9:
                engine = "native" if i % 20 == 9 else "pyverbs"
                res = ud_probe(LinkParams(b.ip, PORT, bind=a.ip, engine=engine), probes=1)
            else:
                res = rc_latency(there, op="write" if i % 2 else "send", size=2, iters=1, warmup=0)
            errors += res.error is not None
            if (i + 1) % 2000 == 0:
                print(f"\n  {i + 1} runs in {time.monotonic() - t0:.0f} s", flush=True)
        for link in links or ():
            link.close()
        time.sleep(1.0)  # the responder finishes its last sessions after our `done` or close
        after = (rdma_resources(), fds(), fds(proc.pid))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    print(
        f"\n{RUNS} probe runs ({errors} with errors) in {time.monotonic() - t0:.0f} s; "
        f"rdma res before {before[0]} after {after[0]}; fds prober {before[1]}->{after[1]}, "
        f"responder {before[2]}->{after[2]}"
    )
    assert errors == 0
    assert after == before
