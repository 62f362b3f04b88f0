"""The ranking figures folded as reports arrive (collector/pathfold.py) give the selection a
walk over every path gives (tests/support/detailwalk.py), over random reports: peers that come
and go, replays, losses, tail regressions, paths and hosts forgotten, named pairs, time
passing past the freshness horizon."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fabricprobe.collector.detail import DetailConfig, DetailSelector, Selection
from fabricprobe.collector.exporter import FabricCollector
from fabricprobe.collector.store import WindowStore
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.sketchwire import to_wire
from fabricprobe.core.stats import LatencySketch
from tests.support.detailwalk import WalkSelector

S = 1_000_000_000
HOSTS = [f"h{i}" for i in range(6)]
KINDS = [("tcp", "pingpong", 64), ("rdma", "send", 64), ("rdma", "ud", 256)]

window = st.fixed_dictionaries(
    {
        "src": st.sampled_from(HOSTS),
        "seq": st.integers(1, 12),  # repeats are replays: touched, not counted again
        "advance_s": st.sampled_from([0, 1, 5, 12, 31]),
        "again": st.booleans(),  # the same paths once more, listed the other way round
        "probes": st.lists(
            st.tuples(
                st.sampled_from([*HOSTS, "far-1", "far-2"]),  # far-*: not registered here
                st.sampled_from(KINDS),
                st.integers(1, 60),  # exchanges
                st.integers(0, 3),  # lost
                st.integers(2_000, 90_000),  # base RTT ns
                st.booleans(),  # the sketch present (a window with no RTT has none)
            ),
            max_size=10,
        ),
    }
)
step = st.one_of(
    window.map(lambda w: ("report", w)),
    st.just(("scrape", None)),
    st.just(("forget", None)),
    st.tuples(st.sampled_from(HOSTS), st.sampled_from(HOSTS)).map(lambda p: ("name", p)),
)


def sketch(base: int, n: int, lost: int) -> pb.Sketch:
    s = LatencySketch()
    s.record_many([base + 97 * i for i in range(n)])
    s.record_lost(lost)
    return to_wire(s)


def same(a: Selection, b: Selection) -> None:
    assert list(a.paths.items()) == list(b.paths.items())
    assert list(a.hosts.items()) == list(b.hosts.items())
    assert list(a.tor_pairs.items()) == list(b.tor_pairs.items())
    assert list(a.tor_reasons.items()) == list(b.tor_reasons.items())
    assert (a.ranked_paths, a.omitted_paths, a.omitted_tor_pairs) == (
        b.ranked_paths,
        b.omitted_paths,
        b.omitted_tor_pairs,
    )


@settings(
    max_examples=int(os.environ.get("PATHFOLD_EXAMPLES", "80")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(steps=st.lists(step, min_size=1, max_size=40), k=st.integers(0, 3))
def test_folded_selection_equals_the_walk_over_every_path(steps: list, k: int) -> None:
    # the walk reads each path's ToR labels afresh, as the folds follow a registration
    # or a forgotten host at once
    run(steps, k)


def run(steps: list, k: int) -> None:
    now = [10_000 * S]
    store = WindowStore(clock=lambda: now[0], forget_after=40.0)
    for i, h in enumerate(HOSTS):
        store.register(pb.HostInfo(host=h, topology=f"t{i // 3}"))
    # tight bounds, so that the choice (and its order) matters
    cfg = DetailConfig(worst_k=k, max_paths=4, max_hosts=3, max_tor_pairs=3, hold_s=20.0)
    plan = {"far-1": "t9"}  # the fleet's plan knows one host registered elsewhere
    folded = FabricCollector(store, detail=DetailSelector(cfg), topology=plan.get)
    walk = WalkSelector(cfg)
    for kind, arg in steps:
        if kind == "report":
            now[0] += arg["advance_s"] * S
            probes = arg["probes"]
            for seq in (arg["seq"], arg["seq"] + 20)[: 1 + arg["again"]]:
                r = pb.WindowReport(
                    host=arg["src"],
                    epoch=1,
                    seq=seq,
                    window_start_unix_ns=now[0] - 10 * S,
                    window_end_unix_ns=now[0],
                )
                for dst, (transport, op, size), n, lost, base, has in probes:
                    p = r.probes.add(dst=dst, transport=transport, op=op, size=size)
                    if has:
                        p.rtt.CopyFrom(sketch(base + seq, n, lost))
                try:
                    store.take(r)
                except ValueError:  # forgotten: back again, maybe under another ToR
                    store.register(pb.HostInfo(host=arg["src"], topology=f"t{seq % 3}"))
                probes = probes[::-1]
        elif kind == "forget":
            now[0] += 15 * S
            store.forget_idle()
        elif kind == "name":
            store.name_pairs([arg])
        else:
            got = folded.select()
            named = store.named_since(now[0] - int(cfg.hold_s * 1e9))
            with store.lock:
                hosts = list(store.hosts)
            want = walk.select(
                store.path_views(), now[0], folded.topology, named, folded.alert_hosts(), hosts
            )
            same(got, want)
            assert walk.dropped == folded.detail.dropped
