"""The request linker: engine fragments kept, linked, and each request counted once when
it is complete."""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.trace.v1 import trace_pb2

from fabricprobe.collector.attribution.engines import parse_fragment
from fabricprobe.collector.attribution.engines.common import Fragment
from fabricprobe.collector.attribution.linker import RequestLinker
from fabricprobe.collector.attribution.linking import REASONS, HostDirectory, MatchConfig
from fabricprobe.collector.attribution.spanattrs import span_attributes
from fabricprobe.collector.attribution.stages import StageRecord
from tests.unit.test_engines import DEC, PRE, vllm_request

S = 1_000_000_000
NOW = 1_000 * S
HOSTS = HostDirectory(
    [("pre-node", ["10.0.0.2"]), ("dec-node.example", ["10.0.0.3"])], MatchConfig()
)


def directory() -> HostDirectory:
    return HOSTS


def frag(span: trace_pb2.Span, resource: dict[str, Any]) -> Fragment:
    got = parse_fragment(span, span_attributes(span), resource)
    assert got is not None
    return got


def pair(rid: str, trace: int, start: int) -> list[Fragment]:
    pre = vllm_request(start, rid, trace, queue=0.002, e2e=0.05, out=1)
    dec = vllm_request(start + S // 10, rid, trace, queue=0.03, e2e=0.3, out=8)
    return [frag(pre, PRE), frag(dec, DEC)]


def linker() -> RequestLinker:
    return RequestLinker(1000, link_wait_s=5.0, pair_wait_s=300.0)


def test_a_pair_with_both_hosts_is_counted_at_once_and_only_once() -> None:
    lk = linker()
    lk.add(pair("req-1", 101, NOW - 2 * S))
    done = lk.complete(NOW, directory)
    assert done.requests == 1 and [r.request_id for r in done.records] == ["req-1"]
    kv = [s for s in done.stages if s.stage == "kv_transfer"]
    assert [(s.src, s.dst) for s in kv] == [("pre-node", "dec-node.example")]
    assert lk.counts().known == 1
    assert lk.complete(NOW + 10 * S, directory).requests == 0  # counted already
    assert lk.counts().known == 1


def test_a_lone_side_waits_link_wait_s_then_counts_with_its_reason() -> None:
    lk = linker()
    lk.add(pair("solo", 102, NOW - S)[:1])  # the prefill side only
    assert lk.complete(NOW, directory).requests == 0
    assert lk.complete(NOW + 5 * S, directory).requests == 1
    counts = lk.counts()
    assert counts.known == 0
    assert [r.reason for r in counts.unknown] == list(REASONS)
    assert {r.reason: r.requests for r in counts.unknown}["one side only"] == 1


def test_a_stage_measured_as_a_span_is_not_counted_again_and_gives_the_path() -> None:
    lk = linker()
    lone = pair("req-2", 103, NOW - S)[1:]  # one side only: its link names no path
    lk.add(lone)
    t0, t1 = NOW - S, NOW - S // 2
    lk.measured(
        [
            StageRecord("req-2", "queue", t0, t1),
            StageRecord("req-2", "kv_transfer", t0, t1, "pre-node", "dec-node"),
        ]
    )
    done = lk.complete(NOW + 6 * S, directory)
    assert done.requests == 1
    assert {s.stage for s in done.stages} == {"prefill", "decode"}
    assert lk.counts().known == 1  # its KV span named the path


def test_linked_reads_the_fragments_that_ended_after_a_time() -> None:
    lk = linker()
    lk.add(pair("old", 104, NOW - 100 * S) + pair("new", 105, NOW - S))
    assert {x.path.request_id for x in lk.linked(0, directory)} == {"old", "new"}
    assert {x.path.request_id for x in lk.linked(NOW - 10 * S, directory)} == {"new"}
    bounded = RequestLinker(2, link_wait_s=5.0, pair_wait_s=300.0)
    bounded.add(pair("old", 104, NOW - 100 * S) + pair("new", 105, NOW - S))
    assert [f.request_id for f in bounded.fragments] == ["new", "new"]


def test_engine_hosts_are_found_once_per_sending_process() -> None:
    lk = linker()
    lk.add(pair("a", 106, NOW - S))
    assert lk.new_engine_hosts(directory) == {"pre-node", "dec-node.example"}
    assert lk.new_engine_hosts(directory) == set()  # nothing new arrived
    lk.add(pair("b", 107, NOW - S))  # the same processes again
    assert lk.new_engine_hosts(directory) == set()
    assert lk.engine_hosts == {"pre-node", "dec-node.example"}


def test_fragments_sharing_any_key_are_one_request_whatever_their_order() -> None:
    """A trace id ties the prefill side to a decode fragment, a request id that one to
    another decode fragment: one request, found as they come (two open ones merge)."""
    lk = linker()
    t = NOW - 2 * S
    pre = frag(vllm_request(t, "req-9", 109, queue=0.002, e2e=0.05, out=1), PRE)
    other = frag(vllm_request(t + S // 10, "alias-9", 110, queue=0.03, e2e=0.3, out=8), DEC)
    dec = frag(vllm_request(t + S // 10, "alias-9", 109, queue=0.03, e2e=0.3, out=8), DEC)
    lk.add([pre])
    lk.add([other])
    assert len(lk.linked(0, directory)) == 2  # nothing ties them yet
    lk.add([dec])  # trace 109 and request id alias-9: both open requests are one
    (one,) = lk.linked(0, directory)
    assert (one.path.src, one.path.dst) == ("pre-node", "dec-node.example")
    done = lk.complete(NOW + 10 * S, directory)
    assert done.requests == 1 and {"req-9", "alias-9"} <= done.ids
    assert lk.fragments == []


def test_fragments_past_the_bound_go_with_their_request_counted() -> None:
    lk = RequestLinker(3, link_wait_s=5.0, pair_wait_s=300.0)
    lk.add(pair("a", 111, NOW - S) + pair("b", 112, NOW - S))
    assert [f.request_id for f in lk.fragments] == ["b", "b"] and lk.dropped == 2
    assert lk.complete(NOW + 10 * S, directory).ids == {"a", "b"}


def test_a_side_that_arrives_late_is_waited_for_from_its_arrival() -> None:
    """Each engine's exporter flushes on its own timer: the decode side of a request that
    ended 8 s ago arrives now, the prefill side 4 s later. The wait runs from the
    arrival, so the two are one request with its path; from the end alone the decode side
    would have been counted alone at once (a CI run of the real vLLM pair: one request of
    eight "one side only")."""
    lk = linker()
    pre, dec = pair("late", 113, NOW - 9 * S)
    lk.add([dec], NOW)
    assert lk.complete(NOW + S, directory).requests == 0
    lk.add([pre], NOW + 4 * S)
    done = lk.complete(NOW + 4 * S, directory)
    assert done.requests == 1 and lk.counts().known == 1
    alone = linker()
    alone.add([dec], NOW)
    assert alone.complete(NOW + 4 * S, directory).requests == 0
    assert alone.complete(NOW + 5 * S, directory).requests == 1  # link_wait_s after arrival
    assert {r.reason: r.requests for r in alone.counts().unknown}["one side only"] == 1
    alone.add([pre], NOW + 6 * S)  # too late: counted, never counted twice
    assert alone.complete(NOW + 6 * S, directory).requests == 0
    assert alone.counts().late == 1 and alone.fragments == []
