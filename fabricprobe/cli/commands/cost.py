"""`probe cost`: the fabric's price of a KV transfer between two hosts, now."""

from __future__ import annotations

from typing import Any

import click

from fabricprobe.cli.options import (
    CollectorCredentials,
    OneLineCommand,
    ask_collector,
    collector_credential_options,
    collector_option,
    fail,
    print_json,
    shown_option,
)

EXIT_UNKNOWN = 3  # the collector answered: no fresh figures for that path (reason given)
MAX_BYTES = 1 << 40


def query(
    collector: str,
    src: str,
    dst: str,
    nbytes: int,
    timeout: float,
    creds: CollectorCredentials,
) -> dict[str, Any]:
    """Ask the collector's Query service for the price (KvCost) as plain data."""
    from fabricprobe.core.api import fabricprobe_pb2 as pb
    from fabricprobe.workload.price import KvCost

    request = pb.KvCostRequest(src=src, dst=dst, bytes=nbytes)
    return KvCost.from_reply(creds.call(collector, "KvCost", request, timeout)).as_dict()


def _text(c: dict[str, Any]) -> str:
    if not c.get("known"):
        return f"{c['src']}->{c['dst']} {c['bytes']:,} B: unknown: {c.get('reason', '')}"
    return (
        f"{c['src']}->{c['dst']} {c['bytes']:,} B over {c.get('transport', '')}: "
        f"p50 {c['p50_s'] * 1e3:,.3f} ms, p99 {c['p99_s'] * 1e3:,.3f} ms "
        f"({c['rtts']} RTTs of p50 {c['rtt_p50_s'] * 1e6:,.0f} µs / p99 "
        f"{c['rtt_p99_s'] * 1e6:,.0f} µs, {c['bandwidth_bytes_per_s'] / 1e9:,.2f} GB/s, "
        f"loss {c['loss_ratio']:.2%}; figures {c['age_s']:.1f} s old)"
    )


@click.command(
    cls=OneLineCommand,
    epilog="""\b
Examples:
  probe cost --insecure --src gpu-node-2 --dst gpu-node-3 --bytes 524288
  probe cost --collector 10.0.0.9:4794 --ca-file ca.pem --token-file reader.token \\
      --src gpu-node-2 --dst gpu-node-3 --bytes 134217728 --json

\b
Exit status: 0 with a price, 3 when the path has no fresh figures (the reason is
printed), 1 when the collector cannot be asked, 2 on bad usage.""",
)
@collector_option()
@click.option("--src", required=True, help="Prefill host (an agent's name).")
@click.option("--dst", required=True, help="Decode host.")
@click.option("--bytes", "nbytes", type=click.IntRange(1, MAX_BYTES), required=True)
@shown_option("--timeout", click.FloatRange(0.01, 60), 5.0)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@collector_credential_options("File holding a reader token.")
def cost(
    collector: str,
    src: str,
    dst: str,
    nbytes: int,
    timeout: float,
    as_json: bool,
    **cred: Any,
) -> None:
    """The predicted time to move --bytes of KV cache from --src to --dst on the fabric
    now: p50 and p99, from the path's newest RTT, bandwidth and loss figures, and how old
    they are. Only the fabric is priced (the protocol's round trips, the bytes at the
    path's bandwidth, retransmits for its loss), not the engines' wait around it. A path
    with no fresh figures is "unknown", with the reason, never a guess."""
    creds = CollectorCredentials.given(cred)
    if src == dst:
        fail("--src and --dst are the same host")
    got = ask_collector(
        collector,
        lambda: query(collector, src, dst, nbytes, timeout, creds),
        usage=("INVALID_ARGUMENT",),
    )
    if as_json:
        print_json(got)
    else:
        click.echo(_text(got))
    if not got.get("known"):
        raise SystemExit(EXIT_UNKNOWN)
