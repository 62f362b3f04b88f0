"""FabricHistory listening to the window store: rows for what reports brought."""

from __future__ import annotations

from fabricprobe.collector.history import FabricHistory
from fabricprobe.collector.store import WindowStore
from fabricprobe.core.api import fabricprobe_pb2 as pb
from tests.unit.test_collector_store import Clock, S, report


def listening(inbox: int = 1000) -> tuple[WindowStore, FabricHistory]:
    store = WindowStore(clock=Clock())
    store.register(pb.HostInfo(host="a"))
    history = FabricHistory(first_window_s=10, inbox=inbox)
    store.listeners.append(history)
    history.watch({("a", "b"), ("c", "a")})
    return store, history


def test_each_newer_window_becomes_one_row() -> None:
    store, history = listening()
    store.take(report("a", 1, 10, probes=[("b", [10_000, 20_000, 30_000], 1)]))
    store.take(report("a", 2, 20, probes=[("b", [50_000], 0), ("c", [7_000], 0)]))
    store.take(report("a", 3, 5, probes=[("b", [90_000], 0)]))  # replayed, older: no row
    store.take(report("a", 2, 20, probes=[("b", [50_000], 0)]))  # duplicate: not taken
    assert history.windows == type(history.windows)()  # nothing before drain()
    assert history.drain(now_ns=30 * S) == 3
    rows = [(w.dst, w.start_ns // S, w.end_ns // S) for w in history.windows]
    assert rows == [("b", 0, 10), ("b", 10, 20), ("c", 10, 20)]
    first = history.windows[0]
    assert first.samples == 3 and first.loss_ratio == 0.25
    assert first.rtt_min_s == 10e-6 and first.rtt_p50_s is not None
    assert 19.9e-6 <= first.rtt_p50_s <= 20.1e-6 and first.rtt_p99_s == 30e-6
    assert history.drain(now_ns=30 * S) == 0  # drained once


def test_only_explanatory_counters_become_rates() -> None:
    store, history = listening()
    names = [("np_ecn_marked_roce_packets", 10, 64), ("port_rcv_data", 1000, 64)]
    store.take(report("a", 1, 10, counters=names))  # first readings: no rate yet
    more = [("np_ecn_marked_roce_packets", 30, 64), ("port_rcv_data", 5000, 64)]
    store.take(report("a", 2, 20, counters=more))
    assert history.drain(now_ns=30 * S) == 1
    (rate,) = history.rates
    assert (rate.category, rate.name, rate.device, rate.rate) == (
        "ecn_mark",
        "np_ecn_marked_roce_packets",
        "mlx5_0",
        2.0,
    )


def test_a_full_inbox_drops_the_oldest_and_counts_it() -> None:
    store, history = listening(inbox=2)
    for seq in range(1, 5):
        store.take(report("a", seq, 10 * seq, probes=[("b", [1_000], 0)]))
    assert history.inbox_dropped == 2
    assert history.drain(now_ns=50 * S) == 2
    assert [w.end_ns // S for w in history.windows] == [30, 40]


def test_rows_older_than_keep_are_trimmed() -> None:
    store, history = listening()
    history.keep_ns = 15 * S
    store.take(report("a", 1, 10, probes=[("b", [1_000], 0)]))
    store.take(report("a", 2, 20, probes=[("b", [1_000], 0)]))
    history.drain(now_ns=30 * S)
    assert [w.end_ns // S for w in history.windows] == [20]


def test_only_watched_pairs_and_hosts_are_kept() -> None:
    store = WindowStore(clock=Clock())
    for h in ("a", "z"):
        store.register(pb.HostInfo(host=h))
    history = FabricHistory(first_window_s=10)
    store.listeners.append(history)
    store.take(report("a", 1, 10, probes=[("b", [1_000], 0)]))  # nobody asked yet
    history.watch({("b", "a")}, store)  # a KV transfer b -> a: the path a -> b counts too
    store.take(report("a", 2, 20, probes=[("b", [2_000], 0), ("c", [3_000], 0)]))
    ecn = [("np_ecn_marked_roce_packets", 1, 64)]
    store.take(report("z", 1, 10, counters=ecn))
    store.take(report("z", 2, 20, counters=[("np_ecn_marked_roce_packets", 9, 64)]))
    history.drain(now_ns=30 * S)
    # the window a -> b that came before watch() is taken from the store's newest
    assert [(w.dst, w.end_ns // S) for w in history.windows] == [("b", 10), ("b", 20)]
    assert not history.rates  # z carries no watched path
    history.watch({("a", "b")}, store)  # already watched: nothing taken twice
    assert history.drain(now_ns=30 * S) == 0
