"""RC probes: ping-pong latency (SEND/RECV, or RDMA WRITE with memory polling as perftest's
write_lat does), one-sided latency (RDMA READ, as perftest's read_lat: the peer's NIC
answers, no software on the peer takes part) and bandwidth (WRITE or SEND with several
operations in flight).

A probe is a session on the responder (`probe serve`): the prober's hello carries its
RdmaEndpoint and the run's shape; the responder builds its QP on the device that owns
the address the control connection arrived at, connects, pre-posts its receives and
answers `ready` with its own RdmaEndpoint. Then the data moves over RDMA only, and the
control connection carries `done`. Every wait has a deadline: a peer that vanishes
ends the run with the completed samples kept and the rest counted as lost.

Each latency sample is an RTT measured by the prober; one-way figures are RTT/2 and are
labelled so. The cost of the loop that takes the samples is measured in the same
process and reported with every result (`loop_overhead_ns`).
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fabricprobe.core.deadline import Deadline
from fabricprobe.core.errors import PeerError, ProbeError
from fabricprobe.core.stats import LatencySketch
from fabricprobe.probes.control import (
    ControlClient,
    ProtocolError,
    RdmaEndpoint,
    Session,
    SessionHandler,
    require_int,
    require_str,
)
from fabricprobe.probes.links import SETUP_TIMEOUT_S
from fabricprobe.probes.measure import (
    BandwidthResult,
    LatencyResult,
    LatencyRound,
    LinkParams,
    clock_pair_ns,
    source_address,
)
from fabricprobe.probes.rdma.links import RdmaLink, pick_engine, responder_engine
from fabricprobe.probes.rdma.verbs import RcEndpoint, Spin, device_for_address

LAT_OPS = ("send", "write", "read")
BW_OPS = ("write", "send")
MIN_SIZE, MAX_SIZE = 1, 1 << 20
MAX_ITERS = 10_000_000
DEPTH = 64  # queue depth: bounds memory and what is in flight
SIGNAL_EVERY = 16  # unsignaled sends between signaled ones (the SQ is drained at each)
Progress = Callable[[int, int], None]
# Where the responder looks for the device that owns the address a probe arrived at.
RESPONDER_SYSFS_ROOT = "/sys"


def check_shape(op: str, size: int, iters: int, ops: tuple[str, ...]) -> None:
    if op not in ops:
        raise ValueError(f"op must be one of {', '.join(ops)}, not {op!r}")
    if not MIN_SIZE <= size <= MAX_SIZE:
        raise ValueError(f"size {size} outside {MIN_SIZE}..{MAX_SIZE} bytes")
    if not 1 <= iters <= MAX_ITERS:
        raise ValueError(f"iterations {iters} outside 1..{MAX_ITERS}")


def _marker(i: int) -> int:
    """Non-zero byte that changes every iteration (the WRITE poller waits for it)."""
    return i % 255 + 1


# ------------------------------------------------------------------------- the loops
# Both sides run the same loops; `first` says who starts a round trip. The prober passes
# SAMPLES (a preallocated array) and gets one RTT in ns per round trip, and OWN (another)
# the prober's own delay in it: how late it can have seen the answer, the time from a
# clock read before the wait's last empty poll to the clock read after the answer (or
# the whole RTT when the wait made no such read), its own pauses and any time the
# thread was descheduled while the answer waited. Neither loop times its post (a
# doorbell on hardware; in soft-RoCE it runs the emulated NIC's send work, and often the
# far end's receive in the same softirq: no host figure there). The Python loop reads
# the clock before each poll (verbs.Spin), the compiled one every 64 empty polls, so its
# figure is that coarse (to within a poll: its read follows the poll it counts from).
# Nothing else is allocated or computed inside the timed part. A loop ends early only at
# a step's deadline or on an error completion, and says how far it got and why.


@dataclass(frozen=True)
class LoopOutcome:
    done: int  # completed round trips
    error: str | None = None


@dataclass(frozen=True)
class PingPong:
    """One ping-pong loop: TOTAL round trips of SIZE-byte messages, FIRST when this side
    sends first (the prober), each step within STEP_S; RTTs (ns) into SAMPLES and the
    prober's own delay into OWN when given; PROGRESS(i, total) every 1,024 round trips
    (the Python loops only: the compiled one runs to the end in C)."""

    size: int
    total: int
    first: bool
    step_s: float
    samples: array[int] | None = None
    own: array[int] | None = None
    progress: Progress | None = None


def _keep(loop: PingPong, i: int, t0: int, t1: int, last_s: float) -> None:
    """Round trip I's RTT (T0 to T1, ns) into LOOP's samples, and into its prober delays
    the time from the wait's last clock read (LAST_S, monotonic s; T0 when earlier)."""
    if loop.samples is not None:
        loop.samples[i] = t1 - t0
    if loop.own is not None:
        loop.own[i] = t1 - max(int(last_s * 1e9), t0)


def _send_pingpong(ep: RcEndpoint, loop: PingPong) -> LoopOutcome:
    size, total, first, step_s = loop.size, loop.total, loop.first, loop.step_s
    progress = loop.progress
    send_cq, recv_cq = ep.send_cq, ep.recv_cq
    signaled, quiet = ep.send_wr(size, True), ep.send_wr(size, False)
    clock, mono, poll, post = time.perf_counter_ns, time.monotonic, ep.poll, ep.post
    i, last_i = 0, total - 1  # the last send is signaled: a kept QP starts each round empty
    try:
        for i in range(total):
            wr = signaled if i % SIGNAL_EVERY == SIGNAL_EVERY - 1 or i == last_i else quiet
            deadline = mono() + step_s
            t0 = clock()
            if first:
                post(wr)
                if not poll(recv_cq, 1, deadline):
                    return LoopOutcome(i, f"no reply within {step_s:g} s")
            else:
                if not poll(recv_cq, 1, deadline):
                    return LoopOutcome(i, f"no request within {step_s:g} s")
                post(wr)
            _keep(loop, i, t0, clock(), ep.last_empty)
            ep.post_recv()
            if wr is signaled:
                ep.poll_or_raise(send_cq, 1, deadline)
            if progress is not None and i & 0x3FF == 0:
                progress(i, total)
    except (PeerError, TimeoutError) as err:
        return LoopOutcome(i, str(err))
    return LoopOutcome(total)


def _write_pingpong(ep: RcEndpoint, remote: RdmaEndpoint, loop: PingPong) -> LoopOutcome:
    size, total, first, step_s = loop.size, loop.total, loop.first, loop.step_s
    progress = loop.progress
    signaled, quiet = ep.write_wr(remote, size, True), ep.write_wr(remote, size, False)
    last = size - 1
    sbuf, rbuf = ep.send_buf, ep.recv_buf
    clock, mono, post = time.perf_counter_ns, time.monotonic, ep.post
    i, last_i = 0, total - 1
    try:
        for i in range(total):
            mark = _marker(i)
            wr = signaled if i % SIGNAL_EVERY == SIGNAL_EVERY - 1 or i == last_i else quiet
            deadline = mono() + step_s
            t0 = clock()
            if not first:
                spin = Spin(deadline)
                while rbuf[last] != mark:  # the peer's WRITE lands in our memory
                    if spin.expired():
                        return LoopOutcome(i, f"no request within {step_s:g} s")
            sbuf[last] = mark
            post(wr)
            if first:
                spin = Spin(deadline)
                while rbuf[last] != mark:
                    if spin.expired():
                        return LoopOutcome(i, f"no reply within {step_s:g} s")
            _keep(loop, i, t0, clock(), spin.last)
            if wr is signaled:
                ep.poll_or_raise(ep.send_cq, 1, deadline)
            if progress is not None and i & 0x3FF == 0:
                progress(i, total)
    except (PeerError, TimeoutError) as err:
        return LoopOutcome(i, str(err))
    return LoopOutcome(total)


def _read_probe(ep: RcEndpoint, remote: RdmaEndpoint, loop: PingPong) -> LoopOutcome:
    """The pyverbs one-sided loop: one signaled RDMA READ at a time, timed from its post
    to its completion."""
    total, step_s = loop.total, loop.step_s
    wr = ep.read_wr(remote, loop.size)
    clock, mono, poll, post = time.perf_counter_ns, time.monotonic, ep.poll, ep.post
    i = 0
    try:
        for i in range(total):
            t0 = clock()
            post(wr)
            if not poll(ep.send_cq, 1, mono() + step_s):
                return LoopOutcome(i, f"no READ response within {step_s:g} s")
            _keep(loop, i, t0, clock(), ep.last_empty)
            if loop.progress is not None and i & 0x3FF == 0:
                loop.progress(i, total)
    except (PeerError, TimeoutError) as err:
        return LoopOutcome(i, str(err))
    return LoopOutcome(total)


def loop_overhead_ns(engine: str = "pyverbs", rounds: int = 2000) -> int:
    """Median cost of what the timed part of a sample holds besides the verbs calls: the
    two clock reads (and, in Python, the store into the sample array). Reported beside
    every figure."""
    if engine == "native":
        from fabricprobe.probes.native_loop import clock_overhead_ns

        return clock_overhead_ns()
    return clock_pair_ns(rounds)


# ------------------------------------------------------------------------- prober side


def local_device(sysfs_root: str | Path, source: str, device: str | None) -> tuple[str, int]:
    name, gid_index = device_for_address(source, sysfs_root)
    if device is not None and device != name:
        raise ProbeError(f"{source} belongs to {name}, not {device}")
    return name, gid_index


# The most inline data a QP is asked for (no provider grants more; the compiled loop's
# open refuses a larger ask, which made every message over 64 KiB fail before its QP).
MAX_INLINE_ASK = 1 << 16


def _endpoint(engine: str, device: str, size: int, gid_index: int, op: str, receives: bool) -> Any:
    """An RC endpoint of ENGINE; pyverbs' gets RECEIVES pre-posted (native posts its own).
    Its QP is asked for SIZE bytes of inline data (up to MAX_INLINE_ASK), and takes what
    the provider grants."""
    remote_access = op in ("write", "read")
    inline = min(size, MAX_INLINE_ASK)
    if engine == "native":
        from fabricprobe.probes.rdma.native import NativeRcEndpoint

        return NativeRcEndpoint(
            device, size, DEPTH, gid_index, remote_access=remote_access, inline=inline
        )
    ep = RcEndpoint(device, size, DEPTH, gid_index, remote_access=remote_access, inline=inline)
    for _ in range(DEPTH if receives else 0):
        ep.post_recv()
    return ep


def _pingpong(engine: str, ep: Any, op: str, remote: RdmaEndpoint, loop: PingPong) -> LoopOutcome:
    if op == "read" and not loop.first:
        raise ValueError("an RDMA READ has no answering loop: its peer's NIC answers")
    if engine == "pyverbs":
        if op == "send":
            return _send_pingpong(ep, loop)
        if op == "read":
            return _read_probe(ep, remote, loop)
        return _write_pingpong(ep, remote, loop)
    size, total, first, step_s = loop.size, loop.total, loop.first, loop.step_s
    samples, own = loop.samples, loop.own
    try:  # the native loop runs to the end in C: no progress callbacks
        if op == "send":
            done = ep.send_pingpong(size, total, first, step_s, samples, own)
        elif op == "read":
            done = ep.read_probe(remote, size, total, step_s, samples, own)
        else:
            done = ep.write_pingpong(remote, size, total, first, step_s, samples, own)
    except PeerError as err:
        return LoopOutcome(int(getattr(err, "completed", 0)), str(err))
    if done < total:
        return LoopOutcome(done, f"no {'reply' if first else 'request'} within {step_s:g} s")
    return LoopOutcome(done)


@contextmanager
def prober_session(
    kind: str,
    link: LinkParams,
    timeout: float,
    params: dict[str, Any],
    endpoint: Callable[[str, int], Any],
) -> Iterator[tuple[ControlClient, Any, RdmaEndpoint]]:
    """Open a KIND session with PARAMS on LINK's responder, our endpoint in the hello:
    ENDPOINT(device, gid_index) makes it on the device of our source address. Yields the
    control client, our endpoint and the responder's RdmaEndpoint; the whole setup (our
    endpoint, connect, hello, the fleet-token challenge, ready) fits in TIMEOUT."""
    setup = Deadline(timeout)
    source = source_address(link.peer, link.port, link.bind)
    dev, gid_index = local_device(link.sysfs_root, source, link.device)
    with ControlClient(
        link.peer, link.port, bind=link.bind, timeout=timeout, token=link.token
    ) as ctl:
        with endpoint(dev, gid_index) as ep:
            spun(ep, link.spin_s)
            hello = {**params, "endpoint": ep.endpoint().as_dict()}
            info = ctl.open(kind, hello, deadline=setup)
            yield ctl, ep, RdmaEndpoint.from_dict(info.get("endpoint"), where="ready.endpoint")


@contextmanager
def _prober_session(
    kind: str, link: LinkParams, timeout: float, engine: str, op: str, params: dict[str, Any]
) -> Iterator[tuple[ControlClient, Any, RdmaEndpoint]]:
    """An RC session of KIND (prober_session) with our endpoint connected to the
    responder's."""
    receives = kind == "rdma_rc_lat" and op == "send"

    def endpoint(dev: str, gid_index: int) -> Any:
        return _endpoint(engine, dev, params["size"], gid_index, op, receives=receives)

    hello = {**params, "op": op, "engine": engine}
    with prober_session(kind, link, timeout, hello, endpoint) as (ctl, ep, remote):
        ep.connect(remote)
        yield ctl, ep, remote


class RcPingLink(RdmaLink):
    """An RC ping-pong link: several rounds over one connected QP on each end, instead of
    a device context, PD, CQs, MR and QP built and torn down for each. Only SEND links
    carry several rounds (a WRITE round's marker sequence restarts, so it could be
    mistaken for the last round's), and READ links (nothing on the peer counts)."""

    def __init__(
        self, params: LinkParams, *, op: str = "send", size: int = 2, keepalive_s: float = 0.0
    ) -> None:
        check_shape(op, size, 1, LAT_OPS)
        if keepalive_s and op == "write":
            raise ValueError("WRITE ping-pong links carry one round")
        super().__init__(params, keepalive_s=keepalive_s)
        self.op, self.size = op, size
        self._overhead_ns: int | None = None

    def _setup(self, params: dict[str, Any]) -> tuple[ControlClient, Any, RdmaEndpoint]:
        return self._stack.enter_context(
            _prober_session(
                "rdma_rc_lat",
                self.params,
                self.timeout,
                self.engine,
                self.op,
                {**params, "size": self.size, "step_s": self.step_s},
            )
        )

    def round(self, iters: int, warmup: int = 0, progress: Progress | None = None) -> LatencyRound:
        """One round of ITERS round trips after WARMUP unrecorded ones: the bare figures
        (what an agent folds into its window, with no per-round sketch to build)."""
        check_shape(self.op, self.size, iters, LAT_OPS)
        total = iters + warmup
        _, ep, remote = self._begin({"iters": total})
        samples, own = array("q", bytes(8 * total)), array("q", bytes(8 * total))
        t0 = time.perf_counter()
        loop = PingPong(self.size, total, True, self.step_s, samples, own, progress)
        out = _pingpong(self.engine, ep, self.op, remote, loop)
        duration = time.perf_counter() - t0
        error, dev = out.error, ep.device
        if out.done < total:
            error = f"stopped after {out.done} of {total} round trips: {error}"
        self._end(error, {"completed": out.done})
        recorded = samples[warmup : out.done]
        return LatencyRound(
            recorded, iters - len(recorded), error, dev, duration, prober_ns=own[warmup : out.done]
        )

    def run(self, iters: int, warmup: int = 0, progress: Progress | None = None) -> LatencyResult:
        """One round, summarised (percentiles, one-way, the loop's own overhead)."""
        r = self.round(iters, warmup, progress)
        if self._overhead_ns is None:
            self._overhead_ns = loop_overhead_ns(self.engine)
        sketch = LatencySketch("rtt")
        sketch.record_many(r.rtt_ns)
        sketch.record_lost(r.lost)
        prober = LatencySketch("delay")
        prober.record_many(r.prober_ns)
        return self._result(
            r,
            sketch,
            prober_delay=prober,
            qp_type="rc",
            op=self.op,
            size=self.size,
            iters=iters,
            loop_overhead_ns=self._overhead_ns,
        )


def rc_latency(
    link: LinkParams,
    *,
    op: str = "send",
    size: int = 2,
    iters: int = 1000,
    warmup: int = 100,
    progress: Progress | None = None,
) -> LatencyResult:
    """RC ping-pong against LINK's responder, one session; RTT samples into a sketch."""
    check_shape(op, size, iters, LAT_OPS)
    with RcPingLink(link, op=op, size=size) as kept:
        return kept.run(iters, warmup, progress)


def rc_bandwidth(
    link: LinkParams,
    *,
    op: str = "write",
    size: int = 65536,
    iters: int = 1000,
    outstanding: int = 16,
    progress: Progress | None = None,
) -> BandwidthResult:
    """Stream ITERS operations of SIZE bytes with OUTSTANDING in flight; bytes/s. Each
    step's deadline is LINK's step_s (default 5 s)."""
    check_shape(op, size, iters, BW_OPS)
    if not 1 <= outstanding <= DEPTH:
        raise ValueError(f"outstanding {outstanding} outside 1..{DEPTH}")
    choice = pick_engine(link.engine)
    engine, step_s = choice.name, link.step(5.0)
    params = {"size": size, "iters": iters, "step_s": step_s}
    timeout = link.setup_timeout(SETUP_TIMEOUT_S)
    with _prober_session("rdma_rc_bw", link, timeout, engine, op, params) as (ctl, ep, remote):
        error = None
        if engine == "native":
            try:
                completed, elapsed_ns = ep.bandwidth(op, size, iters, outstanding, step_s)
            except PeerError as err:
                completed, elapsed_ns, error = int(getattr(err, "completed", 0)), 0, str(err)
            duration = elapsed_ns / 1e9
            if error is None and completed < iters:
                error = f"{iters - completed} operations unfinished at the deadline"
        else:
            t0 = time.perf_counter()
            completed, error = _stream(ep, remote, op, size, iters, outstanding, step_s, progress)
            duration = time.perf_counter() - t0
        if error is None:
            ctl.done({"completed": completed}, timeout=step_s)
        dev = ep.device
    return BandwidthResult(
        transport="rdma",
        qp_type="rc",
        op=op,
        peer=link.peer,
        port=link.port,
        device=dev,
        size=size,
        iters=iters,
        completed=completed,
        bytes=completed * size,
        duration_s=duration,
        error=error,
        engine=engine,
        engine_reason=choice.reason,
    )


def _stream(
    ep: RcEndpoint,
    remote: RdmaEndpoint,
    op: str,
    size: int,
    iters: int,
    outstanding: int,
    step_s: float,
    progress: Progress | None,
) -> tuple[int, str | None]:
    """The pyverbs bandwidth loop: keep OUTSTANDING posted, count send completions."""
    wr = ep.write_wr(remote, size) if op == "write" else ep.send_wr(size)
    posted = completed = 0
    try:
        while completed < iters:
            while posted < iters and posted - completed < outstanding:
                ep.post(wr)
                posted += 1
            got = ep.poll(ep.send_cq, 1, time.monotonic() + step_s)
            if not got:
                return completed, f"{posted - completed} operations unfinished at the deadline"
            completed += got
            if progress is not None and completed & 0xFF == 0:
                progress(completed, iters)
    except PeerError as err:
        return completed, str(err)
    return completed, None


# ------------------------------------------------------------------------- responder side


def _session_shape(
    session: Session, ops: tuple[str, ...]
) -> tuple[str, int, int, float, str, RdmaEndpoint]:
    p = session.params
    op = require_str(p, "op", 16, where="params.")
    size = require_int(p, "size", MIN_SIZE, MAX_SIZE, where="params.")
    iters = require_int(p, "iters", 1, MAX_ITERS, where="params.")
    step_s = float(p.get("step_s", 2.0))
    if not 0.01 <= step_s <= 60:
        raise ProtocolError(f"params.step_s {step_s} outside 0.01..60")
    if op not in ops:
        raise ProtocolError(f"params.op must be one of {ops}, not {op!r}")
    engine = responder_engine(p.get("engine", "pyverbs"))
    return op, size, iters, step_s, engine, session.rdma_endpoint()


def responder_device(session: Session) -> tuple[str, int]:
    """The RDMA device (and GID index) of the address SESSION's control connection
    arrived at: the one a responder answers on."""
    return local_device(RESPONDER_SYSFS_ROOT, session.local[0], None)


def spun(ep: Any, spin_s: float | None) -> Any:
    """EP, its waits set to busy-poll SPIN_S before they sleep (a compiled-loop endpoint;
    None, or a pyverbs endpoint: as it is)."""
    if spin_s is not None and hasattr(ep, "set_spin"):
        ep.set_spin(spin_s)
    return ep


def _session_endpoint(
    session: Session, engine: str, size: int, op: str, receives: bool, remote: RdmaEndpoint
) -> Any:
    session.reserve(2 * size + DEPTH * 64, "an RC endpoint's registered buffer")
    dev, gid_index = responder_device(session)
    ep = session.resources.enter_context(_endpoint(engine, dev, size, gid_index, op, receives))
    spun(ep, session.spin_s)
    ep.connect(remote)
    session.ready({"endpoint": ep.endpoint().as_dict(), "engine": engine})
    return ep


def serve_rc_latency(session: Session) -> dict[str, Any]:
    op, size, iters, step_s, engine, remote = _session_shape(session, LAT_OPS)
    if session.keepalive and op == "write":
        raise ProtocolError("WRITE ping-pong sessions carry one round")
    ep = _session_endpoint(session, engine, size, op, op == "send", remote)
    if op == "read":  # the NIC answers: hold the QP and region until the last round's done
        while (nxt := session.next_round()) is not None:
            require_int(nxt, "iters", 1, MAX_ITERS, where="again.params.")
            session.go()
        if not session.keepalive:  # a round of ITERS READs, READ_WAIT_S each at the slowest
            wait = min(MAX_STREAM_WAIT_S, step_s + iters * READ_WAIT_S)
            session.wait_done(max(session.step_timeout, wait))
        return {"answered": 0, "error": None, "engine": engine}
    answered = 0
    while True:  # one round, or one per `again` of a kept link
        out = _pingpong(engine, ep, op, remote, PingPong(size, iters, False, step_s))
        answered += out.done
        if out.error is not None:
            break
        nxt = session.next_round()
        if nxt is None:
            break
        iters = require_int(nxt, "iters", 1, MAX_ITERS, where="again.params.")
        session.go()
    return {"answered": answered, "error": out.error, "engine": engine}


# The slowest stream a WRITE target waits out: it sees none of the WRITEs land, so it
# holds its QP and region for as long as ITERS x SIZE take at this rate (plus a step).
STREAM_FLOOR_BPS = 1 << 20
READ_WAIT_S = 0.01  # the slowest READ a one-round READ session's target waits out
MAX_STREAM_WAIT_S = 900.0


def stream_wait_s(size: int, iters: int, step_s: float, idle_s: float) -> float:
    """How long the target of a WRITE stream waits for the prober's `done`: never less
    than the responder's idle timeout, as long as the stream takes at STREAM_FLOOR_BPS,
    at most MAX_STREAM_WAIT_S. (It waited the idle timeout alone, and tore the QP and
    region down under a stream still writing into them: the prober's WRITEs stopped
    completing, or ended in IBV_WC_REM_INV_REQ_ERR.)"""
    return max(idle_s, min(MAX_STREAM_WAIT_S, step_s + iters * size / STREAM_FLOOR_BPS))


def serve_rc_bandwidth(session: Session) -> dict[str, Any]:
    op, size, iters, step_s, engine, remote = _session_shape(session, BW_OPS)
    ep = _session_endpoint(session, engine, size, op, op == "send", remote)
    if op == "write":  # the target of RDMA WRITEs keeps its QP and region until `done`
        session.wait_done(stream_wait_s(size, iters, step_s, session.step_timeout))
        return {"received": 0, "engine": engine}
    if engine == "native":
        received, _ = ep.bandwidth("send", size, iters, 1, step_s, first=False)
        return {"received": received, "engine": engine}
    received, posted = 0, DEPTH
    while received < iters and not session.stopping:  # keep receives posted for every SEND
        got = ep.poll(ep.recv_cq, 1, time.monotonic() + step_s)
        if not got:
            break
        received += got
        for _ in range(got):
            if posted < iters:
                ep.post_recv()
                posted += 1
    return {"received": received, "engine": engine}


# Session kind -> handler, for whoever builds a responder.
SESSIONS: dict[str, SessionHandler] = {
    "rdma_rc_lat": serve_rc_latency,
    "rdma_rc_bw": serve_rc_bandwidth,
}
