"""The attribution's fabric feed: which host pairs' history is kept for the join, and
each path's bandwidth, over a real window store."""

from __future__ import annotations

from fabricprobe.collector.attribution.fabric import FabricFeed
from fabricprobe.collector.store import WindowStore
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.sketchwire import to_wire
from fabricprobe.core.stats import LatencySketch

S = 1_000_000_000
NOW = 1_000 * S


def store_of(*hosts: str) -> WindowStore:
    store = WindowStore(clock=lambda: NOW)
    for h in hosts:
        store.register(pb.HostInfo(host=h))
    return store


def probe(store: WindowStore, src: str, dst: str, seq: int, *, bandwidth: float = 0.0) -> None:
    sk = LatencySketch()
    sk.record_many([100_000] * 10)
    r = pb.WindowReport(
        host=src, epoch=1, seq=seq, window_start_unix_ns=NOW - 2 * S, window_end_unix_ns=NOW - S
    )
    r.probes.add(dst=dst, transport="tcp", op="pingpong", size=64, rtt=to_wire(sk))
    if bandwidth:
        r.probes.add(
            dst=dst, transport="tcp", op="stream", size=4096, bytes_moved=int(bandwidth),
            busy_seconds=1.0,
        )  # fmt: skip
    store.take(r)


def test_pairs_are_watched_in_one_order_when_an_end_is_an_agent() -> None:
    store = store_of("a", "b")
    feed = FabricFeed(store, keep_s=3600.0)
    feed.watch({("b", "a"), ("ghost", "spirit"), ("a", "elsewhere")}, named=True)
    assert feed.pairs() == [("a", "b"), ("a", "elsewhere")]
    assert store.named_since(0) == {("a", "b"), ("a", "elsewhere")}
    feed.watch({("a", "c")}, named=False)  # c is no agent, a is: watched, not named
    assert ("a", "c") in feed.pairs() and ("a", "c") not in store.named_since(0)
    assert feed.pairs_dropped_total() == 0  # pairs of no agent are not counted as dropped


def test_a_watched_pair_takes_the_stores_newest_window_at_once() -> None:
    store = store_of("a", "b")
    probe(store, "a", "b", 1)
    feed = FabricFeed(store, keep_s=3600.0)
    feed.watch({("a", "b")}, named=False)
    assert feed.history.drain(NOW) == 1
    windows, _ = feed.history.frames()
    assert list(zip(windows["src"], windows["dst"], strict=True)) == [("a", "b")]


def test_engine_hosts_paths_are_looked_at_again_only_when_something_changed() -> None:
    store = store_of("a", "b", "c")
    probe(store, "a", "b", 1)
    feed = FabricFeed(store, keep_s=3600.0)
    feed.watch_hosts({"a"}, new=True)
    assert feed.pairs() == [("a", "b")]
    probe(store, "c", "b", 1)
    feed.watch_hosts({"a"}, new=False)  # a new path in the store: looked at, not a's
    assert feed.pairs() == [("a", "b")]
    feed.watch_hosts({"a", "c"}, new=False)  # c's path is not new to the store: not looked at
    assert feed.pairs() == [("a", "b")]
    feed.watch_hosts({"a", "c"}, new=True)
    assert feed.pairs() == [("a", "b"), ("b", "c")]
    FabricFeed(None, keep_s=60.0).watch_hosts({"a"}, new=True)  # no store: nothing to watch


def test_bandwidth_is_each_paths_highest_measured_throughput() -> None:
    store = store_of("a", "b")
    probe(store, "a", "b", 1, bandwidth=2e9)
    probe(store, "a", "b", 2, bandwidth=5e8)  # a busy sender later: the peak stands
    feed = FabricFeed(store, keep_s=3600.0)
    assert feed.bandwidth() == {("a", "b"): 2e9}
    assert FabricFeed(None, keep_s=60.0).bandwidth() == {}


def test_at_most_max_pairs_are_watched_and_the_rest_counted() -> None:
    from fabricprobe.collector.attribution.fabric import MAX_PAIRS

    hosts = [f"h{i:03d}" for i in range(200)]
    feed = FabricFeed(store_of(*hosts), keep_s=3600.0)
    feed.watch({(a, b) for i, a in enumerate(hosts) for b in hosts[i + 1 :]}, named=False)
    assert len(feed.pairs()) == MAX_PAIRS
    assert feed.pairs_dropped_total() == 19_900 - MAX_PAIRS
    feed.watch({("h000", "h001")}, named=False)  # watched already: nothing more dropped
    assert feed.pairs_dropped_total() == 19_900 - MAX_PAIRS
