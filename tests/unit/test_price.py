"""The fabric's price of a KV transfer: fresh, stale and missing figures; the Query API
call; the HTTP handler's validation; the scheduler's client."""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import parse_qs

import grpc  # type: ignore[import-untyped]  # grpcio ships no type hints
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabricprobe.collector.attribution.core import Attribution
from fabricprobe.collector.kvparts import PROTOCOL_RTTS, fabric_seconds
from fabricprobe.collector.price import PriceConfig, check_bytes, kv_cost_http, kv_price
from fabricprobe.collector.query import add_query_service
from fabricprobe.collector.store import WindowStore
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.sketchwire import to_wire
from fabricprobe.core.stats import LatencySketch
from fabricprobe.workload.price import PriceClient

S = 10**9
NOW = 1_000 * S


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> int:
        return self.now


def store_with(
    *, rtt_ns: int | None = 30_000, bw: float | None = 2e9, lost: int = 0, end_ns: int = NOW
) -> tuple[WindowStore, Clock]:
    """Hosts a (prefill) and b (decode); a probes b with the figures given."""
    clock = Clock()
    store = WindowStore(clock=clock)
    for h, addr in (("a", "10.0.0.2"), ("b", "10.0.0.3"), ("c", "10.0.0.4")):
        store.register(pb.HostInfo(host=h, addresses=[addr]))
    r = pb.WindowReport(
        host="a", epoch=1, seq=1, window_start_unix_ns=end_ns - S, window_end_unix_ns=end_ns
    )
    if rtt_ns is not None:
        sk = LatencySketch()
        sk.record_many([rtt_ns] * 99 + [10 * rtt_ns])
        for _ in range(lost):
            sk.record_lost()
        r.probes.add(dst="b", transport="tcp", op="pingpong", size=64, rtt=to_wire(sk))
    if bw is not None:
        r.probes.add(
            dst="b", transport="tcp", op="stream", size=4096, bytes_moved=int(bw), busy_seconds=1.0
        )
    store.take(r)
    return store, clock


def test_fresh_figures_give_the_fabric_part_at_the_rtts_p50_and_p99() -> None:
    store, _ = store_with()
    p = kv_price(store, "a", "b", 524_288)
    assert p.known and p.reason == "" and p.transport == "tcp"
    assert p.rtts == PROTOCOL_RTTS["tcp"]
    assert p.rtt_p50_s == pytest.approx(30e-6, rel=0.01)
    assert p.rtt_p99_s == pytest.approx(30e-6, rel=0.01)  # 99 of 100 at 30 µs
    assert p.bandwidth_bytes_per_s == 2e9 and p.loss_ratio == 0
    assert p.p50_s == pytest.approx(3 * p.rtt_p50_s + 524_288 / 2e9)
    assert p.age_s == 0
    # the reverse direction is priced from the same round trips and bandwidth
    q = kv_price(store, "b", "a", 524_288)
    assert q.known and q.p50_s == pytest.approx(p.p50_s)


def test_the_rtt_is_the_smallest_probes_and_the_bandwidth_the_largest() -> None:
    """A fleet probing several sizes: a 64 KiB ping-pong's RTT carries its own
    serialization, and a 64 B stream is held to its message rate; neither is the price's."""
    store, _ = store_with(end_ns=NOW - S // 2)
    r = pb.WindowReport(
        host="a", epoch=1, seq=2, window_start_unix_ns=NOW - S // 2, window_end_unix_ns=NOW
    )
    sk = LatencySketch()
    sk.record_many([900_000] * 100)  # newer, and 30x the 64 B probes' RTT
    r.probes.add(dst="b", transport="tcp", op="pingpong", size=65536, rtt=to_wire(sk))
    r.probes.add(dst="b", transport="tcp", op="stream", size=64, bytes_moved=10**6, busy_seconds=1)
    store.take(r)
    p = kv_price(store, "a", "b", 524_288)
    assert p.known
    assert p.rtt_p50_s == pytest.approx(30e-6, rel=0.01)
    assert p.bandwidth_bytes_per_s == 2e9


def test_the_rtt_is_the_one_sided_probes_where_the_path_has_them() -> None:
    """A path probed by SEND ping-pongs and by one-sided READs (rdma_rc_read): the READs'
    RTT has no software of the far end in it, as a KV transfer's has none; the price takes
    it, even from an older window and a larger probe."""
    store, _ = store_with(rtt_ns=None, end_ns=NOW - S // 2)
    for seq, op, size, rtt in ((2, "read", 256, 20_000), (3, "send", 64, 400_000)):
        start = NOW - S // 2 if op == "read" else NOW - S // 4
        r = pb.WindowReport(
            host="a", epoch=1, seq=seq, window_start_unix_ns=start - S // 4,
            window_end_unix_ns=start,
        )  # fmt: skip
        sk = LatencySketch()
        sk.record_many([rtt] * 100)
        r.probes.add(dst="b", transport="rdma", op=op, size=size, rtt=to_wire(sk))
        store.take(r)
    p = kv_price(store, "a", "b", 524_288)
    assert p.known and p.transport == "rdma"
    assert p.rtt_p50_s == pytest.approx(20e-6, rel=0.01)


def test_loss_and_a_slow_tail_raise_the_price() -> None:
    store, _ = store_with(rtt_ns=30_000, lost=5)
    p = kv_price(store, "a", "b", 4096 * 100)
    assert p.loss_ratio == pytest.approx(5 / 105)
    want = fabric_seconds(4096 * 100, p.rtt_p50_s or 0, 2e9, 5 / 105, "tcp")
    assert p.p50_s == pytest.approx(want)
    assert p.p50_s > 3 * p.rtt_p50_s + 4096 * 100 / 2e9
    assert p.p99_s is not None and p.p99_s >= p.p50_s


def test_stale_figures_are_unknown_with_their_age() -> None:
    store, clock = store_with()
    clock.now = NOW + 31 * S
    p = kv_price(store, "a", "b", 1000, cfg=PriceConfig(max_age_s=30))
    assert not p.known and p.p50_s is None
    assert "31 s old" in p.reason and p.age_s == pytest.approx(31)
    assert kv_price(store, "a", "b", 1000, cfg=PriceConfig(max_age_s=60)).known


@pytest.mark.parametrize(
    ("kw", "src", "dst", "why"),
    [
        ({"rtt_ns": None}, "a", "b", "no RTT probes between a and b"),
        ({"bw": None}, "a", "b", "no bandwidth probes"),
        ({}, "a", "c", "no RTT probes between a and c"),
        ({}, "a", "zz", "host zz is not registered"),
    ],
)
def test_missing_figures_are_unknown_with_the_reason(
    kw: dict[str, object], src: str, dst: str, why: str
) -> None:
    store, _ = store_with(**kw)  # type: ignore[arg-type]
    p = kv_price(store, src, dst, 1000)
    assert not p.known and why in p.reason
    assert p.p50_s is None and p.p99_s is None


def http(store: WindowStore, query: str) -> tuple[int, dict[str, object]]:
    return kv_cost_http(parse_qs(query, keep_blank_values=True), store)


def test_http_handler_answers_a_price_and_an_unknown() -> None:
    store, _ = store_with()
    status, body = http(store, "src=a&dst=b&bytes=524288")
    assert status == 200 and body["known"] is True
    assert body["p50_s"] == pytest.approx(kv_price(store, "a", "b", 524288).p50_s)
    status, body = http(store, "src=a&dst=c&bytes=1")
    assert status == 200 and body["known"] is False and "no RTT" in str(body["reason"])
    assert "p50_s" not in body


@pytest.mark.parametrize(
    ("query", "status", "says"),
    [
        ("dst=b&bytes=1", 400, "src must be given once"),
        ("src=a&src=a&dst=b&bytes=1", 400, "src must be given once"),
        ("src=a&dst=b&bytes=1&x=1", 400, "unknown parameter"),
        ("src=a&dst=b&bytes=0", 400, "bytes must be 1.."),
        ("src=a&dst=b&bytes=-5", 400, "positive whole number"),
        ("src=a&dst=b&bytes=1.5", 400, "positive whole number"),
        ("src=a&dst=b&bytes=%201", 400, "positive whole number"),
        ("src=a&dst=b&bytes=" + "9" * 30, 400, "positive whole number"),
        (f"src=a&dst=b&bytes={(1 << 40) + 1}", 400, "bytes must be 1.."),
        ("src=&dst=b&bytes=1", 400, "src is required"),
        ("src=a%0Ab&dst=b&bytes=1", 400, "not a host name"),
        ("src=" + "a" * 300 + "&dst=b&bytes=1", 400, "not a host name"),
        ("src=a&dst=a&bytes=1", 400, "same host"),
        ("src=a&dst=nowhere&bytes=1", 404, "host nowhere is not registered"),
    ],
)
def test_http_handler_refuses_bad_parameters(query: str, status: int, says: str) -> None:
    store, _ = store_with()
    got, body = http(store, query)
    assert got == status and says in str(body["error"])
    assert len(str(body)) < 400  # bounded, whatever was sent


@given(st.dictionaries(st.text(max_size=8), st.lists(st.text(max_size=40), max_size=3)))
def test_http_handler_answers_any_query_with_a_status_and_json(params: dict) -> None:
    store, _ = store_with()
    status, body = kv_cost_http(params, store)
    assert status in (200, 400, 404)
    assert ("error" in body) == (status != 200)


@given(st.one_of(st.integers(), st.text(max_size=25), st.booleans(), st.floats()))
def test_bytes_are_a_positive_whole_number_under_the_bound(value: object) -> None:
    try:
        n = check_bytes(value)
    except ValueError:
        return
    assert isinstance(n, int) and 1 <= n <= 1 << 40


@pytest.fixture
def served() -> object:
    """A Query service on loopback over the store of store_with()."""
    from concurrent import futures

    store, _ = store_with()
    server = grpc.server(futures.ThreadPoolExecutor(2))
    add_query_service(server, Attribution(store, clock=lambda: NOW))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(0)


def test_client_gets_the_price_and_the_unknown_over_the_query_api(served: str) -> None:
    with PriceClient(served, insecure=True, timeout_s=5) as pc:
        c = pc.cost("a", "b", 524_288)
        assert c.known and c.reachable and c.transport == "tcp" and c.rtts == 3
        assert c.p50_s is not None and c.p50_s > 0 and c.age_s is not None
        u = pc.cost("a", "c", 1)
        assert not u.known and u.reachable and "no RTT" in u.reason and u.p50_s is None
        with pytest.raises(ValueError):
            pc.cost("a", "a", 1)
        with pytest.raises(ValueError):
            pc.cost("a", "b", 0)


def test_client_says_unknown_when_the_collector_does_not_answer() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with PriceClient(f"127.0.0.1:{port}", insecure=True, timeout_s=0.2) as pc:
        c = pc.cost("a", "b", 1)
    assert not c.known and not c.reachable and c.reason.startswith("collector: ")


def test_query_api_refuses_bad_arguments(served: str) -> None:
    from fabricprobe.core.api import fabricprobe_pb2_grpc as pb_grpc

    with grpc.insecure_channel(served) as ch:
        stub = pb_grpc.QueryStub(ch)
        for req in (
            pb.KvCostRequest(src="a", dst="b", bytes=0),
            pb.KvCostRequest(src="", dst="b", bytes=1),
            pb.KvCostRequest(src="a\n", dst="b", bytes=1),
            pb.KvCostRequest(src="a", dst="b", bytes=1 << 41),
        ):
            with pytest.raises(grpc.RpcError) as e:
                stub.KvCost(req, timeout=5)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_probe_cost_prints_the_price_and_exits_3_on_unknown(served: str) -> None:
    import json

    from click.testing import CliRunner

    from fabricprobe.cli import main as cli

    base = ["cost", "--insecure", "--collector", served]
    out = CliRunner().invoke(cli, [*base, "--src", "a", "--dst", "b", "--bytes", "524288"])
    assert out.exit_code == 0, out.output
    assert "a->b 524,288 B over tcp: p50" in out.output
    out = CliRunner().invoke(cli, [*base, "--src", "a", "--dst", "c", "--bytes", "1", "--json"])
    assert out.exit_code == 3
    got = json.loads(out.output)
    assert got["known"] is False and "no RTT" in got["reason"]
    out = CliRunner().invoke(cli, [*base, "--src", "a", "--dst", "b", "--bytes", "0"])
    assert out.exit_code == 2


def test_tor_pairs_carry_the_worst_price_of_their_host_pairs_and_count_unknowns() -> None:
    from fabricprobe.collector.price import PRICE_REFERENCE_BYTES, tor_prices

    store, _ = store_with()
    for h, tor in (("a", "tor-1"), ("b", "tor-2"), ("c", "tor-2")):
        store.register(pb.HostInfo(host=h, addresses=[], topology=tor))
    got = tor_prices(store, [("a", "b"), ("a", "c"), ("a", "gone")])
    want = kv_price(store, "a", "b", PRICE_REFERENCE_BYTES)
    assert got.prices == {("tor-1", "tor-2"): (want.p50_s, want.p99_s)}
    assert (got.known, got.unknown, got.omitted) == (1, 2, 0)
    assert tor_prices(store, [("a", "b")], max_tors=0).omitted == 1


def test_the_path_is_priced_at_the_highest_bandwidth_its_windows_measured() -> None:
    store, clock = store_with(bw=2e9)
    clock.now = NOW + S
    r = pb.WindowReport(
        host="a", epoch=1, seq=2, window_start_unix_ns=NOW, window_end_unix_ns=NOW + S
    )
    # a starved sender's window: 2.5 MB/s on the same path
    r.probes.add(
        dst="b", transport="tcp", op="stream", size=4096, bytes_moved=2_500_000, busy_seconds=1.0
    )
    store.take(r)
    p = kv_price(store, "a", "b", 1 << 20)
    assert p.known and p.bandwidth_bytes_per_s == 2e9
    assert p.age_s == pytest.approx(1.0)  # the RTT window's age: the older figure
    assert Attribution(store, clock=clock).bandwidth()[("a", "b")] == 2e9


finite = st.floats(min_value=0, max_value=1e12, allow_nan=False)


@given(
    st.booleans(),
    st.text(max_size=60),
    st.none() | finite,
    st.none() | finite,
    st.none() | st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["", "rdma", "tcp"]),
    st.integers(0, 10),
    st.integers(1, 1 << 40),
)
def test_a_price_crosses_the_wire_as_it_is(
    known: bool,
    reason: str,
    p50: float | None,
    p99: float | None,
    age: float | None,
    transport: str,
    rtts: int,
    nbytes: int,
) -> None:
    from fabricprobe.core.price import Price
    from fabricprobe.workload.price import KvCost

    p = Price("a", "b", nbytes, known, reason, p50, p99, age_s=age, transport=transport, rtts=rtts)
    wire = pb.KvCostReply.FromString(p.reply().SerializeToString())
    got = KvCost.from_reply(wire)
    assert (got.known, got.reason, got.bytes, got.transport, got.rtts) == (
        known, reason, nbytes, transport, rtts,
    )  # fmt: skip
    assert got.p50_s == p50 and got.p99_s == p99
    # a figure that is not finite is not sent: absent, never NaN
    assert got.age_s == (age if age is not None and math.isfinite(age) else None)


def test_answers_are_counted_and_exported() -> None:
    from prometheus_client import CollectorRegistry

    from fabricprobe.collector.attribution.exporter import AttributionCollector

    store, _ = store_with()
    a = Attribution(store, clock=lambda: NOW)
    for q in ("src=a&dst=b&bytes=1", "src=a&dst=c&bytes=1", "src=a&dst=b&bytes=0"):
        kv_cost_http(parse_qs(q), store, counts=a.price_answers)
    assert a.price_answers.snapshot() == {"known": 1, "unknown": 1, "refused": 1}
    reg = CollectorRegistry()
    reg.register(AttributionCollector(a))
    v = reg.get_sample_value
    assert v("fabricprobe_kv_cost_answers_total", {"answer": "refused"}) == 1
    assert v("fabricprobe_kv_cost_host_pairs", {"state": "known"}) == 0  # no engine pairs


@given(
    st.booleans(),
    st.text(max_size=60),
    st.none() | st.floats(allow_nan=True, allow_infinity=True),
    st.none() | finite,
    st.sampled_from(["", "rdma", "tcp"]),
    st.integers(0, 10),
    st.integers(1, 1 << 40),
)
def test_a_price_and_a_clients_kv_cost_agree(
    known: bool,
    reason: str,
    p50: float | None,
    loss: float | None,
    transport: str,
    rtts: int,
    nbytes: int,
) -> None:
    """The collector's price (fabricprobe.core.price.Price) read back from its KvCost
    answer is the same price, its figures not finite left out; a client's KvCost is it
    and whether the collector answered."""
    from fabricprobe.core.price import Price
    from fabricprobe.workload.price import KvCost

    kw: dict[str, Any] = dict(p50_s=p50, loss_ratio=loss, transport=transport, rtts=rtts)
    ours = Price("a", "b", nbytes, known, reason, **kw)
    back = Price.from_reply(pb.KvCostReply.FromString(ours.reply().SerializeToString()))
    finite = {
        k: v for k, v in ours.as_dict().items() if not isinstance(v, float) or math.isfinite(v)
    }
    assert back.as_dict() == finite
    got = KvCost.from_reply(ours.reply())
    assert got.as_dict() == {**Price.from_reply(ours.reply()).as_dict(), "reachable": True}
