"""A native engine for the RC and UD probes: the hot loops in C (fastpath.c), driven from
Python.

Why: under emulation each Python-level verbs call costs more than the fabric round trip
it times, and pyverbs exposes no raw pointers, so a compiled loop has to own its verbs
resources. `NativeRcEndpoint` mirrors `fabricprobe.probes.rdma.verbs.RcEndpoint` as rc.py uses it
(same constructor, `endpoint()`, `connect()`, `close()`, context manager) and adds whole
loops: `send_pingpong`, `write_pingpong`, `read_probe`, `bandwidth`. `NativeUdEndpoint`
does the same for ud.py's UdEndpoint, with `probe` (a prober's round) and `answer` (a
responder's).
Each call runs one loop in C with the GIL released, so a responder and a prober can
share a process as two threads.

Build with scripts/build-native.sh; `available()` says whether the extension imports
(the loader, its NativeError and the clock's cost are fabricprobe.probes.native_loop's,
which the TCP probe uses without anything of this package). Loops return the iterations
completed (fewer at a per-step deadline); a completion error raises `CompletionError` (a
PeerError) that carries the status name and `completed`.
"""

from __future__ import annotations

import ipaddress
import random
import threading
from array import array
from collections.abc import Callable
from typing import Any, Self

from fabricprobe.core.errors import NotSupported, PeerError, ProbeError
from fabricprobe.probes.control import IB_MTUS, RdmaEndpoint
from fabricprobe.probes.measure import check_spin
from fabricprobe.probes.native_loop import NativeError, load_extension, loads

PORT = 1
BW_OPS = ("write", "send")
_UNSUPPORTED = {95, 93}  # EOPNOTSUPP, EPROTONOSUPPORT
# enum ibv_wc_status, in the order of <infiniband/verbs.h>
WC_STATUS = (
    "IBV_WC_SUCCESS",
    "IBV_WC_LOC_LEN_ERR",
    "IBV_WC_LOC_QP_OP_ERR",
    "IBV_WC_LOC_EEC_OP_ERR",
    "IBV_WC_LOC_PROT_ERR",
    "IBV_WC_WR_FLUSH_ERR",
    "IBV_WC_MW_BIND_ERR",
    "IBV_WC_BAD_RESP_ERR",
    "IBV_WC_LOC_ACCESS_ERR",
    "IBV_WC_REM_INV_REQ_ERR",
    "IBV_WC_REM_ACCESS_ERR",
    "IBV_WC_REM_OP_ERR",
    "IBV_WC_RETRY_EXC_ERR",
    "IBV_WC_RNR_RETRY_EXC_ERR",
    "IBV_WC_LOC_RDD_VIOL_ERR",
    "IBV_WC_REM_INV_RD_REQ_ERR",
    "IBV_WC_REM_ABORT_ERR",
    "IBV_WC_INV_EECN_ERR",
    "IBV_WC_INV_EEC_STATE_ERR",
    "IBV_WC_FATAL_ERR",
    "IBV_WC_RESP_TIMEOUT_ERR",
    "IBV_WC_GENERAL_ERR",
    "IBV_WC_TM_ERR",
    "IBV_WC_TM_RNDV_INCOMPLETE",
)


class NativeUnsupported(NotSupported):
    """The device has no such feature (EOPNOTSUPP, EPROTONOSUPPORT, no RoCE v2 GID)."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


class CompletionError(PeerError):
    """A work completion with an error status: usually a peer that vanished (retries
    exceeded). `completed` counts the iterations finished before it."""

    def __init__(self, message: str, status: int, completed: int) -> None:
        super().__init__(message)
        self.status = status
        self.status_name = status_name(status)
        self.completed = completed


def status_name(status: int) -> str:
    """ibv_wc_status number -> its enum name (the number itself when unknown)."""
    return WC_STATUS[status] if 0 <= status < len(WC_STATUS) else str(status)


_MODULE = "fabricprobe.probes.rdma.native._fastpath"


def load() -> Any:
    """The compiled cffi module (untyped: Any), or NativeError saying how to build it."""
    return load_extension(_MODULE)


def available() -> bool:
    """True when the extension is built and imports (libibverbs loads) here."""
    return loads(_MODULE)


class _NativeEndpoint:
    """What the RC and UD endpoints share: the C endpoint's lifetime and its errors."""

    device: str

    def __init__(self, device: str) -> None:
        mod = load()
        self._ffi, self._lib = mod.ffi, mod.lib
        self.device = device
        self._busy = threading.Lock()  # one loop at a time; close() waits for it
        self._state = threading.Lock()  # guards _ep between close() calls in two threads
        ep = self._lib.fp_new()
        if ep == self._ffi.NULL:
            raise MemoryError("fp_new")
        self._ep: Any = self._ffi.gc(ep, self._lib.fp_free)  # freed even if never closed

    def _opened(self, rc: int) -> None:
        """After fp_open / fp_ud_open: raise (and release) on failure, else read the info."""
        if rc != 0:
            err = self._error()
            self._release()
            raise err
        info = self._ffi.new("struct fp_info *")
        self._lib.fp_info(self._ep, info)
        self.qpn = int(info.qpn)
        self.gid_index = int(info.gid_index)
        self.active_mtu = int(info.active_mtu)
        self.inline = int(info.inline_size)
        self.rkey = int(info.rkey)
        self.recv_addr = int(info.addr)
        self.gid = str(ipaddress.IPv6Address(bytes(self._ffi.buffer(info.gid, 16))))

    def set_spin(self, seconds: float) -> None:
        """Busy-poll SECONDS (0..1 s), then let a receive wait sleep on its CQ's
        completion events (another wait pauses between polls). Unset, a wait busy-polls
        5 ms and then pauses 50 µs between polls. A host that runs many probe loops at
        once on few CPUs wants it. An answer found after a sleep counts in its prober
        delay the time from the wake-up, and the wake-up's own wait for a CPU where the
        kernel keeps it (/proc/thread-self/schedstat)."""
        check_spin(seconds)
        if self._lib.fp_set_spin(self._open_ep(), int(seconds * 1e9)) != 0:
            raise self._error()

    # -- errors ------------------------------------------------------------------------
    def _error(self, completed: int = 0) -> ProbeError:
        """The endpoint's last error as the matching exception."""
        message = self._ffi.string(self._lib.fp_error(self._ep)).decode(errors="replace")
        status = int(self._lib.fp_wc_status(self._ep))
        if status:
            return CompletionError(
                f"{self.device}: {message} [{status_name(status)}] after {completed} iterations",
                status,
                completed,
            )
        errno = int(self._lib.fp_errno(self._ep)) or None
        if errno in _UNSUPPORTED:
            return NativeUnsupported(f"{self.device}: not supported here ({message})", errno)
        return NativeError(message, errno, completed)

    # -- lifetime ----------------------------------------------------------------------
    def _release(self) -> None:
        ep, self._ep = self._ep, None
        if ep is not None:
            self._ffi.release(ep)  # fp_free: QP, AH, MR, CQs, PD, context, then the struct

    def close(self) -> None:
        """Stop a running loop, then release QP, MR, CQs, PD, context. Safe to call twice."""
        with self._state:
            if self._ep is None:
                return
            self._lib.fp_stop(self._ep)
        with self._busy, self._state:
            self._release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open_ep(self) -> Any:
        if self._ep is None:
            raise NativeError(f"{self.device}: endpoint is closed")
        return self._ep

    def _finish(self, done: int, wanted: int) -> int:
        """Raise the kept error when a loop ended short of WANTED because of one."""
        ep = self._ep
        if done < wanted and (self._lib.fp_wc_status(ep) or self._lib.fp_errno(ep)):
            raise self._error(done)
        return done


class NativeRcEndpoint(_NativeEndpoint):
    """One RC QP, its two CQs and a registered buffer of 2 x `size` bytes, owned in C.

    The receive half has `depth` receives posted from the start; the loops re-post
    them. `close()` (idempotent, safe from another thread) stops a running loop first.
    """

    def __init__(
        self,
        device: str,
        size: int,
        depth: int = 64,
        gid_index: int | None = None,
        remote_access: bool = False,
        inline: int = 0,
        port: int = PORT,
    ) -> None:
        if not 1 <= size <= 1 << 30:
            raise ValueError(f"buffer size {size} outside 1..1 GiB")
        if not 2 <= depth <= 1 << 14:
            raise ValueError(f"queue depth {depth} outside 2..16384")
        if not 0 <= inline <= 1 << 16 or not 1 <= port <= 255:
            raise ValueError(f"inline {inline} or port {port} out of range")
        super().__init__(device)
        self.size, self.depth, self.port = size, depth, port
        self.psn = random.randrange(1 << 24)
        self._remote: RdmaEndpoint | None = None
        self._opened(
            self._lib.fp_open(
                self._ep,
                device.encode(),
                size,
                depth,
                port,
                -1 if gid_index is None else gid_index,
                int(remote_access),
                inline,
                self.psn,
            )
        )

    # -- connection --------------------------------------------------------------------
    def endpoint(self) -> RdmaEndpoint:
        """What the peer needs to reach this QP and write into the receive half."""
        return RdmaEndpoint(
            qpn=self.qpn,
            psn=self.psn,
            gid=self.gid,
            gid_index=self.gid_index,
            lid=0,
            rkey=self.rkey,
            addr=self.recv_addr,
            mtu=self.active_mtu,
        )

    def connect(self, remote: RdmaEndpoint) -> None:
        """INIT -> RTR -> RTS towards REMOTE; the path MTU is the smaller active MTU."""
        if remote.mtu not in IB_MTUS:
            raise ValueError(f"remote mtu {remote.mtu} is not one of {IB_MTUS}")
        with self._busy:
            ep = self._open_ep()
            gid = self._ffi.new("uint8_t[16]", remote.gid_bytes)
            if self._lib.fp_connect(ep, remote.qpn, remote.psn, gid, remote.mtu) != 0:
                raise self._error()
            self._remote = remote

    # -- the loops ---------------------------------------------------------------------

    def _rtt_buffer(self, out: array[int] | None, total: int) -> Any:
        if out is None:
            return self._ffi.NULL
        if out.typecode != "q" or len(out) < total:
            raise ValueError(f"out must be array('q') of at least {total} items")
        return self._ffi.from_buffer("int64_t[]", out)

    def _check_loop(self, size: int, total: int, step_s: float) -> int:
        if not 1 <= size <= self.size:
            raise ValueError(f"message size {size} outside 1..{self.size}")
        if total < 0:
            raise ValueError(f"iterations {total} < 0")
        if not step_s > 0:
            raise ValueError(f"step_s {step_s} must be > 0")
        return int(step_s * 1e9)

    def _latency_loop(
        self,
        size: int,
        total: int,
        step_s: float,
        out: array[int] | None,
        prober: array[int] | None,
        run: Callable[[Any, int, Any, Any], int],
    ) -> int:
        """The frame the latency loops share: the shape checked, the endpoint held,
        RUN(ep, step_ns, rtt, own) called with the sample buffers (OUT and PROBER, or
        none), and its round trips done counted against TOTAL."""
        step_ns = self._check_loop(size, total, step_s)
        with self._busy:
            ep, rtt = self._open_ep(), self._rtt_buffer(out, total)
            own = self._rtt_buffer(prober, total)
            return self._finish(int(run(ep, step_ns, rtt, own)), total)

    def send_pingpong(
        self,
        size: int,
        total: int,
        first: bool,
        step_s: float,
        out: array[int] | None = None,
        prober: array[int] | None = None,
    ) -> int:
        """SEND/RECV ping-pong of TOTAL round trips; FIRST starts (the prober) and writes
        each RTT in ns into OUT, and into PROBER how late it can have seen each answer
        (fastpath.c pingpong: from the wait's newest clock read, taken every 64 empty
        polls, to the answer).
        Returns round trips done (fewer only at a deadline)."""
        return self._latency_loop(
            size, total, step_s, out, prober,
            lambda ep, step_ns, rtt, own: self._lib.fp_send_pingpong(
                ep, size, total, int(first), step_ns, rtt, own
            ),
        )  # fmt: skip

    def write_pingpong(
        self,
        remote: RdmaEndpoint,
        size: int,
        total: int,
        first: bool,
        step_s: float,
        out: array[int] | None = None,
        prober: array[int] | None = None,
    ) -> int:
        """RDMA WRITE ping-pong polling the last byte of the receive half (perftest's
        write_lat method); needs remote_access on both ends. As send_pingpong otherwise.
        Once per connection: the markers restart at 1 and the receive half keeps the last."""
        return self._latency_loop(
            size, total, step_s, out, prober,
            lambda ep, step_ns, rtt, own: self._lib.fp_write_pingpong(
                ep, remote.addr, remote.rkey, size, total, int(first), step_ns, rtt, own
            ),
        )  # fmt: skip

    def recv_view(self) -> memoryview:
        """The receive half of the registered buffer: where a peer's WRITEs land and where
        READs put what they bring back (a peer's READs take theirs from it). Valid while
        the endpoint is open."""
        self._open_ep()
        half = self._ffi.cast("uint8_t *", self.recv_addr)
        return memoryview(self._ffi.buffer(half, self.size))

    def read_probe(
        self,
        remote: RdmaEndpoint,
        size: int,
        total: int,
        step_s: float,
        out: array[int] | None = None,
        prober: array[int] | None = None,
    ) -> int:
        """TOTAL RDMA READs of SIZE bytes from the peer's receive half, one at a time
        (perftest's read_lat method): no software on the peer takes part. The peer's
        region needs remote access. OUT and PROBER as send_pingpong's."""
        return self._latency_loop(
            size, total, step_s, out, prober,
            lambda ep, step_ns, rtt, own: self._lib.fp_read_probe(
                ep, remote.addr, remote.rkey, size, total, step_ns, rtt, own
            ),
        )  # fmt: skip

    def bandwidth(
        self,
        op: str,
        size: int,
        iters: int,
        outstanding: int,
        step_s: float,
        first: bool = True,
    ) -> tuple[int, int]:
        """Stream ITERS WRITEs or SENDs of SIZE bytes, OUTSTANDING in flight, to the
        connected peer; returns (completed, elapsed_ns). With first=False and op "send"
        this is the receiving side (counting receives); a WRITE's target runs no loop."""
        if op not in BW_OPS:
            raise ValueError(f"op must be one of {', '.join(BW_OPS)}, not {op!r}")
        step_ns = self._check_loop(size, iters, step_s)
        if not first and op == "write":
            raise ValueError("the target of RDMA WRITEs runs no loop")
        if not 1 <= outstanding <= self.depth:
            raise ValueError(f"outstanding {outstanding} outside 1..{self.depth}")
        elapsed = self._ffi.new("int64_t *")
        with self._busy:
            ep = self._open_ep()
            if not first:
                done = int(self._lib.fp_receive(ep, iters, step_ns, elapsed))
            else:
                remote = self._remote
                if remote is None:
                    raise NativeError(f"{self.device}: endpoint is not connected")
                done = int(
                    self._lib.fp_bandwidth(
                        ep,
                        int(op == "write"),
                        remote.addr,
                        remote.rkey,
                        size,
                        iters,
                        outstanding,
                        step_ns,
                        elapsed,
                    )
                )
            return self._finish(done, iters), int(elapsed[0])


class NativeUdEndpoint(_NativeEndpoint):
    """One UD QP (in RTS, QKEY), two CQs and DEPTH receive slots plus a send slot, owned
    in C, speaking probes/rdma/ud.py's probe/ACK protocol. `sender(remote)` points it at
    the peer's QP; `probe()` runs a prober's round and `answer()` a responder's."""

    def __init__(self, device: str, gid_index: int, qkey: int, depth: int = 8) -> None:
        if not 2 <= depth <= 1 << 14:
            raise ValueError(f"queue depth {depth} outside 2..16384")
        super().__init__(device)
        self.depth, self.port = depth, PORT
        self._opened(
            self._lib.fp_ud_open(
                self._ep, device.encode(), depth, PORT, gid_index, qkey, random.randrange(1 << 24)
            )
        )
        self.hw_ts = bool(self._lib.fp_ud_hw_ts(self._ep))

    def endpoint(self) -> RdmaEndpoint:
        return RdmaEndpoint.datagram(self.qpn, self.gid, self.gid_index)

    def sender(self, remote: RdmaEndpoint) -> None:
        """Address the peer's UD QP (the address handle lives with the endpoint)."""
        with self._busy:
            gid = self._ffi.new("uint8_t[16]", remote.gid_bytes)
            if self._lib.fp_ud_remote(self._open_ep(), remote.qpn, gid) != 0:
                raise self._error()

    def probe(
        self, count: int, step_s: float, seq0: int, interval_s: float = 0.0, late_s: float = 0.0
    ) -> tuple[list[int], list[int], list[int], list[int], int]:
        """COUNT probes from sequence number SEQ0, one out at a time: each waits STEP_S for
        its ACKs, the next goes no sooner than INTERVAL_S after it, and answers are taken
        until LATE_S after the last went (late ones while later probes wait). (network
        RTTs, RTTs with the responder's delay, those delays, the prober's own delay in
        seeing each ACK, probes sent), in ns; a lost probe has none of the four. The
        prober's delay is software-timed (fastpath.c fp_ud_probe: the time from the last
        empty poll of the receive CQ to the poll that found the ACK); its send side is
        not timed."""
        if count < 1 or not step_s > 0 or interval_s < 0 or late_s < 0:
            raise ValueError(
                f"count {count} and step_s {step_s} must be positive, interval {interval_s} "
                f"and late {late_s} not negative"
            )
        net, raw, delay, prober = (array("q", bytes(8 * count)) for _ in range(4))
        buf = self._ffi.from_buffer
        with self._busy:
            sent = int(
                self._lib.fp_ud_probe(
                    self._open_ep(),
                    count,
                    int(step_s * 1e9),
                    int(interval_s * 1e9),
                    int(late_s * 1e9),
                    seq0 & 0xFFFFFFFF,
                    buf("int64_t[]", net),
                    buf("int64_t[]", raw),
                    buf("int64_t[]", delay),
                    buf("int64_t[]", prober),
                )
            )
            self._finish(sent, count)
        kept = [i for i in range(sent) if net[i] >= 0]
        return (
            [net[i] for i in kept],
            [raw[i] for i in kept],
            [delay[i] for i in kept],
            [prober[i] for i in kept],
            sent,
        )

    def answer(self, count: int, step_s: float, idle_s: float) -> int:
        """Answer up to COUNT probes; ends early after IDLE_S without one. Probes answered."""
        with self._busy:
            done = int(
                self._lib.fp_ud_answer(self._open_ep(), count, int(step_s * 1e9), int(idle_s * 1e9))
            )
            return self._finish(done, count)
