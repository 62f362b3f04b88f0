"""TCP ping-pong and throughput against a real responder on loopback."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fabricprobe.cli.commands.serve import open_serve_argv
from fabricprobe.core.errors import PeerError
from fabricprobe.core.stats import LatencySketch, one_way_from_rtt
from fabricprobe.probes import tcp
from fabricprobe.probes.control import ControlClient, Session
from fabricprobe.probes.measure import BandwidthResult, LatencyResult, LinkParams
from fabricprobe.probes.responder import Responder

LOOPBACK = "127.0.0.1"


@pytest.fixture
def responder() -> Iterator[Responder]:
    with Responder(LOOPBACK, 0, idle_timeout=5, grace=0.5, sessions=tcp.SESSIONS, auth=None) as r:
        yield r


def start_serve(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[bytes], int, Path]:
    """`probe serve` on a free loopback port in a subprocess; returns (process, port, log)."""
    log = tmp_path / f"serve-{time.monotonic_ns()}.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            open_serve_argv(f"{LOOPBACK}:0", *args),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        m = re.search(rf"listening on {LOOPBACK}:(\d+)", log.read_text())
        if m:
            return proc, int(m.group(1)), log
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise AssertionError(f"probe serve did not start: {log.read_text()}")


def wait_idle(r: Responder, limit: float = 5.0) -> None:
    end = time.monotonic() + limit
    while r.active_sessions() and time.monotonic() < end:
        time.sleep(0.01)
    assert r.active_sessions() == 0


# --------------------------------------------------------------------------- ping-pong


@pytest.mark.parametrize("size", [1, 64, 1500, 65536, tcp.MAX_SIZE])
def test_pingpong_counts(responder: Responder, size: int) -> None:
    iters = 20 if size >= 65536 else 300
    res = tcp.run_pingpong(
        LinkParams(*responder.address, step_s=5), size=size, iters=iters, warmup=5
    )
    s = res.summary
    assert res.error is None
    assert s.kind == "rtt" and s.count == iters and s.lost == 0
    assert s.min_us is not None and s.p50_us is not None and s.max_us is not None
    assert 0 < s.min_us <= s.p50_us <= s.max_us
    assert res.one_way().kind == "one_way" and res.one_way().p50_us == round(s.p50_us / 2, 3)
    assert res.timer_overhead_ns > 0 and res.loop_overhead_ns >= res.timer_overhead_ns
    assert res.sketch.count == iters and res.source == LOOPBACK
    d = res.as_dict()
    assert d["rtt"]["kind"] == "rtt" and d["one_way"]["derived_from"] == "rtt/2"


def test_pingpong_progress_reports_every_step(responder: Responder) -> None:
    seen: list[tuple[int, int]] = []
    tcp.run_pingpong(
        LinkParams(*responder.address),
        iters=250,
        warmup=0,
        progress=lambda d, t: seen.append((d, t)),
    )
    assert seen[-1] == (250, 250) and all(t == 250 for _, t in seen)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def corrupt_echo(session: Session) -> dict[str, object]:
    """A responder that echoes 10 messages faithfully, then flips a byte."""
    size = session.params["size"]
    lsock = tcp.data_listener(session)
    token = "ab" * tcp.TOKEN_BYTES
    session.ready({"data_port": lsock.getsockname()[1], "token": token})
    (conn,) = tcp.accept_streams(session, lsock, bytes.fromhex(token), 1, 5.0)
    for i in range(1000):
        data = conn.recv(size, socket.MSG_WAITALL)
        if not data:
            break
        if i == 10:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        conn.sendall(data)
    return {}


def test_payload_is_verified() -> None:
    reg = {"tcp_lat": corrupt_echo}
    with Responder(LOOPBACK, 0, idle_timeout=2, grace=0.1, sessions=reg, auth=None) as r:
        res = tcp.run_pingpong(LinkParams(*r.address), size=32, iters=50, warmup=0)
    assert res.error == "echo payload did not match what was sent"
    # the mismatching exchange and everything after it are counted as lost
    assert res.summary.count == 10 and res.summary.lost == 40


def test_bad_params_are_refused(responder: Responder) -> None:
    with ControlClient(*responder.address) as c, pytest.raises(PeerError, match=r"params\.size"):
        c.open("tcp_lat", {"size": tcp.MAX_SIZE + 1})
    with pytest.raises(ValueError, match="size"):
        tcp.run_pingpong(LinkParams(*responder.address), size=0)


def test_refused_port_is_a_peer_error() -> None:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        port = s.getsockname()[1]
    with pytest.raises(PeerError, match="cannot connect"):
        tcp.run_pingpong(LinkParams(LOOPBACK, port), iters=10)


def test_stray_data_connection_cannot_join(responder: Responder) -> None:
    """A connection with the wrong token is dropped; the real prober still gets in."""
    with ControlClient(*responder.address) as c:
        info = c.open("tcp_lat", {"size": 8})
        with socket.create_connection((LOOPBACK, info["data_port"]), timeout=2) as stray:
            stray.sendall(b"\x00" * tcp.TOKEN_BYTES)
            stray.settimeout(2)
            assert stray.recv(1) == b""  # closed by the responder
        data = tcp.open_data_connection(c, info, 2.0)
        with data:
            data.sendall(b"12345678")
            assert data.recv(8, socket.MSG_WAITALL) == b"12345678"
        assert c.done() == {"echoed": 1}


# --------------------------------------------------------------------------- vanished peers


def run_in_thread(
    fn: Callable[..., object], **kwargs: object
) -> tuple[threading.Thread, list[object]]:
    """Start FN in a thread; return once it is measuring (its progress callback fired)."""
    out: list[object] = []
    measuring = threading.Event()
    kwargs["progress"] = lambda done, total: measuring.set()
    t = threading.Thread(target=lambda: out.append(fn(**kwargs)), daemon=True)
    t.start()
    assert measuring.wait(20), "the run never started measuring"
    return t, out


def test_killed_responder_gives_a_result_with_loss(tmp_path: Path) -> None:
    proc, port, _ = start_serve(tmp_path)
    try:
        iters = 10_000_000
        t, out = run_in_thread(
            tcp.run_pingpong,
            link=LinkParams(LOOPBACK, port, step_s=1.0),
            iters=iters,
            warmup=10,
        )
        proc.kill()
        t.join(10)
        assert not t.is_alive(), "the run hung after the responder died"
    finally:
        proc.kill()
        proc.wait()
    (res,) = out
    assert isinstance(res, LatencyResult)
    s = res.summary
    assert 0 < s.count < iters and s.count + s.lost == iters
    assert res.error is not None and ("closed" in res.error or "failed" in res.error)


def test_frozen_responder_ends_by_deadline(tmp_path: Path) -> None:
    proc, port, _ = start_serve(tmp_path)
    try:
        t, out = run_in_thread(
            tcp.run_pingpong,
            link=LinkParams(LOOPBACK, port, step_s=0.5),
            iters=10_000_000,
            warmup=10,
        )
        proc.send_signal(signal.SIGSTOP)
        t0 = time.monotonic()
        t.join(10)
        assert not t.is_alive(), "the run hung on a silent responder"
        assert time.monotonic() - t0 < 6.0  # 0.5 s deadline, generous for a loaded CI host
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait()
    (res,) = out
    assert isinstance(res, LatencyResult)
    assert res.summary.count > 0 and res.summary.lost > 0
    assert res.error == "peer did not answer within 0.5 s"


def test_frozen_responder_during_throughput(tmp_path: Path) -> None:
    proc, port, _ = start_serve(tmp_path)
    try:
        t, out = run_in_thread(
            tcp.run_throughput,
            link=LinkParams(LOOPBACK, port, step_s=0.5),
            duration=30.0,
            streams=2,
        )
        proc.send_signal(signal.SIGSTOP)
        t.join(10)
        assert not t.is_alive(), "the throughput run hung on a silent responder"
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait()
    (res,) = out
    assert isinstance(res, BandwidthResult)
    assert res.error is not None and res.bytes_sent > 0 and res.bytes <= res.bytes_sent


def test_responder_stop_mid_run() -> None:
    r = Responder(LOOPBACK, 0, idle_timeout=5, grace=0.0, sessions=tcp.SESSIONS, auth=None)
    r.__enter__()
    t, out = run_in_thread(
        tcp.run_pingpong, link=LinkParams(*r.address, step_s=1.0), iters=10_000_000
    )
    r.__exit__(None, None, None)
    t.join(10)
    assert not t.is_alive()
    (res,) = out
    assert isinstance(res, LatencyResult)
    assert res.error is not None and res.summary.lost > 0


# --------------------------------------------------------------------------- throughput


@pytest.mark.parametrize("streams", [1, 3])
def test_throughput_by_duration(responder: Responder, streams: int) -> None:
    res = tcp.run_throughput(LinkParams(*responder.address), duration=0.3, streams=streams)
    assert res.error is None and res.streams == streams
    assert res.bytes > 0 and res.bytes == res.bytes_sent
    assert res.bytes_per_second > 0 and 0.25 < res.duration_s < 5.0
    assert res.as_dict()["bytes_per_second"] > 0


def test_throughput_by_byte_count(responder: Responder) -> None:
    res = tcp.run_throughput(
        LinkParams(*responder.address),
        duration=None,
        total_bytes=5_000_003,
        streams=4,
        chunk_size=4096,
    )
    assert res.error is None and res.bytes == 5_000_003 == res.bytes_sent


def test_throughput_argument_checks() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        tcp.run_throughput(LinkParams(LOOPBACK), duration=1.0, total_bytes=10)
    with pytest.raises(ValueError, match="streams"):
        tcp.run_throughput(LinkParams(LOOPBACK), streams=0)


# --------------------------------------------------------------------------- resources


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_no_fd_leak_over_many_runs(responder: Responder) -> None:
    host, port = responder.address
    tcp.run_pingpong(
        LinkParams(host, port), iters=5, warmup=0
    )  # imports and lazy state settle first
    wait_idle(responder)
    before = open_fds()
    for _ in range(30):
        tcp.run_pingpong(LinkParams(host, port), iters=20, warmup=2)
    for _ in range(5):
        tcp.run_throughput(LinkParams(host, port), duration=0.05, streams=2)
    for _ in range(5):
        with pytest.raises(PeerError):
            tcp.run_pingpong(LinkParams(host, 1), iters=5)
        with ControlClient(host, port) as c, pytest.raises(PeerError):
            c.open("tcp_lat", {"size": 0})
    wait_idle(responder)
    assert open_fds() == before


# --------------------------------------------------------------------------- figures


def test_timer_overhead_is_measured() -> None:
    o = tcp.measure_timer_overhead(2000)
    assert 0 < o.pair_ns < 100_000 and o.pair_ns <= o.loop_ns


def test_one_way_and_bypass_ratio() -> None:
    rtt = LatencySketch("rtt")
    for v in (10_000, 20_000, 30_000):
        rtt.record(v)
    s = rtt.summary()
    ow = one_way_from_rtt(s)
    assert s.p50_us is not None and s.max_us is not None
    assert ow.kind == "one_way" and ow.count == 3 and ow.max_us == s.max_us / 2
    assert ow.p50_us == pytest.approx(s.p50_us / 2, abs=0.001)
    fast = LatencySketch("rtt")
    fast.record(5_000)
    assert tcp.kernel_bypass_ratio(s, fast.summary()) == pytest.approx(s.p50_us / 5.0)
    with pytest.raises(ValueError, match="cannot compare"):
        tcp.kernel_bypass_ratio(s, ow)
    with pytest.raises(ValueError):
        one_way_from_rtt(ow)


def test_bind_picks_the_source_address(responder: Responder) -> None:
    """Every 127/8 address is local on Linux: a stand-in for one host's lane address."""
    res = tcp.run_pingpong(LinkParams(*responder.address, bind="127.0.0.2"), iters=20, warmup=0)
    assert res.error is None and res.source == "127.0.0.2"
    bw = tcp.run_throughput(
        LinkParams(*responder.address, bind="127.0.0.2"), duration=0.05, streams=2
    )
    assert bw.error is None and bw.source == "127.0.0.2"
    with pytest.raises(PeerError, match=r"from 192\.0\.2\.1"):
        tcp.run_pingpong(LinkParams(*responder.address, bind="192.0.2.1"), iters=5)  # not ours
