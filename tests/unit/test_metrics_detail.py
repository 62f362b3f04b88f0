"""The collector's bounded /metrics: worst k, alerts, request-named paths, hold times, the
bounds and what they leave out (collector/detail.py), fleet and ToR-pair aggregates."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from fabricprobe.collector.detail import DetailConfig, DetailSelector, choose
from fabricprobe.collector.exporter import FabricCollector
from fabricprobe.collector.store import WindowStore
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.sketchwire import to_wire
from fabricprobe.core.stats import LatencySketch

S = 1_000_000_000


class Clock:
    def __init__(self) -> None:
        self.now = 10_000 * S

    def __call__(self) -> int:
        return self.now


def sketch(base_ns: int, lost: int = 0, n: int = 10) -> pb.Sketch:
    s = LatencySketch()
    s.record_many([base_ns + 100 * i for i in range(n)])
    s.record_lost(lost)
    return to_wire(s)


class Fleet:
    """A store whose hosts h0..hN-1 (ToR t<i // per_tor>) each probe PEERS others over tcp
    and rdma; rtt(src, dst) gives each path's base RTT, loss(src, dst) its lost count."""

    def __init__(self, hosts: int, peers: int, per_tor: int = 4, **detail: object) -> None:
        self.clock = Clock()
        self.store = WindowStore(clock=self.clock, stale_after=30)
        self.names = [f"h{i:03d}" for i in range(hosts)]
        self.peers = peers
        for i, name in enumerate(self.names):
            self.store.register(pb.HostInfo(host=name, topology=f"t{i // per_tor}"))
        self.selector = DetailSelector(DetailConfig(**detail))  # type: ignore[arg-type]
        self.collector = FabricCollector(self.store, detail=self.selector)
        self.seq = 0

    def window(self, rtt: dict[tuple[str, str], int] | None = None, loss: dict | None = None):
        self.seq += 1
        self.clock.now += 10 * S
        for i, src in enumerate(self.names):
            r = pb.WindowReport(
                host=src,
                epoch=1,
                seq=self.seq,
                window_start_unix_ns=self.clock.now - 10 * S,
                window_end_unix_ns=self.clock.now,
            )
            for j in range(1, self.peers + 1):
                dst = self.names[(i + j) % len(self.names)]
                base = (rtt or {}).get((src, dst), 10_000 + 37 * i + j)
                lost = (loss or {}).get((src, dst), 0)
                for transport in ("tcp", "rdma"):
                    op = "pingpong" if transport == "tcp" else "send"
                    r.probes.add(
                        dst=dst, transport=transport, op=op, size=64, rtt=sketch(base, lost)
                    )
            self.store.take(r)

    def select(self):
        return self.collector.select()

    def text(self) -> str:
        reg = CollectorRegistry()
        reg.register(self.collector)
        return generate_latest(reg).decode()


def test_a_small_fleet_shows_every_path_and_host() -> None:
    f = Fleet(6, 2)
    f.window()
    sel = f.select()
    assert len(sel.paths) == 6 * 2 * 2 and sel.omitted_paths == 0
    assert set(sel.hosts) == set(f.names)
    assert f.text().count("fabricprobe_rtt_seconds_count{") == 24


def test_worst_k_of_each_kind_and_the_bound() -> None:
    f = Fleet(20, 4, worst_k=3, max_paths=8)
    slow = {("h005", "h006"): 900_000, ("h007", "h009"): 800_000, ("h010", "h011"): 700_000}
    f.window(rtt={**slow, ("h001", "h002"): 600_000})
    sel = f.select()
    assert len(sel.paths) == 8  # 3 worst of each kind, 2 kinds: 6 + 2 filled
    worst = {k for k, why in sel.paths.items() if why == "worst"}
    assert {(k[0], k[1]) for k in worst} == set(slow)
    assert {k[2] for k in worst} == {"tcp", "rdma"}
    assert list(sel.paths.values()).count("fill") == 2
    assert sel.omitted_paths == 20 * 4 * 2 - 8
    text = f.text()
    assert text.count("fabricprobe_rtt_seconds_count{") == 8
    assert 'fabricprobe_collector_detail_paths{reason="worst"} 6.0' in text
    assert 'fabricprobe_collector_detail_omitted{what="path"} 152.0' in text


def test_a_path_leaving_the_worst_set_is_held_then_let_go() -> None:
    f = Fleet(10, 3, worst_k=1, max_paths=4, hold_s=60)
    f.window(rtt={("h002", "h003"): 900_000})
    assert f.select().paths[("h002", "h003", "tcp", "pingpong", 64)] == "worst"
    f.window(rtt={("h004", "h005"): 900_000})  # another path is the worst now
    sel = f.select()
    assert sel.paths[("h004", "h005", "tcp", "pingpong", 64)] == "worst"
    assert sel.paths[("h002", "h003", "tcp", "pingpong", 64)] == "held"
    for _ in range(6):  # 60 s later it is only filler, if there is room: here there is none
        f.window(rtt={("h004", "h005"): 900_000, ("h006", "h007"): 800_000})
        sel = f.select()
    assert ("h002", "h003", "tcp", "pingpong", 64) not in sel.paths


def test_the_same_scrape_twice_chooses_the_same_paths() -> None:
    f = Fleet(30, 4, worst_k=2, max_paths=10)
    f.window()
    assert f.select().paths == f.select().paths


def test_paths_a_request_named_are_shown_both_ways() -> None:
    f = Fleet(12, 3, worst_k=1, max_paths=6)
    f.window()
    f.store.name_pairs([("h008", "h007")])
    sel = f.select()
    named = {k for k, why in sel.paths.items() if why == "request"}
    assert {(k[0], k[1]) for k in named} == {("h007", "h008")}
    f.store.name_pairs([("h009", "h000")])  # h000 -> h009 is no path of this plan
    assert {k for k, why in f.select().paths.items() if why == "request"} >= named


def test_a_lossy_path_is_an_alert_and_hosts_follow_their_paths() -> None:
    f = Fleet(12, 3, worst_k=0, max_paths=3, max_hosts=4)
    f.window(loss={("h003", "h004"): 2})  # 2 of 12 exchanges lost: over 1 %
    sel = f.select()
    alerts = {k for k, why in sel.paths.items() if why == "alert"}
    assert {(k[0], k[1]) for k in alerts} == {("h003", "h004")} and len(alerts) == 2
    assert sel.hosts["h003"] == "path" and sel.hosts["h004"] == "path"
    assert len(sel.hosts) == 4


def test_a_tail_far_above_the_paths_own_running_p99_is_an_alert() -> None:
    f = Fleet(8, 2, worst_k=0, max_paths=2)
    for _ in range(6):
        f.window()
    assert "alert" not in f.select().paths.values()
    f.window(rtt={("h001", "h002"): 10_000 * 5})  # 5x its usual p99, not the worst of all
    sel = f.select()
    assert {(k[0], k[1]) for k, why in sel.paths.items() if why == "alert"} == {("h001", "h002")}


def test_what_the_bound_keeps_out_is_counted() -> None:
    f = Fleet(10, 3, worst_k=0, max_paths=1)
    f.window(loss={("h001", "h002"): 3, ("h003", "h004"): 3})
    f.select()
    assert f.selector.dropped["path"]["alert"] == 3  # four alert paths, room for one
    assert 'fabricprobe_collector_detail_dropped_total{reason="alert",what="path"}' in f.text()


def test_tor_pairs_aggregate_every_path_and_are_bounded() -> None:
    f = Fleet(16, 4, per_tor=4, max_tor_pairs=6)
    f.window(rtt={("h001", "h005"): 500_000}, loss={("h002", "h003"): 5})
    sel = f.select()
    # 4 ToRs: every intra pair (4 x 2 transports) cannot fit in 6: intra first, then none
    assert len(sel.tor_pairs) == 6 and set(sel.tor_reasons.values()) == {"intra"}
    f2 = Fleet(16, 4, per_tor=4, max_tor_pairs=100)
    f2.window(rtt={("h001", "h005"): 500_000}, loss={("h002", "h003"): 5})
    sel2 = f2.select()
    p99, _ = sel2.tor_pairs[("t0", "t1", "tcp")]
    assert p99 is not None and p99 >= 500_000 / 1e9
    assert sel2.tor_pairs[("t0", "t0", "rdma")][1] > 0
    text = f2.text()
    assert 'fabricprobe_tor_pair_worst_rtt_p99_seconds{dst_tor="t1",src_tor="t0",' in text


def test_a_peer_this_collector_does_not_hold_gets_its_tor_from_the_plan() -> None:
    store = WindowStore()
    store.register(pb.HostInfo(host="a", topology="t1"))
    r = pb.WindowReport(host="a", epoch=1, seq=1, window_end_unix_ns=store.clock())
    r.probes.add(dst="far", transport="tcp", op="pingpong", size=64, rtt=sketch(20_000))
    r.probes.add(dst="nowhere", transport="rdma", op="send", size=64, rtt=sketch(20_000))
    store.take(r)
    fc = FabricCollector(store, topology={"far": "t9"}.get)
    assert set(fc.select().tor_pairs) == {("t1", "t9", "tcp"), ("t1", "unknown", "rdma")}


def test_fleet_histograms_count_every_window() -> None:
    f = Fleet(10, 3, max_paths=0, max_hosts=0, max_tor_pairs=0)
    f.window()
    f.window()
    reg = CollectorRegistry()
    reg.register(f.collector)
    labels = {"transport": "rdma", "op": "send", "size": "64"}
    assert reg.get_sample_value("fabricprobe_fleet_rtt_seconds_count", labels) == 10 * 3 * 10 * 2
    assert reg.get_sample_value("fabricprobe_fleet_probe_lost_total", labels) == 0
    text = generate_latest(reg).decode()
    assert "fabricprobe_rtt_seconds_count{" not in text  # no path shown at a bound of 0
    assert 'fabricprobe_host_up{src="h000"}' in text  # hosts' own up is always there


def test_series_grow_with_hosts_not_with_host_pairs() -> None:
    """Doubling the peers of every host leaves the series where the bounds put them."""
    counts = []
    for peers in (4, 8):
        f = Fleet(40, peers, per_tor=8, worst_k=2, max_paths=20, max_hosts=4, max_tor_pairs=40)
        f.window()
        f.select()
        counts.append(sum(1 for line in f.text().splitlines() if not line.startswith("#")))
    assert counts[1] <= counts[0] * 1.05, counts


@settings(max_examples=200, deadline=None)
@given(
    cands=st.lists(st.tuples(st.integers(0, 30), st.sampled_from(["alert", "worst"]))),
    held=st.dictionaries(st.integers(0, 30), st.integers(0, 100)),
    fill=st.lists(st.integers(0, 60), unique=True),
    limit=st.integers(0, 12),
    hold=st.integers(0, 50),
)
def test_choose_keeps_priority_order_within_the_bound(
    cands: list[tuple[int, str]], held: dict[int, int], fill: list[int], limit: int, hold: int
) -> None:
    now = 100
    before = dict(held)
    got = choose(cands, held, now, hold, limit, fill=fill)
    assert len(got.kept) <= limit
    firsts = list(dict.fromkeys(k for k, _ in cands))
    assert list(got.kept)[: min(limit, len(firsts))] == firsts[:limit]
    for key, why in got.kept.items():
        if why == "held":
            assert key in before and now - before[key] <= hold
        if why == "fill":
            assert key in fill
    assert all(k in held for k, why in got.kept.items() if why not in ("held", "fill"))
    assert len(held) <= 4 * max(1, limit)
    if len(got.kept) < limit:  # room left: nothing was dropped
        assert not got.dropped


def test_a_requests_kv_transfer_names_its_pair_and_its_paths_are_shown() -> None:
    from fabricprobe.collector.attribution.core import Attribution
    from fabricprobe.collector.attribution.stages import StageRecord

    f = Fleet(12, 3, worst_k=0, max_paths=2)
    f.window()
    now = f.clock.now
    Attribution(f.store, clock=f.clock).take(
        [
            StageRecord("r1", "kv_transfer", now - S, now, "h005", "h004", transport="rdma"),
            StageRecord("r2", "kv_transfer", now - S, now, "ghost", "spirit", transport="rdma"),
        ],
        [],
    )
    assert f.store.named_since(0) == {("h004", "h005")}  # a pair of no known host: not named
    sel = f.select()
    assert {k for k, why in sel.paths.items() if why == "request"} == {
        ("h004", "h005", "tcp", "pingpong", 64),
        ("h004", "h005", "rdma", "send", 64),
    }


def test_the_collector_settings_reach_the_selector() -> None:
    from fabricprobe.collector.config import CollectorSettings

    cfg = CollectorSettings(
        insecure=True, detail_worst_k=3, detail_max_paths=40, detail_hold_s=60.0
    ).server_config()
    assert (cfg.detail.worst_k, cfg.detail.max_paths, cfg.detail.hold_s) == (3, 40, 60.0)
    assert cfg.detail.fresh_s == cfg.stale_after


def test_hosts_over_an_alert_threshold_are_shown_first() -> None:
    f = Fleet(40, 1, worst_k=0, max_paths=0, max_hosts=2)
    f.window()
    spooling = pb.WindowReport(host="h030", epoch=1, seq=f.seq + 1, window_end_unix_ns=f.clock.now)
    spooling.agent.CopyFrom(pb.AgentStats(spool_depth=5))
    f.store.take(spooling)
    heavy = pb.WindowReport(host="h031", epoch=1, seq=f.seq + 1, window_end_unix_ns=f.clock.now)
    heavy.agent.CopyFrom(pb.AgentStats(rss_bytes=100 << 20))
    f.store.take(heavy)
    assert f.select().hosts == {"h030": "alert", "h031": "alert"}


def test_named_pairs_and_fleet_classes_are_bounded() -> None:
    from fabricprobe.collector import pathtable as store_mod

    s = WindowStore()
    s.name_pairs((f"a{i}", f"b{i}") for i in range(store_mod.MAX_NAMED_PAIRS + 10))
    assert len(s.named.at) == store_mod.MAX_NAMED_PAIRS
    assert ("a0", "b0") not in s.named.at  # the oldest went first
    s.register(pb.HostInfo(host="a"))
    r = pb.WindowReport(host="a", epoch=1, seq=1, window_end_unix_ns=s.clock())
    for i in range(store_mod.MAX_FLEET_CLASSES + 3):
        r.probes.add(dst="b", transport="tcp", op="pingpong", size=i + 1, rtt=sketch(20_000))
    s.take(r)
    assert len(s.path_table.fleet) == store_mod.MAX_FLEET_CLASSES and s.dropped["class"] == 3
