"""Ground truth for the attribution: a known delay on one path, KV transfers over RDMA on
three, and the collector must rank that path first and flag it alone.

Per round: `tc netem` delays one directed path; the workload (the real pipeline, kv_sink
sessions over RC WRITE, spans through the OpenTelemetry SDK's OTLP exporter) runs over
h0->h1, h0->h2 and h1->h2, and RC latency probes measure the same three paths halfway
through it and after it, with the delay still on, inside the same window. The probe
sketches (RTTs and the prober's own delay in each) and the hosts' rxe hw_counters reach
the collector as the WindowReports an agent sends (Register, then reports through the
agent API). Delays 2, 5 and 10 ms, each put once on every path (9 rounds).

Quiet: the lane as it is; at least 7 of 9 rounds right, at most one untouched path
flagged (fabric-bound or faulty) over all rounds.

Busy: three spinning processes share one CPU with the probers and the KV senders (Load
says where everything else runs). Host noise then swamps the transfers and the probes'
tails; the probes' floor, which it cannot raise, must still single out the delayed path
in 8 of 9 rounds with no untouched path flagged, and the probers' measured delay must
call untouched paths host-bound in at least a third of the rounds. The seconds from the
delay's start to the analysis that flags it are printed (the time to detect; one
analysis a round here, where a collector analyses every window).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

from fabricprobe.cli import netem
from fabricprobe.collector.attribution.analysis import AnalysisConfig
from fabricprobe.collector.service import CollectorServer, ServerConfig
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.models import PRESETS
from fabricprobe.core.sketchwire import to_wire
from fabricprobe.core.stats import LatencySketch
from fabricprobe.probes.counters import read_port_counters
from fabricprobe.probes.measure import LinkParams
from fabricprobe.probes.rdma.rc import rc_latency
from fabricprobe.workload.pipeline import (
    Host,
    RequestResult,
    WorkloadConfig,
    close_channels,
    run_pipeline,
)
from fabricprobe.workload.spans import SpanSender
from fabricprobe.workload.transfer import KvChannel
from tests.rdma.conftest import LaneHost, nic_work_apart, start_responder

PORT = 4797
DELAYS = ("2ms", "5ms", "10ms")
PER_PATH = 5  # KV transfers per path and round
PROBE_ITERS = 30


class Reporter:
    """Sends what an agent would: one WindowReport per host and window."""

    def __init__(self, server: CollectorServer, hosts: list[LaneHost]) -> None:
        self.server, self.hosts, self.seq = server, hosts, 0
        for h in hosts:
            server.api.register(pb.HostInfo(host=h.name, addresses=[h.ip]))

    def report(self, start_ns: int, sketches: dict[tuple[str, str], Sketches]) -> None:
        self.seq += 1
        end_ns = time.time_ns()
        for h in self.hosts:
            r = pb.WindowReport(
                host=h.name,
                epoch=1,
                seq=self.seq,
                window_start_unix_ns=start_ns,
                window_end_unix_ns=end_ns,
            )
            for (src, dst), (rtt, own) in sketches.items():
                if src == h.name:
                    r.probes.add(dst=dst, transport="rdma", op="write", size=64,
                                 rtt=to_wire(rtt), prober_delay=to_wire(own))  # fmt: skip
            pc = read_port_counters("/sys", h.device, 1)
            values = {**(pc.pma.values if pc.pma else {}), **(pc.hw.values if pc.hw else {})}
            for name, value in sorted(values.items()):
                r.counters.add(kind="rdma", device=h.device, port=1, priority=-1, name=name,
                               value=value, width=64)  # fmt: skip
            self.server.api.report(r)


# a path's RTTs and the prober's own delay in each (probes/rdma/rc.py)
Sketches = tuple[LatencySketch, LatencySketch]


def probe_paths(
    paths: list[tuple[LaneHost, LaneHost]], into: dict[tuple[str, str], Sketches]
) -> None:
    for a, b in paths:
        res = rc_latency(LinkParams(b.ip, PORT, bind=a.ip), op="write", size=64,
                         iters=PROBE_ITERS, warmup=5)  # fmt: skip
        rtt, own = into.setdefault((a.name, b.name), (LatencySketch(), LatencySketch("delay")))
        rtt.merge(res.sketch)
        assert res.prober_delay is not None
        own.merge(res.prober_delay)


class EmitAndProbe:
    """Span out each finished request; after the AT-th, a probe pass over every path."""

    def __init__(
        self,
        sender: SpanSender,
        model: str,
        paths: list[tuple[LaneHost, LaneHost]],
        sketches: dict[tuple[str, str], Sketches],
        at: int,
    ) -> None:
        self.sender, self.model, self.paths, self.sketches, self.at = (
            sender, model, paths, sketches, at,
        )  # fmt: skip
        self.done = 0

    def __call__(self, r: RequestResult) -> None:
        self.sender.emit(r, self.model)
        self.done += 1
        if self.done == self.at:
            probe_paths(self.paths, self.sketches)


HOGS = 3  # busy processes beside the probers in the loaded run


@dataclass
class Load:
    """Where the run's parts go. Quiet: anywhere. Busy: HOGS spinning processes share one
    CPU with the probers and the KV senders (this process's threads while they probe and
    send), and the other CPU is left to the responders, the emulated NIC's receive work
    (steered there, its softirqs ahead of the busy processes: nic_work_apart), the
    collector and the analysis. All lane hosts
    share one kernel: a CPU of their own is what makes the far ends and the collector
    other machines, as they are in a fleet. (The senders' rxe send work runs in their own
    context, on the busy CPU: soft-RoCE charges the NIC's part of a post to its sender, as
    a hardware NIC does not.)"""

    busy: int | None = None
    free: int | None = None
    hogs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @classmethod
    @contextmanager
    def of(cls, kind: str) -> Iterator[Load]:
        if kind == "quiet":
            yield cls()
            return
        cpus = sorted(os.sched_getaffinity(0))
        assert len(cpus) >= 2, f"the loaded run needs 2 CPUs in the lane VM, it has {cpus}"
        load = cls(busy=cpus[-1], free=cpus[0])
        spin = [sys.executable, "-c", "while True: pass"]
        load.hogs = [
            subprocess.Popen(["taskset", "-c", str(load.busy), *spin]) for _ in range(HOGS)
        ]
        os.sched_setaffinity(0, {load.free})  # threads started from here on inherit it
        try:
            with nic_work_apart(load.free):
                yield load
        finally:
            os.sched_setaffinity(0, set(cpus))
            for h in load.hogs:
                h.kill()
                h.wait()

    @property
    def responder_cpu(self) -> str | None:
        return None if self.free is None else str(self.free)

    @contextmanager
    def probers(self) -> Iterator[None]:
        """This thread (and the threads it starts) on the probers' CPU, if busy."""
        if self.busy is None:
            yield
            return
        os.sched_setaffinity(0, {self.busy})
        try:
            yield
        finally:
            os.sched_setaffinity(0, {self.free})


@pytest.mark.timeout(900)  # 9 rounds of 15-50 s under emulation on a busy machine
@pytest.mark.parametrize("kind", ["quiet", "busy"])
def test_delayed_path_ranks_first_and_alone_is_flagged(
    lane_hosts: list[LaneHost], kind: str
) -> None:
    with Load.of(kind) as load:
        _ground_truth(lane_hosts, load)


def _ground_truth(lane_hosts: list[LaneHost], load: Load) -> None:
    h0, h1, h2 = lane_hosts[:3]
    paths = [(h0, h1), (h0, h2), (h1, h2)]
    wl_paths = [(Host(a.name, a.ip), Host(b.name, b.ip)) for a, b in paths]
    proc = start_responder(lane_hosts, PORT, cpu=load.responder_cpu)
    server = CollectorServer(ServerConfig(listen="127.0.0.1:0", metrics_listen=""))
    server.start()
    sender = SpanSender(f"127.0.0.1:{server.port}")
    channels: dict[tuple[str, str], KvChannel] = {}
    cfg = WorkloadConfig(
        model=PRESETS["Qwen2.5-7B"],  # 56 KiB of KV cache per token
        prompt_tokens=16,  # 0.4-1.3 MiB per transfer
        output_tokens=2,
        prefill_s_per_token=0.0,
        decode_step_s=0.001,
        requests=PER_PATH * len(paths),
        transport="rdma",
        port=PORT,
        outstanding=1,  # layer by layer: each layer's WRITE completes before the next
    )
    analysis = AnalysisConfig()
    server.attribution.cfg = analysis
    hits, failures, false_flags, rows = 0, 0, 0, []
    detect: list[float] = []
    host_rounds = 0  # rounds with an untouched path called host-bound
    reporter = Reporter(server, lane_hosts[:3])
    try:
        # warm-up: sessions opened, first-touch costs paid, counter baselines reported
        with load.probers():
            run_pipeline(wl_paths, cfg, channels=channels)
        reporter.report(time.time_ns(), {})
        for delay in DELAYS:
            for slow in paths:
                t0 = time.time_ns()
                before = server.attribution.ingest.received_total
                sketches: dict[tuple[str, str], Sketches] = {}
                netem.impair(slow[0].netdev, slow[1].ip, delay=delay)
                try:
                    t1 = time.time_ns()
                    emit = EmitAndProbe(sender, cfg.model.name, paths, sketches, cfg.requests // 2)
                    with load.probers():
                        results = run_pipeline(wl_paths, cfg, on_request=emit, channels=channels)
                        t2 = time.time_ns()
                        probe_paths(paths, sketches)
                finally:
                    netem.clear(slow[0].netdev)
                reporter.report(t0, sketches)
                failed = [r.error for r in results if r.error]
                failures += len(failed)
                assert len(failed) <= len(results) // 5, f"KV transfers failed: {failed}"
                want = before + 7 * (
                    len(results) - len(failed)
                )  # llm_request and six stage spans each
                sender.provider.force_flush(30_000)
                deadline = time.monotonic() + 30
                while server.attribution.ingest.received_total < want:
                    assert time.monotonic() < deadline, "spans did not arrive"
                    time.sleep(0.1)
                window_s = (time.time_ns() - t0) / 1e9 + 1.0
                res = server.attribution.analyse(window_s=window_s)
                ranked = res.paths
                first = (ranked.iloc[0]["src"], ranked.iloc[0]["dst"])
                flagged = {
                    (r.src, r.dst)
                    for r in ranked.itertuples(index=False)
                    if r.fabric_bound or r.fabric_fault
                }
                host = {(r.src, r.dst) for r in ranked.itertuples(index=False) if r.host_bound}
                want_path = (slow[0].name, slow[1].name)
                hit = first == want_path and flagged == {want_path}
                hits += hit
                false_flags += len(flagged - {want_path})
                host_rounds += bool(host - {want_path})
                if want_path in flagged:  # the delay went on at t1, the analysis just ran
                    detect.append((time.time_ns() - t1) / 1e9)
                rows.append((delay, want_path, hit, ranked))
                print(
                    f"\n{delay} on {want_path[0]}->{want_path[1]}: {'HIT' if hit else 'MISS'} "
                    f"(probes {(t1 - t0) / 1e9:.1f} s, workload {(t2 - t1) / 1e9:.1f} s, "
                    f"round {(time.time_ns() - t0) / 1e9:.1f} s; host-bound: "
                    f"{', '.join(f'{a}->{b}' for a, b in sorted(host)) or 'none'})"
                )
                print(
                    ranked[["src", "dst", "transfers", "kv_median_s", "kv_ratio", "rtt_min_s",
                            "rtt_p50_s", "rtt_p99_s", "rtt_ratio", "explained_s", "fabric_bound",
                            "fabric_fault", "host_delay_s", "host_bound"]]
                    .to_string(index=False)
                )  # fmt: skip
    finally:
        for h in lane_hosts:
            netem.clear(h.netdev)
        close_channels(channels)
        sender.close()
        server.stop(0)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    n = len(rows)
    what = f"busy ({HOGS} processes on the probers' CPU)" if load.busy is not None else "quiet"
    print(f"\nground truth, {what}: {hits}/{n} rounds right ({hits / n:.0%}); per delay:")
    print(f"  ({failures} KV transfers ended in an error completion and were left out)")
    for delay in DELAYS:
        mine = [r for r in rows if r[0] == delay]
        print(f"  {delay}: {sum(r[2] for r in mine)}/{len(mine)}")
    print(f"  untouched paths flagged: {false_flags} in {n} rounds ({2 * n} untouched paths)")
    print(f"  rounds with an untouched path called host-bound: {host_rounds} of {n}")
    if detect:
        detect.sort()
        print(
            f"  time to detect (delay on -> path flagged, one analysis a round): median "
            f"{detect[len(detect) // 2]:.1f} s, max {detect[-1]:.1f} s (R-Pingmesh's window: "
            "30 s; Minder: 3.6 s)"
        )
    if load.busy is not None:
        # host noise only adds delay: the probes' floor keeps the delayed path apart, and
        # the probers' own delay, measured in each exchange, names the rest host-bound
        assert hits >= n - 1, f"busy: the delayed path was found in only {hits} of {n} rounds"
        # ... but not all of it: a responder's (or the emulated NIC's) wait is in no one's
        # measured delay, and one CI run's round saw an untouched path's p99 at 8.4 ms with
        # its prober's own delay at 0.7 us. As one round may miss, one of the 2n untouched
        # paths may be flagged (the quiet runs below allow as much)
        assert false_flags <= 1, f"busy: {false_flags} untouched paths flagged"
        # a prober sharing its CPU loses slices in its probe passes: its windows' tails are
        # its own delay (collector/attribution/fabricjoin.py). How often a slice is lost
        # inside a probe pass is the emulation's: 9 of 9 rounds with other work beside the
        # VM, 5 and 6 of 9 with the machine to itself (the code before and after the fold
        # alike), where the untouched paths' tails stayed under a few ms. So this holds
        # the verdict to a third of the rounds; the safety property is the one above: host
        # noise flags no more untouched paths than a quiet run's emulation does.
        # (tests/rdma/test_prober_delay.py holds the prober's delay itself to a known
        # stopped time.)
        assert host_rounds >= n // 3, f"busy: host-bound paths in only {host_rounds} rounds"
        return
    # Under QEMU's software emulation a sender's stall can slow a clean path's transfers
    # for a whole round, and a delay's effect on a transfer can drown in one: the test
    # holds the attribution to a hit rate, not to every single round.
    assert hits >= n - 2, f"the delayed path was found in only {hits} of {n} rounds"
    assert false_flags <= 1, f"{false_flags} untouched paths flagged"
