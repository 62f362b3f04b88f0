"""TCP baseline probes: ping-pong RTT (TCP_NODELAY) and bulk throughput.

They run against the same responder as the RDMA probes, so TCP and RDMA are measured
on the same pair at the same time. The session starts on the control connection
(fabricprobe.probes.control): the prober's hello names `tcp_lat` or `tcp_bw`; the responder opens
an ephemeral data listener on the address the control connection arrived at and
answers `ready {data_port, token}`. The prober then opens one data connection per
stream from the same source address and sends the 16-byte token first, so a stray
connection cannot join the session. Keeping data apart from control leaves the data
connection a pure byte stream and the control connection free for `done`.

Timing: the prober's exchanges run in the compiled loop of probes/native_loop
(`fp_tcp_pingpong`, the GIL released; libc only) when it is built, else in Python; the result's
`engine` says which (`native` or `python`) and `engine_reason` why. Either way a sample
is a monotonic clock read before the send to one after the last byte of the echo, the
buffers are allocated before the loop, and the data socket is blocking with the
per-exchange deadline set in the kernel (SO_RCVTIMEO/SO_SNDTIMEO), so each step is one
system call, as in a C tool, and a silent peer still cannot hang the run (the native
loop reads the rest of a split echo with poll() against the exchange's deadline). The
cost of the loop itself is reported as `timer_overhead_ns` (two back-to-back clock
reads) and `loop_overhead_ns` (the Python loop timed with null I/O; in C, the clock pair
is all the loop adds).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import secrets
import socket
import statistics
import struct
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fabricprobe.core.deadline import Deadline, Timeout, as_deadline
from fabricprobe.core.errors import NotSupported, PeerError, ProbeError
from fabricprobe.core.stats import LatencySketch, LatencySummary
from fabricprobe.probes import native_loop
from fabricprobe.probes.control import (
    DEFAULT_TIMEOUT_S,
    ControlClient,
    ProtocolError,
    Session,
    SessionHandler,
    optional_float,
    optional_int,
    require_int,
    require_str,
)
from fabricprobe.probes.measure import BandwidthResult, LatencyResult, LinkParams, clock_pair_ns

MIN_SIZE = 1
MAX_SIZE = 1 << 20  # 1 MiB
MAX_CHUNK = 16 << 20
MAX_STREAMS = 64
TOKEN_BYTES = 16
DEFAULT_CHUNK = 128 << 10
_ACK = struct.Struct("!Q")

Progress = Callable[[int, int], None]  # (done, total) in iterations or milliseconds


# --------------------------------------------------------------------------- results


def kernel_bypass_ratio(tcp: LatencySummary, rdma: LatencySummary) -> float | None:
    """TCP median over RDMA median for the same kind of figure (RTT with RTT only)."""
    if tcp.kind != rdma.kind:
        raise ValueError(f"cannot compare a {tcp.kind} figure with a {rdma.kind} figure")
    if not tcp.p50_us or not rdma.p50_us:
        return None
    return tcp.p50_us / rdma.p50_us


# --------------------------------------------------------------------------- timing loop


class Stopped(Exception):
    """The exchange loop ended early: DONE exchanges finished before index DONE failed."""

    def __init__(self, done: int, cause: str | OSError) -> None:
        super().__init__(done, cause)
        self.done = done
        self.cause = cause

    def reason(self, timeout: float) -> str:
        if isinstance(self.cause, str):
            return self.cause
        if _is_timeout(self.cause):
            return f"peer did not answer within {timeout:g} s"
        return f"data connection failed: {self.cause.strerror or self.cause}"


def _exchange_loop(
    send: Callable[[memoryview], object],
    recv_into: Callable[[memoryview, int, int], int],
    sbuf: bytearray,
    rbuf: bytearray,
    samples: array[int],
    base: int,
    n: int,
    verify: bool,
    deadline_ns: int,
) -> None:
    """Run N exchanges, RTTs into SAMPLES[BASE:]; any failure raises Stopped.

    Each system call is bounded by the socket's kernel deadline; DEADLINE_NS bounds
    the whole exchange when the echo arrives in pieces.
    """
    clock = time.perf_counter_ns
    size = len(sbuf)
    sview = memoryview(sbuf)
    rview = memoryview(rbuf)
    waitall = socket.MSG_WAITALL
    i = 0
    try:
        for i in range(n):
            sbuf[0] = (base + i) & 0xFF  # a fresh first byte: a stale echo fails verification
            t0 = clock()
            send(sview)
            got = recv_into(rview, size, waitall)
            while got < size:
                if got == 0:
                    raise Stopped(base + i, "peer closed the data connection")
                # MSG_WAITALL still returns short on a signal or a deadline; go on reading
                if clock() - t0 > deadline_ns:
                    raise Stopped(base + i, "echo incomplete at the deadline")
                k = recv_into(rview[got:], size - got, waitall)
                if k == 0:
                    raise Stopped(base + i, "peer closed the data connection")
                got += k
            t1 = clock()
            samples[base + i] = t1 - t0
            if verify and rbuf != sbuf:
                raise Stopped(base + i, "echo payload did not match what was sent")
    except OSError as e:
        raise Stopped(base + i, e) from None


# --------------------------------------------------------------------------- which loop

LOOPS = ("auto", "native", "python")


@dataclass(frozen=True)
class ClientLoop:
    """Which loop times the prober's ping-pongs (`native` or `python`) and why."""

    name: str
    reason: str


@functools.cache
def _native_status() -> str | None:
    """None when the compiled loop (probes/native_loop) loads here, else why not."""
    try:
        native_loop.load()
    except ProbeError as e:  # not built, or built for another Python
        return str(e)
    return None


def pick_loop(requested: str = "auto") -> ClientLoop:
    """`auto` takes the compiled loop when it is built and loads, else the Python one;
    an explicit `native` that cannot load raises NotSupported."""
    if requested not in LOOPS:
        raise ValueError(f"loop must be one of {', '.join(LOOPS)}, not {requested!r}")
    if requested == "python":
        return ClientLoop("python", "python: asked for")
    why = _native_status()
    if why is None:
        return ClientLoop("native", "native: the compiled loop is built and loads")
    if requested == "native":
        raise NotSupported(f"the native TCP loop is not built here: {why}")
    return ClientLoop("python", f"python: the compiled loop does not load ({why})")


_NATIVE_STOPS = {
    native_loop.TCP_CLOSED: "peer closed the data connection",
    native_loop.TCP_MISMATCH: "echo payload did not match what was sent",
}


def run_exchanges(
    loop: str,
    sock: socket.socket,
    sbuf: bytearray,
    rbuf: bytearray,
    samples: array[int],
    base: int,
    n: int,
    verify: bool,
    timeout: float,
) -> None:
    """N ping-pongs on SOCK by LOOP (`native` or `python`), RTTs in ns into
    SAMPLES[BASE:]; each exchange within TIMEOUT s. Any failure raises Stopped."""
    if loop == "native":
        try:
            done, status = native_loop.tcp_pingpong(
                sock.fileno(), sbuf, rbuf, samples, base, n, timeout, verify
            )
        except native_loop.NativeError as e:
            raise Stopped(base, str(e)) from None
        if status == native_loop.TCP_TIMEOUT:
            raise Stopped(base + done, TimeoutError(errno.ETIMEDOUT, "timed out"))
        if status in _NATIVE_STOPS:
            raise Stopped(base + done, _NATIVE_STOPS[status])
        if status:
            raise Stopped(base + done, OSError(-status, os.strerror(-status)))
        return
    _exchange_loop(
        sock.sendall, sock.recv_into, sbuf, rbuf, samples, base, n, verify, int(timeout * 1e9)
    )


@dataclass(frozen=True)
class TimerOverhead:
    """What the measuring itself costs, in ns (medians)."""

    pair_ns: int  # two back-to-back perf_counter_ns() calls
    loop_ns: int  # one iteration of the exchange loop with null I/O


def measure_timer_overhead(n: int = 20_000, loop: str = "python") -> TimerOverhead:
    """Time the clock and the exchange loop with I/O replaced by no-ops. The native loop
    holds nothing but its two clock reads between a sample's ends besides the system
    calls, so both of its figures are its clock pair's."""
    if loop == "native":
        pair = native_loop.clock_overhead_ns()
        return TimerOverhead(pair, pair)
    pair = clock_pair_ns(n)
    buf = bytearray(64)
    samples = array("q", bytes(8 * n))

    def null_send(view: memoryview) -> None:
        return None

    def null_recv(view: memoryview, k: int, flags: int) -> int:
        return k

    _exchange_loop(null_send, null_recv, buf, buf, samples, 0, n, True, 1 << 62)
    return TimerOverhead(pair, int(statistics.median(samples)))


# --------------------------------------------------------------------------- sockets


def set_kernel_timeouts(sock: socket.socket, seconds: float) -> None:
    """Blocking socket whose recv/send give up after SECONDS (EAGAIN) inside the kernel."""
    sock.settimeout(None)
    sec = int(seconds)
    usec = max(1, int((seconds - sec) * 1_000_000)) if seconds > 0 else 0
    tv = struct.pack("@ll", sec, usec)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def send_within(sock: socket.socket, view: memoryview, timeout: float) -> None:
    """All of VIEW within TIMEOUT on a socket with kernel timeouts (set_kernel_timeouts).

    A blocking send() returns short only when its SO_SNDTIMEO ran out (or a signal came)
    part-way; sendall would then start a new full wait, so a peer that stops reading
    could hold a sender for twice the timeout. Here the rest gets only what is left.
    """
    t0 = time.monotonic()
    sent = sock.send(view)
    if sent == len(view):
        return
    try:
        while sent < len(view):
            left = timeout - (time.monotonic() - t0)
            if left <= 0:
                raise TimeoutError(f"peer took {sent} of {len(view)} bytes in {timeout:g} s")
            set_kernel_timeouts(sock, left)
            sent += sock.send(view[sent:])
    finally:
        set_kernel_timeouts(sock, timeout)


def _is_timeout(e: OSError) -> bool:
    return isinstance(e, TimeoutError) or e.errno in (errno.EAGAIN, errno.EWOULDBLOCK)


def _failure(e: OSError, timeout: float) -> str:
    return Stopped(0, e).reason(timeout)


def open_data_connection(
    ctrl: ControlClient, info: dict[str, Any], timeout: Timeout
) -> socket.socket:
    """Connect one data stream to the port in the responder's ready info and send the
    token, within TIMEOUT: pass the Deadline the control session's setup started, so the
    whole setup fits in it."""
    deadline = as_deadline(timeout)
    port = require_int(info, "data_port", 1, 65535, where="ready.info.")
    token_hex = require_str(info, "token", 2 * TOKEN_BYTES, where="ready.info.")
    try:
        token = bytes.fromhex(token_hex)
    except ValueError:
        raise ProtocolError("ready.info.token: not hex") from None
    assert ctrl.channel is not None
    peer_ip = ctrl.channel.sock.getpeername()[0]
    sock = socket.socket(ctrl.channel.sock.family, socket.SOCK_STREAM)
    try:
        sock.bind((ctrl.local_address, 0))
        for step in ("connect", "token"):
            left = deadline.remaining()
            if left <= 0:
                raise TimeoutError
            sock.settimeout(left)
            if step == "connect":
                sock.connect((peer_ip, port))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            else:
                sock.sendall(token)
    except OSError as e:
        sock.close()
        raise PeerError(
            f"cannot open the data connection to port {port}: {_failure(e, deadline.seconds)}"
        ) from None
    return sock


# --------------------------------------------------------------------------- ping-pong


def run_pingpong(
    link: LinkParams,
    *,
    size: int = 64,
    iters: int = 1000,
    warmup: int = 100,
    verify: bool = True,
    progress: Progress | None = None,
    loop: str = "auto",
) -> LatencyResult:
    """Measure TCP ping-pong RTT of SIZE-byte messages against LINK's responder, timed by
    LOOP (see pick_loop: the compiled loop when it is built; the result names it).

    Raises PeerError if the session cannot start within LINK's timeout (default 5 s):
    connect, hello, the fleet-token challenge and the data connection share it. Once it
    has started, a peer that vanishes ends the run within LINK's step_s (default 2 s):
    finished samples are kept, the remaining iterations are counted as lost and `error`
    says why. The closing `done` exchange gets step_s too.
    """
    timeout, connect_timeout = link.step(2.0), link.setup_timeout(DEFAULT_TIMEOUT_S)
    if not MIN_SIZE <= size <= MAX_SIZE:
        raise ValueError(f"size must be {MIN_SIZE}..{MAX_SIZE} bytes, got {size}")
    if iters < 1 or warmup < 0:
        raise ValueError("iters must be >= 1 and warmup >= 0")
    if not timeout > 0:
        raise ValueError("timeout must be positive")
    chosen = pick_loop(loop)
    sketch = LatencySketch("rtt")
    sbuf = bytearray(secrets.token_bytes(size))
    rbuf = bytearray(size)
    samples = array("q", bytes(8 * iters))
    completed = 0
    error: str | None = None
    started = time.perf_counter()
    setup = Deadline(connect_timeout)
    with ControlClient.to(link, connect_timeout) as ctrl:
        info = ctrl.open("tcp_lat", {"size": size, "timeout": timeout}, deadline=setup)
        source = ctrl.local_address
        data = open_data_connection(ctrl, info, setup)
        with data:
            set_kernel_timeouts(data, timeout)
            warming = True
            try:
                if warmup:
                    scratch = array("q", bytes(8 * warmup))
                    run_exchanges(
                        chosen.name, data, sbuf, rbuf, scratch, 0, warmup, verify, timeout
                    )
                warming = False
                step = max(1, min(iters // 100, 10_000)) if progress else iters
                while completed < iters:
                    n = min(step, iters - completed)
                    run_exchanges(
                        chosen.name, data, sbuf, rbuf, samples, completed, n, verify, timeout
                    )
                    completed += n
                    if progress:
                        progress(completed, iters)
            except Stopped as e:
                completed = 0 if warming else e.done
                error = e.reason(timeout)
        duration = time.perf_counter() - started
        if error is None:
            with contextlib.suppress(PeerError):
                ctrl.done({"completed": completed}, timeout=timeout)
    # after the run, not before: a peer that is not there costs no calibration
    overhead = measure_timer_overhead(loop=chosen.name)
    sketch.record_many(samples[:completed].tolist())
    sketch.record_lost(iters - completed)
    return LatencyResult(
        transport="tcp",
        op="pingpong",
        peer=link.peer,
        port=link.port,
        source=source,
        size=size,
        iters=iters,
        warmup=warmup,
        summary=sketch.summary(),
        timer_overhead_ns=overhead.pair_ns,
        loop_overhead_ns=overhead.loop_ns,
        duration_s=duration,
        error=error,
        sketch=sketch,
        engine=chosen.name,
        engine_reason=chosen.reason,
    )


# --------------------------------------------------------------------------- throughput


@dataclass
class _Stream:
    sock: socket.socket
    sent: int = 0
    acked: int = 0
    end_s: float = 0.0
    error: str | None = None


def _send_stream(
    st: _Stream,
    chunk: memoryview,
    start: threading.Event,
    duration: float | None,
    quota: int | None,
    timeout: float,
) -> None:
    """Send for DURATION seconds or QUOTA bytes, then collect the responder's byte count."""
    start.wait()
    clock = time.perf_counter
    stop_at = clock() + (duration or 0.0)
    n = len(chunk)
    try:
        if quota is not None:
            while st.sent < quota:
                k = min(n, quota - st.sent)
                send_within(st.sock, chunk if k == n else chunk[:k], timeout)
                st.sent += k
        else:
            while clock() < stop_at:
                send_within(st.sock, chunk, timeout)
                st.sent += n
        # The responder answers EOF with the byte count it received: only then are
        # the bytes known to have crossed the network, not just our socket buffer.
        st.sock.shutdown(socket.SHUT_WR)
        ack = bytearray(_ACK.size)
        got = 0
        while got < len(ack):
            k = st.sock.recv_into(memoryview(ack)[got:])
            if k == 0:
                raise Stopped(0, "peer closed the data connection before confirming")
            got += k
        st.acked = _ACK.unpack(ack)[0]
        st.end_s = clock()
    except Stopped as e:
        st.error = e.reason(timeout)
    except OSError as e:
        st.error = _failure(e, timeout)


def run_throughput(
    link: LinkParams,
    *,
    duration: float | None = 5.0,
    total_bytes: int | None = None,
    streams: int = 1,
    chunk_size: int = DEFAULT_CHUNK,
    progress: Progress | None = None,
) -> BandwidthResult:
    """Send bulk data for DURATION seconds (or TOTAL_BYTES) over STREAMS connections to
    LINK's responder.

    Throughput counts only bytes the responder confirmed. A peer that vanishes ends
    the run within LINK's step_s (default 2 s) of its last progress, with `error` set.
    """
    timeout, connect_timeout = link.step(2.0), link.setup_timeout(DEFAULT_TIMEOUT_S)
    if (duration is None) == (total_bytes is None):
        raise ValueError("give exactly one of duration and total_bytes")
    if duration is not None and not 0 < duration <= 3600:
        raise ValueError(f"duration must be in (0, 3600] s, got {duration}")
    if total_bytes is not None and total_bytes < 1:
        raise ValueError("total_bytes must be >= 1")
    if not 1 <= streams <= MAX_STREAMS:
        raise ValueError(f"streams must be 1..{MAX_STREAMS}, got {streams}")
    if not MIN_SIZE <= chunk_size <= MAX_CHUNK:
        raise ValueError(f"chunk size must be {MIN_SIZE}..{MAX_CHUNK} bytes, got {chunk_size}")
    chunk = memoryview(bytearray(secrets.token_bytes(chunk_size)))
    params = {"streams": streams, "chunk_size": chunk_size, "timeout": timeout}
    setup = Deadline(connect_timeout)  # the control session and every stream's connection
    with contextlib.ExitStack() as stack:
        ctrl = stack.enter_context(ControlClient.to(link, connect_timeout))
        info = ctrl.open("tcp_bw", params, deadline=setup)
        source = ctrl.local_address
        lanes: list[_Stream] = []
        for _ in range(streams):
            sock = open_data_connection(ctrl, info, setup)
            stack.callback(sock.close)
            set_kernel_timeouts(sock, timeout)
            lanes.append(_Stream(sock))
        go = threading.Event()
        quotas = _split(total_bytes, streams)
        threads = [
            threading.Thread(
                target=_send_stream,
                args=(st, chunk, go, duration, quotas[i], timeout),
                name=f"tcp-bw-{i}",
                daemon=True,
            )
            for i, st in enumerate(lanes)
        ]
        for t in threads:
            t.start()
        started = time.perf_counter()
        go.set()
        _wait_streams(threads, lanes, duration, total_bytes, started, progress)
        ends = [st.end_s for st in lanes if st.end_s]
        elapsed = (max(ends) if ends else time.perf_counter()) - started
        errors = [st.error for st in lanes if st.error]
        if not errors:
            with contextlib.suppress(PeerError):
                ctrl.done({"bytes_sent": sum(st.sent for st in lanes)}, timeout=timeout)
    return BandwidthResult(
        transport="tcp",
        op="stream",
        peer=link.peer,
        port=link.port,
        source=source,
        streams=streams,
        size=chunk_size,
        bytes=sum(st.acked for st in lanes),
        bytes_sent=sum(st.sent for st in lanes),
        duration_s=elapsed,
        error=errors[0] if errors else None,
    )


def _split(total: int | None, parts: int) -> list[int | None]:
    if total is None:
        return [None] * parts
    share, extra = divmod(total, parts)
    return [share + (1 if i < extra else 0) for i in range(parts)]


def _wait_streams(
    threads: Sequence[threading.Thread],
    lanes: Sequence[_Stream],
    duration: float | None,
    total_bytes: int | None,
    started: float,
    progress: Progress | None,
) -> None:
    """Join the sender threads, reporting progress; each one ends by its own deadlines."""
    while alive := [t for t in threads if t.is_alive()]:
        alive[0].join(0.1)
        if progress:
            if total_bytes is not None:
                progress(min(total_bytes, sum(st.sent for st in lanes)), total_bytes)
            elif duration is not None:
                ms = int((time.perf_counter() - started) * 1000)
                progress(min(ms, int(duration * 1000)), int(duration * 1000))


# --------------------------------------------------------------------------- responder side


def data_listener(session: Session) -> socket.socket:
    """An ephemeral listener on the address the control connection arrived at."""
    family = socket.AF_INET6 if ":" in session.local[0] else socket.AF_INET
    lsock = session.track(socket.socket(family, socket.SOCK_STREAM))
    lsock.bind((session.local[0], 0))
    lsock.listen(MAX_STREAMS)
    return lsock


def accept_streams(
    session: Session, lsock: socket.socket, token: bytes, count: int, timeout: float
) -> list[socket.socket]:
    """Accept COUNT data connections that present TOKEN, all within one deadline."""
    deadline = Deadline(session.step_timeout)
    peer_ip = session.peer[0]
    out: list[socket.socket] = []
    while len(out) < count:
        if deadline.expired or session.stopping:
            raise PeerError(f"only {len(out)} of {count} data connections arrived in time")
        lsock.settimeout(max(0.01, deadline.remaining()))
        try:
            conn, addr = lsock.accept()
        except TimeoutError:
            continue
        session.track(conn)
        if addr[0] != peer_ip:
            conn.close()  # not our prober: it may not join the session
            continue
        conn.settimeout(max(0.01, deadline.remaining()))
        try:
            got = conn.recv(TOKEN_BYTES, socket.MSG_WAITALL)
        except OSError:
            got = b""
        if got != token:
            conn.close()
            continue
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        set_kernel_timeouts(conn, timeout)
        out.append(conn)
    lsock.close()
    return out


def _native_echo() -> Callable[[int, int], int] | None:
    """The compiled echo loop (probes/native_loop) when it is built, else None."""
    return native_loop.tcp_echo if native_loop.available() else None


def _echo(conn: socket.socket, size: int, idle: float) -> int:
    """Echo SIZE-byte messages until the prober closes; return how many were echoed.

    This loop is inside every RTT the prober measures, so it does as little as it can:
    no per-message checks. Abort needs none: Session.abort() shuts the socket down,
    which makes the blocked recv return 0.
    """
    native = _native_echo()
    if native is not None:  # the compiled echo: a Python echo costs more than the RTT here
        try:
            return native(conn.fileno(), size)
        except OSError as e:
            if _is_timeout(e):
                raise PeerError(f"prober idle for {idle:g} s") from None
            raise PeerError(f"data connection failed: {e.strerror or e}") from None
    view = memoryview(bytearray(size))
    recv_into, send = conn.recv_into, conn.sendall
    waitall = socket.MSG_WAITALL
    echoed = 0
    try:
        while True:
            got = recv_into(view, size, waitall)
            if got != size:
                if got == 0:
                    return echoed
                while got < size:  # short read: a signal or the idle deadline
                    k = recv_into(view[got:], size - got, waitall)
                    if k == 0:
                        return echoed
                    got += k
            send(view)
            echoed += 1
    except OSError as e:
        if _is_timeout(e):
            raise PeerError(f"prober idle for {idle:g} s") from None
        raise PeerError(f"data connection failed: {e.strerror or e}") from None


def _session_params(session: Session) -> tuple[float, str]:
    timeout = optional_float(session.params, "timeout", 0.001, 600.0, 2.0, where="params.")
    return timeout, secrets.token_hex(TOKEN_BYTES)


def serve_tcp_lat(session: Session) -> dict[str, Any]:
    """Responder side of a ping-pong: echo every SIZE-byte message back. A kept link
    (`keepalive_s`) is echoed for as long as the prober sends within the keepalive."""
    size = require_int(session.params, "size", MIN_SIZE, MAX_SIZE, where="params.")
    session.reserve(size, "a tcp_lat echo buffer")
    _timeout, token = _session_params(session)
    lsock = data_listener(session)
    session.ready({"data_port": lsock.getsockname()[1], "token": token})
    idle = max(session.step_timeout, session.keepalive)
    (conn,) = accept_streams(session, lsock, bytes.fromhex(token), 1, idle)
    try:
        echoed = _echo(conn, size, idle)
    except PeerError as e:
        if not session.keepalive:
            raise
        session.ended_idle = str(e)  # a kept link left idle: nothing to answer
        return {}
    if session.keepalive:
        session.ended_idle = "the prober closed its link"
    return {"echoed": echoed}


def _sink(conn: socket.socket, chunk_size: int, out: list[int], idx: int, errs: list[str]) -> None:
    """Read until EOF, then send back the byte count."""
    buf = memoryview(bytearray(chunk_size))
    total = 0
    try:
        while True:
            k = conn.recv_into(buf)
            if k == 0:
                break
            total += k
        out[idx] = total
        conn.sendall(_ACK.pack(total))
    except OSError as e:
        out[idx] = total
        errs.append(f"stream {idx}: {'idle timeout' if _is_timeout(e) else e.strerror or e}")


def serve_tcp_bw(session: Session) -> dict[str, Any]:
    """Responder side of a throughput run: sink every stream, confirm bytes at EOF."""
    streams = require_int(session.params, "streams", 1, MAX_STREAMS, where="params.")
    chunk_size = optional_int(
        session.params, "chunk_size", MIN_SIZE, MAX_CHUNK, DEFAULT_CHUNK, where="params."
    )
    session.reserve(streams * min(chunk_size, 1 << 20), f"tcp_bw's {streams} stream buffers")
    _timeout, token = _session_params(session)
    lsock = data_listener(session)
    session.ready({"data_port": lsock.getsockname()[1], "token": token})
    conns = accept_streams(session, lsock, bytes.fromhex(token), streams, session.step_timeout)
    received = [0] * streams
    errs: list[str] = []
    threads = [
        threading.Thread(target=_sink, args=(c, min(chunk_size, 1 << 20), received, i, errs))
        for i, c in enumerate(conns)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()  # each sink ends by EOF, its idle deadline, or abort()
    if errs:
        raise PeerError("; ".join(errs))
    return {"bytes": sum(received), "streams": streams}


# Session kind -> handler, for whoever builds a responder.
SESSIONS: dict[str, SessionHandler] = {"tcp_lat": serve_tcp_lat, "tcp_bw": serve_tcp_bw}
