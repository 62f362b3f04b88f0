"""The window store's three tables on their own (hosts, path figures, counter tracks), and
the copies with named fields the store hands readers."""

from __future__ import annotations

import dataclasses

import pytest

from fabricprobe.collector.countertable import CounterKey, CounterTable
from fabricprobe.collector.hosttable import HostState, HostTable, HostView, SeqSet
from fabricprobe.collector.pathtable import NamedPairs, PathTable, host_pair
from fabricprobe.collector.store import DROPS, WindowStore
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.sketchwire import from_wire, to_wire
from fabricprobe.core.stats import LatencySketch

S = 1_000_000_000


def drops() -> dict[str, int]:
    return dict.fromkeys(DROPS, 0)


def host(name: str = "a", topology: str = "tor1") -> HostState:
    return HostState(info=pb.HostInfo(host=name, topology=topology), registered_ns=0)


def rtt(*ns: int, lost: int = 0) -> pb.Sketch:
    s = LatencySketch("rtt")
    s.record_many(list(ns))
    s.record_lost(lost)
    return to_wire(s)


# -- hosts ---------------------------------------------------------------------------------


def test_host_table_registers_refreshes_and_bounds() -> None:
    d = drops()
    t = HostTable(d, stale_after=30, forget_after=100, max_hosts=2)
    state, moved = t.register(pb.HostInfo(host="a", topology="t1"), 10 * S)
    assert moved and state.registered_ns == 10 * S and state.last_report_ns == 10 * S
    again, moved = t.register(pb.HostInfo(host="a", topology="t1"), 20 * S)
    assert again is state and not moved and state.last_report_ns == 20 * S
    _, moved = t.register(pb.HostInfo(host="a", topology="t2"), 21 * S)
    assert moved  # another ToR label: the folds must read it again
    t.register(pb.HostInfo(host="b"), 21 * S)
    with pytest.raises(ValueError, match="2 hosts already"):
        t.register(pb.HostInfo(host="c"), 21 * S)
    assert d["host"] == 1


def test_host_table_stale_views_and_silent_hosts() -> None:
    t = HostTable(drops(), stale_after=30, forget_after=100)
    a, _ = t.register(pb.HostInfo(host="a", version="1.2"), 0)
    t.register(pb.HostInfo(host="b"), 90 * S)
    view = t.views(40 * S)["a"]
    assert view == HostView("a", a.info, None, 0, 0, stale=True)
    assert not t.views(40 * S)["b"].stale
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.stale = False  # type: ignore[misc]
    assert t.silent(150 * S) == ["a"] and list(t.by_name) == ["b"]
    assert t.silent(150 * S, also=lambda name, h: name == "b") == ["b"] and not t.by_name


def test_seq_set_floor_and_gap() -> None:
    seqs = SeqSet()
    for s in (1, 2, 4):
        seqs.add(s)
    assert seqs.floor == 2 and 4 in seqs and 3 not in seqs
    assert seqs.taken() == {1, 2, 4}
    for s in range(5, 5 + SeqSet.MAX_ABOVE + 1):  # seq 3 never comes
        seqs.add(s)
    assert 3 in seqs  # the gap was given up: a late 3 counts as seen


def test_lifetimes_retire_in_the_order_heard() -> None:
    h = host()
    assert [h.lifetime(e) for e in (500, 100, 300, 200, 400)] == [1, 2, 3, 4, 5]
    assert h.lifetime(500) is None  # the first heard of went, whatever its value
    assert h.lifetime(100) == 2


# -- counters ------------------------------------------------------------------------------


def reading(value: int, width: int = 32, name: str = "out_of_buffer") -> pb.CounterReading:
    return pb.CounterReading(
        kind="rdma", device="mlx5_0", port=1, priority=-1, name=name, value=value, width=width
    )


def test_counter_table_key_rate_and_bounds() -> None:
    d = drops()
    t = CounterTable(d, max_per_host=1)
    h = host()
    assert t.merge(h, 10 * S, (1, 1), 0, reading(100)) is None  # the first reading: no rate
    key, rate = t.merge(h, 20 * S, (1, 2), 0, reading(300)) or (None, None)
    assert key == CounterKey("a", "rdma", "mlx5_0", 1, "", -1, "out_of_buffer")
    assert key is not None and key.src == "a" and key.kind == "rdma" and key.name == "out_of_buffer"
    assert rate == pytest.approx(20.0)
    assert t.merge(h, 30 * S, (1, 1), 0, reading(400)) is None  # older by (lifetime, seq)
    assert t.merge(h, 30 * S, (1, 3), 0, reading(1, name="other")) is None  # over the bound
    assert t.merge(h, 30 * S, (1, 4), 0, reading(1 << 32)) is None  # wider than 32 bits
    assert (d["stale_reading"], d["counter"], d["value"]) == (1, 1, 1)
    assert t.rates({"out_of_buffer"}) == [(key, pytest.approx(20.0))]
    assert t.rates({"something_else"}) == []


def test_counter_table_copies_and_forgets() -> None:
    t = CounterTable(drops())
    a, b = host("a"), host("b")
    t.merge(a, 10 * S, (1, 1), 5 * S, reading(1))
    t.merge(b, 10 * S, (1, 1), 50 * S, reading(1))
    assert [k.src for k in t.keys_of({"b"})] == ["b"] and len(t.keys_of(None)) == 2
    copies = t.copies(t.keys_of(None))
    next(iter(copies.values())).total = 99
    assert all(track.total == 0 for track in t.by_key.values())  # copies, not the tracks
    t.forget(dead=set(), idle_ns=10 * S, hosts={"a": a, "b": b})  # a's is idle
    assert [k.src for k in t.by_key] == ["b"] and a.counters == 0 and b.counters == 1
    t.forget(dead={"b"}, idle_ns=0, hosts={"b": b})
    assert not t.by_key and b.counters == 0


# -- paths ---------------------------------------------------------------------------------


def window(dst: str = "b", *ns: int, **kw: object) -> pb.ProbeWindow:
    w = pb.ProbeWindow(dst=dst, transport="tcp", op="pingpong", size=64, **kw)  # type: ignore[arg-type]
    if ns:
        w.rtt.CopyFrom(rtt(*ns))
    return w


def test_path_table_merges_newest_and_fleet() -> None:
    d = drops()
    t = PathTable(d)
    h = host()
    w = window("b", 10_000, 20_000)
    key = t.merge(h, 10 * S, (1, 2), 5 * S, w, from_wire(w.rtt))
    older = window("b", 90_000)
    t.merge(h, 5 * S, (1, 1), 6 * S, older, from_wire(older.rtt))  # replayed after a newer one
    assert key == ("a", "b", "tcp", "pingpong", 64)
    st = t.by_key[key]
    assert st.windows == 2 and st.rtt.count == 3 and t.merges == 2
    assert st.last_end_ns == 10 * S and st.last_rtt is not None and st.last_rtt.count == 2
    assert st.last_p99_ns == 20_000  # the newest window's, at most 50 exchanges: its max
    assert t.fleet[("tcp", "pingpong", 64)].count == 3 and h.paths == 1
    assert t.by_pair == {("a", "b"): [key]}


def test_path_table_drops_bad_bandwidth_and_paths_over_the_bound() -> None:
    d = drops()
    t = PathTable(d, max_per_host=1)
    h = host()
    assert t.merge(h, 0, (1, 1), 0, window("b", bytes_moved=10, busy_seconds=0.0), None) is None
    assert d["value"] == 1
    assert t.merge(h, 0, (1, 1), 0, window("b", bytes_moved=10**9, busy_seconds=1.0), None)
    assert t.merge(h, 0, (1, 1), 0, window("c"), None) is None and d["path"] == 1
    st = t.by_key[("a", "b", "tcp", "pingpong", 64)]
    assert st.last_bytes_per_second == st.peak_bytes_per_second == 1e9


def test_path_table_views_fresh_pairs_and_forget() -> None:
    t = PathTable(drops())
    a, b = host("a"), host("b")
    wa = window("b", 7_000)
    ka = t.merge(a, 10 * S, (1, 1), 10 * S, wa, from_wire(wa.rtt))
    kb = t.merge(b, 11 * S, (1, 1), 20 * S, window("a", bytes_moved=100, busy_seconds=1.0), None)
    assert ka is not None and kb is not None
    views = t.views("b", "a")
    assert [v.key for v in views] == [ka, kb]
    assert (views[0].key.src, views[0].key.dst, views[0].key.transport) == ("a", "b", "tcp")
    assert views[0].rtt is not None and views[0].rtt.count == 1
    assert views[1].rtt is None and views[1].last_bytes_per_second == 100.0
    assert t.fresh(15 * S, 10) == [kb] and t.fresh(0, 1) == [ka]
    assert t.of_pairs([host_pair("b", "a")]) == [ka, kb]
    copies = t.copies([ka, ("x", "y", "tcp", "pingpong", 1)])
    assert list(copies) == [ka] and copies[ka] is not t.by_key[ka]
    assert t.forget(dead={"b"}, idle_ns=0, hosts={"a": a, "b": b}) == [kb]
    assert t.by_pair == {("a", "b"): [ka]} and b.paths == 0
    assert t.forget(dead=set(), idle_ns=15 * S, hosts={"a": a}) == [ka]
    assert not t.by_pair and a.paths == 0


def test_named_pairs_keep_the_newest() -> None:
    named = NamedPairs(limit=2)
    named.name([("b", "a")], 1)
    named.name([("c", "d"), ("e", "f")], 2)
    assert named.since(0) == {("c", "d"), ("e", "f")}  # ("a", "b") went first
    named.name([("d", "c")], 3)
    assert named.since(3) == {("c", "d")}


# -- the store's views ---------------------------------------------------------------------


def test_the_store_hands_out_named_copies() -> None:
    now = [100 * S]
    store = WindowStore(stale_after=30, clock=lambda: now[0])
    store.register(pb.HostInfo(host="b", topology="t2"))
    store.register(pb.HostInfo(host="a", topology="t1"))
    r = pb.WindowReport(host="a", epoch=1, seq=1, window_end_unix_ns=now[0])
    r.probes.add(dst="b", transport="tcp", op="pingpong", size=64, rtt=rtt(5_000))
    r.counters.add(kind="rdma", device="d", port=1, name="packet_seq_err", value=1, width=64)
    store.take(r)
    assert store.host_names() == ["b", "a"]  # in the order they registered
    assert store.has_host("a") and not store.has_host("z") and store.host_view("z") is None
    view = store.host_view("a")
    assert view is not None and view.info.topology == "t1" and not view.stale
    now[0] += 31 * S
    assert store.host_views()["b"].stale
    (path,) = store.pair_paths("b", "a")
    assert path.key == ("a", "b", "tcp", "pingpong", 64) and path.last_end_ns == 100 * S
    snap = store.snapshot()
    assert snap.hosts["a"].name == "a" and snap.hosts["a"].last_window_end_ns == 100 * S
    (key,) = snap.counters
    assert key.src == "a" and key.name == "packet_seq_err" and key.device == "d"


def test_host_table_admits_each_report_once_and_keeps_the_newest() -> None:
    d = drops()
    t = HostTable(d, stale_after=30, forget_after=100)
    h, _ = t.register(pb.HostInfo(host="a"), 0)
    assert t.admit(h, 7, 2, 5 * S) == (1, 2) and h.last_report_ns == 5 * S
    assert t.admit(h, 7, 2, 6 * S) is None and h.duplicates == 1 and h.reports == 1
    assert t.admit(h, 7, 1, 6 * S) == (1, 1)
    t.newest(h, (1, 2), 20 * S, pb.AgentStats(probes=3))
    t.newest(h, (1, 1), 10 * S, pb.AgentStats(probes=1))  # older: changes nothing
    assert h.last_window_end_ns == 20 * S and h.agent is not None and h.agent.probes == 3
    t.newest(h, (1, 3), 30 * S, pb.AgentStats(cpu_seconds=float("nan")))
    assert h.last_window_end_ns == 30 * S and h.agent.probes == 3 and d["value"] == 1
    for epoch in range(8, 8 + 4):  # four newer lifetimes retire lifetime 7
        t.admit(h, epoch, 1, 7 * S)
    assert t.admit(h, 7, 3, 8 * S) is None and d["stale_epoch"] == 1
