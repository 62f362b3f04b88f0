"""The agent's probes: the TCP runners, the kept-link pool, and the scheduler.

A runner takes a ProbeSpec and a ProbeContext and returns a ProbeOutcome (one burst of
COUNT exchanges); it never raises for a peer that is down, it reports the burst as
failed and its exchanges as lost. TCP runners are in TCP_RUNNERS here, the RDMA ones
(`rdma_rc_lat`, `rdma_ud`, ...) in fabricprobe.agent.rdma_runners; the agent hands the
Scheduler the table it runs and advertises only the kinds it has a runner for.

Latency bursts run over kept links (each agent's ProbeContext.links, so that agents
sharing a process never share a link): the first burst to a target opens the
session (and, for RDMA, builds the verbs resources) on both ends, later bursts reuse
it, so a burst costs its exchanges and little else. A link whose burst fails is closed
and opened again at the next burst; one whose responder let it go (a restart, or the
keepalive ran out) is opened again at once, in the same burst.

The scheduler probes each target once per interval, jittered so that a fleet does not
probe in lockstep, and within a rate budget (bursts per second) shared by all targets.
A bulk burst (bandwidth, or messages larger than one packet) runs alone to its peer: the
peer's small-message bursts never share the path with this host's own bulk traffic to
it, whose packets they would queue behind (their RTTs would carry it). Small-message
bursts to one peer (its ECMP classes, its kinds) run side by side. A bulk burst that is
due holds the peer's later bursts until it has run, so it cannot be starved.
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from fabricprobe.core.errors import ProbeError
from fabricprobe.core.stats import LatencySketch
from fabricprobe.probes.control import MAX_KEEPALIVE_S, LinkStale
from fabricprobe.probes.fleet import FleetToken
from fabricprobe.probes.links import TcpPingLink
from fabricprobe.probes.measure import BandwidthResult, LatencyRound, LinkParams
from fabricprobe.probes.tcp import MAX_CHUNK, run_throughput
from fabricprobe.probes.threads import name_os_thread
from fabricprobe.probes.trace import CLASS_KINDS

log = logging.getLogger("fabricprobe.agent")


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
    ecmp_class: int = 0  # which of the target's ECMP classes (rdma_ud): a link of its own
    rail: int | None = None  # the rail both ends' devices are on (None: off the rails)
    local_device: str = ""  # this host's device on that rail
    bind: str = ""  # and its address, the probes' source ("": the agent's own)


@dataclass
class ProbeOutcome:
    """One burst: RTTs (lost exchanges inside), or bytes moved, or why it failed."""

    transport: str  # "tcp" or "rdma"
    op: str  # "pingpong", "send", "write", "ud", "stream"
    rtt: LatencySketch | None = None  # a runner that keeps its own sketch (RDMA probes)
    rtt_ns: list[int] = field(default_factory=list)  # or the bare RTTs, cheaper per burst
    prober_ns: list[int] = field(default_factory=list)  # RDMA: the prober's delay in each RTT
    lost: int = 0  # exchanges that got no answer (beside those inside `rtt`)
    bytes_moved: int = 0
    busy_seconds: float = 0.0
    failed: bool = False
    error: str | None = None
    sport: int = 0  # the ECMP class's UDP source port, out and back (0: not known)
    return_sport: int = 0
    source: str = ""  # the address the probes went out from


Runner = Callable[[ProbeSpec, "ProbeContext"], ProbeOutcome]

MAX_ECMP_CLASSES = 16


def class_specs(spec: ProbeSpec, classes: int) -> list[ProbeSpec]:
    """SPEC as CLASSES ECMP classes (a link, and so a queue pair, each), sharing its
    exchanges: the same probes per interval, spread over more paths. Kinds without
    classes, and 0 or 1, give SPEC alone."""
    n = min(max(classes, 1), MAX_ECMP_CLASSES) if spec.kind in CLASS_KINDS else 1
    if n == 1:
        return [spec]
    count = max(1, spec.count // n)
    return [dataclasses.replace(spec, ecmp_class=i, count=count) for i in range(n)]


# ------------------------------------------------------------------- kept links


class Link(Protocol):
    def close(self) -> None: ...


L = TypeVar("L", bound=Link)
R = TypeVar("R")


def keepalive_for(spec: ProbeSpec) -> float:
    """How long the peer holds a link between bursts: three intervals (jitter and a busy
    rate budget never make it lapse), at least 30 s, at most the protocol's bound."""
    return min(MAX_KEEPALIVE_S, max(30.0, 3 * spec.interval_s))


# A kept link whose last burst ran through in less than this is `quick`: its next burst
# may run in the scheduling thread (Scheduler, INLINE_KINDS).
QUICK_S = 0.1


class _Kept:
    __slots__ = ("dropped", "link", "lock", "quick")

    def __init__(self, link: Any) -> None:
        self.lock = threading.Lock()  # one burst at a time on a link
        self.link = link
        self.dropped = False  # no longer assigned: closed after the burst that holds it
        self.quick = False


class Links:
    """Kept probe links by target; each carries one burst at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._links: dict[tuple[str, str, int, int, int], _Kept] = {}

    @staticmethod
    def key(spec: ProbeSpec) -> tuple[str, str, int, int, int]:
        return (spec.kind, spec.address, spec.port, spec.size, spec.ecmp_class)

    def burst(self, spec: ProbeSpec, new: Callable[[], L], run: Callable[[L], R]) -> R:
        """RUN over SPEC's link (made by NEW the first time). A link gone stale before
        its round started is set up again once, at once."""
        with self._lock:
            kept = self._links.get(self.key(spec))
            if kept is None:
                kept = self._links[self.key(spec)] = _Kept(new())
        with kept.lock:
            t0, through = time.monotonic(), False
            try:
                r = run(kept.link)
                through = True
                return r
            except LinkStale as e:
                log.debug("link to %s (%s) was let go, set up again: %s", spec.dst, spec.kind, e)
                r = run(kept.link)
                through = True
                return r
            finally:
                # a burst that ended short closed its link, so it is not open: a link
                # that cannot say whether it is open is never quick
                kept.quick = (
                    through
                    and time.monotonic() - t0 < QUICK_S
                    and bool(getattr(kept.link, "is_open", False))
                )
                if kept.dropped:
                    kept.link.close()

    def quick(self, spec: ProbeSpec) -> bool:
        """SPEC's link is open and its last burst ran through within QUICK_S."""
        kept = self._links.get(self.key(spec))
        return kept is not None and kept.quick and not kept.dropped

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
    token: FleetToken | None = field(default=None, compare=False, repr=False)
    links: Links = field(default_factory=Links, compare=False, repr=False)
    spin_s: float | None = None  # RDMA loops' busy-poll before they sleep (None: theirs)


# --------------------------------------------------------------------------- TCP


def link_params(spec: ProbeSpec, ctx: ProbeContext, setup_s: float | None = None) -> LinkParams:
    """Where and how patiently this agent reaches SPEC's peer: from its own source
    address, each step within the context's timeout, setup within SETUP_S (default the
    same)."""
    return LinkParams(
        spec.address,
        spec.port,
        bind=spec.bind or ctx.bind,
        device=spec.local_device or None,
        sysfs_root=ctx.sysfs_root,
        timeout=ctx.timeout if setup_s is None else max(ctx.timeout, setup_s),
        step_s=ctx.timeout,
        spin_s=ctx.spin_s,
        token=ctx.token,
    )


def kept_burst(
    spec: ProbeSpec,
    ctx: ProbeContext,
    outcome: tuple[str, str],
    new: Callable[[], L],
    run: Callable[[L], LatencyRound],
) -> ProbeOutcome:
    """One latency burst over SPEC's kept link (made by NEW, run by RUN), as OUTCOME's
    (transport, op); in a burst that cannot run at all every exchange counts as lost."""
    try:
        r = ctx.links.burst(spec, new, run)
    except (ProbeError, OSError, ValueError) as e:
        return ProbeOutcome(*outcome, lost=spec.count, failed=True, error=str(e))
    return ProbeOutcome(
        *outcome,
        rtt_ns=r.rtt_ns.tolist(),
        prober_ns=r.prober_ns.tolist(),
        lost=r.lost,
        error=r.error,
    )


def kept_runner(
    outcome: tuple[str, str],
    new: Callable[[LinkParams, ProbeSpec], L],
    run: Callable[[L, int], LatencyRound],
    setup_s: float | None = None,
) -> Runner:
    """A runner of latency bursts over kept links (kept_burst): NEW(how to reach the
    target, setup within SETUP_S; the spec) makes a target's link, RUN(link, COUNT) runs
    one burst on it."""

    def runner(spec: ProbeSpec, ctx: ProbeContext) -> ProbeOutcome:
        return kept_burst(
            spec,
            ctx,
            outcome,
            lambda: new(link_params(spec, ctx, setup_s), spec),
            lambda link: run(link, spec.count),
        )

    return runner


def stream_burst(outcome: tuple[str, str], stream: Callable[[], BandwidthResult]) -> ProbeOutcome:
    """One bandwidth burst, STREAM, as OUTCOME's (transport, op): the bytes the peer
    confirmed and the time they took, or why it could not run."""
    try:
        res = stream()
    except (ProbeError, OSError, ValueError) as e:
        return ProbeOutcome(*outcome, failed=True, error=str(e))
    return ProbeOutcome(
        *outcome, bytes_moved=res.bytes, busy_seconds=res.duration_s, error=res.error
    )


# COUNT TCP ping-pongs of SIZE bytes over the target's kept `tcp_lat` link.
tcp_pingpong = kept_runner(
    ("tcp", "pingpong"),
    lambda params, spec: TcpPingLink(params, size=spec.size, keepalive_s=keepalive_for(spec)),
    lambda link, count: link.round(count),
)


BW_MIN_BYTES = 1 << 20


def tcp_stream(spec: ProbeSpec, ctx: ProbeContext) -> ProbeOutcome:
    """Bulk TCP send of SIZE x COUNT bytes (at least 1 MiB) in SIZE-byte chunks; the bytes
    the peer confirmed and the time they took (session tcp_bw). Not planned by default:
    add `tcp_bw` to the collector's probe kinds to measure bandwidth."""
    total = max(spec.size * spec.count, BW_MIN_BYTES)
    return stream_burst(
        ("tcp", "stream"),
        lambda: run_throughput(
            link_params(spec, ctx),
            duration=None,
            total_bytes=total,
            chunk_size=min(max(spec.size, 1), MAX_CHUNK),
        ),
    )


# Probe kind -> runner for TCP; fabricprobe.agent.rdma_runners has the RDMA ones, and the
# agent passes the table it runs to its Scheduler.
TCP_RUNNERS: dict[str, Runner] = {"tcp_lat": tcp_pingpong, "tcp_bw": tcp_stream}

# Kinds whose burst on a quick kept link (Links.quick) the scheduling thread runs itself
# instead of waking a worker: a TCP burst on an open link is its exchanges (well under
# a millisecond each on a healthy path) and a peer that stops answering ends it within
# one step (ProbeContext.timeout), so it holds the next due burst back less than the
# schedule's jitter moves it. Handing it over costs more CPU than the burst itself
# (bench/agent_footprint.py). A burst that was slow or failed sends the next one to a
# worker again. RDMA kinds always go to a worker: a UD burst waits for late answers.
INLINE_KINDS = frozenset({"tcp_lat"})
STREAM_KINDS = frozenset({"tcp_bw", "rdma_rc_bw"})  # bandwidth bursts
BULK_BYTES = 4096  # a message over this (an RDMA MTU at most) is bulk: it runs alone


def bulk(spec: ProbeSpec) -> bool:
    """SPEC's burst puts bulk traffic on the path: it runs alone to its peer."""
    return spec.kind in STREAM_KINDS or spec.size > BULK_BYTES


# --------------------------------------------------------------------------- scheduler


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
        runners: Mapping[str, Runner],
        inline_kinds: frozenset[str] = INLINE_KINDS,
    ) -> None:
        self.ctx, self.sink, self.jitter = ctx, sink, jitter
        self.runners = dict(runners)
        self.inline_kinds = inline_kinds
        self.inline = 0  # bursts the scheduling thread ran itself
        self.budget = RateBudget(budget)
        self.slowdown = 1.0  # the agent's self-throttle: intervals stretch by this much
        self.bursts = 0
        # (due time, sequence number, spec): the sequence number keeps specs uncompared
        self._heap: list[tuple[float, int, ProbeSpec]] = []
        self._n = 0
        self._free = workers  # probe slots: bursts running at once, inline or on a worker
        self._busy: dict[str, int] = {}  # peers with bursts running: how many
        self._bulk: set[str] = set()  # peers with a bulk burst running
        self.held = 0  # times a due burst waited for its peer's bulk burst
        # Guards the heap, the budget and the slots. The scheduling thread sleeps on
        # the bell, a lock held while nobody rang it: set_targets(), stop() and a worker
        # that frees a slot release it. Both are single C calls, where a Condition's
        # wait and notify run a page of Python on every burst.
        self._lock = threading.Lock()
        self._bell = threading.Lock()
        self._bell.acquire()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="probe", initializer=name_os_thread
        )
        self._thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)

    def _ring(self) -> None:
        with contextlib.suppress(RuntimeError):  # rung already: one ring wakes it once
            self._bell.release()

    def set_targets(self, specs: Iterable[ProbeSpec], budget: float | None = None) -> None:
        """Replace the targets; each first runs at a random point of its interval."""
        now = time.monotonic()
        with self._lock:
            self._heap = []
            for spec in specs:
                if spec.kind not in self.runners:
                    log.warning("no runner for probe kind %s (target %s)", spec.kind, spec.dst)
                    continue
                self._n += 1
                self._heap.append((now + random.uniform(0, spec.interval_s), self._n, spec))
            heapq.heapify(self._heap)
            if budget:
                self.budget = RateBudget(budget)
            kept = [d[2] for d in self._heap]
        self._ring()
        self.ctx.links.retain(kept)  # links to targets no longer assigned are closed

    def targets(self) -> list[ProbeSpec]:
        with self._lock:
            return [d[2] for d in self._heap]

    def start(self) -> None:
        self._thread.start()

    @property
    def running(self) -> bool:
        """The scheduling thread is alive (False before start() and after it ended)."""
        return self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        self._ring()
        if self._thread.is_alive():
            self._thread.join()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.ctx.links.close()

    def _next(self) -> tuple[ProbeSpec | None, float | None]:
        """The burst to start now (its slot taken, its next run scheduled), or None and
        how long to sleep (None: until rung). A due burst that must wait for its peer
        (_must_wait) keeps its place at the head of the queue; the burst it waits for
        rings when it ends."""
        with self._lock:
            if not self._heap or not self._free:
                return None, None  # set_targets() or a freed slot rings
            now = time.monotonic()
            heap = self._heap
            held: list[tuple[float, int, ProbeSpec]] = []
            waiting: set[str] = set()
            while heap and heap[0][0] <= now and self._must_wait(heap[0][2], waiting):
                spec = heap[0][2]
                if bulk(spec):
                    waiting.add(spec.dst)  # the peer's later bursts wait behind it
                held.append(heapq.heappop(heap))
            try:
                if not heap or heap[0][0] > now:
                    return None, heap[0][0] - now if heap else None
                wait = self.budget.wait_time()
                if wait > 0:
                    return None, wait
                at, _, spec = heap[0]
                spread = 1.0 + random.uniform(-self.jitter, self.jitter)
                self._n += 1
                nxt = max(at + spec.interval_s * spread * self.slowdown, now)
                heapq.heapreplace(heap, (nxt, self._n, spec))
                self._free -= 1
                self._busy[spec.dst] = self._busy.get(spec.dst, 0) + 1
                if bulk(spec):
                    self._bulk.add(spec.dst)
                return spec, 0.0
            finally:
                for item in held:
                    heapq.heappush(heap, item)
                self.held += bool(held)

    def _must_wait(self, spec: ProbeSpec, waiting: set[str]) -> bool:
        """SPEC's peer has a bulk burst running or due before it, or SPEC is bulk and
        the peer has any burst running."""
        if spec.dst in self._bulk or spec.dst in waiting:
            return True
        return bulk(spec) and spec.dst in self._busy

    def _loop(self) -> None:
        name_os_thread()
        while not self._stop.is_set():
            spec, wait = self._next()
            if spec is None:
                # asleep until the next burst is due, or until rung
                if wait is None:
                    self._bell.acquire()
                else:
                    self._bell.acquire(timeout=wait)
                continue
            if spec.kind in self.inline_kinds and self.ctx.links.quick(spec):
                self.inline += 1
                self._run(spec, ring=False)  # this thread looks at the heap next anyway
                continue
            if self._stop.is_set():
                self._release(spec, ring=False)
                break
            self._pool.submit(self._run, spec)

    def _release(self, spec: ProbeSpec, ring: bool) -> None:
        with self._lock:
            self._free += 1
            left = self._busy.pop(spec.dst, 1) - 1
            if left:
                self._busy[spec.dst] = left
            if bulk(spec):
                self._bulk.discard(spec.dst)
        if ring:
            self._ring()

    def _run(self, spec: ProbeSpec, ring: bool = True) -> None:
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
            self._release(spec, ring)
        self.bursts += 1
        if outcome.error:
            log.debug("probe %s to %s: %s", spec.kind, spec.dst, outcome.error)
        try:
            self.sink(spec, outcome)
        except Exception:  # one bad outcome costs its burst, on a worker or inline alike
            log.exception("outcome of probe %s to %s not taken", spec.kind, spec.dst)
