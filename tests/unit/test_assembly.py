"""Requests assembled until they settle: complete (quiet, their link in), then joinable
(their agents' reports past their KV transfers in, or not to be waited for), once; the
open ones bounded, with those settled early counted. And the Attribution around it: a
scrape shows a request once it settled, `probe why` before."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from fabricprobe.collector.attribution.assembly import Open, RequestAssembly
from fabricprobe.collector.attribution.core import Attribution
from fabricprobe.collector.attribution.exporter import AttributionCollector
from fabricprobe.collector.attribution.stages import RequestRecord, StageRecord
from fabricprobe.collector.store import WindowStore
from fabricprobe.core.api import fabricprobe_pb2 as pb
from tests.unit.test_attribution_export import sketch
from tests.unit.test_attribution_linker import pair

S = 1_000_000_000
NOW = 1_000 * S


def kv(rid: str, end: int, src: str = "a", dst: str = "b") -> StageRecord:
    return StageRecord(rid, "kv_transfer", end - S // 10, end, src, dst, transport="rdma", bytes=1)


def assembly(**kw: float) -> RequestAssembly:
    return RequestAssembly(settle_s=5.0, horizon_s=30.0, link_cap_s=600.0, **kw)  # type: ignore[arg-type]


def settled(a: RequestAssembly, now: int, ends: dict[str, int]) -> list[str]:
    return [o.rid for o in a.settle(a.complete(now), ends, now)]


def test_a_request_settles_once_quiet_and_its_agents_reported_past_it() -> None:
    a = assembly()
    a.records([kv("r1", NOW)], [RequestRecord("r1", NOW - S, NOW, 0.5, 1.0, 8, 32)], NOW)
    assert settled(a, NOW + 4 * S, {"a": NOW + 2 * S, "b": NOW + 2 * S}) == []  # not quiet
    # quiet; a's window past it is in, b's (an agent) not yet
    assert settled(a, NOW + 5 * S, {"a": NOW + 2 * S, "b": NOW - S}) == []
    assert settled(a, NOW + 6 * S, {"a": NOW + 2 * S, "b": NOW + S}) == ["r1"]
    assert settled(a, NOW + 7 * S, {"a": NOW + 2 * S, "b": NOW + S}) == []  # once
    assert not a.open


def test_silent_agents_and_hosts_that_are_no_agents_are_not_waited_for() -> None:
    a = assembly()
    a.records([kv("r1", NOW), kv("r2", NOW, "a", "elsewhere")], [], NOW)
    # b has not reported for over horizon_s: nothing to wait for; "elsewhere" is no agent
    got = settled(a, NOW + 5 * S, {"a": NOW + S, "b": NOW - 31 * S})
    assert sorted(got) == ["r1", "r2"]
    a.records([kv("r3", NOW)], [], NOW)
    assert settled(a, NOW + 5 * S, {"a": NOW - S, "b": NOW - S}) == []
    assert settled(a, NOW + 30 * S, {"a": NOW - S, "b": NOW - S}) == ["r3"]  # horizon


def test_a_promised_link_is_waited_for_until_kept_or_given_up() -> None:
    a = assembly()
    frags = pair("req-1", 101, NOW - 20 * S)
    a.promised(frags, NOW)
    a.records([kv("req-1", NOW - 19 * S)], [], NOW)
    assert settled(a, NOW, {}) == []  # quiet, but its engines' link is to come
    a.linked([], {"req-1"}, NOW)  # the linker is done with its fragments (another id)
    assert settled(a, NOW, {}) == ["req-1"]
    a.promised(pair("req-2", 102, NOW - 20 * S), NOW)
    assert settled(a, NOW + 599 * S, {}) == []
    assert settled(a, NOW + 600 * S, {}) == ["req-2"]  # link_cap_s


def test_at_most_max_open_and_the_oldest_settle_early_counted() -> None:
    a = assembly(max_open=2)
    a.records([kv(f"r{i}", NOW) for i in range(4)], [], NOW)
    assert list(a.open) == ["r2", "r3"] and a.forced_total() == 2
    assert settled(a, NOW, {}) == ["r0", "r1"]  # taken as they are by the next pass
    a.records([kv(f"s{i}", NOW) for i in range(5)], [], NOW)  # a flood before a pass
    assert a.forced_total() == 2 + 5 and list(a.open) == ["s3", "s4"]
    assert settled(a, NOW, {}) == ["s1", "s2"]  # the newest the bound holds; r2 to s0 let go


def fleet() -> tuple[WindowStore, Attribution, list[int]]:
    now = [NOW]
    store = WindowStore(clock=lambda: now[0])
    for h in ("a", "b"):
        store.register(pb.HostInfo(host=h))
    return store, Attribution(store, clock=lambda: now[0]), now


def report(store: WindowStore, end: int, seq: int) -> None:
    r = pb.WindowReport(
        host="a", epoch=1, seq=seq, window_start_unix_ns=end - 10 * S, window_end_unix_ns=end
    )
    r.probes.add(dst="b", transport="rdma", op="write", size=64, rtt=sketch(50_000))
    store.take(r)


def test_a_scrape_shows_a_request_once_it_settled_and_why_before() -> None:
    store, att, now = fleet()
    report(store, NOW - 5 * S, 1)
    att.take(
        [kv(f"r{i}", NOW - S // 2) for i in range(3)],
        [RequestRecord(f"r{i}", NOW - S, NOW - S // 2, 0.5, 1.0, 8, 32) for i in range(3)],
    )
    reg = CollectorRegistry()
    reg.register(AttributionCollector(att))
    path = {"src": "a", "dst": "b", "transport": "rdma"}
    assert reg.get_sample_value("fabricprobe_path_kv_wait_seconds", path) is None
    res = att.analyse(max_age_s=0)  # open, joined with what there is: no window of then
    assert sorted(res.kv["request_id"]) == ["r0", "r1", "r2"]
    assert list(res.kv["fabric_windows"]) == [0, 0, 0]
    now[0] = NOW + 5 * S
    att.sync()  # quiet now, but a has not reported past the transfers: they wait
    assert reg.get_sample_value("fabricprobe_path_kv_wait_seconds", path) is None
    report(store, NOW + 5 * S, 2)
    att.sync()
    assert reg.get_sample_value("fabricprobe_path_kv_wait_seconds", path) == 0.1
    assert reg.get_sample_value("fabricprobe_kv_share_ttft_ratio") == 0.2
    res = att.analyse(max_age_s=0)  # settled: joined with the window that covers them
    assert sorted(res.kv["request_id"]) == ["r0", "r1", "r2"]
    assert list(res.kv["fabric_windows"]) == [1, 1, 1]
    assert len(att.settler.since(0)) == 3 and not att.assembly.open
    counts = dict(att.counts().fold_dropped)
    assert counts == {"path": 0, "rho": 0, "request": 0, "fragment": 0}


def test_a_request_no_join_can_take_costs_only_itself() -> None:
    """A join that fails (a fault put in its way) fails its batch, then only itself: the
    other requests settle, and the failures are counted as the analysis's are."""
    _, att, now = fleet()
    real = att._join

    def join(requests: list[Open]) -> list[list[tuple[object, ...]]]:
        if any(o.rid == "bad" for o in requests):
            raise TypeError("'<' not supported between instances of 'int' and 'str'")
        return real(requests)

    att._join = join  # type: ignore[method-assign]
    att.take([kv("bad", NOW - S), kv("good", NOW - S)], [])
    now[0] = NOW + 40 * S  # quiet, and past the horizon: both settle now
    att.sync()
    assert [s.rid for s in att.settler.since(0)] == ["good"]
    assert att.counts().analysis_failures == 2  # the batch, then the bad one alone
    assert not att.assembly.open


def test_a_request_waits_for_its_paths_window_not_only_its_hosts_reports() -> None:
    """A host's report past a transfer need not carry the transfer's path: a peer's bulk
    burst holds the latency bursts back, a loaded host runs them late. The request waits
    for the path's window past it, which covers it once in."""
    store, att, now = fleet()
    report(store, NOW - 5 * S, 1)
    att.take(
        [kv("r0", NOW - S // 2)], [RequestRecord("r0", NOW - S, NOW - S // 2, 0.5, 1.0, 8, 32)]
    )
    now[0] = NOW + 5 * S
    store.take(
        pb.WindowReport(
            host="a",
            epoch=1,
            seq=2,
            window_start_unix_ns=NOW + 4 * S,
            window_end_unix_ns=NOW + 5 * S,
        )
    )  # a's report past the transfer, without the path's window
    att.sync()
    assert att.assembly.open and not att.settler.since(0)
    report(store, NOW + 6 * S, 3)
    att.sync()
    assert not att.assembly.open
    assert list(att.analyse(max_age_s=0).kv["fabric_windows"]) == [1]
    # one that no report comes past is waited for horizon_s at most
    att.take(
        [kv("r1", NOW + 7 * S)], [RequestRecord("r1", NOW + 6 * S, NOW + 7 * S, 0.5, 1.0, 8, 32)]
    )
    now[0] = NOW + 36 * S
    att.sync()
    assert att.assembly.open
    now[0] = NOW + 37 * S
    att.sync()
    assert not att.assembly.open
