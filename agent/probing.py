"""The agent's probes: a kind -> runner registry, the TCP runner, and the scheduler.

A runner takes a ProbeSpec and a ProbeContext and returns a ProbeOutcome (one burst of
COUNT exchanges); it never raises for a peer that is down, it reports the burst as
failed and its exchanges as lost. TCP ping-pong is registered here; RDMA runners
(`rdma_rc_lat`, `rdma_ud`, ...) register themselves under their kind from the modules
in RUNNER_MODULES, and the agent advertises only the kinds it has a runner for.

Latency bursts run over kept links (each agent's ProbeContext.links, so that agents
sharing a process never share a link): the first burst to a target opens the
session (and, for RDMA, builds the verbs resources) on both ends, later bursts reuse
it, so a burst costs its exchanges and little else. A link whose burst fails is closed
and opened again at the next burst; one whose responder let it go (a restart, or the
keepalive ran out) is opened again at once, in the same burst.

The scheduler probes each target once per interval, jittered so that a fleet does not
probe in lockstep, and within a rate budget (bursts per second) shared by all targets.
"""

from __future__ import annotations

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
from typing import Any, Protocol, TypeVar

from fabricprobe.probes.control import MAX_KEEPALIVE_S, ControlClient, LinkStale
from fabricprobe.probes.errors import PeerError, ProbeError
from fabricprobe.probes.stats import LatencySketch
from fabricprobe.probes.tcp import (
    MAX_CHUNK,
    open_data_connection,
    run_throughput,
    set_kernel_timeouts,
)

log = logging.getLogger("fabricprobe.agent")

# Modules whose import registers more runners; a missing one is skipped quietly.
RUNNER_MODULES: tuple[str, ...] = ("fabricprobe.agent.rdma_runners",)


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


Runner = Callable[[ProbeSpec, "ProbeContext"], ProbeOutcome]
RUNNERS: dict[str, Runner] = {}


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


# ------------------------------------------------------------------- kept links


class Link(Protocol):
    def close(self) -> None: ...


L = TypeVar("L", bound=Link)
R = TypeVar("R")


def keepalive_for(spec: ProbeSpec) -> float:
    """How long the peer holds a link between bursts: three intervals (jitter and a busy
    rate budget never make it lapse), at least 30 s, at most the protocol's bound."""
    return min(MAX_KEEPALIVE_S, max(30.0, 3 * spec.interval_s))


class _Kept:
    __slots__ = ("dropped", "link", "lock")

    def __init__(self, link: Any) -> None:
        self.lock = threading.Lock()  # one burst at a time on a link
        self.link = link
        self.dropped = False  # no longer assigned: closed after the burst that holds it


class Links:
    """Kept probe links by target; each carries one burst at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._links: dict[tuple[str, str, int, int], _Kept] = {}

    @staticmethod
    def key(spec: ProbeSpec) -> tuple[str, str, int, int]:
        return (spec.kind, spec.address, spec.port, spec.size)

    def burst(self, spec: ProbeSpec, new: Callable[[], L], run: Callable[[L], R]) -> R:
        """RUN over SPEC's link (made by NEW the first time). A link gone stale before
        its round started is set up again once, at once."""
        with self._lock:
            kept = self._links.get(self.key(spec))
            if kept is None:
                kept = self._links[self.key(spec)] = _Kept(new())
        with kept.lock:
            try:
                return run(kept.link)
            except LinkStale as e:
                log.debug("link to %s (%s) was let go, set up again: %s", spec.dst, spec.kind, e)
                return run(kept.link)
            finally:
                if kept.dropped:
                    kept.link.close()

    def __len__(self) -> int:
        return len(self._links)

    def retain(self, specs: list[ProbeSpec]) -> None:
        """Close the links of targets no longer assigned."""
        keep = {self.key(s) for s in specs}
        with self._lock:
            gone = [self._links.pop(k) for k in list(self._links) if k not in keep]
            for kept in gone:
                kept.dropped = True
        for kept in gone:
            with kept.lock:  # after a burst still running on it
                kept.link.close()

    def close(self) -> None:
        self.retain([])


@dataclass(frozen=True)
class ProbeContext:
    """What a runner needs to know about this host."""

    bind: str | None  # source address: it picks the path when hosts share a machine
    timeout: float  # deadline of each step in seconds
    sysfs_root: str = "/sys"
    local_device: str = ""  # this host's RDMA device (RDMA kinds)
    links: Links = field(default_factory=Links, compare=False, repr=False)


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


class TcpPingLink:
    """A kept `tcp_lat` session: the control and the data connection stay open between
    bursts (the responder echoes whatever arrives, for up to the keepalive between
    bursts). Lighter than fabricprobe.probes.tcp.run_pingpong: no timer calibration, one warm-up
    exchange per burst. A warm-up that fails on a kept link means the responder let it
    go (LinkStale): nothing of the burst was measured yet."""

    def __init__(self, spec: ProbeSpec, ctx: ProbeContext) -> None:
        self.spec, self.ctx = spec, ctx
        self._ctrl: ControlClient | None = None
        self._data: socket.socket | None = None
        self._sbuf = bytearray(random.randbytes(spec.size))
        self._rbuf = bytearray(spec.size)

    def _open(self) -> socket.socket:
        spec, ctx = self.spec, self.ctx
        self._ctrl = ControlClient(spec.address, spec.port, bind=ctx.bind, timeout=ctx.timeout)
        try:
            info = self._ctrl.open(
                "tcp_lat",
                {"size": spec.size, "timeout": ctx.timeout, "keepalive_s": keepalive_for(spec)},
            )
            self._data = open_data_connection(self._ctrl, info, ctx.timeout)
            set_kernel_timeouts(self._data, ctx.timeout)
        except BaseException:
            self.close()
            raise
        return self._data

    def close(self) -> None:
        if self._data is not None:
            self._data.close()
            self._data = None
        if self._ctrl is not None:
            self._ctrl.close()
            self._ctrl = None

    def burst(self, count: int) -> ProbeOutcome:
        """COUNT ping-pongs after one warm-up exchange."""
        kept = self._data is not None
        data = self._data or self._open()
        sbuf, rbuf = self._sbuf, self._rbuf
        try:
            _exchange(data, sbuf, rbuf)  # warm-up: first-packet costs are not the fabric
        except (OSError, PeerError) as e:
            self.close()
            if kept:
                raise LinkStale(f"kept session to {self.spec.address} is gone: {e}") from e
            raise
        out = ProbeOutcome("tcp", "pingpong")
        samples = out.rtt_ns
        try:
            for i in range(count):
                sbuf[0] = i & 0xFF
                samples.append(_exchange(data, sbuf, rbuf))
                if rbuf[0] != sbuf[0]:
                    raise PeerError("echo did not match what was sent")
        except (OSError, PeerError) as e:
            out.error = f"after {len(samples)} exchanges: {e}"
            self.close()
        out.lost = count - len(samples)
        return out


@register_runner("tcp_lat")
def tcp_pingpong(spec: ProbeSpec, ctx: ProbeContext) -> ProbeOutcome:
    """COUNT TCP ping-pongs of SIZE bytes over the target's kept `tcp_lat` link."""
    try:
        return ctx.links.burst(
            spec, lambda: TcpPingLink(spec, ctx), lambda link: link.burst(spec.count)
        )
    except (ProbeError, OSError) as e:
        return ProbeOutcome("tcp", "pingpong", lost=spec.count, failed=True, error=str(e))


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
    ) -> None:
        self.ctx, self.sink, self.jitter = ctx, sink, jitter
        self.runners = RUNNERS if runners is None else runners
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
        self.ctx.links.retain(kept)  # links to targets no longer assigned are closed

    def targets(self) -> list[ProbeSpec]:
        with self._cv:
            return [d.spec for d in self._heap]

    def start(self) -> None:
        self._thread.start()

    @property
    def running(self) -> bool:
        """The scheduling thread is alive (False before start() and after it ended)."""
        return self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        with self._cv:
            self._cv.notify()
        if self._thread.is_alive():
            self._thread.join()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.ctx.links.close()

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
