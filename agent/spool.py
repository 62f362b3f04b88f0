"""A bounded on-disk spool of window reports waiting for the collector's acknowledgement.

One file per window, `<epoch>-<seq>.win`, holding the serialized WindowReport. A
window is written (to a temporary name, then renamed, so a crash leaves no torn file)
before it is sent, and deleted only when the collector acknowledges it, so a window
the collector has not acknowledged survives a collector outage and an agent restart.

The bound: at most `max_windows` files and `max_bytes` bytes (defaults 8,640 windows,
a day at the default 10 s window, and 64 MiB). When a new window would pass either,
the oldest windows are dropped and counted in `dropped`; `depth` and `bytes` are
exported with every report.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MAX_WINDOWS = 8_640
DEFAULT_MAX_BYTES = 64 << 20
_NAME = re.compile(r"^(\d{1,20})-(\d{1,20})\.win$")


@dataclass(frozen=True, order=True)
class SpoolKey:
    epoch: int
    seq: int

    @property
    def filename(self) -> str:
        return f"{self.epoch:020d}-{self.seq:020d}.win"


class Spool:
    """Thread-safe FIFO of serialized windows in DIRECTORY (see the module docstring)."""

    def __init__(
        self,
        directory: Path | str,
        *,
        max_windows: int = DEFAULT_MAX_WINDOWS,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        if max_windows < 1 or max_bytes < 1:
            raise ValueError("spool bounds must be positive")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_windows, self.max_bytes = max_windows, max_bytes
        self.dropped = 0
        self._lock = threading.Lock()
        self._sizes: dict[SpoolKey, int] = {}
        self._bytes = 0
        for p in self.dir.iterdir():
            m = _NAME.match(p.name)
            if m is None:
                if p.name.endswith(".tmp"):
                    p.unlink(missing_ok=True)  # a write cut short by a crash
                continue
            size = p.stat().st_size
            self._sizes[SpoolKey(int(m.group(1)), int(m.group(2)))] = size
            self._bytes += size
        with self._lock:
            self._enforce(0)

    @property
    def depth(self) -> int:
        with self._lock:
            return len(self._sizes)

    @property
    def size_bytes(self) -> int:
        with self._lock:
            return self._bytes

    def put(self, key: SpoolKey, data: bytes) -> None:
        """Store one window durably; drops the oldest ones first if the bound needs it."""
        if len(data) > self.max_bytes:
            raise ValueError(f"a {len(data)}-byte window cannot fit a {self.max_bytes}-byte spool")
        path = self.dir / key.filename
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # a crash or power loss must not leave an empty window
        os.replace(tmp, path)
        with self._lock:
            old = self._sizes.pop(key, 0)
            self._bytes -= old
            self._enforce(len(data))
            self._sizes[key] = len(data)
            self._bytes += len(data)

    def _enforce(self, incoming: int) -> None:
        """Drop oldest windows until INCOMING more bytes and one more file fit."""
        extra = 1 if incoming else 0
        while self._sizes and (
            len(self._sizes) + extra > self.max_windows or self._bytes + incoming > self.max_bytes
        ):
            oldest = min(self._sizes)
            self._remove(oldest)
            self.dropped += 1

    def _remove(self, key: SpoolKey) -> None:
        self._bytes -= self._sizes.pop(key)
        with contextlib.suppress(FileNotFoundError):
            (self.dir / key.filename).unlink()

    def pending(self, limit: int | None = None) -> list[SpoolKey]:
        """Keys oldest first (previous agent lifetimes first, then by sequence)."""
        with self._lock:
            keys = sorted(self._sizes)
        return keys if limit is None else keys[:limit]

    def read(self, key: SpoolKey) -> bytes | None:
        """The window's bytes, or None if it was dropped meanwhile."""
        try:
            return (self.dir / key.filename).read_bytes()
        except FileNotFoundError:
            return None

    def ack(self, key: SpoolKey) -> None:
        """The collector holds KEY: forget it."""
        with self._lock:
            if key in self._sizes:
                self._remove(key)
