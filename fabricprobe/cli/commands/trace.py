"""`probe trace PEER`: the routed hops of RoCEv2 traffic to a peer, one line per UDP
source port (ECMP class). probes/trace.py says how the probes go and what a hop's RTT
holds."""

from __future__ import annotations

import click

from fabricprobe.cli.options import (
    OneLineCommand,
    bind_option,
    fail,
    json_option,
    print_json,
    shown_option,
    sysfs_option,
)
from fabricprobe.core.errors import ProbeError
from fabricprobe.probes.measure import source_address
from fabricprobe.probes.trace import (
    MAX_CLASSES,
    MAX_HOPS,
    ROCE_V2_PORT,
    TraceConfig,
    TraceResult,
    check_addresses,
    spread_sports,
    trace_udp,
)


@click.command(
    cls=OneLineCommand,
    epilog="""\b
Examples:
  probe trace 192.0.2.3                       # 4 classes: a line of hops each
  probe trace 192.0.2.3 --bind 192.0.2.1 --sports 16
  probe trace 192.0.2.3 --method udp --json   # no privilege needed""",
)
@click.argument("peer")
@bind_option
@shown_option(
    "--sports",
    click.IntRange(1, MAX_CLASSES),
    4,
    "How many ECMP classes (UDP source ports) to trace.",
    dest="classes",
)
@shown_option(
    "--method",
    click.Choice(["auto", "ud", "udp"]),
    "auto",
    "ud: hop-limited UD probes through the RDMA device (needs CAP_NET_RAW); udp: UDP probes "
    "on the same 5-tuple (no privilege); auto: ud where it can be had.",
)
@shown_option("--max-hops", click.IntRange(1, MAX_HOPS), 8, "Highest TTL.")
@shown_option(
    "--timeout", click.FloatRange(0.01, 10), 0.3, "Seconds to wait for each hop's answer."
)
@sysfs_option
@json_option
def trace(
    peer: str,
    bind: str | None,
    classes: int,
    method: str,
    max_hops: int,
    timeout: float,
    sysfs_root: str,
    as_json: bool,
) -> None:
    """The routed hops of RoCEv2 traffic to PEER (an IPv4 address), one line per UDP
    source port (ECMP class): each router's address on the way, and the time its
    answer took (host-bound: a router answers on its slow path)."""
    try:
        check_addresses(bind or "0.0.0.0", peer)
        config = TraceConfig(max_hops=max_hops, timeout_s=timeout)
        source = source_address(peer, ROCE_V2_PORT, bind)
        result = _run(source, peer, classes, config, method, sysfs_root)
    except ValueError as e:
        fail(str(e))
    except (ProbeError, OSError) as e:
        fail(str(e), 1)
    if as_json:
        print_json(result.to_json())
        return
    click.echo(
        f"trace {result.source} -> {result.peer} udp/4791, {len(result.classes)} classes, "
        f"{result.method} probes ({result.why})"
    )
    for c in result.classes:
        hops = "  ".join(
            f"{h.ttl} {h.address} {h.rtt_s * 1e3:.2f} ms"
            if h.address and h.rtt_s is not None
            else f"{h.ttl} *"
            for h in c.hops
        )
        end = f"  -> {result.peer}" if c.complete else "  (hop limit)"
        click.echo(f"  sport {c.sport:5d}  {hops or 'no routed hop'}{end}")


def _run(
    source: str, peer: str, classes: int, config: TraceConfig, method: str, sysfs_root: str
) -> TraceResult:
    if method == "udp":
        return trace_udp(source, peer, spread_sports(classes), config, "asked for")
    try:
        from fabricprobe.probes.rdma.trace import trace_peer
    except ImportError as e:
        if method == "ud":
            fail(f"UD probes need pyverbs ({e})")
        return trace_udp(source, peer, spread_sports(classes), config, f"no pyverbs ({e})")
    return trace_peer(source, peer, classes, config, method, sysfs_root)
