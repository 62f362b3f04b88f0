"""The agent's probes: a kind -> runner registry, the TCP runner, and the scheduler.

A runner takes a ProbeSpec and a ProbeContext and returns a ProbeOutcome (one burst of
COUNT exchanges); it never raises for a peer that is down, it reports the burst as
failed and its exchanges as lost. TCP ping-pong is registered here; RDMA runners
(`rdma_rc_lat`, `rdma_ud`, ...) register themselves under their kind from the modules
in RUNNER_MODULES, and the agent advertises only the kinds it has a runner for.

The scheduler probes each target once per interval, jittered so that a fleet does not
probe in lockstep, and within a rate budget (bursts per second) shared by all targets.
"""

from __future__ import annotations

import contextlib
import heapq
import importlib
import logging
import random
import socket
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from probes.control import ControlClient
from probes.errors import PeerError, ProbeError
from probes.stats import LatencySketch
from probes.tcp import (
    MAX_CHUNK,
    open_data_connection,
    run_throughput,
    set_kernel_timeouts,
)

log = logging.getLogger("fabricprobe.agent")

# Modules whose import registers more runners; a missing one is skipped quietly.
RUNNER_MODULES: tuple[str, ...] = ("agent.rdma_runners",)


@dataclass(frozen=True)
class ProbeSpec:
    """One assigned target, as the agent runs it."""

    dst: str
    address: str
    port: int
    kind: str
    size: int
    count: int
    interval_s: float
    device: str = ""  # peer RDMA device (RDMA kinds)
    gid: str = ""  # peer GID (RDMA kinds)


@dataclass(frozen=True)
class ProbeContext:
    """What a runner needs to know about this host."""

    bind: str | None  # source address: it picks the path when hosts share a machine
    timeout: float  # deadline of each step in seconds
    sysfs_root: str = "/sys"
    local_device: str = ""  # this host's RDMA device (RDMA kinds)


@dataclass
class ProbeOutcome:
    """One burst: RTTs (lost exchanges inside), or bytes moved, or why it failed."""

    transport: str  # "tcp" or "rdma"
    op: str  # "pingpong", "send", "write", "ud", "stream"
    rtt: LatencySketch | None = None  # a runner that keeps its own sketch (RDMA probes)
    rtt_ns: list[int] = field(default_factory=list)  # or the bare RTTs, cheaper per burst
    lost: int = 0  # exchanges that got no answer (beside those inside `rtt`)
    bytes_moved: int = 0
    busy_seconds: float = 0.0
    failed: bool = False
    error: str | None = None


Runner = Callable[[ProbeSpec, ProbeContext], ProbeOutcome]
RUNNERS: dict[str, Runner] = {}


class Keeper(Protocol):
    """What runners keep between bursts (open probe links): told which targets remain
    whenever the assignment changes, and closed when the scheduler stops."""

    def retain(self, specs: list[ProbeSpec]) -> None: ...

    def close(self) -> None: ...


KEEPERS: list[Keeper] = []


def register_runner(kind: str) -> Callable[[Runner], Runner]:
    """Decorator: run probes of KIND with the decorated function."""

    def deco(fn: Runner) -> Runner:
        RUNNERS[kind] = fn
        return fn

    return deco


def load_runner_modules(names: Iterable[str] = RUNNER_MODULES) -> list[str]:
    """Import the optional runner modules; one line per module that failed to load."""
    problems = []
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                problems.append(f"{name}: {e}")
        except ImportError as e:
            problems.append(f"{name}: {e}")
    for p in problems:
        log.warning("probe runners not available: %s", p)
    return problems


# --------------------------------------------------------------------------- TCP


def _exchange(sock: socket.socket, sbuf: bytearray, rbuf: bytearray) -> int:
    """One ping-pong; the RTT in ns. OSError or PeerError when the peer fails."""
    size = len(sbuf)
    view = memoryview(rbuf)
    t0 = time.perf_counter_ns()
    sock.sendall(sbuf)
    got = 0
    while got < size:
        k = sock.recv_into(view[got:], size - got)
        if k == 0:
            raise PeerError("peer closed the data connection")
        got += k
    return time.perf_counter_ns() - t0


@register_runner("tcp_lat")
def tcp_pingpong(spec: ProbeSpec, ctx: ProbeContext) -> ProbeOutcome:
    """COUNT TCP ping-pongs of SIZE bytes against the peer's responder (session tcp_lat).

    Lighter than probes.tcp.run_pingpong (no timer calibration, no warm-up beyond one
    exchange), so a burst every few seconds to dozens of peers stays cheap.
    """
    out = ProbeOutcome("tcp", "pingpong")
    samples = out.rtt_ns
    done = 0
    try:
        with ControlClient(spec.address, spec.port, bind=ctx.bind, timeout=ctx.timeout) as ctrl:
            info = ctrl.open("tcp_lat", {"size": spec.size, "timeout": ctx.timeout})
            with open_data_connection(ctrl, info, ctx.timeout) as data:
                set_kernel_timeouts(data, ctx.timeout)
                sbuf = bytearray(random.randbytes(spec.size))
                rbuf = bytearray(spec.size)
                _exchange(data, sbuf, rbuf)  # warm-up: first-packet costs are not the fabric
                try:
                    for i in range(spec.count):
                        sbuf[0] = i & 0xFF
                        samples.append(_exchange(data, sbuf, rbuf))
                        done += 1
                        if rbuf[0] != sbuf[0]:
                            raise PeerError("echo did not match what was sent")
                except (OSError, PeerError) as e:
                    out.error = f"after {done} exchanges: {e}"
            if out.error is None:
                with contextlib.suppress(ProbeError, OSError):
                    ctrl.done({"completed": done}, timeout=ctx.timeout)
    except (ProbeError, OSError) as e:
        out.failed = done == 0
        out.error = out.error or str(e)
    out.lost = spec.count - done
    return out


BW_MIN_BYTES = 1 << 20


@register_runner("tcp_bw")
def tcp_stream(spec: ProbeSpec, ctx: ProbeContext) -> ProbeOutcome:
    """Bulk TCP send of SIZE x COUNT bytes (at least 1 MiB) in SIZE-byte chunks; the bytes
    the peer confirmed and the time they took (session tcp_bw). Not planned by default:
    add `tcp_bw` to the collector's probe kinds to measure bandwidth."""
    total = max(spec.size * spec.count, BW_MIN_BYTES)
    try:
        res = run_throughput(
            spec.address,
            spec.port,
            duration=None,
            total_bytes=total,
            chunk_size=min(max(spec.size, 1), MAX_CHUNK),
            bind=ctx.bind,
            timeout=ctx.timeout,
            connect_timeout=ctx.timeout,
        )
    except (ProbeError, OSError, ValueError) as e:
        return ProbeOutcome("tcp", "stream", failed=True, error=str(e))
    return ProbeOutcome(
        "tcp", "stream", bytes_moved=res.bytes, busy_seconds=res.duration_s, error=res.error
    )


# --------------------------------------------------------------------------- scheduler


@dataclass(order=True)
class _Due:
    at: float
    n: int
    spec: ProbeSpec = field(compare=False)


class RateBudget:
    """Token bucket of bursts per second shared by every target."""

    def __init__(self, per_second: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = max(per_second, 0.01)
        self.clock = clock
        self.tokens = 1.0
        self.last = clock()

    def wait_time(self) -> float:
        """0 if a burst may start now (and takes the token), else seconds to wait."""
        now = self.clock()
        self.tokens = min(max(1.0, self.rate), self.tokens + (now - self.last) * self.rate)
        self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


Sink = Callable[[ProbeSpec, ProbeOutcome], None]


class Scheduler:
    """Runs assigned targets on their jittered schedules within a rate budget."""

    def __init__(
        self,
        ctx: ProbeContext,
        sink: Sink,
        *,
        jitter: float = 0.2,
        workers: int = 4,
        budget: float = 20.0,
        runners: dict[str, Runner] | None = None,
        keepers: list[Keeper] | None = None,
    ) -> None:
        self.ctx, self.sink, self.jitter = ctx, sink, jitter
        self.runners = RUNNERS if runners is None else runners
        self.keepers = KEEPERS if keepers is None else keepers
        self.budget = RateBudget(budget)
        self.bursts = 0
        self._heap: list[_Due] = []
        self._n = 0
        self._cv = threading.Condition()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="probe")
        self._slots = threading.Semaphore(workers)
        self._thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)

    def set_targets(self, specs: Iterable[ProbeSpec], budget: float | None = None) -> None:
        """Replace the targets; each first runs at a random point of its interval."""
        now = time.monotonic()
        with self._cv:
            self._heap = []
            for spec in specs:
                if spec.kind not in self.runners:
                    log.warning("no runner for probe kind %s (target %s)", spec.kind, spec.dst)
                    continue
                self._n += 1
                self._heap.append(_Due(now + random.uniform(0, spec.interval_s), self._n, spec))
            heapq.heapify(self._heap)
            if budget:
                self.budget = RateBudget(budget)
            self._cv.notify()
            kept = [d.spec for d in self._heap]
        for keeper in self.keepers:
            keeper.retain(kept)

    def targets(self) -> list[ProbeSpec]:
        with self._cv:
            return [d.spec for d in self._heap]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._cv:
            self._cv.notify()
        if self._thread.is_alive():
            self._thread.join()
        self._pool.shutdown(wait=True, cancel_futures=True)
        for keeper in self.keepers:
            keeper.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._cv:
                if not self._heap:
                    self._cv.wait(1.0)
                    continue
                wait = self._heap[0].at - time.monotonic()
                if wait > 0:
                    self._cv.wait(min(wait, 1.0))
                    continue
                wait = self.budget.wait_time()
                if wait > 0:
                    self._cv.wait(wait)
                    continue
                due = heapq.heappop(self._heap)
                spread = 1.0 + random.uniform(-self.jitter, self.jitter)
                self._n += 1
                heapq.heappush(
                    self._heap,
                    _Due(
                        max(due.at + due.spec.interval_s * spread, time.monotonic()),
                        self._n,
                        due.spec,
                    ),
                )
            self._slots.acquire()
            if self._stop.is_set():
                self._slots.release()
                break
            self._pool.submit(self._run, due.spec)

    def _run(self, spec: ProbeSpec) -> None:
        try:
            outcome = self.runners[spec.kind](spec, self.ctx)
        except Exception as e:  # a runner bug must not kill the scheduler
            log.exception("probe %s to %s crashed", spec.kind, spec.dst)
            outcome = ProbeOutcome(
                "rdma" if spec.kind.startswith("rdma") else "tcp",
                spec.kind,
                failed=True,
                error=str(e),
            )
        finally:
            self._slots.release()
        self.bursts += 1
        if outcome.error:
            log.debug("probe %s to %s: %s", spec.kind, spec.dst, outcome.error)
        self.sink(spec, outcome)
