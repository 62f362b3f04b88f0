"""Deadlines shared by the steps of one operation (connect, hello, ready, a query's
pages), so that the steps split the time the caller gave instead of each taking a full
timeout of its own."""

from __future__ import annotations

import time


class Deadline:
    """A point in time (monotonic) that a multi-step operation must finish by.

    One Deadline is passed down through every step of a stage (connect, hello, the
    fleet-token challenge, ready, the data connections), so the steps share the time
    the caller gave instead of each taking a full timeout of its own. `seconds` is that
    time, for messages ("... within 2 s")."""

    __slots__ = ("_end", "seconds")

    def __init__(self, seconds: float) -> None:
        if not seconds > 0:
            raise ValueError(f"deadline must be positive, got {seconds}")
        self.seconds = seconds
        self._end = time.monotonic() + seconds

    def remaining(self) -> float:
        """Seconds left, never below zero."""
        return max(0.0, self._end - time.monotonic())

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self._end


Timeout = float | Deadline  # seconds from now, or a deadline shared with earlier steps


def as_deadline(t: Timeout) -> Deadline:
    """T itself when it is a Deadline (time already spent counts), else one T s from now."""
    return t if isinstance(t, Deadline) else Deadline(t)
