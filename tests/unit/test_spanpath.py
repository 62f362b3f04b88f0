"""Engine traces gathered on their trace's shard until a side names the path's source:
vLLM sides in either order, a lone side after the hold, the bound on what waits."""

from __future__ import annotations

from typing import Any

from fabricprobe.collector.attribution.engines.common import Fragment
from fabricprobe.collector.attribution.linking import HostDirectory, MatchConfig
from fabricprobe.collector.attribution.spanpath import Item, PathRelay, engine_fragment, path_source
from tests.unit.spanmaker import S
from tests.unit.test_engines import vllm_request

HOSTS = HostDirectory([("pre-node", ["10.0.0.2"]), ("dec-node", ["10.0.0.3"])], MatchConfig())
PRE = {"host.name": "pre-node", "service.name": "vllm-prefill"}
DEC = {"host.name": "10.0.0.3", "service.name": "vllm-decode"}


def side(resource: dict[str, Any], trace: int, start: int, max_tokens: int) -> Fragment:
    span = vllm_request(start, f"req-{trace}", trace, queue=0.01, e2e=0.1, out=max_tokens)
    span.attributes.add(key="gen_ai.request.max_tokens").value.int_value = max_tokens
    frag = engine_fragment(span, resource, "vllm.api_server")
    assert frag is not None
    return frag


def item(frag: Fragment) -> Item:
    return Item(None, "", None, "", frag.span_id, frag.hosts, (0, 0, 0))


def relay(**kw: Any) -> tuple[PathRelay, list[tuple[str | None, list[str], str]], list[int]]:
    got: list[tuple[str | None, list[str], str]] = []
    now = [100 * S]
    r = PathRelay(
        lambda host, items, result: got.append((host, [i.span for i in items], result)),
        lambda: HOSTS,
        lambda: now[0],
        hold_s=5.0,
        **kw,
    )
    return r, got, now


def test_the_path_source_is_the_prefill_side_as_the_join_picks_it() -> None:
    pre, dec = side(PRE, 1, 10 * S, 1), side(DEC, 1, 11 * S, 16)
    assert path_source([dec], HOSTS) == (False, None)  # a decode side names no prefill host
    assert path_source([pre], HOSTS) == (True, "pre-node")  # one token: a proxy's prefill call
    # two sides that do not say which is which: the one that started first (the join's rule)
    other = {"host.name": "pre-node", "service.name": "vllm-a"}
    assert path_source([dec, side(other, 1, 9 * S, 16)], HOSTS) == (True, "pre-node")
    assert path_source([dec, side(other, 1, 12 * S, 16)], HOSTS) == (True, "dec-node")
    assert path_source([dec, pre], HOSTS) == (True, "pre-node")


def test_a_decode_side_waits_for_its_prefill_side_then_both_go_to_its_host() -> None:
    r, got, now = relay()
    dec = side(DEC, 1, 11 * S, 16)
    r.add(b"t1", [item(dec)], [dec])
    assert got == [] and r.held == 1
    now[0] += 2 * S
    r.expire()
    assert got == []  # within the hold
    pre = side(PRE, 1, 10 * S, 1)
    r.add(b"t1", [item(pre)], [pre])
    assert got == [("pre-node", [dec.span_id, pre.span_id], "path")] and r.held == 0
    late = side(DEC, 1, 12 * S, 16)
    r.add(b"t1", [item(late)], [late])  # decided: later spans of the trace go at once
    assert got[-1] == ("pre-node", [late.span_id], "path")


def test_a_lone_side_goes_by_its_own_host_after_the_hold_and_what_waits_is_bounded() -> None:
    r, got, now = relay(max_held=2)
    dec = side(DEC, 2, 11 * S, 16)
    r.add(b"t2", [item(dec)], [dec])
    now[0] += 6 * S
    r.expire()
    assert got == [("dec-node", [dec.span_id], "unpaired")] and r.held == 0
    # a prefill side after the hold: decided with everything the trace showed
    pre = side(PRE, 2, 10 * S, 1)
    r.add(b"t2", [item(pre)], [pre])
    assert got[-1] == ("pre-node", [pre.span_id], "path")
    for t in (3, 4, 5):
        f = side(DEC, t, 11 * S, 16)
        r.add(b"t%d" % t, [item(f)], [f])
    # three waiting over a bound of two: the oldest trace goes on at once, unpaired
    assert r.held == 2 and got[-1][2] == "unpaired"
