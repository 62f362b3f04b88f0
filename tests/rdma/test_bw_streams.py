"""Bandwidth streams that outlast the responder's idle timeout, on real soft-RoCE: the
target of RDMA WRITEs sees none of them land, and used to wait for the prober's `done`
no longer than that timeout, then tore its QP and registered region down under a
stream still writing into them. The prober's WRITEs then stopped completing: measured
here, every stream ended at the prober's 5 s step deadline with 35-40 % of its WRITEs
unfinished (on a loaded machine, in IBV_WC_REM_INV_REQ_ERR). Twenty streams of 64 KiB
and 1 MiB WRITEs, each longer than a responder's one-second idle timeout, all
complete. (Messages over 64 KiB also failed before: the compiled loop's QP was asked
for all of them as inline data.)"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabricprobe.cli import netem
from fabricprobe.cli.sessions import served_sessions
from fabricprobe.probes.measure import LinkParams
from fabricprobe.probes.rdma.rc import rc_bandwidth
from fabricprobe.probes.responder import Responder

PORT = 4799
PROBE = str(Path(sys.executable).with_name("probe"))  # the console script a user runs
IDLE_S = 1.0
STREAM_BYTES = 48 << 20  # each stream: 1.5-10 s at the lane's 5-30 MB/s


@pytest.fixture(scope="module")
def short_idle_responder(lane_hosts) -> Iterator[Responder]:
    with Responder(
        "0.0.0.0", PORT, sessions=served_sessions(), auth=None, idle_timeout=IDLE_S
    ) as responder:
        yield responder


def test_write_streams_longer_than_the_idle_timeout_all_complete(
    lane_hosts, short_idle_responder
) -> None:
    a, c = lane_hosts[0], lane_hosts[2]
    rows = []
    for i in range(20):
        size = 65536 if i % 2 == 0 else 1 << 20
        iters = STREAM_BYTES // size
        res = rc_bandwidth(
            LinkParams(c.ip, PORT, bind=a.ip), op="write", size=size, iters=iters, outstanding=16
        )
        rows.append((size, res.completed, iters, res.duration_s, res.error))
        print(
            f"\nstream {i + 1}: {size} B x {iters}: {res.completed} completed in "
            f"{res.duration_s:.2f} s, {res.bytes_per_second / 1e6:.2f} MB/s, error {res.error}"
        )
    failed = [r for r in rows if r[4] is not None or r[1] != r[2]]
    assert not failed, failed
    # the streams did outlast the idle timeout: without the fix they would have failed
    assert sum(r[3] > IDLE_S for r in rows) >= 10, rows


@pytest.mark.parametrize("op", ["write", "send"])
def test_bw_under_loss_reports_goodput_and_retransmits(
    lane_hosts, short_idle_responder, op: str
) -> None:
    """`probe bw` with 1 % of h0's RoCE packets to h1 dropped (netem): RC resends, so the
    run completes, with a goodput below the clean run's and the port's retransmit
    counters moved (measured: 22-31 MB/s clean, 4.6-5.6 MB/s at 1 %, ~200 sequence errors)."""
    a, b = lane_hosts[0], lane_hosts[1]
    args = [f"{b.ip}:{PORT}", "--bind", a.ip, "--op", op, "--size", "64K", "--iters", "300"]
    args += ["--json"]
    runs = {}
    for loss in (None, "1%"):
        if loss:
            netem.impair(a.netdev, b.ip, loss=loss, udp_dport=netem.ROCE_V2_PORT)
        try:
            res = subprocess.run(
                [PROBE, "bw", *args], capture_output=True, text=True, timeout=300, check=False
            )
        finally:
            netem.clear(a.netdev)
        assert res.returncode == 0, res.stdout + res.stderr
        runs[loss] = json.loads(res.stdout)
        rdma, counters = runs[loss]["rdma"], runs[loss]["retransmit_counters"]
        print(f"\n{op}, loss {loss}: {rdma['bytes_per_second'] / 1e6:.2f} MB/s, {counters}")
        assert rdma["completed"] == 300 and rdma.get("error") is None
        assert counters["device"] == a.device
    clean, lossy = runs[None], runs["1%"]
    assert lossy["rdma"]["bytes_per_second"] < clean["rdma"]["bytes_per_second"]
    # ~19,200 packets of which 1 % dropped: the sender's NAKed sequence errors count them
    # (the emulated lane resends a few on a clean run too, by ACK timeout)
    seq = [r["retransmit_counters"]["deltas"]["rcvd_seq_err"] for r in (clean, lossy)]
    assert seq[1] >= 20 and seq[1] > seq[0], seq
