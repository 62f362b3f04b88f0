"""WindowStore: merging per path, duplicates, counter wraps and resets, staleness."""

from __future__ import annotations

import pytest

from fabricprobe.collector.store import ReportError, WindowStore
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.sketchwire import to_wire
from fabricprobe.core.stats import LatencySketch

S = 1_000_000_000


class Clock:
    def __init__(self) -> None:
        self.now = 1_000 * S

    def __call__(self) -> int:
        return self.now


def sketch(*rtts_ns: int, lost: int = 0) -> pb.Sketch:
    s = LatencySketch("rtt")
    s.record_many(list(rtts_ns))
    s.record_lost(lost)
    return to_wire(s)


def report(host: str, seq: int, end_s: int, *, epoch: int = 1, **kw: object) -> pb.WindowReport:
    r = pb.WindowReport(
        host=host,
        epoch=epoch,
        seq=seq,
        window_start_unix_ns=(end_s - 10) * S,
        window_end_unix_ns=end_s * S,
    )
    for dst, rtts, lost in kw.get("probes", []):  # type: ignore[attr-defined]
        r.probes.add(dst=dst, transport="tcp", op="pingpong", size=64, rtt=sketch(*rtts, lost=lost))
    for name, value, width in kw.get("counters", []):  # type: ignore[attr-defined]
        r.counters.add(
            kind="rdma", device="mlx5_0", port=1, priority=-1, name=name, value=value, width=width
        )
    return r


@pytest.fixture
def store() -> WindowStore:
    s = WindowStore(stale_after=30, forget_after=100, clock=Clock())
    s.register(pb.HostInfo(host="a"))
    return s


def test_windows_merge_per_path_and_duplicates_are_dropped(store: WindowStore) -> None:
    store.take(report("a", 1, 10, probes=[("b", [10_000, 20_000], 1)]))
    store.take(report("a", 2, 20, probes=[("b", [30_000], 0)]))
    dup = store.take(report("a", 2, 20, probes=[("b", [30_000], 0)]))
    assert dup.duplicate
    path = store.paths[("a", "b", "tcp", "pingpong", 64)]
    assert path.rtt.count == 3 and path.rtt.lost == 1 and path.windows == 2
    assert store.duplicates_total == 1 and store.reports_total == 2
    # a new agent lifetime starts seq again at 1 and is not a duplicate
    assert not store.take(report("a", 1, 30, epoch=2)).duplicate
    assert store.seqs_taken("a") == {1: {1, 2}, 2: {1}}


def test_out_of_order_replay_is_taken_once(store: WindowStore) -> None:
    for seq in (3, 1, 2, 3, 1):
        store.take(report("a", seq, 10 * seq))
    assert store.reports_total == 3 and store.duplicates_total == 2


def test_counter_total_survives_32bit_wrap_and_reset(store: WindowStore) -> None:
    store.take(report("a", 1, 10, counters=[("out_of_buffer", 2**32 - 100, 32)]))
    store.take(report("a", 2, 20, counters=[("out_of_buffer", 50, 32)]))  # wrapped: +150
    track = store.counters[("a", "rdma", "mlx5_0", 1, "", -1, "out_of_buffer")]
    assert track.total == 150 and track.wraps == 1 and track.rate == pytest.approx(15.0)
    store.take(report("a", 3, 30, counters=[("out_of_buffer", 2**31, 64)]))
    store.take(report("a", 4, 40, counters=[("out_of_buffer", 7, 64)]))  # reset: +7
    assert track.resets == 1 and track.total == 150 + 2**31 - 50 + 7
    # an older window replayed later does not move the total
    store.take(report("a", 9, 5, counters=[("out_of_buffer", 0, 64)]))
    assert track.total == 150 + 2**31 - 50 + 7


def test_bad_reports_are_refused_whole(store: WindowStore) -> None:
    bad = report("a", 1, 10, probes=[("b", [1], 0)])
    bad.probes[0].rtt.counts.append(1)  # one count more than slots
    with pytest.raises(ReportError, match="malformed"):
        store.take(bad)
    with pytest.raises(ReportError, match="not registered"):
        store.take(report("zz", 1, 10))
    with pytest.raises(ReportError, match="seq"):
        store.take(report("a", 0, 10))
    assert store.reports_total == 0 and not store.paths
    assert store.rejected_total == 3


def test_hosts_go_stale_then_are_forgotten(store: WindowStore) -> None:
    clock = store.clock
    assert isinstance(clock, Clock)
    store.take(report("a", 1, 10, probes=[("b", [5], 0)]))
    assert [h.info.host for h in store.live_hosts()] == ["a"]
    clock.now += 31 * S
    assert store.live_hosts() == []
    assert store.forget_idle() == []
    clock.now += 100 * S
    assert store.forget_idle() == ["a"] and not store.paths


def test_rate_of_a_counter_absent_from_the_newest_window_is_zero(store: WindowStore) -> None:
    from prometheus_client import CollectorRegistry

    from fabricprobe.collector.exporter import FabricCollector

    store.take(report("a", 1, 10, counters=[("rcvd_pkts", 100, 64)]))
    store.take(report("a", 2, 20, counters=[("rcvd_pkts", 300, 64)]))
    reg = CollectorRegistry()
    reg.register(FabricCollector(store))
    labels = {"src": "a", "device": "mlx5_0", "port": "1", "counter": "rcvd_pkts"}
    assert reg.get_sample_value("fabricprobe_rdma_port_stat_per_second", labels) == 20.0
    store.take(report("a", 3, 30))  # unchanged: the agent left it out
    assert reg.get_sample_value("fabricprobe_rdma_port_stat_per_second", labels) == 0.0
    assert reg.get_sample_value("fabricprobe_rdma_port_stat_total", labels) == 200.0


def test_a_snapshot_is_not_changed_by_later_reports(store: WindowStore) -> None:
    store.take(report("a", 1, 10, probes=[("b", [10_000], 0)], counters=[("rx", 5, 64)]))
    store.take(report("a", 2, 20, probes=[("b", [20_000], 0)], counters=[("rx", 9, 64)]))
    snap = store.snapshot(chunk=1)
    store.take(report("a", 3, 30, probes=[("b", [30_000], 0)], counters=[("rx", 20, 64)]))
    path = snap.paths[("a", "b", "tcp", "pingpong", 64)]
    assert path.rtt.count == 2 and path.rtt.max_ns == 20_000 and path.windows == 2
    (track,) = snap.counters.values()
    assert track.total == 4 and track.last_value == 9
    live = store.paths[("a", "b", "tcp", "pingpong", 64)]
    assert live.rtt.count == 3 and live.windows == 3
