"""The agent's own load and its self-throttle.

Every figure the agent measures about itself (its CPU seconds, its RSS, the clock they are
divided by) comes through a reader given to `SelfLoad`, so that a test drives them and
none of them depends on the machine's uptime or on the test process's own CPU.
"""

from __future__ import annotations

import logging
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from fabricprobe.probes.hostload import CpuPressure

log = logging.getLogger("fabricprobe.agent")

MAX_SLOWDOWN = 4.0  # the self-throttle stretches probe intervals at most this much
STEP = 1.5  # each window over budget stretches them by this, each one under eases back


def own_cpu_s() -> float:
    """User + system CPU seconds of this process, every thread (one getrusage call, in
    µs; psutil's cpu_times reads /proc in 10 ms ticks for about 70 times the cost)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def own_rss_bytes() -> int:
    """Resident set size of this process."""
    return int(psutil.Process().memory_info().rss)


@dataclass(frozen=True)
class Readers:
    """Where the agent's figures about itself come from (the process's own by default)."""

    cpu_s: Callable[[], float] = own_cpu_s
    rss_bytes: Callable[[], int] = own_rss_bytes
    monotonic: Callable[[], float] = time.monotonic


@dataclass(frozen=True)
class Load:
    """One window's figures about the agent itself."""

    cpu_s: float  # CPU seconds since the process started
    share: float  # share of a core used since the previous window
    pressure: float | None  # host CPU pressure (PSI) over the window; None without PSI
    rss_bytes: int
    probe_rate: float  # probe bursts a second over the window


class SelfLoad:
    """Measures the agent's share of a core and the host's CPU pressure once a window, and
    steers the scheduler's slowdown from them: stretched by 1.5x (up to 4x, never a stop)
    while over budget, eased back by the same step once under it."""

    def __init__(
        self,
        pressure: CpuPressure,
        *,
        cpu_budget: float,
        pressure_limit: float,
        readers: Readers | None = None,
    ) -> None:
        self.pressure = pressure
        self.cpu_budget = cpu_budget
        self.pressure_limit = pressure_limit
        self.readers = readers or Readers()
        self._last = (self.readers.monotonic(), self.readers.cpu_s(), 0)  # (when, cpu, bursts)

    def window(self, bursts: int, slowdown: float) -> tuple[Load, float]:
        """The window's figures and the slowdown to use from now on; BURSTS is the
        probe-burst count so far, SLOWDOWN the scheduler's current stretch."""
        now, cpu_s = self.readers.monotonic(), self.readers.cpu_s()
        when, cpu0, bursts0 = self._last
        elapsed = max(now - when, 1e-3)
        self._last = (now, cpu_s, bursts)
        share = max(0.0, (cpu_s - cpu0) / elapsed)
        pressure = self.pressure.sample(now)
        load = Load(cpu_s, share, pressure, self.readers.rss_bytes(), (bursts - bursts0) / elapsed)
        return load, self.steer(load, slowdown)

    def steer(self, load: Load, slowdown: float) -> float:
        """The slowdown after a window with LOAD."""
        over = load.share > self.cpu_budget or (
            load.pressure is not None and load.pressure > self.pressure_limit
        )
        s = min(MAX_SLOWDOWN, slowdown * STEP) if over else max(1.0, slowdown / STEP)
        if s != slowdown:
            log.info(
                "self-throttle %.2fx (agent %.2f%% of a core, CPU pressure %s)",
                s,
                load.share * 100,
                "unknown" if load.pressure is None else f"{load.pressure:.0%}",
            )
        return s
