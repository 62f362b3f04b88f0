"""Many consecutive probe runs leave no QP, CQ, MR, PD, context or file descriptor behind,
in the prober or in the responder (`rdma res show` counts the whole VM): one-shot
sessions, and kept links (as the agent runs them) carrying rounds and then let go."""

from __future__ import annotations

import os
import signal
import time

import pytest

from fabricprobe.core.errors import ProbeError
from fabricprobe.probes.measure import LinkParams
from fabricprobe.probes.rdma.rc import RcPingLink, rc_latency
from fabricprobe.probes.rdma.ud import UdLink
from tests.rdma.conftest import rdma_resources, start_responder
from tests.support.ud import ud_probe

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
        failed: list[str] = []  # runs whose peer answered past a deadline
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
            try:
                if i % 10 == 8 and links is not None:
                    res = links[0].run(1) if i % 20 == 8 else links[1].run(1)
                elif i % 10 == 9:
                    engine = "native" if i % 20 == 9 else "pyverbs"
                    res = ud_probe(LinkParams(b.ip, PORT, bind=a.ip, engine=engine), probes=1)
                else:
                    op = "write" if i % 2 else "send"
                    res = rc_latency(there, op=op, size=2, iters=1, warmup=0)
            except ProbeError as e:  # what the run built must be released all the same
                failed.append(f"run {i}: {e}")
                continue
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
        f"\n{RUNS} probe runs ({errors} with errors, {len(failed)} failed: {failed[:5]}) in "
        f"{time.monotonic() - t0:.0f} s; "
        f"rdma res before {before[0]} after {after[0]}; fds prober {before[1]}->{after[1]}, "
        f"responder {before[2]}->{after[2]}"
    )
    # on an emulator the machine starves a run can miss a deadline (one UD closing
    # handshake in 3,000 came over 2 s late once); a leak shows in the counts either way
    assert errors == 0 and len(failed) <= RUNS // 1000, failed
    assert after == before
