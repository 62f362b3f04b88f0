"""RC and UD probes between lane hosts, against a real `probe serve` process."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator

import pytest

from fabricprobe.agent.probing import Links, ProbeSpec
from fabricprobe.cli import netem
from fabricprobe.core.errors import PeerError
from fabricprobe.probes.control import ControlClient, LinkStale
from fabricprobe.probes.measure import LatencyResult, LinkParams
from fabricprobe.probes.rdma.rc import RcPingLink, rc_bandwidth, rc_latency
from fabricprobe.probes.rdma.ud import UdEndpoint, UdLink
from tests.rdma.conftest import rdma_resources, start_responder
from tests.support.ud import ud_probe

PORT = 4793


@pytest.fixture(scope="module")
def responder(lane_hosts) -> Iterator[None]:
    proc = start_responder(lane_hosts, PORT)
    yield
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


@pytest.mark.parametrize("op", ["send", "write", "read"])
def test_rc_latency_counts_every_round_trip(lane_hosts, responder, op: str) -> None:
    a, b = lane_hosts[0], lane_hosts[1]
    res = rc_latency(LinkParams(b.ip, PORT, bind=a.ip), op=op, size=2, iters=300, warmup=20)
    print(f"\nRC {op} {a.name}->{b.name}: {res.summary}")
    assert res.error is None and res.device == a.device
    assert res.summary.count == 300 and res.summary.lost == 0
    assert 0 < res.summary.min_us <= res.summary.p50_us <= res.summary.max_us


# One-packet messages (the lane's path MTU is 1024): on 6.1's rxe, multi-packet
# operations retransmitted under emulation load sometimes end in an error completion
# (IBV_WC_REM_INV_REQ_ERR, LOC_QP_OP_ERR); ib_write_bw -s 65536 fails the same way there.
@pytest.mark.parametrize(("op", "size", "outstanding"), [("write", 1024, 16), ("send", 1024, 16)])
def test_rc_bandwidth_completes_every_operation(
    lane_hosts, responder, op: str, size: int, outstanding: int
) -> None:
    a, c = lane_hosts[0], lane_hosts[2]
    res = rc_bandwidth(
        LinkParams(c.ip, PORT, bind=a.ip), op=op, size=size, iters=200, outstanding=outstanding
    )
    print(f"\nRC {op} bandwidth {a.name}->{c.name}: {res.bytes_per_second / 1e6:.2f} MB/s")
    assert res.error is None and res.completed == 200 and res.bytes_per_second > 0


@pytest.mark.parametrize("engine", ["pyverbs", "native"])
def test_ud_probe_subtracts_the_responder_delay(lane_hosts, responder, engine: str) -> None:
    a, c = lane_hosts[0], lane_hosts[2]
    res = ud_probe(LinkParams(c.ip, PORT, bind=a.ip, engine=engine), probes=200)
    d = res.as_dict()
    print(
        f"\nUD {engine} {a.name}->{c.name}: network RTT p50 {d['rtt']['p50_us']} us, "
        f"with responder delay {d['rtt_with_responder_delay']['p50_us']} us, delay p50 "
        f"{d['responder_delay_p50_us']} us, timestamps {d['timestamps']}"
    )
    assert res.error is None
    assert res.summary.count + res.summary.lost == 200 and res.summary.count >= 190
    assert res.responder_delay_p50_us is not None and res.responder_delay_p50_us > 0
    # the means, exact sums: on a loaded lane RTTs of milliseconds put both p50s in one
    # HDR slot (1 %), wider than a responder delay of tens of µs
    assert res.summary.mean_us < res.raw_summary.mean_us
    assert d["timestamps"] == "software" and d["engine"] == engine
    assert d["engine_reason"].startswith(f"{engine}: ")


def test_the_responder_is_no_ud_reflector(lane_hosts, responder) -> None:
    """A prober on A asks B's responder to answer a UD QP on C: B refuses before it
    sends anything, and C's QP receives no ACK."""
    a, b, c = lane_hosts[0], lane_hosts[1], lane_hosts[2]
    with UdEndpoint(c.device, c.gid_index) as victim:
        third = victim.endpoint().as_dict()
        with ControlClient(b.ip, PORT, bind=a.ip, timeout=30) as ctl:
            with pytest.raises(PeerError, match="is not the address that asked"):
                ctl.open("rdma_ud", {"probes": 100, "step_s": 0.5, "endpoint": third})
        assert victim.receive(time.monotonic() + 1.0) is None


@pytest.mark.parametrize("engine", ["pyverbs", "native"])
def test_a_peer_that_vanishes_mid_run_gives_a_result_with_loss(lane_hosts, engine: str) -> None:
    a, b = lane_hosts[0], lane_hosts[1]
    proc = start_responder(lane_hosts, PORT + 1)
    qps_before = sum(d["qp"] for d in rdma_resources().values())
    iters = 1_000_000
    result = {}

    def run() -> None:
        result["res"] = rc_latency(
            LinkParams(b.ip, PORT + 1, bind=a.ip, step_s=2.0, engine=engine),
            op="send",
            size=2,
            iters=iters,
            warmup=0,
        )

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 180  # both QPs exist: the ping-pong is starting
    while sum(d["qp"] for d in rdma_resources().values()) < qps_before + 2:
        assert time.monotonic() < deadline, "the probe never got going"
        time.sleep(0.5)
    time.sleep(3)
    proc.kill()
    proc.wait()
    t0 = time.monotonic()
    t.join(timeout=60)
    assert not t.is_alive(), "the probe hung after its peer vanished"
    res = result["res"]
    print(
        f"\nvanished peer ({engine}): {res.summary.count} done, {res.summary.lost} lost, "
        f"ended {time.monotonic() - t0:.1f} s after the kill: {res.error}"
    )
    assert res.error is not None and res.summary.count > 0 and res.summary.lost > 0
    assert res.summary.count + res.summary.lost == iters
    after = sum(d["qp"] for d in rdma_resources().values())
    assert after == qps_before, "a QP outlived the run"


def qps() -> int:
    return sum(d["qp"] for d in rdma_resources().values())


def settle_qps(want: int, limit: float = 30.0) -> int:
    """QPs in the VM once the responder has ended sessions whose prober closed its end."""
    end = time.monotonic() + limit
    while (n := qps()) != want and time.monotonic() < end:
        time.sleep(0.2)
    return n


@pytest.mark.parametrize(
    "kind", ["rc pyverbs", "rc native", "read pyverbs", "read native", "ud pyverbs", "ud native"]
)
def test_a_kept_link_carries_rounds_over_one_qp_on_each_end(
    lane_hosts, responder, kind: str
) -> None:
    a, b = lane_hosts[0], lane_hosts[1]
    before = qps()
    link: RcPingLink | UdLink
    engine = kind.split()[1]
    if kind.startswith("ud"):
        link = UdLink(LinkParams(b.ip, PORT, bind=a.ip, engine=engine), keepalive_s=30)
    else:
        op = "read" if kind.startswith("read") else "send"
        params = LinkParams(b.ip, PORT, bind=a.ip, engine=engine)
        link = RcPingLink(params, op=op, size=64, keepalive_s=30)
    counts, errors, during = [], [], set()
    t0 = time.monotonic()
    with link:
        for _ in range(20):
            res = link.run(10, warmup=1)
            counts.append(res.summary.count + res.summary.lost)
            errors.append(res.error)
            during.add(qps())
    print(f"\n{kind} link: 20 rounds of 10 in {time.monotonic() - t0:.1f} s, QPs {during}")
    assert errors == [None] * 20 and counts == [10] * 20
    assert link.rounds == 20 and during == {before + 2}  # one QP each end, all along
    assert settle_qps(before) == before


def test_a_write_link_is_one_round_only(lane_hosts, responder) -> None:
    b = lane_hosts[1]
    with pytest.raises(ValueError, match="WRITE ping-pong links carry one round"):
        RcPingLink(LinkParams(b.ip, PORT), op="write", keepalive_s=30)


def test_a_link_whose_responder_restarted_is_set_up_again_in_the_same_burst(
    lane_hosts,
) -> None:
    a, b = lane_hosts[0], lane_hosts[1]
    port = PORT + 2
    links = Links()
    spec = ProbeSpec("h1", b.ip, port, "rdma_rc_lat", 64, 10, 10.0)
    opened: list[RcPingLink] = []

    def new() -> RcPingLink:
        opened.append(RcPingLink(LinkParams(b.ip, port, bind=a.ip), size=64, keepalive_s=30))
        return opened[-1]

    def burst(link: RcPingLink):
        return link.run(10, warmup=1)

    def restart(proc):
        proc.send_signal(signal.SIGTERM)  # idle links are let go at once
        assert proc.wait(timeout=30) == 0
        return start_responder(lane_hosts, port)

    proc = start_responder(lane_hosts, port)
    try:
        assert links.burst(spec, new, burst).error is None
        proc = restart(proc)
        res = links.burst(spec, new, burst)  # stale inside, set up again in the same burst
        assert res.error is None and res.summary.count == 10
        assert len(opened) == 1 and opened[0].rounds == 2
        proc = restart(proc)
        with pytest.raises(LinkStale):  # the link notices before any round starts
            opened[0].run(10)
        assert opened[0].run(10, warmup=1).error is None and opened[0].rounds == 3
    finally:
        links.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def _wait_out_four_lost(link: UdLink, a, c) -> tuple[LatencyResult, float, float]:
    """Four probes over LINK with every RoCE packet from A to C dropped (TCP still
    passes, so the kept link stays up): the result, and the CPU and wall seconds (the
    CPU printed, never held to a bound: it is the whole process's, and a figure of
    speed belongs in a benchmark, bench/rdma_burst_cost.py)."""
    netem.impair(a.netdev, c.ip, loss="100%", udp_dport=netem.ROCE_V2_PORT)
    try:
        c0, t0 = time.process_time(), time.monotonic()
        res = link.run(4, warmup=0)
        return res, time.process_time() - c0, time.monotonic() - t0
    finally:
        netem.clear(a.netdev)


@pytest.mark.parametrize("engine", ["pyverbs", "native"])
def test_waiting_out_lost_probes_pauses_between_polls(lane_hosts, responder, engine: str) -> None:
    """Every RoCE packet on the path dropped (TCP still passes, so the kept link stays
    up): each probe is waited out to its deadline and counted lost, and the kept link
    outlives the loss."""
    a, c = lane_hosts[0], lane_hosts[2]
    there = LinkParams(c.ip, PORT, bind=a.ip, engine=engine, step_s=0.5)
    with UdLink(there, keepalive_s=30) as link:
        assert link.run(3).error is None
        res, cpu, wall = _wait_out_four_lost(link, a, c)
        after = link.run(3)
    print(f"\n{engine}: 4 lost probes waited out in {wall:.2f} s with {cpu:.2f} s of CPU")
    assert (res.summary.count, res.summary.lost, res.error) == (0, 4, None)
    assert wall >= 4 * 0.5
    assert after.error is None and after.summary.count == 3  # the link outlived the loss


def test_loops_that_sleep_on_completion_events_answer_every_probe(lane_hosts, responder) -> None:
    """With no busy-poll at all (spin_s 0), the compiled loops sleep on the receive CQ's
    completion event from the first empty poll: every UD probe and RC SEND ping-pong is
    answered, each RTT still holds the prober's delay, and a round waits out its lost
    probes to their deadlines."""
    a, c = lane_hosts[0], lane_hosts[2]
    asleep = LinkParams(c.ip, PORT, bind=a.ip, engine="native", step_s=0.5, spin_s=0.0)
    rc = rc_latency(asleep, op="send", size=64, iters=200, warmup=5)
    assert rc.error is None and rc.summary.count == 200 and rc.summary.lost == 0
    with UdLink(asleep, keepalive_s=30) as link:
        r = link.round(100, warmup=1)
        assert r.error is None and len(r.rtt_ns) == 100 and r.lost == 0
        assert all(0 <= p <= w for p, w in zip(r.prober_ns, r.raw_ns, strict=True))
        res, cpu, wall = _wait_out_four_lost(link, a, c)
    rtts = sorted(r.rtt_ns)
    print(
        f"\nasleep: RC SEND 64 B p50 {rc.summary.p50_us:.1f} us; UD p50 "
        f"{rtts[50] / 1e3:.1f} us; 4 lost probes waited out in {wall:.2f} s with {cpu:.3f} s"
        " of CPU"
    )
    assert (res.summary.count, res.summary.lost, res.error) == (0, 4, None)
    assert wall >= 4 * 0.5


def test_a_delay_on_the_path_lifts_a_read_by_at_least_the_delay(lane_hosts, responder) -> None:
    """One-sided READs through the responder: a delay on the path lifts each READ's RTT
    by at least the delay (the peer's NIC answers; nothing of the peer's host is in it)."""
    a, b = lane_hosts[0], lane_hosts[1]
    link = LinkParams(b.ip, PORT, bind=a.ip, engine="native")
    read = rc_latency(link, op="read", size=64, iters=300, warmup=10)
    netem.impair(a.netdev, b.ip, delay="2ms")
    try:
        delayed = rc_latency(link, op="read", size=64, iters=100, warmup=5)
    finally:
        netem.clear(a.netdev)
    r, d = read.summary.p50_us, delayed.summary.p50_us
    print(f"\n64 B READ p50 {r:.1f} us, with 2 ms {d:.1f} us")
    for res in (read, delayed):
        assert res.error is None and res.summary.lost == 0
    assert delayed.summary.min_us >= 2000 + read.summary.min_us
