"""The first real RDMA test: an RC QP from host A's rxe device to host B's, 1,000 SENDs,
every payload checked, and the hw_counters deltas on both ends."""

from __future__ import annotations

import hashlib
import time

from fabricprobe.probes.rdma.verbs import RcEndpoint

MESSAGES = 1000
SIZE = 64
COUNTERS = ("sent_pkts", "rcvd_pkts", "rdma_sends", "rdma_recvs")


def payload(seq: int) -> bytes:
    return hashlib.blake2b(seq.to_bytes(4, "big"), digest_size=SIZE).digest()


def test_rc_send_recv_1000_verified(lane_hosts) -> None:
    a, b = lane_hosts[0], lane_hosts[1]
    before = {h.name: {c: h.hw_counter(c) for c in COUNTERS} for h in (a, b)}
    verified = 0
    with (
        RcEndpoint(a.device, SIZE, gid_index=a.gid_index) as qa,
        RcEndpoint(b.device, SIZE, gid_index=b.gid_index) as qb,
    ):
        qa.connect(qb.endpoint())
        qb.connect(qa.endpoint())
        send = qa.send_wr(SIZE)
        for seq in range(MESSAGES):
            deadline = time.monotonic() + 10
            qb.post_recv()
            qa.send_buf[:] = payload(seq)
            qa.post(send)
            qb.poll_or_raise(qb.recv_cq, 1, deadline)
            qa.poll_or_raise(qa.send_cq, 1, deadline)
            assert bytes(qb.recv_buf) == payload(seq), f"payload {seq} differs"
            verified += 1
    after = {h.name: {c: h.hw_counter(c) for c in COUNTERS} for h in (a, b)}
    delta = {h: {c: after[h][c] - before[h][c] for c in COUNTERS} for h in after}
    print(
        f"\n{a.name}({a.device}) -> {b.name}({b.device}): {verified} messages of {SIZE} B "
        f"sent and verified; hw_counters deltas {delta}"
    )
    assert verified == MESSAGES
    assert delta[a.name]["rdma_sends"] == MESSAGES
    assert delta[b.name]["rdma_recvs"] == MESSAGES
    assert delta[a.name]["sent_pkts"] >= MESSAGES
    # every request packet A sent arrived at B (no loss on the lane's bridge)
    assert delta[b.name]["rcvd_pkts"] == delta[a.name]["sent_pkts"]
    # and B's ACKs arrived at A
    assert delta[a.name]["rcvd_pkts"] == delta[b.name]["sent_pkts"] > 0
