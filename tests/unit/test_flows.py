"""A request's own links, off the lane: the QP listing as iproute2 prints it (the lane's
own output), the agent's QP reader, QPs paired across hosts into flows by their numbers
and PSNs, and a flow's source port traced and answered with its links, each lookup
counted by its outcome; hostile listings fuzzed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabricprobe.agent.flows import MAX_REPORTED, QpReader
from fabricprobe.collector.fabric.flows import MAX_QPS_PER_HOST, PSN_SLACK, FlowTable
from fabricprobe.collector.fabric.links import FabricLinks
from fabricprobe.collector.fabric.localize import LocalizeConfig
from fabricprobe.collector.fabric.service import links_reply
from fabricprobe.collector.fabric.topology import Topology
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.errors import ParseError, ProbeError, ToolMissing
from fabricprobe.probes.ethtool import CommandResult
from fabricprobe.probes.qps import MAX_QPS, parse_qps, psn_gap, read_qps
from fabricprobe.probes.sport import connected_sport
from tests.unit.test_fabric_links import hops, leaf_spine

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "rdma_qp"
LISTING = (FIXTURES / "rxe_workload.json").read_text()


def runner_of(text: str, rc: int = 0, err: str = ""):
    def run(argv, timeout):
        assert argv[:2] == ["rdma", "-j"]
        return CommandResult(rc, text, err)

    return run


def test_the_lane_s_listing_parses_to_its_two_connected_qps() -> None:
    got = parse_qps(LISTING)
    assert got.refused == 0 and got.dropped == 0 and len(got.qps) == 6
    rc = [q for q in got.qps if q.connected]
    assert [(q.device, q.lqpn, q.rqpn, q.comm, q.pid) for q in rc] == [
        ("rxe0", 17, 17, "probe", 316),
        ("rxe3", 17, 17, "answer", 317),
    ]
    # the two ends' PSNs meet: what one sends next is what the other expects
    assert rc[0].sq_psn == rc[1].rq_psn and rc[0].rq_psn == rc[1].sq_psn
    gsi = [q for q in got.qps if not q.connected]
    assert {q.type for q in gsi} == {"GSI"} and all(q.pid == 0 for q in gsi)
    assert [q.device for q in parse_qps(LISTING, {"rxe3"}).qps] == ["rxe3", "rxe3"]


def test_hostile_listings_are_refused_record_by_record() -> None:
    good = json.loads(LISTING)[0]
    bad = [
        7,
        {**good, "lqpn": -1},
        {**good, "lqpn": 1 << 24},
        {**good, "rqpn": "17"},
        {**good, "sq-psn": True},
        {**good, "comm": "x" * 65},
        {**good, "ifname": "rxe\n0"},
        {k: v for k, v in good.items() if k != "type"},
    ]
    got = parse_qps(json.dumps([good, *bad]))
    assert len(got.qps) == 1 and got.refused == len(bad)
    many = parse_qps(json.dumps([good] * (MAX_QPS + 5)))
    assert len(many.qps) == MAX_QPS and many.dropped == 5
    for text in ("{", '{"a": 1}', "[" * 100_000):
        with pytest.raises(ParseError):
            parse_qps(text)
    assert parse_qps("").qps == ()


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c,
                                                                          max_size=12),
                    max_leaves=30))  # fmt: skip
def test_any_json_parses_or_is_refused_never_raises_otherwise(doc) -> None:
    try:
        got = parse_qps(json.dumps(doc))
    except ParseError:
        return
    assert got.refused + len(got.qps) <= (len(doc) if isinstance(doc, list) else 0)


def test_reading_the_tool_says_why_it_could_not() -> None:
    def missing(argv, timeout):
        raise FileNotFoundError("rdma")

    with pytest.raises(ToolMissing, match="iproute2"):
        read_qps(runner=missing)
    with pytest.raises(ProbeError, match="NETLINK_RDMA"):
        read_qps(runner=runner_of("", 1, "Failed to open NETLINK_RDMA socket"))
    with pytest.raises(ProbeError, match="not JSON"):
        read_qps(runner=runner_of("garbage"))
    assert psn_gap(5, 0xFFFFFE) == 7 and psn_gap(100, 40) == 60


def test_the_agent_lists_its_devices_connected_qps_with_their_source_ports() -> None:
    reader = QpReader({"rxe0": "rdma_rxe"}, {"rxe0": 0}, 15.0, runner_of(LISTING))
    assert reader.due(1000.0) is None  # until a collector with a fabric file asks
    reader.wanted = True
    first = reader.due(1000.0)
    # every 15 s on the wall clock (every agent at the same window cut), not every window
    assert first is not None and reader.due(1004.0) is None
    assert reader.due(1005.0) is not None and reader.due(1019.9) is None
    [qp] = first.qps
    assert (qp.device, qp.lqpn, qp.rqpn, qp.comm, qp.rail) == ("rxe0", 17, 17, "probe", 0)
    assert qp.sport == connected_sport(17, 17) and not qp.own  # pid 316 is not this process
    unknown = QpReader({"rxe0": "some_nic"}, {}, 15.0, runner_of(LISTING)).listing()
    assert unknown.qps[0].sport == 0 and not unknown.qps[0].HasField("rail")
    failing = QpReader({"rxe0": "rdma_rxe"}, {}, 15.0, runner_of("", 1, "not allowed"))
    got = failing.listing()
    assert "not allowed" in got.error and not got.qps and failing.failures == 1
    for drivers, every in (({}, 15.0), ({"rxe0": "rdma_rxe"}, 0.0)):  # no device; off
        off = QpReader(drivers, {}, every, runner_of(LISTING), wanted=True)
        assert off.due(1.0) is None
    many = json.loads(LISTING)[0]
    text = json.dumps([{**many, "lqpn": 100 + i} for i in range(MAX_REPORTED + 3)])
    big = QpReader({"rxe0": "rdma_rxe"}, {}, 15.0, runner_of(text)).listing()
    assert len(big.qps) == MAX_REPORTED and big.dropped == 3


def qp(device: str, lqpn: int, rqpn: int, sq: int, rq: int, *, own=False, comm="engine", rail=0):
    return pb.LiveQp(
        device=device, lqpn=lqpn, rqpn=rqpn, type="RC", state="RTS", sq_psn=sq, rq_psn=rq,
        pid=1000, comm=comm, sport=connected_sport(lqpn, rqpn), own=own, rail=rail,
    )  # fmt: skip


def listing(*qps: pb.LiveQp) -> pb.QpList:
    return pb.QpList(qps=list(qps))


def test_qps_pair_across_hosts_by_their_numbers_and_psns() -> None:
    t = FlowTable()
    t.take("h0", listing(qp("rxe0", 17, 18, 5000, 9000)), 100.0)
    # h1's QP 18 -> 17 with PSNs far from h0's: another connection with the same numbers
    t.take("h1", listing(qp("rxe1", 18, 17, 8_000_000, 12_000_000)), 100.0)
    made = t.take("h3", listing(qp("rxe3", 18, 17, 9040, 5100)), 100.0)
    assert {(f.src, f.dst) for f in made} == {("h0", "h3"), ("h3", "h0")}
    flows, why, outcome = t.flows("h0", "h3", 90.0, 110.0)
    [f] = flows
    assert (f.out.lqpn, f.back.lqpn, f.gap, why, outcome) == (17, 18, 100, "", "pair")
    assert f.out.sport == connected_sport(17, 18)
    assert t.flows("h0", "h1", 90.0, 110.0)[2] == "no pair"  # PSNs more than PSN_SLACK off
    assert t.flows("h3", "h0", 90.0, 110.0)[0][0].out.sport == connected_sport(18, 17)
    # live only around when they were listed (a listing interval's slack either side)
    assert t.flows("h0", "h3", 500.0, 600.0)[2] == "no pair"
    assert (
        t.flows("h0", "h9", 90.0, 110.0)[1]
        == "no QP listing from h9 (its agent lists none: qp_interval_s 0, no RDMA)"
    )


def test_a_qp_keeps_its_task_s_name_once_that_thread_has_ended() -> None:
    """The tool names a QP's task from /proc as it lists: a later listing of the same QP
    whose thread has ended names none (a lane CI run's workload QP, made by a worker
    thread that had finished its share) and the name listed before stays."""
    t = FlowTable()
    t.take("h0", listing(qp("rxe0", 29, 29, 5000, 9000, comm="probe")), 100.0)
    t.take("h3", listing(qp("rxe3", 29, 29, 9000, 5000, comm="answer")), 100.0)
    t.take("h0", listing(qp("rxe0", 29, 29, 5400, 9000, comm="")), 102.0)
    [f] = t.flows("h0", "h3", 101.0, 103.0)[0]
    assert (f.out.comm, f.back.comm, f.out.sq_psn) == ("probe", "answer", 5400)


def test_the_agents_own_qps_are_no_flow_and_a_half_own_pair_is() -> None:
    t = FlowTable()
    t.take("h0", listing(qp("rxe0", 17, 17, 10, 20, own=True)), 100.0)
    t.take("h1", listing(qp("rxe1", 17, 17, 20, 10, own=True)), 100.0)
    assert t.flows("h0", "h1", 90, 110)[2] == "no pair"  # a probe's kept link
    t.take("h1", listing(qp("rxe1", 17, 17, 20, 10, own=False)), 101.0)
    assert len(t.flows("h0", "h1", 90, 110)[0]) == 1  # an engine to an agent's answering loop


def test_rails_keep_their_qps_apart_and_the_closest_psns_win() -> None:
    t = FlowTable()
    t.take("h0", listing(qp("rxe0", 17, 17, 1000, 2000, rail=0)), 100.0)
    t.take("h1", listing(qp("rxe1a", 17, 17, 2000, 1000, rail=1),
                         qp("rxe1b", 17, 17, 2400, 1300, rail=0),
                         qp("rxe1c", 17, 17, 2100, 1010, rail=0)), 100.0)  # fmt: skip
    [f] = t.flows("h0", "h1", 90, 110)[0]
    assert f.back.device == "rxe1c" and f.gap == 100


def test_a_listing_that_failed_says_why_and_bounds_hold() -> None:
    t = FlowTable(keep_s=60)
    t.take("h0", pb.QpList(error="`rdma resource show qp` failed (exit 1): not allowed"), 1.0)
    t.take("h1", listing(qp("rxe1", 17, 17, 1, 1)), 1.0)
    flows, why, outcome = t.flows("h0", "h1", 0, 2)
    assert not flows and "not allowed" in why and outcome == "no listing"
    assert t.counts.listings_failed == 1
    t.take(
        "h2", listing(*(qp("rxe2", 100 + i, 7, 0, 0) for i in range(MAX_QPS_PER_HOST + 10))), 2.0
    )
    assert t.live() == 1 + MAX_QPS_PER_HOST and t.counts.qps_dropped == 10
    t.take("h2", listing(qp("rxe2", 0, 7, 0, 0), qp("", 5, 7, 0, 0)), 3.0)
    assert t.counts.qps_refused == 2
    t.take("h1", listing(), 100.0)  # past keep_s: h1's and h2's old QPs forgotten
    t.take("h2", listing(), 100.0)
    assert t.live() == 0
    t.take("h1", listing(qp("rxe1", 17, 17, 1, 1)), 101.0)
    t.take("h2", listing(), 200.0)  # h0 and h1 have listed nothing since: forgotten whole
    assert t.live() == 0 and t.flows("h1", "h2", 0, 300)[2] == "no listing"


U32 = st.integers(0, 2**32 - 1)
LIVE_QPS = st.builds(
    pb.LiveQp,
    device=st.text(max_size=70),
    lqpn=U32,
    rqpn=U32,
    sq_psn=U32,
    rq_psn=U32,
    sport=U32,
    comm=st.text(max_size=70),
    own=st.booleans(),
    rail=U32,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["h0", "h1", "h2"]), LIVE_QPS), max_size=30))
def test_hostile_qp_messages_never_break_the_table(rows) -> None:
    t = FlowTable()
    for i, (host, q) in enumerate(rows):
        t.take(host, listing(q), float(i))
    for a in ("h0", "h1", "h2"):
        for b in ("h0", "h1", "h2"):
            flows, _, _ = t.flows(a, b, 0.0, 100.0)
            assert all(f.gap <= PSN_SLACK and 0 < f.out.lqpn < 1 << 24 for f in flows)


def test_a_flow_s_source_port_is_traced_and_answers_the_request_s_links() -> None:
    doc = leaf_spine()
    clock = [1000.0]
    links = FabricLinks(Topology.from_doc(doc), LocalizeConfig(), clock=lambda: clock[0])

    def report(host: str, *qps: pb.LiveQp, paths=()) -> None:
        r = pb.WindowReport(host=host, window_end_unix_ns=int(clock[0] * 1e9))
        if qps:
            r.qps.CopyFrom(listing(*qps))
        r.class_paths.extend(paths)
        links.take(host, r)

    # the hosts' addresses, as their own traces teach them
    report("h0", paths=[class_path(doc, "h0", "h2", 0xC000, 0)])
    report("h2", paths=[class_path(doc, "h2", "h0", 0xC000, 0)])
    engine_out, engine_back = qp("rxe0", 17, 18, 500, 900), qp("rxe2", 18, 17, 900, 500)
    reply = links_reply(links, "h0", "h2", (999.0, 1001.0))
    assert not reply.flows and "no QP listing from h0" in reply.flows_reason
    report("h0", engine_out)
    report("h2", engine_back)
    asked = {h: [(x.dst, x.address, x.sport) for x in links.retraces(h)] for h in ("h0", "h2")}
    assert asked == {
        "h0": [("h2", "192.0.2.3", engine_out.sport)],
        "h2": [("h0", "192.0.2.1", engine_back.sport)],
    }
    reply = links_reply(links, "h0", "h2", (999.0, 1001.0))
    assert [(f.sport, f.traced) for f in reply.flows] == [(engine_out.sport, False)]
    assert reply.flows_reason == "its flow's trace is asked for and not in yet"
    report("h0", engine_out, paths=[class_path(doc, "h0", "h2", engine_out.sport, 1)])
    report("h2", engine_back, paths=[class_path(doc, "h2", "h0", engine_back.sport, 0)])
    reply = links_reply(links, "h0", "h2", (999.0, 1001.0))
    [f] = reply.flows
    assert (
        f.traced and reply.flows_reason == "" and (f.src_qpn, f.dst_qpn, f.psn_gap) == (17, 18, 0)
    )
    assert list(f.links) == [
        "h0->leaf0", "leaf0->spine1", "spine1->leaf1", "leaf1->h2",  # out, over spine 1
        "h2->leaf1", "leaf1->spine0", "spine0->leaf0", "leaf0->h0",  # its ACKs, over spine 0
    ]  # fmt: skip
    # a flow's path is its own: never a class the localizer judges or counts as cover
    assert all(k.sport == 0xC000 for k in links.class_links())
    assert links.snapshot().counts.retraces_asked["flow"] == 2
    assert links.flows.counts.lookups == {"no listing": 1, "not traced": 1, "flow": 1}


def class_path(doc: dict, src: str, dst: str, sport: int, spine: int) -> pb.ClassPath:
    """The trace of class SPORT from SRC to DST over SPINE in the leaf-spine DOC."""
    ip = {n["name"]: n["ip"] for n in doc["nics"]}
    return pb.ClassPath(dst=dst, sport=sport, src_ip=ip[src], dst_ip=ip[dst],
                        hops=hops(doc, src, dst, spine), rail=0)  # fmt: skip


def flows_fabric() -> FabricLinks:
    """A leaf-spine whose h0 -> h2 engine flow is traced (out over spine 1), as the test
    above builds it, at a frozen clock of 1000 s."""
    doc = leaf_spine()
    links = FabricLinks(Topology.from_doc(doc), LocalizeConfig(), clock=lambda: 1000.0)

    out, back = qp("rxe0", 17, 18, 500, 900), qp("rxe2", 18, 17, 900, 500)
    for host, live, paths in (
        (
            "h0",
            out,
            [class_path(doc, "h0", "h2", 0xC000, 0), class_path(doc, "h0", "h2", out.sport, 1)],
        ),
        (
            "h2",
            back,
            [class_path(doc, "h2", "h0", 0xC000, 0), class_path(doc, "h2", "h0", back.sport, 0)],
        ),
    ):
        for _ in range(2):  # the listing first teaches the flow, then its trace comes
            r = pb.WindowReport(host=host, window_end_unix_ns=int(1000 * 1e9))
            r.qps.CopyFrom(listing(live))
            r.class_paths.extend(paths)
            links.take(host, r)
    return links


@pytest.fixture
def links_served() -> object:
    """The Query service on loopback over flows_fabric()'s links."""
    from concurrent import futures

    import grpc

    from fabricprobe.collector.attribution.core import Attribution
    from fabricprobe.collector.query import add_query_service
    from fabricprobe.collector.store import WindowStore

    links = flows_fabric()
    server = grpc.server(futures.ThreadPoolExecutor(2))
    add_query_service(server, Attribution(WindowStore()), links=links)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", links
    server.stop(0)


def test_the_slowest_requests_links_come_in_one_ask_as_each_alone(links_served) -> None:
    from fabricprobe.cli.commands.why import query_links

    target, links = links_served
    out = qp("rxe0", 17, 18, 500, 900)
    during, lo, hi = (999.0, 1001.0), int(999e9), int(1001e9)
    requests = [
        {"request_id": "r1", "src": "h0", "dst": "h2", "start_unix_ns": lo, "end_unix_ns": hi},
        {"request_id": "r2", "src": "h2", "dst": "h0", "start_unix_ns": lo, "end_unix_ns": hi},
        {"request_id": "self", "src": "h0", "dst": "h0"},  # no fabric between: left out
        {"request_id": "r3", "src": "h0", "dst": "h2"},  # no span: the last minute
        {"request_id": "r4", "src": "h0", "dst": "h3", "start_unix_ns": lo, "end_unix_ns": hi},
    ]
    asked_before = sum(links.flows.counts.lookups.values())
    got = query_links(target, requests, timeout=10)
    assert [r["request_id"] for r in got["requests"]] == ["r1", "r2", "r3", "r4"]
    r1, r2, r3, r4 = got["requests"]
    assert r1["links_of"] == f"its flow: QP 17 -> 18, source port {out.sport}"
    assert r1["links"] == sorted([
        "h0->leaf0", "leaf0->spine1", "spine1->leaf1", "leaf1->h2",
        "h2->leaf1", "leaf1->spine0", "spine0->leaf0", "leaf0->h0",
    ])  # fmt: skip
    assert r3["links"] == r1["links"]  # the flow of the last minute is the same one
    assert r2["links_of"].startswith("its flow: QP 18 -> 17")  # the ACKs' way, traced too
    assert r4["links"] == [] and "no QP listing from h3" in r4["links_of"]
    # one lookup each, as each pair asked alone would make
    assert sum(links.flows.counts.lookups.values()) - asked_before == 4
    for r, (src, dst, span) in zip(
        (r1, r2, r4),
        (("h0", "h2", during), ("h2", "h0", during), ("h0", "h3", during)),
        strict=True,
    ):
        alone = links_reply(links, src, dst, span)
        assert [c["sport"] for c in r["classes"]] == [c.sport for c in alone.classes]
        assert [f["links"] for f in r["flows"]] == [list(f.links) for f in alone.flows]


def test_a_links_ask_with_hostile_spans_is_refused_whole(links_served) -> None:
    import grpc

    from fabricprobe.collector.query import MAX_LINK_SPANS
    from fabricprobe.core.api import fabricprobe_pb2_grpc as pb_grpc

    target, _ = links_served
    ok = pb.LinksSpan(src="h0", dst="h2")
    with grpc.insecure_channel(target) as ch:
        stub = pb_grpc.QueryStub(ch)
        assert len(stub.Links(pb.LinksRequest(spans=[ok] * MAX_LINK_SPANS), timeout=10).spans) == (
            MAX_LINK_SPANS
        )
        for spans, said in (
            ([ok] * (MAX_LINK_SPANS + 1), "at most 200 spans"),
            ([ok, pb.LinksSpan(src="h0")], "spans[1].dst is required"),
            ([pb.LinksSpan(src="h0\n", dst="h2")], "spans[0].src is not a host name"),
            ([pb.LinksSpan(src="h0", dst="h2", from_unix_ns=5, to_unix_ns=4)], "spans[0]: "),
            ([pb.LinksSpan(src="h0", dst="h2", to_unix_ns=1 << 62)], "at most a day"),
        ):
            with pytest.raises(grpc.RpcError) as e:
                stub.Links(pb.LinksRequest(spans=spans), timeout=10)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert said in e.value.details()


def test_a_links_reply_past_its_size_bound_says_which_spans_it_left_out(monkeypatch) -> None:
    from fabricprobe.collector.fabric import service

    links = flows_fabric()
    base = links_reply(links).ByteSize()
    [alone] = links_reply(links, spans=[("h0", "h2", (999.0, 1001.0))]).spans
    # room for the ranked links and two spans' answers, not a third's
    mark = pb.SpanLinks(flows_reason=service.LEFT_OUT).ByteSize() + 8
    monkeypatch.setattr(service, "REPLY_BYTES", base + 2 * (alone.ByteSize() + 8) + 4 * mark)
    got = links_reply(links, spans=[("h0", "h2", (999.0, 1001.0))] * 4)
    assert [s.flows_reason == service.LEFT_OUT for s in got.spans] == [False, False, True, True]
    assert got.spans[0] == alone and not got.spans[3].flows and not got.spans[3].classes
    assert got.ByteSize() <= service.REPLY_BYTES


def test_a_fabric_s_links_past_the_reply_s_bound_are_its_lowest_ranked(monkeypatch) -> None:
    from fabricprobe.collector.fabric import service

    links = flows_fabric()
    whole = links_reply(links)
    assert whole.links_left_out == 0 and len(whole.links) > 10
    each = [v.ByteSize() + 8 for v in whole.links]
    monkeypatch.setattr(service, "LINKS_BYTES", sum(each[:10]))
    got = links_reply(links, spans=[("h0", "h2", (999.0, 1001.0))])
    assert list(got.links) == list(whole.links[:10])
    assert got.links_left_out == len(whole.links) - 10
    assert got.spans[0].flows  # the spans keep the room the links left


@settings(max_examples=200, deadline=None)
@given(
    spans=st.lists(
        st.builds(
            pb.LinksSpan,
            src=st.text(max_size=40),
            dst=st.sampled_from(["h0", "h2", "h3", "", "x" * 300]),
            from_unix_ns=st.integers(-(1 << 63), (1 << 63) - 1),
            to_unix_ns=st.integers(-(1 << 63), (1 << 63) - 1),
        ),
        max_size=5,
    )
)
def test_any_links_ask_is_answered_or_refused_never_raises_otherwise(spans) -> None:
    from fabricprobe.collector.attribution.core import Attribution
    from fabricprobe.collector.query import QueryServicer
    from fabricprobe.collector.store import WindowStore

    class Refused(Exception):
        pass

    class Context:  # what the servicer asks of gRPC's: abort with a status
        def abort(self, code, details):
            raise Refused(code, details)

    links = flows_fabric()
    servicer = QueryServicer(Attribution(WindowStore()), None, links)
    try:
        reply = servicer.Links(pb.LinksRequest(spans=spans), Context())
    except Refused as e:
        assert str(e.args[1]).startswith("links: ")
        return
    assert len(reply.spans) == len(spans)
