"""The hosts the window store knows: each agent's registration, its report history (which
(epoch, seq) pairs were taken, so that a replay is not counted twice) and its newest
self-figures.

Plain Python with no lock of its own: the window store (collector/store.py) calls it
with its lock held, and hands readers `HostView` copies.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from fabricprobe.core.api import fabricprobe_pb2 as pb

MAX_HOSTS = 10_000  # registered hosts (tokens bound them already; plain text does not)
MAX_EPOCHS = 4  # agent lifetimes whose sequence numbers are kept per host
MAX_RETIRED = 64  # older lifetimes remembered per host: their replays are not counted again
MAX_STAT = 1e15  # agent self-figures (CPU seconds, probe rate)


class SeqSet:
    """Sequence numbers taken for one epoch: a contiguous floor plus a bounded set above."""

    __slots__ = ("above", "floor")
    MAX_ABOVE = 1024  # seqs held above the floor; a gap older than that is given up

    def __init__(self) -> None:
        self.floor = 0  # every seq <= floor was taken
        self.above: set[int] = set()

    def __contains__(self, seq: int) -> bool:
        return seq <= self.floor or seq in self.above

    def add(self, seq: int) -> None:
        self.above.add(seq)
        while self.floor + 1 in self.above:
            self.floor += 1
            self.above.discard(self.floor)
        if len(self.above) > self.MAX_ABOVE:  # a gap that will never fill: move past it
            self.floor = min(self.above)
            self.above.discard(self.floor)

    def taken(self) -> set[int]:
        """Every seq taken (tests and diagnostics)."""
        return set(range(1, self.floor + 1)) | set(self.above)


@dataclass
class HostState:
    """What the collector knows of one agent."""

    info: pb.HostInfo
    registered_ns: int
    last_report_ns: int = 0  # collector clock (time.time_ns) when the last report arrived
    last_window_end_ns: int = 0
    agent: pb.AgentStats | None = None
    reports: int = 0
    duplicates: int = 0
    # epoch -> (its lifetime number, seqs taken), in the order the collector first heard
    # of each lifetime: that order, not the epoch's value (a clock), says which is newer
    seen: OrderedDict[int, tuple[int, SeqSet]] = field(default_factory=OrderedDict)
    retired: OrderedDict[int, None] = field(default_factory=OrderedDict)
    lifetimes: int = 0
    newest: tuple[int, int] = (0, 0)  # (lifetime, seq) of the newest report taken
    paths: int = 0
    counters: int = 0

    def lifetime(self, epoch: int) -> int | None:
        """EPOCH's lifetime number (a new lifetime gets the next one), or None
        for a lifetime retired to make room for newer ones."""
        held = self.seen.get(epoch)
        if held is not None:
            return held[0]
        if epoch in self.retired:
            return None
        self.lifetimes += 1
        self.seen[epoch] = (self.lifetimes, SeqSet())
        while len(self.seen) > MAX_EPOCHS:  # the lifetime heard of first goes
            old, _ = self.seen.popitem(last=False)
            self.retired[old] = None
            while len(self.retired) > MAX_RETIRED:
                self.retired.popitem(last=False)
        return self.lifetimes


@dataclass(frozen=True, slots=True)
class HostView:
    """One host as the store held it at one moment, for readers outside the store's lock.
    The registration and the agent's figures are the messages the store holds: each is
    replaced whole by a newer one, never changed in place."""

    name: str
    info: pb.HostInfo
    agent: pb.AgentStats | None
    last_report_ns: int
    last_window_end_ns: int
    stale: bool


class HostTable:
    """Registered hosts by name, with the bounds and ages that decide stale and gone."""

    def __init__(
        self,
        drops: dict[str, int],
        *,
        stale_after: float,
        forget_after: float,
        max_hosts: int = MAX_HOSTS,
    ) -> None:
        self.drops = drops  # the store's drop counts (what="host")
        self.stale_after = stale_after
        self.forget_after = forget_after
        self.max_hosts = max_hosts
        self.by_name: dict[str, HostState] = {}

    def register(self, info: pb.HostInfo, now: int) -> tuple[HostState, bool]:
        """Add or refresh INFO's host (its sequence history survives); (its state, whether
        its ToR label is another now). ValueError when the table is full."""
        state = self.by_name.get(info.host)
        if state is None:
            if len(self.by_name) >= self.max_hosts:
                self.drops["host"] += 1
                raise ValueError(f"the collector holds {self.max_hosts} hosts already")
            state = HostState(info=info, registered_ns=now, last_report_ns=now)
            self.by_name[info.host] = state
            return state, True
        moved = state.info.topology != info.topology
        state.info = info
        state.last_report_ns = max(state.last_report_ns, now)
        return state, moved

    def admit(self, state: HostState, epoch: int, seq: int, now: int) -> tuple[int, int] | None:
        """Take the report (EPOCH, SEQ) of STATE's host: its (lifetime, seq) order, or None
        for one taken before (a replay of a retired lifetime is counted as stale_epoch)."""
        lifetime = state.lifetime(epoch)
        if lifetime is None:  # a lifetime older than the ones kept: taken long ago
            self.drops["stale_epoch"] += 1
            state.duplicates += 1
            return None
        seqs = state.seen[epoch][1]
        if seq in seqs:
            state.duplicates += 1
            return None
        seqs.add(seq)
        state.last_report_ns = now
        state.reports += 1
        return (lifetime, seq)

    def newest(
        self, state: HostState, order: tuple[int, int], end_ns: int, agent: pb.AgentStats | None
    ) -> None:
        """A report taken in ORDER ended at END_NS with the agent's figures AGENT: the host's
        newest, unless a later one came first (newest by lifetime and seq: clocks may step)."""
        if order <= state.newest:
            return
        state.newest = order
        state.last_window_end_ns = end_ns
        if agent is not None:
            if _agent_ok(agent):
                state.agent = agent
            else:
                self.drops["value"] += 1

    def is_stale(self, state: HostState, now: int) -> bool:
        return (now - state.last_report_ns) / 1e9 > self.stale_after

    def silent(self, now: int, also: Callable[[str, HostState], bool] | None = None) -> list[str]:
        """Drop the hosts silent for forget_after seconds, and those ALSO picks; their names."""
        gone = [
            name
            for name, h in self.by_name.items()
            if (now - h.last_report_ns) / 1e9 > self.forget_after
            or (also is not None and also(name, h))
        ]
        for name in gone:
            del self.by_name[name]
        return gone

    def view(self, state: HostState, now: int) -> HostView:
        return HostView(
            state.info.host,
            state.info,
            state.agent,
            state.last_report_ns,
            state.last_window_end_ns,
            self.is_stale(state, now),
        )

    def views(self, now: int) -> dict[str, HostView]:
        return {name: self.view(h, now) for name, h in self.by_name.items()}


def _agent_ok(a: pb.AgentStats) -> bool:
    return all(math.isfinite(v) and 0.0 <= v <= MAX_STAT for v in (a.cpu_seconds, a.probe_rate))
