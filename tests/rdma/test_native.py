"""The native RC engine end to end on soft-RoCE: two NativeRcEndpoints on two lane hosts,
driven from one process (the prober in this thread, the responder in another: each loop
runs in C with the GIL released). A peer that vanishes or never connects must end a
loop at its deadline with fewer iterations, never hang it."""

from __future__ import annotations

import statistics
import threading
import time
from array import array
from collections.abc import Callable, Iterator
from ipaddress import IPv4Address, IPv6Address
from typing import Any

import pytest

from fabricprobe.probes.rdma.native import CompletionError, NativeRcEndpoint, available

SIZE = 2
ITERS = 1000
STEP_S = 5.0
# Bandwidth runs use one-packet messages (the lane's path MTU). Multi-packet RDMA WRITEs
# with several in flight sometimes die with IBV_WC_REM_INV_REQ_ERR on the lane's rxe:
# packets reordered between the two vCPUs, then a retransmission the responder rejects;
# ib_write_bw -s 65536 fails the same way there. A one-packet message has no opcode
# sequence to break.
BW_SIZE, BW_OPS = 1024, 2000


@pytest.fixture(scope="module", autouse=True)
def _built() -> None:
    if not available():
        pytest.fail("the native engine is not built: run scripts/build-native.sh", pytrace=False)


class Background:
    """Run FN in a thread; `result()` joins with a timeout and re-raises its exception."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._value: Any = None
        self._error: BaseException | None = None

        def run() -> None:
            try:
                self._value = fn()
            except BaseException as err:
                self._error = err

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def result(self, timeout: float) -> Any:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"the background loop still runs after {timeout} s"
        if self._error is not None:
            raise self._error
        return self._value


def pair(lane_hosts: Any, size: int, remote_access: bool = False) -> Iterator[Any]:
    a, b = lane_hosts[0], lane_hosts[1]
    with (
        NativeRcEndpoint(a.device, size, 64, a.gid_index, remote_access, inline=size) as qa,
        NativeRcEndpoint(b.device, size, 64, b.gid_index, remote_access, inline=size) as qb,
    ):
        qa.connect(qb.endpoint())
        qb.connect(qa.endpoint())
        yield qa, qb


@pytest.fixture
def send_pair(lane_hosts: Any) -> Iterator[Any]:
    yield from pair(lane_hosts, SIZE)


@pytest.fixture
def write_pair(lane_hosts: Any) -> Iterator[Any]:
    yield from pair(lane_hosts, SIZE, remote_access=True)


@pytest.fixture
def bw_pair(lane_hosts: Any) -> Iterator[Any]:
    yield from pair(lane_hosts, BW_SIZE, remote_access=True)


def describe(name: str, rtts: array[int]) -> str:
    us = sorted(r / 1000 for r in rtts)
    return (
        f"{name}: {len(us)} RTTs, p50 {statistics.median(us):.1f} us "
        f"(one-way {statistics.median(us) / 2:.1f}), min {us[0]:.1f}, max {us[-1]:.1f}"
    )


def test_endpoint_describes_the_qp(send_pair: Any, lane_hosts: Any) -> None:
    qa, _ = send_pair
    ep = qa.endpoint()
    assert ep.qpn == qa.qpn > 0
    assert IPv6Address(ep.gid).ipv4_mapped == IPv4Address(lane_hosts[0].ip)
    assert ep.mtu in (256, 512, 1024, 2048, 4096)
    assert ep.gid_index == lane_hosts[0].gid_index


def test_send_pingpong_1000(send_pair: Any) -> None:
    qa, qb = send_pair
    rtts = array("q", bytes(8 * ITERS))
    responder = Background(lambda: qb.send_pingpong(SIZE, ITERS, False, STEP_S))
    done = qa.send_pingpong(SIZE, ITERS, True, STEP_S, rtts)
    assert responder.result(30) == ITERS
    assert done == ITERS
    assert min(rtts) > 0
    print("\n" + describe("native SEND ping-pong 2 B", rtts))


def test_write_pingpong_1000(write_pair: Any) -> None:
    qa, qb = write_pair
    rtts = array("q", bytes(8 * ITERS))
    responder = Background(lambda: qb.write_pingpong(qa.endpoint(), SIZE, ITERS, False, STEP_S))
    done = qa.write_pingpong(qb.endpoint(), SIZE, ITERS, True, STEP_S, rtts)
    assert responder.result(30) == ITERS
    assert done == ITERS
    assert min(rtts) > 0
    print("\n" + describe("native WRITE ping-pong 2 B", rtts))


def test_read_probe_needs_no_loop_on_the_peer(write_pair: Any) -> None:
    """1000 one-sided READs from the peer's region while the peer's side runs nothing at
    all (no loop, no thread): its NIC answers every one, and each READ brings back what
    the peer's region holds."""
    qa, qb = write_pair
    qb.recv_view()[:SIZE] = b"\x5a" * SIZE  # what the READs must bring back
    rtts, own = array("q", bytes(8 * ITERS)), array("q", bytes(8 * ITERS))
    assert qa.read_probe(qb.endpoint(), SIZE, ITERS, STEP_S, rtts, own) == ITERS
    assert bytes(qa.recv_view()[:SIZE]) == b"\x5a" * SIZE
    assert min(rtts) > 0 and all(0 <= o <= r for o, r in zip(own, rtts, strict=True))
    print("\n" + describe("native READ 2 B", rtts))


def test_write_bandwidth_completes_every_op(bw_pair: Any) -> None:
    qa, _ = bw_pair
    assert qa.endpoint().mtu >= BW_SIZE
    done, elapsed_ns = qa.bandwidth("write", BW_SIZE, BW_OPS, 16, STEP_S)
    assert done == BW_OPS
    assert elapsed_ns > 0
    print(f"\nnative WRITE bandwidth {BW_SIZE} B: {BW_OPS * BW_SIZE / elapsed_ns * 1e3:.1f} MB/s")


def test_send_bandwidth_every_send_received(bw_pair: Any) -> None:
    qa, qb = bw_pair
    receiver = Background(lambda: qb.bandwidth("send", BW_SIZE, BW_OPS, 16, STEP_S, first=False))
    done, elapsed_ns = qa.bandwidth("send", BW_SIZE, BW_OPS, 16, STEP_S)
    received, _ = receiver.result(30)
    assert done == received == BW_OPS
    print(f"\nnative SEND bandwidth {BW_SIZE} B: {BW_OPS * BW_SIZE / elapsed_ns * 1e3:.1f} MB/s")


def completed(loop: Callable[[], int]) -> int:
    """Iterations a loop finished, whether it returned at a deadline or raised."""
    try:
        return loop()
    except CompletionError as err:  # retries exhausted before the deadline
        assert err.status_name.startswith("IBV_WC_")
        return err.completed


def test_peer_never_connected_ends_at_deadline(lane_hosts: Any) -> None:
    a, b = lane_hosts[0], lane_hosts[1]
    with (
        NativeRcEndpoint(a.device, SIZE, 64, a.gid_index) as qa,
        NativeRcEndpoint(b.device, SIZE, 64, b.gid_index) as qb,
    ):
        qa.connect(qb.endpoint())  # qb stays in INIT: it drops what arrives
        t0 = time.monotonic()
        done = completed(lambda: qa.send_pingpong(SIZE, 100, True, 0.3))
        took = time.monotonic() - t0
    assert done == 0
    assert took < 5, f"the loop took {took:.1f} s to give up"


@pytest.mark.parametrize("op", ["send", "write"])
def test_peer_vanishes_mid_run(lane_hosts: Any, op: str) -> None:
    a, b = lane_hosts[0], lane_hosts[1]
    answered = 50
    qa = NativeRcEndpoint(a.device, SIZE, 64, a.gid_index, remote_access=True)
    qb = NativeRcEndpoint(b.device, SIZE, 64, b.gid_index, remote_access=True)
    with qa:
        qa.connect(qb.endpoint())
        qb.connect(qa.endpoint())

        def responder() -> int:
            with qb:  # answers 50 round trips, then its QP is gone
                if op == "send":
                    return qb.send_pingpong(SIZE, answered, False, STEP_S)
                return qb.write_pingpong(qa.endpoint(), SIZE, answered, False, STEP_S)

        peer = Background(responder)
        t0 = time.monotonic()
        if op == "send":
            done = completed(lambda: qa.send_pingpong(SIZE, 500, True, 0.5))
        else:
            done = completed(lambda: qa.write_pingpong(qb.endpoint(), SIZE, 500, True, 0.5))
        took = time.monotonic() - t0
        assert peer.result(30) == answered
    assert done == answered
    assert took < 10, f"the loop took {took:.1f} s to give up"


def test_close_stops_a_running_loop(lane_hosts: Any) -> None:
    a, b = lane_hosts[0], lane_hosts[1]
    with NativeRcEndpoint(b.device, SIZE, 64, b.gid_index) as qb:
        qa = NativeRcEndpoint(a.device, SIZE, 64, a.gid_index)
        qa.connect(qb.endpoint())  # nobody answers; the step deadline is far away
        loop = Background(lambda: qa.send_pingpong(SIZE, 100, True, 60.0))
        time.sleep(0.5)
        t0 = time.monotonic()
        qa.close()
        assert loop.result(10) == 0
        assert time.monotonic() - t0 < 5
        qa.close()  # idempotent
