"""Counter tracks: every counter of every host, its last reading, a total that survives
32-bit wraps and device resets, and its rate.

Plain Python with no lock of its own: the window store (collector/store.py) calls it
with its lock held.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Container, Iterable
from dataclasses import dataclass
from typing import NamedTuple

from fabricprobe.collector.hosttable import HostState
from fabricprobe.core.api import fabricprobe_pb2 as pb

MAX_COUNTERS_PER_HOST = 4096  # new counters beyond it are dropped and counted; idle ones expire
# A 32-bit counter read lower than before wrapped only if it could have travelled
# 2**32 - prev + new in the time between the readings: at up to WRAP_RATE_FACTOR times the
# fastest rate it has shown (at least MIN_WRAP_RATE a second), or, before it has shown
# one, at a rate that wraps it once a minute (a counter faster than that cannot be read
# at 10 s windows anyway). Anything else is a reset of the device.
WRAP_RATE_FACTOR = 4.0
MIN_WRAP_RATE = 1e6
FIRST_WRAP_RATE = 2**32 / 60.0


class CounterKey(NamedTuple):
    """One counter of one host, as its agent names it (pb.CounterReading)."""

    src: str  # the host
    kind: str  # rdma, pfc, netdev, nixl
    device: str  # RDMA device, or a NIXL source's host:port
    port: int
    netdev: str
    priority: int  # PFC priority, -1 for none
    name: str  # as the kernel (or NIXL) spells it


@dataclass
class CounterTrack:
    """One counter of one host: the last reading, a wrap/reset-corrected total, a rate."""

    width: int
    last_value: int
    last_ns: int
    order: tuple[int, int] = (0, 0)  # (lifetime, seq) of the last reading
    total: int = 0  # increase since the collector first saw it, wraps and resets counted
    rate: float | None = None  # per second between the two newest readings
    peak_rate: float = 0.0  # the fastest it has moved (tells a wrap from a reset)
    wraps: int = 0
    resets: int = 0
    touched_ns: int = 0

    def advance(self, value: int, width: int, end_ns: int, order: tuple[int, int]) -> float | None:
        """Take a newer reading: the increase since the last one goes into the total (a
        32-bit counter that went down wrapped if it could have travelled that far at a
        speed it has shown, else it was reset, as a 64-bit one always was); the new rate,
        or None when the agent's clock stepped back (no rate from it)."""
        dt = (end_ns - self.last_ns) / 1e9
        if value >= self.last_value:  # the common case, without the wrap/reset analysis
            delta = value - self.last_value
        elif self.width == 32 and width == 32 and dt > 0:
            travelled = (1 << 32) - self.last_value + value
            fastest = (
                max(MIN_WRAP_RATE, WRAP_RATE_FACTOR * self.peak_rate)
                if self.peak_rate > 0
                else FIRST_WRAP_RATE
            )
            if travelled <= fastest * dt:
                delta = travelled
                self.wraps += 1
            else:
                delta = value
                self.resets += 1
        else:
            delta = value  # a 64-bit counter never wraps in practice: it was reset
            self.resets += 1
        self.total += delta
        self.last_value, self.order, self.width, self.last_ns = value, order, width, end_ns
        if dt <= 0:
            return None
        self.rate = delta / dt
        self.peak_rate = max(self.peak_rate, self.rate)
        return self.rate


class CounterTable:
    """Every host's counter tracks by CounterKey, within a bound per host."""

    def __init__(self, drops: dict[str, int], max_per_host: int = MAX_COUNTERS_PER_HOST) -> None:
        self.drops = drops  # the store's drop counts (counter, value, stale_reading, clock_step)
        self.max_per_host = max_per_host
        self.by_key: dict[CounterKey, CounterTrack] = {}

    def merge(
        self, state: HostState, end_ns: int, order: tuple[int, int], now: int, c: pb.CounterReading
    ) -> tuple[CounterKey, float] | None:
        """Fold one reading of STATE's host in; the counter and its new rate when the rate
        changed."""
        key = CounterKey(state.info.host, c.kind, c.device, c.port, c.netdev, c.priority, c.name)
        value = c.value
        if value >= 1 << c.width:
            self.drops["value"] += 1
            return None
        track = self.by_key.get(key)
        if track is None:
            if state.counters >= self.max_per_host:
                self.drops["counter"] += 1
                return None
            state.counters += 1
            self.by_key[key] = CounterTrack(c.width, value, end_ns, order, touched_ns=now)
            return None
        if order <= track.order:
            self.drops["stale_reading"] += 1
            return None  # a replayed older reading: the totals already passed it
        track.touched_ns = now
        rate = track.advance(value, c.width, end_ns, order)
        if rate is None:  # the agent's clock stepped back: the increase counts, no rate
            self.drops["clock_step"] += 1
            return None
        return key, rate

    def forget(self, dead: Collection[str], idle_ns: int, hosts: dict[str, HostState]) -> None:
        """Drop the counters of the DEAD hosts, and those no reading touched since IDLE_NS
        (their host's bound frees up)."""
        old = [k for k, t in self.by_key.items() if k.src in dead or t.touched_ns < idle_ns]
        for key in old:
            del self.by_key[key]
            if (h := hosts.get(key.src)) is not None:
                h.counters -= 1

    def keys_of(self, hosts: Container[str] | None) -> list[CounterKey]:
        """The counters of HOSTS (None: every host's)."""
        if hosts is None:
            return list(self.by_key)
        return [k for k in self.by_key if k.src in hosts]

    def copies(self, keys: Iterable[CounterKey]) -> dict[CounterKey, CounterTrack]:
        """Copies of the tracks of KEYS that are still held."""
        out: dict[CounterKey, CounterTrack] = {}
        for key in keys:
            t = self.by_key.get(key)
            if t is not None:
                out[key] = copy.copy(t)
        return out

    def rates(self, names: Container[str]) -> list[tuple[CounterKey, float]]:
        """(key, rate) of every counter named in NAMES that has a rate."""
        return [
            (k, t.rate) for k, t in self.by_key.items() if k.name in names and t.rate is not None
        ]
