"""A bounded on-disk spool of window reports waiting for the collector's acknowledgement.

One file per window, `<epoch>-<seq>.win`: a 12-byte header (magic `FPW1`, payload length,
CRC-32 of the payload, both big-endian u32) and the serialized WindowReport. A window is
written (to a temporary name, then renamed, so a crash leaves no torn file) before it is
sent, and deleted only when the collector acknowledges it, so a window the collector has
not acknowledged survives a collector outage and an agent restart.

The bound: at most `max_windows` files and `max_bytes` bytes (defaults 8,640 windows,
a day at the default 10 s window, and 64 MiB). When a new window would pass either,
the oldest windows are dropped and counted in `dropped`.

Faults heal instead of stopping the agent:

* A write that fails (ENOSPC, EIO, EROFS, a vanished directory...) is counted in
  `write_failures`, and the window is kept in memory, at most `max_memory_windows` of them
  (older ones beyond that are dropped and counted in `dropped`), so the agent keeps
  reporting. Each later put() first moves the held windows to disk, so spooling resumes
  by itself once space returns.
* A file whose header, length or checksum is wrong (or whose payload the caller cannot
  decode) is moved to `quarantine/`, which keeps the newest `max_quarantine` files, and
  counted in `quarantined`.
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path

from google.protobuf.message import DecodeError

from fabricprobe.core.api import fabricprobe_pb2 as pb

DEFAULT_MAX_WINDOWS = 8_640
DEFAULT_MAX_BYTES = 64 << 20
DEFAULT_MAX_MEMORY_WINDOWS = 360  # an hour of 10 s windows held through a disk fault
DEFAULT_MAX_QUARANTINE = 32
MAGIC = b"FPW1"
_HEADER = struct.Struct(">4sII")
_NAME = re.compile(r"^(\d{1,20})-(\d{1,20})\.win$")
QUARANTINE_DIR = "quarantine"


class SpoolCorrupt(Exception):
    """A spool file that cannot be a window: bad header, length or checksum."""


def encode_record(payload: bytes) -> bytes:
    """Header + PAYLOAD, as one spool file holds it."""
    return _HEADER.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload


def decode_record(data: bytes) -> bytes:
    """The payload of one spool file; SpoolCorrupt when it is torn or altered."""
    if len(data) < _HEADER.size:
        raise SpoolCorrupt(f"{len(data)} bytes: shorter than the {_HEADER.size}-byte header")
    magic, length, crc = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise SpoolCorrupt(f"wrong header {magic!r}, expected {MAGIC!r}")
    payload = data[_HEADER.size :]
    if len(payload) != length:
        raise SpoolCorrupt(f"header says {length} payload bytes, the file holds {len(payload)}")
    if zlib.crc32(payload) != crc:
        raise SpoolCorrupt("payload checksum mismatch")
    return payload


def decode_window(payload: bytes, key: SpoolKey | None = None) -> pb.WindowReport:
    """The WindowReport a spool payload holds; SpoolCorrupt when it is not one, or when it
    names another window than the file it came from (KEY)."""
    try:
        report = pb.WindowReport.FromString(payload)
    except (DecodeError, RecursionError) as e:
        raise SpoolCorrupt(f"not a WindowReport: {e}") from None
    if key is not None and (report.epoch, report.seq) != (key.epoch, key.seq):
        raise SpoolCorrupt(f"holds window {report.epoch}-{report.seq}, not {key.epoch}-{key.seq}")
    return report


@dataclass(frozen=True, order=True)
class SpoolKey:
    epoch: int
    seq: int

    @property
    def filename(self) -> str:
        return f"{self.epoch:020d}-{self.seq:020d}.win"


def _write_file(path: Path, data: bytes) -> None:
    """Write DATA durably under PATH (the seam fault tests replace to inject an errno)."""
    tmp = path.with_suffix(".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # a crash or power loss must not leave an empty window
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


class Spool:
    """Thread-safe FIFO of serialized windows in DIRECTORY (see the module docstring)."""

    def __init__(
        self,
        directory: Path | str,
        *,
        max_windows: int = DEFAULT_MAX_WINDOWS,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_memory_windows: int = DEFAULT_MAX_MEMORY_WINDOWS,
        max_quarantine: int = DEFAULT_MAX_QUARANTINE,
    ) -> None:
        if min(max_windows, max_bytes, max_memory_windows) < 1 or max_quarantine < 0:
            raise ValueError("spool bounds must be positive")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_windows, self.max_bytes = max_windows, max_bytes
        self.max_memory_windows, self.max_quarantine = max_memory_windows, max_quarantine
        self.dropped = 0
        self.write_failures = 0
        self.quarantined = 0
        self.last_error: str | None = None
        self._lock = threading.Lock()
        self._sizes: dict[SpoolKey, int] = {}  # on disk
        self._memory: dict[SpoolKey, bytes] = {}  # written nowhere yet (a disk fault)
        self._bytes = 0
        for p in self.dir.iterdir():
            m = _NAME.match(p.name)
            if m is None:
                if p.name.endswith(".tmp"):
                    p.unlink(missing_ok=True)  # a write cut short by a crash
                continue
            try:
                size = p.stat().st_size
            except OSError:
                continue
            self._sizes[SpoolKey(int(m.group(1)), int(m.group(2)))] = size
            self._bytes += size
        with self._lock:
            self._enforce(0)

    @property
    def depth(self) -> int:
        """Windows waiting, on disk and in memory."""
        with self._lock:
            return len(self._sizes) + len(self._memory)

    @property
    def in_memory(self) -> int:
        with self._lock:
            return len(self._memory)

    @property
    def size_bytes(self) -> int:
        with self._lock:
            return self._bytes + sum(len(v) + _HEADER.size for v in self._memory.values())

    def put(self, key: SpoolKey, payload: bytes) -> bool:
        """Store one window; True when it reached the disk, False when it is held in memory
        (or, too big for the spool, dropped). Never raises for a disk fault."""
        data = encode_record(payload)
        if len(data) > self.max_bytes:
            with self._lock:
                self.dropped += 1
                self.last_error = f"a {len(data)}-byte window cannot fit the spool"
            return False
        with self._lock:
            self._memory[key] = payload
            self._memory = dict(sorted(self._memory.items()))
            while len(self._memory) > self.max_memory_windows:
                del self._memory[min(self._memory)]
                self.dropped += 1
            held = list(self._memory)
        for k in held:  # oldest first, so order on disk follows order of cutting
            if not self._persist(k):
                break
        with self._lock:
            return key not in self._memory and key in self._sizes

    def _persist(self, key: SpoolKey) -> bool:
        with self._lock:
            payload = self._memory.get(key)
        if payload is None:
            return True  # acknowledged or dropped meanwhile
        data = encode_record(payload)
        try:
            _write_file(self.dir / key.filename, data)
        except OSError as e:
            with self._lock:
                self.write_failures += 1
                self.last_error = f"write {key.filename}: {e.strerror or e}"
            return False
        with self._lock:
            if self._memory.pop(key, None) is None:  # acknowledged while it was written
                with contextlib.suppress(OSError):
                    (self.dir / key.filename).unlink()
                return True
            self._bytes -= self._sizes.pop(key, 0)
            self._enforce(len(data))
            self._sizes[key] = len(data)
            self._bytes += len(data)
        return True

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
        with contextlib.suppress(OSError):
            (self.dir / key.filename).unlink()

    def pending(self, limit: int | None = None) -> list[SpoolKey]:
        """Keys oldest first (previous agent lifetimes first, then by sequence)."""
        with self._lock:
            keys = sorted(self._sizes.keys() | self._memory.keys())
        return keys if limit is None else keys[:limit]

    def read(self, key: SpoolKey) -> bytes | None:
        """The window's payload, or None if it was dropped meanwhile. A file that is
        corrupt or unreadable is quarantined (and None returned)."""
        with self._lock:
            held = self._memory.get(key)
        if held is not None:
            return held
        try:
            data = (self.dir / key.filename).read_bytes()
        except FileNotFoundError:
            with self._lock:
                if key in self._sizes:  # removed behind our back
                    self._bytes -= self._sizes.pop(key)
            return None
        except OSError as e:
            self.quarantine(key, f"unreadable: {e.strerror or e}")
            return None
        try:
            return decode_record(data)
        except SpoolCorrupt as e:
            self.quarantine(key, str(e))
            return None

    def quarantine(self, key: SpoolKey, reason: str) -> None:
        """Move KEY's file aside (bounded), forget it, count it; never raises."""
        qdir = self.dir / QUARANTINE_DIR
        src = self.dir / key.filename
        with self._lock:
            self._memory.pop(key, None)
            if key in self._sizes:
                self._bytes -= self._sizes.pop(key)
            self.quarantined += 1
            self.last_error = f"quarantined {key.filename}: {reason}"
        try:
            qdir.mkdir(exist_ok=True)
            os.replace(src, qdir / key.filename)
            kept = sorted(p for p in qdir.iterdir() if p.is_file())
            for old in kept[: max(0, len(kept) - self.max_quarantine)]:
                old.unlink(missing_ok=True)
        except OSError:
            with contextlib.suppress(OSError):
                src.unlink()  # cannot keep it aside: at least never read it again

    def ack(self, key: SpoolKey) -> None:
        """The collector holds KEY: forget it."""
        with self._lock:
            self._memory.pop(key, None)
            if key in self._sizes:
                self._remove(key)
