"""`probe lat` and `probe bw`: RC latency and bandwidth against a peer running `probe serve`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click
from rich.console import Console

from fabricprobe.cli.options import (
    OneLineCommand,
    SizeParam,
    bind_option,
    fail,
    json_option,
    load_token,
    port_option,
    print_json,
    resolve_peer,
    sysfs_option,
    timeout_option,
    token_file_option,
)
from fabricprobe.cli.render import latency_table, loss_line, progress_bar
from fabricprobe.probes import tcp as tcp_lib
from fabricprobe.probes.errors import ProbeError
from fabricprobe.probes.fleet import FleetToken
from fabricprobe.probes.measure import LinkParams

T = TypeVar("T")
SIZE = SizeParam(1, 1 << 20)
device_option = click.option(
    "--device",
    default=None,
    help="RDMA device to use (default: the one owning the source address).",
)
engine_option = click.option(
    "--engine",
    type=click.Choice(["auto", "pyverbs", "native"]),
    default="auto",
    show_default=True,
    help="Hot loop: pyverbs, or the compiled one (native); auto takes native when built.",
)
tcp_option = click.option(
    "--tcp",
    "with_tcp",
    is_flag=True,
    help="Also run the same shape over TCP to the same peer and print the kernel-bypass ratio.",
)


def peer_options(f: Callable[..., None]) -> Callable[..., None]:
    """The options `probe lat` and `probe bw` share, after their own."""
    stack = (
        bind_option,
        device_option,
        engine_option,
        tcp_option,
        timeout_option(None, "30 for the RDMA setup; 2 per exchange, lat; 5, bw"),
        token_file_option,
        json_option,
    )
    f = sysfs_option(f)
    for option in reversed(stack):  # as decorators listed top to bottom would apply
        f = option(f)
    return f


def _measure(call: Callable[[], T]) -> T:
    """CALL's result; a bad argument exits 2, a probe that could not run exits 1."""
    try:
        return call()
    except ValueError as e:
        fail(str(e))
    except ProbeError as e:
        fail(str(e), 1)


def _beside(call: Callable[[], T]) -> T:
    """The TCP run beside the RDMA one; its failure exits 1."""
    try:
        return call()
    except ProbeError as e:
        fail(f"TCP beside RDMA failed: {e}", 1)


def _link(
    host: str,
    port: int,
    bind: str | None,
    device: str | None,
    sysfs_root: str,
    engine: str,
    timeout: float | None,
    token: FleetToken | None,
) -> LinkParams:
    """The peer and how to reach it, from the options; a bad value exits 2. TIMEOUT (None:
    each probe's defaults) bounds the setup and each step alike."""
    try:
        return LinkParams(
            host,
            port,
            bind=bind,
            device=device,
            sysfs_root=sysfs_root,
            engine=engine,
            timeout=timeout,
            step_s=timeout,
            token=token,
        )
    except ValueError as e:
        fail(str(e))


def _rc() -> Any:
    """fabricprobe.probes.rdma.rc imports pyverbs: load it only when an RDMA command runs."""
    try:
        from fabricprobe.probes.rdma import rc
    except ImportError as e:
        fail(f"RDMA probes need pyverbs ({e}); see the README's install section")
    return rc


@click.command(
    cls=OneLineCommand,
    epilog="""\b
Examples:
  probe lat 10.0.0.2                       # SEND/RECV ping-pong, 2 B, 1,000 iterations
  probe lat 10.0.0.2 --op write --size 4K --iters 100000
  probe lat 192.0.2.2 --bind 192.0.2.1 --tcp   # RDMA then TCP, with the bypass ratio
  probe lat 10.0.0.2 --json | jq .rdma.rtt.p99_us""",
)
@click.argument("peer")
@port_option
@click.option(
    "--op",
    type=click.Choice(["send", "write"]),
    default="send",
    show_default=True,
    help="SEND/RECV ping-pong, or RDMA WRITE with memory polling (perftest's write_lat).",
)
@click.option("--size", type=SIZE, default="2", show_default=True, help="Message size, 1 B..1 MiB.")
@click.option("--iters", type=click.IntRange(1, 10_000_000), default=1000, show_default=True)
@click.option("--warmup", type=click.IntRange(0, 1_000_000), default=100, show_default=True)
@peer_options
def lat(
    peer: str,
    port: int | None,
    op: str,
    size: int,
    iters: int,
    warmup: int,
    bind: str | None,
    device: str | None,
    with_tcp: bool,
    timeout: float | None,
    as_json: bool,
    sysfs_root: str,
    engine: str,
    token_file: str | None,
) -> None:
    """RC ping-pong latency to PEER. Figures are RTTs; one-way columns are RTT/2."""
    host, port = resolve_peer(peer, port)
    token = load_token(token_file)
    rc = _rc()
    with progress_bar(not as_json and iters >= 5000, f"RDMA {op} ping-pong", "iterations") as bar:
        res = _measure(
            lambda: rc.rc_latency(
                _link(host, port, bind, device, sysfs_root, engine, timeout, token),
                op=op,
                size=size,
                iters=iters,
                warmup=warmup,
                progress=bar,
            )
        )
    out: dict[str, Any] = {"rdma": res.as_dict()}
    rows = {f"rdma {op}": res.summary}
    errors = [res.error] if res.error else []
    if with_tcp:
        t = _beside(
            lambda: tcp_lib.run_pingpong(
                LinkParams(host, port, bind=bind, timeout=timeout, step_s=timeout, token=token),
                size=size,
                iters=iters,
                warmup=warmup,
            )
        )
        out["tcp"] = t.as_dict()
        rows["tcp"] = t.summary
        ratio = tcp_lib.kernel_bypass_ratio(t.summary, res.summary)
        out["kernel_bypass_ratio"] = ratio
        errors += [t.error] if t.error else []
    if as_json:
        print_json(out)
    else:
        console = Console()
        console.print(
            f"RC {op} ping-pong {res.device} -> {host}:{port} ({res.engine} loop): {size:,} B, "
            f"{iters:,} measured (+{warmup:,} warm-up)",
            highlight=False,
        )
        console.print(f"engine: {res.engine_reason}", highlight=False)
        console.print(latency_table(rows))
        for name, summary in rows.items():
            console.print(loss_line(name, summary), highlight=False)
        console.print(
            f"timing loop cost: {res.loop_overhead_ns:,} ns per iteration "
            "(clock reads + bookkeeping, measured in this process)",
            highlight=False,
        )
        if with_tcp:
            r = out["kernel_bypass_ratio"]
            console.print(
                f"kernel-bypass ratio (TCP p50 RTT / RDMA p50 RTT): "
                f"{'-' if r is None else f'{r:.2f}x'}",
                highlight=False,
            )
    if errors:
        fail("run ended early: " + "; ".join(errors), 1)


@click.command(
    cls=OneLineCommand,
    epilog="""\b
Examples:
  probe bw 10.0.0.2                        # RDMA WRITE, 64 KiB, 16 in flight
  probe bw 10.0.0.2 --op send --size 1M --iters 2000
  probe bw 192.0.2.2 --bind 192.0.2.1 --tcp --json""",
)
@click.argument("peer")
@port_option
@click.option("--op", type=click.Choice(["write", "send"]), default="write", show_default=True)
@click.option(
    "--size", type=SIZE, default="64K", show_default=True, help="Message size, 1 B..1 MiB."
)
@click.option("--iters", type=click.IntRange(1, 10_000_000), default=1000, show_default=True)
@click.option(
    "--outstanding",
    type=click.IntRange(1, 64),
    default=16,
    show_default=True,
    help="Operations in flight.",
)
@peer_options
def bw(
    peer: str,
    port: int | None,
    op: str,
    size: int,
    iters: int,
    outstanding: int,
    bind: str | None,
    device: str | None,
    with_tcp: bool,
    timeout: float | None,
    as_json: bool,
    sysfs_root: str,
    engine: str,
    token_file: str | None,
) -> None:
    """RC bandwidth to PEER: ITERS operations of SIZE bytes, OUTSTANDING in flight."""
    host, port = resolve_peer(peer, port)
    token = load_token(token_file)
    rc = _rc()
    with progress_bar(not as_json and iters >= 2000, f"RDMA {op} bandwidth", "operations") as bar:
        res = _measure(
            lambda: rc.rc_bandwidth(
                _link(host, port, bind, device, sysfs_root, engine, timeout, token),
                op=op,
                size=size,
                iters=iters,
                outstanding=outstanding,
                progress=bar,
            )
        )
    out: dict[str, Any] = {"rdma": res.as_dict()}
    errors = [res.error] if res.error else []
    if with_tcp:
        t = _beside(
            lambda: tcp_lib.run_throughput(
                LinkParams(host, port, bind=bind, timeout=timeout, step_s=timeout, token=token),
                duration=None,
                total_bytes=size * iters,
                chunk_size=size,
            )
        )
        out["tcp"] = t.as_dict()
        out["rdma_to_tcp_ratio"] = (
            res.bytes_per_second / t.bytes_per_second if t.bytes_per_second else None
        )
        errors += [t.error] if t.error else []
    if as_json:
        print_json(out)
    else:
        console = Console()
        console.print(
            f"RC {op} bandwidth {res.device} -> {host}:{port} ({res.engine} loop): {size:,} B x "
            f"{res.completed:,}/{iters:,} in {res.duration_s:.3f} s = "
            f"{res.bytes_per_second / 1e6:,.2f} MB/s "
            f"({res.bytes_per_second * 8 / 1e9:.3f} Gb/s)",
            highlight=False,
        )
        console.print(f"engine: {res.engine_reason}", highlight=False)
        if with_tcp:
            tcp_bps = out["tcp"]["bytes_per_second"]
            r = out["rdma_to_tcp_ratio"]
            console.print(
                f"TCP same bytes: {tcp_bps / 1e6:,.2f} MB/s; RDMA/TCP "
                f"{'-' if r is None else f'{r:.2f}x'}",
                highlight=False,
            )
    if errors:
        fail("run ended early: " + "; ".join(errors), 1)
