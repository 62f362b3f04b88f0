"""How busy the host is: CPU pressure from PSI (/proc/pressure/cpu).

The kernel's pressure stall information counts, in microseconds since boot, the time at
least one runnable task waited for a CPU ("some"). Its growth over a window divided by
the window's length is the share of the window in which something on the host was kept
off a CPU: on a host at 0.6, a probe thread that wakes up to read an answer waits too,
and what it measures is partly the host. It says nothing of which task waited; the
agent's own reference probe (a ping-pong against its own responder) measures what the
host adds to a probe itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from fabricprobe.core.errors import ParseError
from fabricprobe.probes.numbers import parse_uint

_TOTAL = re.compile(r"^some\b.*\btotal=([0-9]{1,20})\s*$", re.M)


def parse_pressure(text: str) -> int:
    """The "some" total (µs) of a /proc/pressure/* file; ParseError if there is none."""
    m = _TOTAL.search(text)
    if m is None:
        raise ParseError("no 'some ... total=N' line in the pressure file")
    return parse_uint(m.group(1), "pressure total")


@dataclass
class CpuPressure:
    """Share of the time between two reads in which a task waited for a CPU."""

    path: Path = Path("/proc/pressure/cpu")
    _last: tuple[float, int] | None = None
    unavailable: str | None = None  # why it cannot be read (no PSI, psi=0), once known

    def sample(self, now_s: float) -> float | None:
        """The share since the previous call (None on the first, or without PSI)."""
        if self.unavailable is not None:
            return None
        try:
            total = parse_pressure(self.path.read_text())
        except OSError as e:
            # no PSI in this kernel, or booted with psi=0: nothing to read, ever
            self.unavailable = f"{self.path}: {e.strerror or e}"
            return None
        except ParseError as e:
            self.unavailable = f"{self.path}: {e}"
            return None
        last, self._last = self._last, (now_s, total)
        if last is None or now_s <= last[0] or total < last[1]:
            return None
        return min(1.0, (total - last[1]) / 1e6 / (now_s - last[0]))
