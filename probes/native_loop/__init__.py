"""The compiled loops' loader, and the TCP baseline's loops in C (socketloop.c).

Two cffi extensions hold the probes' hot loops: this package's `_socketloop` (the TCP
ping-pong, the TCP echo and the clock they time with; libc only) and the RDMA engine's
`_fastpath` (probes/rdma/native; linked with libibverbs). `load_extension` imports
either, with the same message when it is not built or does not load, so the TCP probe
needs neither pyverbs nor libibverbs, nor anything of probes/rdma.

Build with scripts/build-native.sh (or the package build); `available()` says whether the
socket loop imports here, and the TCP probe falls back to its Python loop when not.
"""

from __future__ import annotations

import importlib
import os
import sys
from array import array
from errno import EINTR
from typing import Any

from fabricprobe.core.errors import ProbeError

SOCKET_LOOP = "fabricprobe.probes.native_loop._socketloop"

# fp_tcp_pingpong's reasons to stop early (socketloop.c), besides -errno
TCP_CLOSED, TCP_TIMEOUT, TCP_MISMATCH = 1, 2, 3


class NativeError(ProbeError):
    """A compiled loop is not built or does not load, or a call in it failed; `errno`
    tells unsupported from broken, `completed` counts the loop iterations done before a
    loop failed."""

    def __init__(self, message: str, errno: int | None = None, completed: int = 0) -> None:
        super().__init__(message)
        self.errno = errno
        self.completed = completed


def load_extension(module: str) -> Any:
    """The compiled cffi MODULE (untyped: Any), or NativeError saying how to build it."""
    loaded = sys.modules.get(module)  # every probe burst asks: skip the import machinery
    if loaded is not None:
        return loaded
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise NativeError(
            f"the compiled loop {module.rpartition('.')[2]} is not built or does not load "
            f"({err}); run scripts/build-native.sh"
        ) from err


def load() -> Any:
    """The socket loop's extension, or NativeError."""
    return load_extension(SOCKET_LOOP)


def loads(module: str) -> bool:
    """True when the compiled MODULE is built and imports here."""
    try:
        load_extension(module)
    except NativeError:
        return False
    return True


def available() -> bool:
    """True when the socket loop is built and imports here."""
    return loads(SOCKET_LOOP)


def clock_overhead_ns() -> int:
    """Median cost of the clock-read pair that brackets each native RTT sample (the TCP
    and the RDMA loops read the same clock, CLOCK_MONOTONIC, the same way)."""
    return int(load().lib.fp_clock_overhead_ns(1024))


def tcp_echo(fd: int, size: int) -> int:
    """Echo SIZE-byte messages on the connected TCP socket FD until the peer closes;
    returns how many. A receive timeout or a socket error raises OSError."""
    mod = load()
    done = int(mod.lib.fp_tcp_echo(fd, mod.ffi.new("uint8_t[]", size), size))
    if done < 0:
        raise OSError(-done, os.strerror(-done))
    return done


def tcp_pingpong(
    fd: int,
    sbuf: bytearray,
    rbuf: bytearray,
    out: array[int],
    base: int,
    count: int,
    step_s: float,
    verify: bool = True,
) -> tuple[int, int]:
    """COUNT ping-pongs of len(SBUF) bytes on the connected TCP socket FD, in C: RTTs in
    ns into OUT[BASE:]. Returns (exchanges done, status): status 0 when all COUNT are
    done, else TCP_CLOSED, TCP_TIMEOUT (an exchange passed STEP_S), TCP_MISMATCH or
    -errno. Exchange i sends BASE + i in byte 0, so a stale echo fails VERIFY. A signal
    ends the call after the exchange it came in (status -EINTR) and the loop goes on,
    after Python has run its handlers (Ctrl-C raises here)."""
    size = len(sbuf)
    if not 1 <= size <= 1 << 30 or len(rbuf) != size:
        raise ValueError(f"buffers of 1..1 GiB and equal size, not {size} and {len(rbuf)}")
    if count < 0 or base < 0 or out.typecode != "q" or len(out) < base + count:
        raise ValueError(f"out must be array('q') with room for {count} RTTs from {base}")
    if not step_s > 0:
        raise ValueError(f"step_s {step_s} must be > 0")
    mod = load()
    ffi, lib = mod.ffi, mod.lib
    sp, rp = ffi.from_buffer("uint8_t[]", sbuf), ffi.from_buffer("uint8_t[]", rbuf)
    rtt = ffi.from_buffer("int64_t[]", out)
    status = ffi.new("int *")
    step_ns = max(1000, int(step_s * 1e9))
    done = 0
    while True:
        n = int(
            lib.fp_tcp_pingpong(
                fd,
                sp,
                rp,
                size,
                count - done,
                step_ns,
                int(verify),
                base + done,
                rtt + base + done,
                status,
            )
        )
        done += n
        if status[0] != -EINTR or done >= count:
            return done, (0 if status[0] == -EINTR else int(status[0]))
