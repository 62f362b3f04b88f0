"""The UD prober's own delay on its way from a burst to the join: the agent's window
carries it as a `prober_delay` sketch, the collector's store holds it to what it can be
and keeps the newest window's p50, the history hands it to the join, and the join takes
a path's own prober delay as its prober end's host delay (the reference otherwise), so
that a UD window whose prober delay dominates its median or its tail comes back
host-bound."""

from __future__ import annotations

import pytest

from fabricprobe.agent.probing import ProbeOutcome, ProbeSpec
from fabricprobe.agent.window import WindowAggregator
from fabricprobe.collector.attribution.join import join_fabric, stages_frame
from fabricprobe.collector.history import FabricHistory, FabricWindow, rates_frame, windows_frame
from fabricprobe.collector.store import ReportError, WindowStore
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.sketchwire import from_wire, to_wire
from fabricprobe.core.stats import LatencySketch
from tests.unit.test_collector_store import Clock, S
from tests.unit.test_host_delay import ref, transfers

US = 1e-6


def _sketch(kind: str, values: list[int], lost: int = 0) -> pb.Sketch:
    sk = LatencySketch(kind)  # type: ignore[arg-type]
    sk.record_many(values)
    sk.record_lost(lost)
    return to_wire(sk)


def test_the_agents_window_carries_the_probers_delay_of_ud_bursts_only() -> None:
    agg = WindowAggregator()
    ud = ProbeSpec("b", "10.0.0.2", 4793, "rdma_ud", 20, 3, 10.0)
    tcp = ProbeSpec("b", "10.0.0.2", 4793, "tcp_lat", 64, 2, 10.0)
    agg.add(ud, ProbeOutcome("rdma", "ud", rtt_ns=[90_000, 95_000], prober_ns=[4_000, 6_000]))
    agg.add(ud, ProbeOutcome("rdma", "ud", rtt_ns=[91_000], prober_ns=[5_000], lost=1))
    agg.add(tcp, ProbeOutcome("tcp", "pingpong", rtt_ns=[30_000, 31_000]))
    by_op = {w.op: w for w in agg.cut()}
    d = from_wire(by_op["ud"].prober_delay)
    assert (d.kind, d.count, d.lost, d.min_ns, d.max_ns) == ("delay", 3, 0, 4_000, 6_000)
    assert from_wire(by_op["ud"].rtt).count == 3 and from_wire(by_op["ud"].rtt).lost == 1
    assert not by_op["pingpong"].HasField("prober_delay")


def _ud_report(seq: int, rtts: list[int], prober: pb.Sketch | None, transport: str = "rdma"):
    r = pb.WindowReport(
        host="a", epoch=1, seq=seq, window_start_unix_ns=(seq - 1) * 10 * S,
        window_end_unix_ns=seq * 10 * S,
    )  # fmt: skip
    w = r.probes.add(dst="b", transport=transport, op="ud", size=20, rtt=_sketch("rtt", rtts))
    if prober is not None:
        w.prober_delay.CopyFrom(prober)
    return r


@pytest.fixture
def store() -> WindowStore:
    s = WindowStore(clock=Clock())
    s.register(pb.HostInfo(host="a"))
    return s


def test_the_store_keeps_the_newest_windows_prober_delay_p50(store: WindowStore) -> None:
    history = FabricHistory(first_window_s=10)
    store.listeners.append(history)
    history.watch({("a", "b")})
    store.take(_ud_report(1, [100_000] * 3, _sketch("delay", [5_000, 6_000, 40_000])))
    path = store.paths[("a", "b", "rdma", "ud", 20)]
    assert path.last_prober_delay_ns == pytest.approx(6_000, rel=0.01)  # 2 HDR digits
    store.take(_ud_report(2, [100_000] * 2, None))  # a window without one: none held
    assert path.last_prober_delay_ns is None
    history.drain(now_ns=30 * S)
    first, second = history.windows
    assert first.prober_delay_min_s == 5e-6 and first.prober_delay_p50_s == pytest.approx(
        6e-6, rel=0.01
    )
    assert first.prober_delay_p99_s == pytest.approx(40e-6, rel=0.01)
    assert second.prober_delay_p50_s is None and second.rtt_p50_s is not None


@pytest.mark.parametrize(
    ("transport", "prober", "why"),
    [
        ("tcp", _sketch("delay", [5_000]), "RDMA window"),
        ("rdma", _sketch("rtt", [5_000]), "of kind"),
        ("rdma", _sketch("delay", [5_000], lost=1), "without loss"),
        ("rdma", _sketch("delay", [5_000] * 4), "4 prober delays for 3 RTTs"),
        ("rdma", pb.Sketch(kind="delay", count=2, slots=[1], counts=[1]), "do not add up"),
    ],
)
def test_a_prober_delay_it_cannot_be_refuses_the_report(
    store: WindowStore, transport: str, prober: pb.Sketch, why: str
) -> None:
    with pytest.raises(ReportError, match=why):
        store.take(_ud_report(1, [100_000] * 3, prober, transport))
    assert store.rejected_total == 1 and not store.paths


def test_an_rtt_sketch_of_kind_delay_is_refused(store: WindowStore) -> None:
    r = _ud_report(1, [100_000], None)
    r.probes[0].rtt.kind = "delay"
    with pytest.raises(ReportError, match="RTT sketch of kind delay"):
        store.take(r)


def ud(start: int, end: int, lo_us: float, p50_us: float, p99_us: float, own: tuple | None):
    """A UD window a -> b; OWN: the prober's delay (min, p50, p99) in µs, or None."""
    d = (None, None, None) if own is None else tuple(v * US for v in own)
    return FabricWindow(
        "a", "b", "rdma", "ud", 20, start, end, lo_us * US, p50_us * US, p99_us * US, 0.0, 50, *d
    )


def _join(windows: list[FabricWindow]):
    st = stages_frame(transfers("a", "b", 0.030))
    out = join_fabric(st, windows_frame(windows), rates_frame([]), slack_s=0.0)
    return out.iloc[0]


QUIET_OWN = (3, 4, 8)  # µs: a poll's gap, as on a quiet lane


def test_a_ud_window_whose_prober_delay_dominates_is_host_bound() -> None:
    # both hosts' references stay quiet: only the path's own prober delay sees the stall
    refs = [ref(h, s * S, e * S, 30, 35) for h in "ab" for s, e in ((0, 10), (10, 30))]
    quiet = ud(0, 10 * S, 80, 90, 120, QUIET_OWN)
    busy = ud(10 * S, 30 * S, 85, 1090, 3000, (3, 1000, 2900))  # the prober waited ~1 ms
    row = _join([*refs, quiet, busy])
    # the prober end: its own delay beyond the path's quietest (1000 - 3 µs); the
    # responder end: half of b's reference beyond its floor (5 / 2 µs)
    assert row["host_delay_s"] == pytest.approx((997 + 2.5) * US)
    assert row["host_bound"] == 1.0
    assert row["rtt_p50_net_s"] == pytest.approx(90.5 * US)  # 1090 - 999.5
    # without the prober's own figure the quiet references would call it the network's
    row = _join([*refs, quiet, ud(10 * S, 30 * S, 85, 1090, 3000, None)])
    assert row["host_delay_s"] == pytest.approx(5 * US) and row["host_bound"] == 0.0


def test_a_window_whose_tail_is_the_probers_delay_is_host_bound() -> None:
    # a prober spinning on a shared CPU: its median exchange is the path's, and now and
    # then it loses a slice (the p99 rises by 3 ms, its own delay's p99 with it)
    refs = [ref(h, s * S, e * S, 30, 35) for h in "ab" for s, e in ((0, 10), (10, 30))]
    quiet = ud(0, 10 * S, 80, 90, 120, QUIET_OWN)
    row = _join([*refs, quiet, ud(10 * S, 30 * S, 80, 95, 3080, (3, 4, 2900))])
    assert row["host_delay_s"] == pytest.approx((4 - 3 + 2.5) * US)  # the median's figure
    assert row["host_bound"] == 1.0  # 2897 µs of the tail's 3000 µs rise
    # the same tail with a prober that saw every answer at once is the path's own
    row = _join([*refs, quiet, ud(10 * S, 30 * S, 80, 95, 3080, (3, 4, 9))])
    assert row["host_bound"] == 0.0


def test_a_ud_path_the_network_delays_is_not_host_bound() -> None:
    # the floor rises by 1 ms (netem); the prober delay stays at a poll's gap
    refs = [ref(h, s * S, e * S, 30, 35) for h in "ab" for s, e in ((0, 10), (10, 30))]
    row = _join([*refs, ud(0, 10 * S, 80, 90, 120, QUIET_OWN), ud(10 * S, 30 * S, 1080, 1090,
                 1120, QUIET_OWN)])  # fmt: skip
    assert row["host_delay_s"] == pytest.approx((4 - 3 + 2.5) * US)
    assert row["host_bound"] == 0.0


def test_the_prober_delay_stands_in_for_the_probers_reference_only() -> None:
    # a's reference is busy (2 ms) but the path's own prober delay is quiet: the path's
    # own figure wins for the prober end; b's reference still counts for the responder
    refs = [ref("a", 0, 10 * S, 30, 35), ref("a", 10 * S, 30 * S, 30, 2000)]
    refs += [ref("b", 0, 10 * S, 30, 35), ref("b", 10 * S, 30 * S, 30, 1035)]
    row = _join([*refs, ud(0, 10 * S, 80, 90, 120, QUIET_OWN), ud(10 * S, 30 * S, 80, 600,
                 900, QUIET_OWN)])  # fmt: skip
    assert row["host_delay_s"] == pytest.approx((4 - 3 + 1005 / 2) * US)
    assert row["host_bound"] == 1.0  # 503.5 µs of the 520 µs rise, nearly all b's


def test_a_transfer_of_no_named_transport_takes_the_paths_prober_delay_too() -> None:
    refs = [ref(h, s * S, e * S, 30, 35) for h in "ab" for s, e in ((0, 10), (10, 30))]
    tcp = FabricWindow("a", "b", "tcp", "pingpong", 64, 10 * S, 30 * S, 40e-6, 50e-6, 90e-6, 0.0, 9)
    ws = [*refs, tcp, ud(0, 10 * S, 80, 90, 120, QUIET_OWN)]
    ws.append(ud(10 * S, 30 * S, 85, 1090, 3000, (3, 1000, 2900)))
    st = stages_frame(transfers("a", "b", 0.030)).assign(transport="")
    row = join_fabric(st, windows_frame(ws), rates_frame([]), slack_s=0.0).iloc[0]
    assert row["host_delay_s"] == pytest.approx((997 + 2.5) * US)
