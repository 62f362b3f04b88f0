"""TCP probe runner against a real responder, the scheduler, the rate budget, windows."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import ClassVar

import pytest

from fabricprobe.agent.probing import (
    TCP_RUNNERS,
    ProbeContext,
    ProbeOutcome,
    ProbeSpec,
    RateBudget,
    Scheduler,
    tcp_pingpong,
)
from fabricprobe.agent.rdma_runners import all_runners
from fabricprobe.agent.window import WindowAggregator
from fabricprobe.core.sketchwire import from_wire
from fabricprobe.core.stats import LatencySketch
from fabricprobe.probes.control import ControlClient
from fabricprobe.probes.measure import LatencyRound, LinkParams
from fabricprobe.probes.rdma.sessions import probe_sessions
from fabricprobe.probes.responder import Responder
from fabricprobe.probes.tcp import open_data_connection


@pytest.fixture
def responder() -> Iterator[Responder]:
    with Responder("127.0.0.1", 0, idle_timeout=2.0, sessions=probe_sessions(), auth=None) as r:
        yield r


def spec(port: int, **kw: object) -> ProbeSpec:
    base: dict[str, object] = dict(
        dst="peer",
        address="127.0.0.1",
        port=port,
        kind="tcp_lat",
        size=64,
        count=5,
        interval_s=0.05,
    )
    base.update(kw)
    return ProbeSpec(**base)  # type: ignore[arg-type]


def test_tcp_lat_is_in_the_tables() -> None:
    assert TCP_RUNNERS["tcp_lat"] is tcp_pingpong
    assert all_runners()["tcp_lat"] is tcp_pingpong


def test_tcp_bursts_share_one_kept_session(caplog: pytest.LogCaptureFixture) -> None:
    """Bursts to a target reuse its session; a restarted responder costs no burst; a
    link no longer assigned is closed and its responder session ends quietly."""
    caplog.set_level("INFO", "fabricprobe.responder")
    ctx = ProbeContext(bind="127.0.0.1", timeout=1)
    r = Responder("127.0.0.1", 0, idle_timeout=2.0, grace=0.2, sessions=probe_sessions(), auth=None)
    r.__enter__()
    port = r.port
    target = spec(port)
    try:
        for _ in range(4):
            out = tcp_pingpong(target, ctx)
            assert out.error is None and len(out.rtt_ns) == 5
        assert r.active_sessions() == 1 and r.served == 0 and len(ctx.links) == 1
        r.__exit__(None, None, None)  # the responder restarts under the kept link
        r = Responder(
            "127.0.0.1", port, idle_timeout=2.0, grace=0.2, sessions=probe_sessions(), auth=None
        )
        r.__enter__()
        out = tcp_pingpong(target, ctx)
        assert out.error is None and len(out.rtt_ns) == 5 and not out.failed
        ctx.links.retain([])
        _wait_until(lambda: r.active_sessions() == 0)
    finally:
        r.__exit__(None, None, None)
    assert "session tcp_lat" in caplog.text and "the prober closed its link" in caplog.text


def test_a_kept_tcp_session_ends_quietly_after_its_keepalive(
    responder: Responder, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", "fabricprobe.responder")
    with ControlClient(*responder.address, timeout=2) as ctrl:
        info = ctrl.open("tcp_lat", {"size": 8, "keepalive_s": 0.3})
        with open_data_connection(ctrl, info, 2.0):
            _wait_until(lambda: responder.active_sessions() == 0, limit=5)
    assert "(prober idle for 2 s)" in caplog.text  # the responder's idle timeout, not 0.3


def test_tcp_pingpong_measures_rtt(responder: Responder) -> None:
    out = tcp_pingpong(spec(responder.port, size=1024), ProbeContext(bind="127.0.0.1", timeout=1))
    assert out.error is None and not out.failed
    assert len(out.rtt_ns) == 5 and out.lost == 0 and all(v > 0 for v in out.rtt_ns)
    assert (out.transport, out.op) == ("tcp", "pingpong")


def test_tcp_stream_reports_confirmed_bytes(responder: Responder) -> None:
    out = TCP_RUNNERS["tcp_bw"](
        spec(responder.port, kind="tcp_bw", size=65536, count=32),
        ProbeContext(bind="127.0.0.1", timeout=2),
    )
    assert out.error is None and (out.transport, out.op) == ("tcp", "stream")
    assert out.bytes_moved == 65536 * 32 and out.busy_seconds > 0


def test_dead_peer_is_a_failed_burst_with_every_exchange_lost() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nobody listens here once closed
    out = tcp_pingpong(spec(port), ProbeContext(bind=None, timeout=0.5))
    assert out.failed and out.error
    assert out.lost == 5 and not out.rtt_ns


def test_rate_budget() -> None:
    now = [0.0]
    b = RateBudget(2.0, clock=lambda: now[0])
    assert b.wait_time() == 0.0
    assert b.wait_time() == pytest.approx(0.5)
    now[0] += 0.5
    assert b.wait_time() == 0.0


def test_scheduler_runs_targets_within_budget_and_skips_unknown_kinds() -> None:
    seen: list[str] = []
    lock = threading.Lock()

    def fake(s: ProbeSpec, ctx: ProbeContext) -> ProbeOutcome:
        with lock:
            seen.append(s.dst)
        sk = LatencySketch()
        sk.record(1000)
        return ProbeOutcome("tcp", "pingpong", rtt=sk)

    agg = WindowAggregator()
    sched = Scheduler(ProbeContext(None, 1.0), agg.add, budget=1000, runners={"tcp_lat": fake})
    sched.set_targets([spec(1, dst="a"), spec(1, dst="b"), spec(1, dst="c", kind="rdma_ud")])
    assert sorted(s.dst for s in sched.targets()) == ["a", "b"]
    sched.start()
    time.sleep(0.6)
    sched.stop()
    assert seen.count("a") >= 4 and seen.count("b") >= 4 and "c" not in seen
    windows = {w.dst: w for w in agg.cut()}
    assert set(windows) == {"a", "b"}
    assert windows["a"].rtt.count == seen.count("a")
    assert agg.cut() == []

    slow = Scheduler(ProbeContext(None, 1.0), agg.add, budget=5, runners={"tcp_lat": fake})
    seen.clear()
    slow.set_targets([spec(1, dst=f"p{i}", interval_s=0.01) for i in range(10)])
    slow.start()
    time.sleep(1.0)
    slow.stop()
    assert 3 <= len(seen) <= 8  # ~5 bursts/s (plus the first token), not 10 x 100/s


@pytest.mark.parametrize("big", [("tcp_bw", 64), ("tcp_lat", 65536)])
def test_a_bulk_burst_runs_alone_to_its_peer(big: tuple[str, int]) -> None:
    """A peer's small-message bursts never run while this host's bulk burst to it does
    (bandwidth, or a ping-pong of 64 KiB: they would queue behind it on the path) and the
    other way round; small bursts to one peer run side by side, and bursts to other peers
    run beside a bulk burst."""
    kind, size = big
    lock = threading.Lock()
    running: dict[str, list[str]] = {"a": [], "b": []}
    clashes: list[tuple[str, list[str]]] = []
    side_by_side = {"lat": 0, "peers": 0}
    done: list[str] = []

    def burst(s: ProbeSpec, ctx: ProbeContext) -> ProbeOutcome:
        with lock:
            mine = running[s.dst]
            name = "bulk" if s.size == size and s.kind == kind else "small"
            if "bulk" in mine or (name == "bulk" and mine):
                clashes.append((name, list(mine)))
            side_by_side["lat"] = max(side_by_side["lat"], mine.count("small") + 1)
            mine.append(name)
            side_by_side["peers"] = max(
                side_by_side["peers"], sum(bool(v) for v in running.values())
            )
        time.sleep(0.03 if name == "bulk" else 0.01)
        with lock:
            mine.remove(name)
            done.append(f"{s.dst}:{name}")
        return ProbeOutcome("tcp", "pingpong", rtt_ns=[1000])

    sched = Scheduler(
        ProbeContext(None, 1.0),
        lambda s, o: None,
        budget=1000,
        workers=6,
        runners={"tcp_lat": burst, "tcp_bw": burst},
    )
    sched.set_targets(
        [
            spec(1, dst=d, kind=k, size=n, interval_s=0.02)
            for d in ("a", "b")
            for k, n in (("tcp_lat", 64), (kind, size), ("tcp_lat", 64))
        ]
    )
    sched.start()
    time.sleep(0.8)
    sched.stop()
    assert clashes == []
    assert side_by_side == {"lat": 2, "peers": 2}
    assert sched.held > 0  # due bursts did wait for their peer
    for d in ("a", "b"):  # neither kind starved the other
        assert done.count(f"{d}:small") >= 5 and done.count(f"{d}:bulk") >= 3


def test_quick_kept_bursts_run_in_the_scheduling_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tcp_lat burst on an open kept link whose last burst ran through quickly runs in
    the scheduling thread (no worker woken); the first burst (setup), one that was slow
    and one that failed go to a worker, and so do other kinds."""
    from fabricprobe.agent import probing

    monkeypatch.setattr(probing, "QUICK_S", 0.05)
    ran: list[tuple[str, str]] = []
    slow = {"b": True}

    class Kept:
        is_open = True

        def close(self) -> None:
            pass

    def burst(s: ProbeSpec, ctx: ProbeContext) -> ProbeOutcome:
        def run(link: Kept) -> None:
            ran.append((s.dst, threading.current_thread().name))
            if s.dst == "b" and slow["b"]:
                slow["b"] = False
                time.sleep(0.08)  # over QUICK_S once: the next one goes to a worker

        ctx.links.burst(s, Kept, run)
        return ProbeOutcome("tcp", "pingpong", rtt_ns=[1000])

    agg = WindowAggregator()
    sched = Scheduler(
        ProbeContext(None, 1.0),
        agg.add,
        budget=1000,
        runners={"tcp_lat": burst, "other": burst},
    )
    a, b = spec(1, dst="a", interval_s=0.04), spec(1, dst="b", interval_s=0.04, address="x")
    sched.set_targets([a, b, spec(1, dst="c", kind="other", interval_s=0.04, address="y")])
    sched.start()
    _wait_until(lambda: sum(d == "b" for d, _ in ran) >= 8 and sum(d == "a" for d, _ in ran) >= 8)
    sched.stop()
    where = {d: [t.rstrip("0123456789").rstrip("_") for e, t in ran if e == d] for d in "abc"}
    for d in "ab":  # a worker sets the link up (b's bursts overlap while one is slow)
        assert where[d][0] == "probe" and where[d][-3:] == ["scheduler"] * 3, where
    assert where["b"].count("probe") >= 2  # the one after the slow burst too
    assert set(where["c"]) == {"probe"}
    assert sched.inline == where["a"].count("scheduler") + where["b"].count("scheduler")
    assert agg.bursts == len(ran)

    # over a real responder: a link whose peer went away is not quick any more
    ctx = ProbeContext("127.0.0.1", 0.5)
    r = Responder("127.0.0.1", 0, sessions=probe_sessions(), auth=None, grace=0.05)
    with r:
        s = spec(r.port)
        assert not ctx.links.quick(s)
        assert not tcp_pingpong(s, ctx).failed and ctx.links.quick(s)
    _wait_until(lambda: r.active_sessions() == 0)
    out = tcp_pingpong(s, ctx)
    assert out.failed or out.error
    assert not ctx.links.quick(s)
    ctx.links.close()


def test_a_sink_that_raises_never_stops_the_schedule() -> None:
    class Kept:
        is_open = True

        def close(self) -> None:
            pass

    def burst(s: ProbeSpec, ctx: ProbeContext) -> ProbeOutcome:
        ctx.links.burst(s, Kept, lambda link: None)
        return ProbeOutcome("tcp", "pingpong", rtt_ns=[1000])

    def sink(s: ProbeSpec, o: ProbeOutcome) -> None:
        raise ValueError("bad outcome")

    sched = Scheduler(ProbeContext(None, 1.0), sink, budget=1000, runners={"tcp_lat": burst})
    sched.set_targets([spec(1, interval_s=0.01)])
    sched.start()
    _wait_until(lambda: sched.inline >= 3)
    assert sched.running
    sched.stop()


def test_runner_crash_is_a_failed_burst() -> None:
    def broken(s: ProbeSpec, ctx: ProbeContext) -> ProbeOutcome:
        raise RuntimeError("bug")

    agg = WindowAggregator()
    sched = Scheduler(ProbeContext(None, 1.0), agg.add, runners={"tcp_lat": broken})
    sched.set_targets([spec(1, interval_s=0.05)])
    sched.start()
    time.sleep(0.2)
    sched.stop()
    (w,) = agg.cut()
    assert w.failures >= 1


def test_rdma_runners_keep_links_between_bursts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The RC runner sets a link up once and reuses it; a link its responder let go is
    set up again within the same burst; a dead peer is a failed burst with its exchanges
    lost; a target no longer assigned has its link closed. (The link stands in for
    fabricprobe.probes.rdma.rc's, which needs an RDMA device: the lane tests run the real one.)"""
    import sys
    import types
    from array import array

    from fabricprobe.core.errors import PeerError
    from fabricprobe.probes.control import LinkStale

    links: list[FakeLink] = []

    class FakeLink:
        def __init__(self, params: LinkParams, **kw: object) -> None:
            self.params, self.kw, self.rounds, self.closed = params, kw, 0, 0
            self.peer = params.peer
            self.stale_once = self.peer == "10.0.0.3"
            links.append(self)

        def round(self, iters: int, warmup: int = 0) -> object:
            if self.peer == "10.0.0.9":
                raise PeerError("no responder")
            if self.stale_once:
                self.stale_once = False
                raise LinkStale("the responder restarted")
            self.rounds += 1
            return LatencyRound(array("q", [3000] * iters), 0, None, "rxe0", 0.01)

        def close(self) -> None:
            self.closed += 1

    def fake_rc_bandwidth(params: LinkParams, **kw: object) -> object:
        assert isinstance(kw["size"], int)
        return types.SimpleNamespace(bytes=8 * kw["size"], duration_s=0.5, error=None)

    fake = types.ModuleType("fabricprobe.probes.rdma.rc")
    fake.RcPingLink = FakeLink  # type: ignore[attr-defined]
    fake.rc_bandwidth = fake_rc_bandwidth  # type: ignore[attr-defined]
    fake_ud = types.ModuleType("fabricprobe.probes.rdma.ud")
    fake_ud.UdLink = FakeLink  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fabricprobe.probes.rdma.rc", fake)
    monkeypatch.setitem(sys.modules, "fabricprobe.probes.rdma.ud", fake_ud)
    from fabricprobe.agent import rdma_runners as mod

    runners = mod.rdma_runners()
    assert sorted(runners) == ["rdma_rc_bw", "rdma_rc_lat", "rdma_rc_read", "rdma_ud"]
    runner = runners["rdma_rc_lat"]
    ctx = ProbeContext(bind="10.0.0.1", timeout=1.0, sysfs_root="/x")
    b = ProbeSpec("b", "10.0.0.2", 4793, "rdma_rc_lat", 64, 2, 10.0)
    for _ in range(3):
        out = runner(b, ctx)
        assert (out.transport, out.op, out.failed) == ("rdma", "send", False)
        assert out.rtt_ns == [3000, 3000] and out.lost == 0
    (link,) = links
    assert link.rounds == 3 and link.closed == 0
    assert link.params.bind == "10.0.0.1" and link.params.timeout == mod.SETUP_TIMEOUT_S
    assert link.params.step_s == 1.0 and link.params.sysfs_root == "/x"
    assert link.kw["keepalive_s"] == 30.0 and link.kw["op"] == "send"

    c = ProbeSpec("c", "10.0.0.3", 4793, "rdma_rc_lat", 64, 2, 100.0)
    out = runner(c, ctx)
    assert not out.failed and links[1].rounds == 1 and links[1].kw["keepalive_s"] == 300.0

    down = runner(ProbeSpec("d", "10.0.0.9", 4793, "rdma_rc_lat", 64, 2, 10.0), ctx)
    assert down.failed and down.lost == 2 and down.rtt is None and not down.rtt_ns
    assert len(ctx.links) == 3

    ctx.links.retain([c])
    assert len(ctx.links) == 1 and (links[0].closed, links[1].closed, links[2].closed) == (1, 0, 1)
    ctx.links.close()
    assert len(ctx.links) == 0 and links[1].closed == 1

    read = runners["rdma_rc_read"](
        ProbeSpec("e", "10.0.0.5", 4793, "rdma_rc_read", 64, 2, 10.0), ctx
    )
    assert (read.transport, read.op, read.failed, read.rtt_ns) == (
        "rdma",
        "read",
        False,
        [3000] * 2,
    )
    assert links[-1].kw == {"op": "read", "size": 64, "keepalive_s": 30.0}

    bw = runners["rdma_rc_bw"](ProbeSpec("b", "10.0.0.2", 4793, "rdma_rc_bw", 65536, 8, 10.0), ctx)
    assert (bw.op, bw.bytes_moved, bw.busy_seconds) == ("write_stream", 8 * 65536, 0.5)


def test_scheduler_keeps_links_of_assigned_targets_only_and_closes_them_at_stop() -> None:
    closed: list[str] = []

    class Held:
        def __init__(self, dst: str) -> None:
            self.dst = dst

        def close(self) -> None:
            closed.append(self.dst)

    ctx = ProbeContext(None, 1.0)
    for dst in ("a", "b"):
        ctx.links.burst(spec(1, dst=dst, address=f"127.0.0.{ord(dst)}"), lambda d=dst: Held(d), id)
    sched = Scheduler(
        ctx,
        WindowAggregator().add,
        runners={"tcp_lat": lambda s, c: ProbeOutcome("tcp", "pingpong")},
    )
    sched.set_targets([spec(1, dst="b", address="127.0.0.98"), spec(1, dst="x", kind="nope")])
    assert closed == ["a"] and len(ctx.links) == 1
    sched.start()
    sched.stop()
    assert closed == ["a", "b"] and len(ctx.links) == 0


def test_agents_in_one_process_never_share_a_link() -> None:
    made: list[str] = []
    one, two = ProbeContext("127.0.0.1", 1.0), ProbeContext("127.0.0.2", 1.0)
    for ctx in (one, two, one):
        ctx.links.burst(spec(1), lambda c=ctx: made.append(c.bind or "") or c, id)
    assert made == ["127.0.0.1", "127.0.0.2"]


def test_window_takes_bare_rtts_and_loss() -> None:
    agg = WindowAggregator()
    s = spec(1)
    agg.add(s, ProbeOutcome("tcp", "pingpong", rtt_ns=[1000, 2000], lost=1))
    agg.add(s, ProbeOutcome("tcp", "pingpong", failed=True, lost=5))
    (w,) = agg.cut()
    sk = from_wire(w.rtt)
    assert (sk.count, sk.lost, w.failures) == (2, 6, 1)


def _wait_until(cond: Callable[[], bool], limit: float = 5.0) -> None:
    end = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.01)


def test_an_agent_probes_a_fleet_responder_with_the_fleet_token() -> None:
    from fabricprobe.probes.fleet import FleetToken

    token = FleetToken(b"the-fleet-token-of-this-test")
    with Responder("127.0.0.1", 0, sessions=probe_sessions(), auth=token, grace=0.2) as r:
        stranger = tcp_pingpong(spec(r.port), ProbeContext(bind="127.0.0.1", timeout=1))
        assert stranger.failed and "fleet token" in (stranger.error or "")
        member = ProbeContext(bind="127.0.0.1", timeout=1, token=token)
        out = tcp_pingpong(spec(r.port), member)
        assert out.error is None and len(out.rtt_ns) == 5
        member.links.close()


class _FakeLink:
    """A kept link that records how it was made and run."""

    made: ClassVar[list[tuple[LinkParams, dict[str, object]]]] = []

    def __init__(self, params: LinkParams, **kw: object) -> None:
        _FakeLink.made.append((params, kw))

    def round(self, count: int, warmup: int = 0) -> LatencyRound:
        from array import array

        return LatencyRound(array("q", [1000 + warmup] * count), 0, None, "rxe0", 0.01)

    def close(self) -> None:
        pass


def test_rdma_runners_keep_their_links_and_name_their_outcomes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("pyverbs")
    from fabricprobe.agent import rdma_runners
    from fabricprobe.probes.measure import BandwidthResult
    from fabricprobe.probes.rdma import rc, ud

    _FakeLink.made = []
    monkeypatch.setattr(rc, "RcPingLink", _FakeLink)
    monkeypatch.setattr(ud, "UdLink", _FakeLink)
    streamed: list[tuple[LinkParams, dict[str, object]]] = []

    def rc_bandwidth(link: LinkParams, **kw: object) -> BandwidthResult:
        streamed.append((link, kw))
        return BandwidthResult("rdma", "write", link.peer, link.port, 64, 6400, 0.5)

    monkeypatch.setattr(rc, "rc_bandwidth", rc_bandwidth)
    runners = rdma_runners.rdma_runners()
    ctx = ProbeContext(bind="127.0.0.1", timeout=1.0)
    lat = runners["rdma_rc_lat"](spec(4793, kind="rdma_rc_lat", interval_s=60), ctx)
    assert (lat.transport, lat.op, lat.rtt_ns, lat.failed) == ("rdma", "send", [1001] * 5, False)
    params, kw = _FakeLink.made[-1]
    assert kw == {"op": "send", "size": 64, "keepalive_s": 180.0}
    assert (params.timeout, params.step_s) == (rdma_runners.SETUP_TIMEOUT_S, 1.0)
    got = runners["rdma_ud"](spec(4793, kind="rdma_ud", count=3), ctx)
    assert (got.op, got.rtt_ns) == ("ud", [1001] * 3)
    assert _FakeLink.made[-1][1] == {"keepalive_s": 30.0}
    bw = runners["rdma_rc_bw"](spec(4793, kind="rdma_rc_bw", count=100), ctx)
    assert (bw.op, bw.bytes_moved, bw.busy_seconds, bw.failed) == ("write_stream", 6400, 0.5, False)
    assert streamed[-1][1] == {"op": "write", "size": 64, "iters": 100}


def test_a_runner_that_cannot_reach_its_target_reports_a_failed_burst() -> None:
    ctx = ProbeContext(bind="127.0.0.1", timeout=1.0)
    bad = spec(0)  # no such port: the link cannot even be described
    lat = tcp_pingpong(bad, ctx)
    assert (lat.failed, lat.lost) == (True, 5) and "port" in (lat.error or "")
    bw = TCP_RUNNERS["tcp_bw"](spec(0, kind="tcp_bw"), ctx)
    assert (bw.transport, bw.op, bw.failed, bw.bytes_moved) == ("tcp", "stream", True, 0)
