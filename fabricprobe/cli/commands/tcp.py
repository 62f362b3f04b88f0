"""`probe tcp`: the TCP baseline (ping-pong RTT or throughput) against `probe serve`."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from fabricprobe.cli.options import (
    Peer,
    SizeParam,
    fail,
    peer_options,
    print_json,
    probe_command,
    timeout_option,
    unset_option,
)
from fabricprobe.cli.render import latency_table, loss_line, progress_bar
from fabricprobe.core.errors import PeerError
from fabricprobe.core.hostport import format_hostport
from fabricprobe.probes import tcp as tcp_lib
from fabricprobe.probes.measure import BandwidthResult, LatencyResult

DEFAULT_ITERS = 10_000
DEFAULT_WARMUP = 100
DEFAULT_DURATION = 5.0
PROGRESS_MIN_ITERS = 2_000  # shorter runs finish before a bar would be any use
R = TypeVar("R", LatencyResult, BandwidthResult)


@probe_command(
    """\b
Examples:
  probe tcp 10.0.0.2                          # 10,000 ping-pongs of 64 B, RTT table
  probe tcp 10.0.0.2:4793 --size 4K --iters 100000 --bind 10.0.0.1
  probe tcp 10.0.0.2 --bw --duration 10 --streams 4
  probe tcp 10.0.0.2 --json | jq .rtt.p99_us"""
)
@unset_option(
    "--size",
    SizeParam(tcp_lib.MIN_SIZE, tcp_lib.MAX_CHUNK),
    "Message size: 1 B..1 MiB for RTT (default 64); send size for --bw (default 128K).",
)
@unset_option(
    "--iters", click.IntRange(1, 100_000_000), f"Measured ping-pongs (default {DEFAULT_ITERS:,})."
)
@unset_option(
    "--warmup",
    click.IntRange(0, 1_000_000),
    f"Unrecorded ping-pongs first (default {DEFAULT_WARMUP}).",
)
@click.option("--bw", is_flag=True, help="Measure throughput instead of RTT.")
@unset_option(
    "--duration",
    click.FloatRange(0.01, 3600),
    f"--bw: seconds to send (default {DEFAULT_DURATION:g}).",
)
@unset_option(
    "--bytes",
    SizeParam(1, 1 << 40),
    "--bw: send this many bytes instead of for a duration.",
    dest="total_bytes",
)
@unset_option(
    "--streams",
    click.IntRange(1, tcp_lib.MAX_STREAMS),
    "--bw: parallel connections (default 1).",
)
@peer_options(timeout_option(2.0))
def tcp(
    to: Peer,
    size: int | None,
    iters: int | None,
    warmup: int | None,
    bw: bool,
    duration: float | None,
    total_bytes: int | None,
    streams: int | None,
    as_json: bool,
) -> None:
    """TCP baseline against PEER running `probe serve`: ping-pong RTT, or --bw throughput.

    Latency figures are round-trip times (RTT); the one-way column is RTT/2, an
    estimate that assumes a symmetric path.
    """
    _check_args(bw, size, iters, warmup, duration, total_bytes, streams)
    _check_addresses(to.host, to.port, to.bind)
    link = to.tcp_link()
    if bw:
        if total_bytes is None and duration is None:
            duration = DEFAULT_DURATION
        unit = "bytes" if total_bytes else "ms"
        _run(
            progress_bar(not as_json, "TCP throughput", unit),
            lambda progress: tcp_lib.run_throughput(
                link,
                duration=duration,
                total_bytes=total_bytes,
                streams=streams or 1,
                chunk_size=size or tcp_lib.DEFAULT_CHUNK,
                progress=progress,
            ),
            _print_throughput,
            as_json,
        )
        return
    n = iters or DEFAULT_ITERS
    _run(
        progress_bar(not as_json and n >= PROGRESS_MIN_ITERS, "TCP ping-pong", "iterations"),
        lambda progress: tcp_lib.run_pingpong(
            link,
            size=size or 64,
            iters=n,
            warmup=DEFAULT_WARMUP if warmup is None else warmup,
            progress=progress,
        ),
        _print_latency,
        as_json,
    )


def _run(
    bar: AbstractContextManager[Any],
    measure: Callable[[Any], R],
    show: Callable[[R], None],
    as_json: bool,
) -> None:
    """MEASURE under the progress BAR, then SHOW the result (or print its JSON); a peer
    that fails the run exits 1, as does a run that ended early (once it is shown)."""
    with bar as progress:
        try:
            res = measure(progress)
        except PeerError as e:
            fail(str(e), 1)
    if as_json:
        print_json(res.as_dict())
    else:
        show(res)
    if res.error:
        fail(f"run ended early: {res.error}", 1)


def _check_args(
    bw: bool,
    size: int | None,
    iters: int | None,
    warmup: int | None,
    duration: float | None,
    total_bytes: int | None,
    streams: int | None,
) -> None:
    """Reject option combinations that do not fit the chosen mode (exit 2)."""
    if bw:
        if iters is not None or warmup is not None:
            fail("--iters and --warmup are for RTT runs, not --bw")
        if duration is not None and total_bytes is not None:
            fail("give --duration or --bytes, not both")
        return
    for name, value in (("--duration", duration), ("--bytes", total_bytes), ("--streams", streams)):
        if value is not None:
            fail(f"{name} needs --bw")
    if size is not None and size > tcp_lib.MAX_SIZE:
        fail(f"--size {size} is over the ping-pong limit of {tcp_lib.MAX_SIZE} bytes (1 MiB)")


def _check_addresses(host: str, port: int, bind: str | None) -> None:
    if bind is not None:
        try:
            ipaddress.ip_address(bind)
        except ValueError:
            fail(f"--bind {bind!r} is not an IP address")
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        fail(f"cannot resolve peer {host!r}: {e.strerror}")


def _headline(what: str, res: LatencyResult | BandwidthResult, detail: str) -> Console:
    """A console for RES, its first line printed: what ran, towards whom, from where."""
    console = Console()
    where = f"{format_hostport(res.peer, res.port)} from {res.source}"
    console.print(f"TCP {what} to {where}: {detail}", highlight=False)
    return console


def _print_latency(res: LatencyResult) -> None:
    console = _headline(
        "ping-pong",
        res,
        f"{res.size:,} B messages, {res.iters:,} measured (+{res.warmup:,} warm-up)",
    )
    console.print(latency_table({"tcp": res.summary}))
    console.print(loss_line("tcp", res.summary), highlight=False)
    console.print(
        f"timer overhead: {res.timer_overhead_ns} ns per clock pair, "
        f"{res.loop_overhead_ns} ns per loop iteration (inside every RTT)",
        highlight=False,
    )
    console.print(f"loop: {res.engine_reason}", highlight=False)


def _print_throughput(res: BandwidthResult) -> None:
    console = _headline("throughput", res, f"{res.streams} stream(s), {res.chunk_size:,} B sends")
    table = Table()
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_row("bytes confirmed by peer", f"{res.bytes:,}")
    table.add_row("bytes sent", f"{res.bytes_sent:,}")
    table.add_row("duration (s)", f"{res.duration_s:.3f}")
    table.add_row("throughput (Gbit/s)", f"{res.bytes_per_second * 8 / 1e9:.3f}")
    table.add_row("throughput (MiB/s)", f"{res.bytes_per_second / (1 << 20):,.1f}")
    console.print(table)
