"""`probe validate --fleet`: the collector's view of every host's checks, and drift."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.table import Table

from fabricprobe.cli.options import CollectorCredentials


def fleet_query(
    collector: str,
    host: str,
    include_waived: bool,
    timeout: float,
    creds: CollectorCredentials,
) -> dict[str, Any]:
    """The Drift reply as plain data (raises grpc.RpcError, ValueError)."""
    from google.protobuf.json_format import MessageToDict

    from fabricprobe.core.api import fabricprobe_pb2 as pb

    request = pb.DriftRequest(host=host, include_waived=include_waived)
    reply = creds.call(collector, "Drift", request, timeout)
    data = MessageToDict(
        reply, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    for row in data.get("hosts", []):
        row["taken_unix_ns"] = int(row.get("taken_unix_ns", 0))
    return data


def _age(ns: int, now: float) -> str:
    if not ns:
        return "-"
    s = max(0.0, now - ns / 1e9)
    return f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.0f} min"


def render_fleet(data: dict[str, Any], console: Console) -> int:
    """Print the drift table and the per-host summary; the exit status (1 on drift or a
    FAIL that is not waived)."""
    now = datetime.now(UTC).timestamp()
    drift = data.get("drift", [])
    t = Table(title="Hosts that differ from their group (the value most of the group holds)")
    for c in ("host", "group", "check", "value", "group's value", "agree", "ports", "waived"):
        t.add_column(c, overflow="fold")
    for r in drift:
        t.add_row(
            r["host"],
            f"{r['group_by']}={r['group']}",
            r["check"],
            r["value"],
            r["peers_value"],
            f"{r['peers_agree']}/{r['group_size']}",
            r.get("ports") or "-",
            r.get("waiver") or "-" if r.get("waived") else "no",
        )
    hosts = data.get("hosts", [])
    h = Table(title="Each host's newest checks")
    for c in ("host", "topology", "role", "checked", "PASS", "WARN", "FAIL", "SKIP", "failing"):
        h.add_column(c, overflow="fold")
    for r in hosts:
        by = r.get("by_status", {})
        h.add_row(
            r["host"],
            r.get("topology") or "-",
            r.get("role") or "-",
            _age(r["taken_unix_ns"], now) + " ago",
            *(str(by.get(s, 0)) for s in ("PASS", "WARN", "FAIL", "SKIP")),
            ", ".join(r.get("failing", [])) or "-",
        )
    if drift:
        console.print(t)
    else:
        console.print("No host differs from its group.", style="green")
    console.print(h)
    missing = int(data.get("hosts_without_checks", 0))
    if missing:
        console.print(f"{missing} registered host(s) have sent no checks yet", style="yellow")
    return fleet_exit(data)


def fleet_exit(data: dict[str, Any]) -> int:
    """1 when a host differs from its group without a waiver or fails a check, else 0."""
    bad = [r for r in data.get("drift", []) if not r.get("waived")]
    failing = [r for r in data.get("hosts", []) if r.get("failing")]
    return 1 if bad or failing else 0
