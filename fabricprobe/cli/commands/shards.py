"""`probe shards`: the live collector shards in etcd, who owns a host, and a Prometheus
file_sd target list of their /metrics (Prometheus has no etcd discovery of its own)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from fabricprobe.cli.options import OneLineCommand, fail, print_json
from fabricprobe.core.shards import DEFAULT_PREFIX, Etcd, EtcdError, owner_of, parse_endpoints


@click.command(
    cls=OneLineCommand,
    epilog="""\b
Examples:
  probe shards --etcd etcd-1:2379,etcd-2:2379
  probe shards --etcd etcd-1:2379 --host gpu-node-17        # which shard owns it
  probe shards --etcd etcd-1:2379 --file-sd /etc/prometheus/fabricprobe-shards.json
  probe shards --etcd etcd-1:2379 --ca-file etcd-ca.pem --cert-file me.pem --key-file me.key""",
)
@click.option("--etcd", "endpoints", required=True, metavar="HOST:PORT,...", help="etcd endpoints.")
@click.option("--prefix", default=DEFAULT_PREFIX, show_default=True, help="Key prefix in etcd.")
@click.option(
    "--ca-file",
    type=click.Path(exists=True, dir_okay=False),
    help="CA of etcd's certificate: speak https.",
)
@click.option(
    "--cert-file",
    type=click.Path(exists=True, dir_okay=False),
    help="Client certificate for etcd (PEM).",
)
@click.option("--key-file", type=click.Path(exists=True, dir_okay=False), help="Its key (PEM).")
@click.option("--host", "hosts", multiple=True, metavar="NAME", help="Print the shard owning NAME.")
@click.option(
    "--file-sd",
    type=click.Path(dir_okay=False, writable=True),
    help="Write the shards' /metrics as a Prometheus file_sd target file.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def shards(
    endpoints: str,
    prefix: str,
    ca_file: str | None,
    cert_file: str | None,
    key_file: str | None,
    hosts: tuple[str, ...],
    file_sd: str | None,
    as_json: bool,
) -> None:
    """List the collector shards live in etcd."""
    if bool(cert_file) != bool(key_file):
        fail("--cert-file and --key-file go together")
    if cert_file and not ca_file:
        fail("--cert-file needs --ca-file (a client certificate goes over https only)")
    try:
        client = Etcd(
            parse_endpoints(endpoints),
            prefix=prefix,
            ca_file=ca_file or "",
            cert_file=cert_file or "",
            key_file=key_file or "",
        )
        members, bad = client.members(serializable=True)
    except ValueError as e:
        fail(f"--etcd: {e}")
    except EtcdError as e:
        fail(str(e), 1)
    owners = {h: (m.name if (m := owner_of(h, members)) else None) for h in hosts}
    if file_sd:
        targets = [
            {"targets": [m.metrics], "labels": {"shard": m.name}} for m in members if m.metrics
        ]
        path = Path(file_sd)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(targets, indent=2) + "\n")
        os.replace(tmp, path)  # Prometheus never reads half a file
    if as_json:
        print_json(
            {
                "members": [
                    {"name": m.name, "api": m.api, "otlp": m.otlp_target, "metrics": m.metrics}
                    for m in members
                ],
                "unreadable": bad,
                "owners": owners,
            }
        )
        return
    for m in members:
        click.echo(f"{m.name}\tapi {m.api}\totlp {m.otlp_target}\tmetrics {m.metrics or '-'}")
    if bad:
        click.echo(f"({bad} member records could not be read)", err=True)
    for h, name in owners.items():
        click.echo(f"{h}: {name or 'no shard'}")
