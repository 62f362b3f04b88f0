"""The prober's own delay in UD and RC probes, on real soft-RoCE with both engines:
reported for every answered probe, small on a quiet lane, never more than the RTT it sits
in, and it follows real host delay: with the prober stopped (SIGSTOP) for a known share of
the time, the RTTs rise and the prober's delay carries the stopped time, while the RTT
without it rises by far less.

A stop, not busy processes: in soft-RoCE a busy CPU also slows the emulated NIC and,
through the machine's cores that the VM's vCPUs share, the far end; the RTT without the
prober's delay then rises with it (its p90 by 0.8-1.6 ms in the runs measured), which is
not the prober's and which a hardware NIC does not have. And how often busy processes take
the prober's CPU in the middle of a probe depends on how the emulation schedules them: on
a machine left to the VM the spinning processes seldom did (a UD p90 prober delay of 0.7 µs
against an RTT p90 of 544 µs), on a loaded one nearly always. A stop leaves the CPU free,
lands where the loop runs in user space (in its wait, before its post, or between
exchanges), and the process that stops it writes down when, so each round is held to the
stopped time that fell inside it, however loaded the machine is."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fabricprobe.probes.measure import LatencyRound, LinkParams
from fabricprobe.probes.native_loop import clock_overhead_ns
from fabricprobe.probes.rdma.rc import RcPingLink
from fabricprobe.probes.rdma.ud import UdLink
from tests.rdma.conftest import start_responder

PORT = 4797
PROBES = 1000


def _pin(pid: int, cpus: set[int]) -> None:
    """Every thread of process PID onto CPUS."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), cpus)


@pytest.fixture(scope="module")
def responder(lane_hosts) -> Iterator[subprocess.Popen[bytes]]:
    proc = start_responder(lane_hosts, PORT)
    yield proc
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def _p(values: list[int], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] / 1000


PAUSE_S, EVERY_S = 0.010, 0.015  # the prober stopped 10 ms in every 15 ms
STOPPER = """
import os, signal, sys, time
pid, stop, every, log = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
out = open(log, "w", buffering=1)
def end(*_):
    os.kill(pid, signal.SIGCONT)  # never leave it stopped
    os._exit(0)
signal.signal(signal.SIGTERM, end)
print("ready", flush=True)
while True:
    time.sleep(every - stop)
    a = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    time.sleep(stop)
    os.kill(pid, signal.SIGCONT)
    out.write(f"{a} {time.monotonic()}\\n")
"""


@dataclass
class Stops:
    """When the prober was stopped: (start, end) in this machine's monotonic seconds."""

    spans: list[tuple[float, float]]

    def within(self, t0: float, t1: float) -> float:
        """Seconds stopped between T0 and T1."""
        return sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in self.spans)


@contextmanager
def paused(cpu: int) -> Iterator[Stops]:
    """This process stopped (SIGSTOP) for PAUSE_S in every EVERY_S by a process on CPU,
    then left running: a prober descheduled for a known time, as netem is a known
    delay. Nothing else slows: the CPU is free while it is stopped. The Stops yielded are
    filled in when the block ends."""
    stops = Stops([])
    with tempfile.NamedTemporaryFile("r", suffix=".stops") as log:
        proc = subprocess.Popen(
            ["taskset", "-c", str(cpu), sys.executable, "-c", STOPPER, str(os.getpid()),
             str(PAUSE_S), str(EVERY_S), log.name],
            stdout=subprocess.PIPE,
        )  # fmt: skip
        try:
            assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
            yield stops
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            os.kill(os.getpid(), signal.SIGCONT)
            for line in Path(log.name).read_text().splitlines():
                a, b = line.split()
                stops.spans.append((float(a), float(b)))


def _stopped_round(link: Any) -> tuple[LatencyRound, float]:
    """A round over LINK (set up already) with the prober stopped for a known share of the
    time; the round and the seconds it was stopped while the round ran. The stopper keeps
    the responder's CPU."""
    with paused(1) as stops:
        t0 = time.monotonic()
        r = link.round(PROBES, warmup=5)
        t1 = time.monotonic()
    stopped = stops.within(t0, t1)
    print(f"\nstopped {stopped * 1e3:,.1f} ms of the round's {(t1 - t0) * 1e3:,.1f} ms")
    return r, stopped


def _hold_to_the_stops(quiet: dict[str, float], slow: dict[str, float], stopped_s: float) -> None:
    """The stops landed inside the round and raised its RTTs (by at least a quarter of the
    stopped time: a stop in the round's control exchanges, between probes or in the
    warm-up is in no RTT), and the prober's delay carries that rise: the RTT without it
    rises by less than half as much. The figures are sums over the round's probes, in
    seconds, scaled to PROBES."""
    rise = slow["rtt_s"] - quiet["rtt_s"]
    print(f"\nRTTs rose {rise * 1e3:,.1f} ms, without the prober's delay "
          f"{(slow['wire_s'] - quiet['wire_s']) * 1e3:,.1f} ms")  # fmt: skip
    assert stopped_s >= 3 * PAUSE_S, "the stops did not land inside the round"
    assert rise >= 0.25 * stopped_s, ("the stops did not delay the prober", rise, stopped_s)
    assert slow["wire_s"] - quiet["wire_s"] < 0.5 * rise, (quiet, slow)


def _sums(rtt: list[int], own: list[int]) -> dict[str, float]:
    """A round's sums in seconds, scaled to PROBES: its RTTs and the RTTs without the
    prober's delay."""
    scale = PROBES / len(rtt) / 1e9
    return {"rtt_s": sum(rtt) * scale, "wire_s": (sum(rtt) - sum(own)) * scale}


def _ud_link(lane_hosts, engine: str) -> UdLink:
    a, c = lane_hosts[0], lane_hosts[2]
    return UdLink(LinkParams(c.ip, PORT, bind=a.ip, engine=engine), keepalive_s=30)


def _check(r: LatencyRound, engine: str, label: str) -> dict[str, float]:
    """The invariants of one round; its figures in µs, and its sums (_sums)."""
    assert r.error is None, r.error
    net, raw, resp, own = (list(x) for x in (r.rtt_ns, r.raw_ns, r.delays_ns, r.prober_ns))
    assert len(net) == len(raw) == len(resp) == len(own) >= PROBES - 5
    for n, w, d, p in zip(net, raw, resp, own, strict=True):
        assert w == n + d and n >= 0 and d >= 0  # the responder's delay is taken out exactly
        assert 0 <= p <= w  # the prober's spans lie inside the RTT
    wire = [w - p for w, p in zip(raw, own, strict=True)]  # the RTT without the prober's delay
    figures = {
        "raw_min": min(raw) / 1000,
        "raw_p10": _p(raw, 0.1),
        "raw_p50": _p(raw, 0.5),
        "raw_p90": _p(raw, 0.9),
        "net_p50": _p(net, 0.5),
        "responder_p50": _p(resp, 0.5),
        "prober_min": min(own) / 1000,
        "prober_p50": _p(own, 0.5),
        "prober_p90": _p(own, 0.9),
        "raw_minus_prober_p50": _p(wire, 0.5),
        "raw_minus_prober_p90": _p(wire, 0.9),
    }
    over = sum(p > n for n, p in zip(net, own, strict=True))
    print(
        f"\nUD {engine} {label}: "
        + ", ".join(f"{k} {v:,.1f}" for k, v in figures.items())
        + f" (µs); {len(net)} answered, {r.lost} lost; prober delay above the network RTT"
        f" in {over}"
    )
    return figures | _sums(raw, own)


@pytest.mark.parametrize("engine", ["pyverbs", "native"])
def test_the_probers_delay_is_reported_small_when_quiet_and_follows_a_stopped_prober(
    lane_hosts, responder, engine: str
) -> None:
    print(f"\nclock read pair (native loop): {clock_overhead_ns()} ns")
    _pin(responder.pid, {1})  # the responder keeps its own CPU: only the prober is stopped
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {0})
    try:
        with _ud_link(lane_hosts, engine) as link:
            quiet = _check(link.round(PROBES, warmup=5), engine, "as the lane is")
            r, stopped = _stopped_round(link)
        slow = _check(r, engine, f"stopped {PAUSE_S * 1e3:.0f} ms in every {EVERY_S * 1e3:.0f} ms")
    finally:
        os.sched_setaffinity(0, mine)
    # at its quickest the compiled loop's delay is a poll's gap (about a µs in the lane),
    # a small part of the quickest RTT however busy the machine is (a loaded machine
    # delays most probes: then their prober delay is large). The Python loop's own gaps
    # are not small under emulation (its pauses past SPIN_S, milliseconds on a loaded
    # machine: real delay in its RTTs), but its quickest probe still shows the network
    # apart from them
    if engine == "native":
        assert quiet["prober_min"] < 0.05 * quiet["raw_min"]
    else:
        assert quiet["prober_min"] < quiet["raw_min"]
    _hold_to_the_stops(quiet, slow, stopped)


def _rc_link(lane_hosts, engine: str, op: str) -> RcPingLink:
    a, c = lane_hosts[0], lane_hosts[2]
    return RcPingLink(LinkParams(c.ip, PORT, bind=a.ip, engine=engine), op=op, size=64)


def _rc_check(r: LatencyRound, label: str) -> dict[str, float]:
    """An RC round's invariants (a prober delay for every RTT, inside it); µs figures, and
    its sums (_sums)."""
    assert r.error is None, r.error
    rtt, own = list(r.rtt_ns), list(r.prober_ns)
    assert len(rtt) == len(own) == PROBES
    assert all(0 <= p <= t for t, p in zip(rtt, own, strict=True))
    wire = [t - p for t, p in zip(rtt, own, strict=True)]
    figures = {
        "rtt_min": min(rtt) / 1000,
        "rtt_p50": _p(rtt, 0.5),
        "rtt_p99": _p(rtt, 0.99),
        "rtt_mean": sum(rtt) / len(rtt) / 1000,
        "prober_min": min(own) / 1000,
        "prober_p50": _p(own, 0.5),
        "prober_p99": _p(own, 0.99),
        "rtt_minus_prober_mean": sum(wire) / len(wire) / 1000,
    }
    print(f"\nRC {label}: " + ", ".join(f"{k} {v:,.1f}" for k, v in figures.items()) + " (µs)")
    return figures | _sums(rtt, own)


@pytest.mark.parametrize("op", ["send", "write"])
@pytest.mark.parametrize("engine", ["pyverbs", "native"])
def test_rc_rounds_carry_the_probers_delay_and_it_follows_a_paused_prober(
    lane_hosts, responder, engine: str, op: str
) -> None:
    """RC has no answer that says when the responder saw the request, but the prober's
    own lateness is the same: the time from the clock read before the wait's last empty
    poll to the answer (probes/rdma/rc.py). Quiet, the compiled loop's quickest exchange
    has next to none. With the prober stopped for a known share of the time, its
    measured delay carries the stopped time."""
    _pin(responder.pid, {1})
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {0})
    label = f"{engine} {op}"
    try:
        with _rc_link(lane_hosts, engine, op) as link:
            quiet = _rc_check(link.round(PROBES, warmup=5), f"{label} as the lane is")
            r, stopped = _stopped_round(link)
        slow = _rc_check(
            r, f"{label}, stopped {PAUSE_S * 1e3:.0f} ms in every {EVERY_S * 1e3:.0f} ms"
        )
    finally:
        os.sched_setaffinity(0, mine)
    # neither loop times its post; the compiled one reads the clock every 64 empty polls
    assert quiet["prober_min"] < 0.5 * quiet["rtt_min"]
    _hold_to_the_stops(quiet, slow, stopped)


def test_the_agents_ud_window_carries_the_probers_delay_to_the_collector(
    lane_hosts, responder
) -> None:
    """The agent's own UD runner, window and the collector's store, on real soft-RoCE:
    every answered probe's prober delay arrives, and the store holds its p50."""
    from fabricprobe.agent.probing import ProbeContext, ProbeSpec
    from fabricprobe.agent.rdma_runners import rdma_runners
    from fabricprobe.agent.window import WindowAggregator
    from fabricprobe.collector.store import WindowStore
    from fabricprobe.core.api import fabricprobe_pb2 as pb

    a, c = lane_hosts[0], lane_hosts[2]
    ctx = ProbeContext(bind=a.ip, timeout=2.0, local_device=a.device)
    spec = ProbeSpec("h2", c.ip, PORT, "rdma_ud", 20, 50, 10.0, device=c.device)
    agg = WindowAggregator()
    try:
        for _ in range(2):  # the second burst over the kept link
            out = rdma_runners()["rdma_ud"](spec, ctx)
            assert not out.failed and out.error is None, out.error
            assert len(out.prober_ns) == len(out.rtt_ns) >= 45
            agg.add(spec, out)
    finally:
        ctx.links.close()
    (window,) = agg.cut()
    store = WindowStore()
    store.register(pb.HostInfo(host="h0"))
    report = pb.WindowReport(host="h0", epoch=1, seq=1, window_end_unix_ns=1)
    report.probes.append(window)
    store.take(report)
    path = store.paths[("h0", "h2", "rdma", "ud", 20)]
    assert path.last_prober_delay is not None and path.last_rtt is not None
    assert path.last_prober_delay.count == path.last_rtt.count
    d, p50 = path.last_prober_delay, path.last_prober_delay_ns
    assert p50 is not None and d.lost == 0 and d.min_ns is not None and d.max_ns is not None
    assert d.min_ns <= p50 <= d.max_ns
    print(
        f"\nagent UD window h0 -> h2: {path.last_rtt.count} RTTs, p50 "
        f"{path.last_rtt.percentile_ns(50.0)} ns; prober delay p50 {p50} ns"
    )
