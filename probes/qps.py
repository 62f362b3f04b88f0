"""The live queue pairs on this host's RDMA devices, as the kernel's resource tracking
lists them (`rdma -j resource show qp`, iproute2, over netlink): each connected QP's
number, its peer's QP number, its PSNs and the task that made it.

A connected QP's UDP source port follows from its two QP numbers by its driver's rule
(probes/sport.py), so a KV transfer's 5-tuple, and with a trace its links, can be known
from this list alone. The agent reads it on its own devices only, bounded in size, and
never fails a window over it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from fabricprobe.core.errors import ParseError, ProbeError
from fabricprobe.probes.ethtool import Runner, run_command, run_tool

RDMA_TIMEOUT = 5.0
MAX_TEXT = 8 << 20  # bytes of tool output read at most
MAX_QPS = 4096  # QPs kept from one listing (an engine host has hundreds)
CONNECTED = ("RC", "UC", "XRC_INI", "XRC_TGT", "DRIVER")
QPN_MAX = 0xFFFFFF
PSN_MAX = 0xFFFFFF
COMM_MAX = 64


@dataclass(frozen=True)
class LiveQp:
    device: str
    port: int
    lqpn: int
    rqpn: int  # 0 for a QP with no connected peer (UD, GSI)
    type: str
    state: str
    sq_psn: int  # the next PSN it sends
    rq_psn: int  # the next PSN it expects
    pid: int  # the task (thread) that made it; 0 for the kernel's
    comm: str

    @property
    def connected(self) -> bool:
        return self.type in CONNECTED and self.rqpn > 0


def _int(rec: dict[str, Any], key: str, top: int, default: int | None = None) -> int:
    v = rec.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= top:
        raise ParseError(f"{key}: {v!r} is not an integer in 0..{top}")
    return v


def _str(rec: dict[str, Any], key: str, most: int, default: str | None = None) -> str:
    v = rec.get(key, default)
    if not isinstance(v, str) or len(v) > most or not v.isprintable():
        raise ParseError(f"{key}: {str(v)[:40]!r} is not a short printable string")
    return v


def parse_qp(rec: Any) -> LiveQp:
    """One record of the listing; ParseError says what is wrong with it."""
    if not isinstance(rec, dict):
        raise ParseError("a QP record is not an object")
    return LiveQp(
        device=_str(rec, "ifname", 64),
        port=_int(rec, "port", 255, 0),
        lqpn=_int(rec, "lqpn", QPN_MAX),
        rqpn=_int(rec, "rqpn", QPN_MAX, 0),
        type=_str(rec, "type", 16),
        state=_str(rec, "state", 16, ""),
        sq_psn=_int(rec, "sq-psn", PSN_MAX, 0),
        rq_psn=_int(rec, "rq-psn", PSN_MAX, 0),
        pid=_int(rec, "pid", 2**22, 0),
        comm=_str(rec, "comm", COMM_MAX, ""),
    )


@dataclass(frozen=True)
class QpListing:
    qps: tuple[LiveQp, ...]
    refused: int  # records that were not QPs as the tool prints them
    dropped: int  # QPs past MAX_QPS


def parse_qps(text: str, devices: Collection[str] | None = None) -> QpListing:
    """The QPs of `rdma -j resource show qp`'s TEXT on DEVICES (all when None): a record
    that is not a QP is refused and counted, the rest kept, MAX_QPS at most."""
    if len(text) > MAX_TEXT:
        raise ParseError(f"the QP listing is over {MAX_TEXT} bytes")
    try:
        doc = json.loads(text) if text.strip() else []
    except (ValueError, RecursionError) as e:
        raise ParseError(f"the QP listing is not JSON: {e}") from e
    if not isinstance(doc, list):
        raise ParseError("the QP listing is not a JSON array")
    out: list[LiveQp] = []
    refused = dropped = 0
    for rec in doc:
        try:
            qp = parse_qp(rec)
        except ParseError:
            refused += 1
            continue
        if devices is not None and qp.device not in devices:
            continue
        if len(out) >= MAX_QPS:
            dropped += 1
            continue
        out.append(qp)
    return QpListing(tuple(out), refused, dropped)


def read_qps(
    devices: Collection[str] | None = None,
    runner: Runner = run_command,
    timeout: float = RDMA_TIMEOUT,
) -> QpListing:
    """The live QPs on DEVICES, from `rdma -j resource show qp`. ToolMissing without
    iproute2's rdma; ProbeError when it fails (no RDMA netlink, not allowed, too slow)."""
    res = run_tool(["rdma", "-j", "resource", "show", "qp"], runner, timeout, "iproute2")
    if res.returncode != 0:
        why = (res.stderr or res.stdout).strip()[:200] or "no output"
        raise ProbeError(f"`rdma resource show qp` failed (exit {res.returncode}): {why}")
    try:
        return parse_qps(res.stdout, devices)
    except ParseError as e:
        raise ProbeError(f"`rdma resource show qp`: {e}") from e


def own_task(pid: int) -> bool:
    """Whether task PID is a thread of this process (the agent's own probes' QPs)."""
    return pid > 0 and os.path.exists(f"/proc/self/task/{pid}")


def psn_gap(a: int, b: int) -> int:
    """How far apart two 24-bit PSNs are, either way round."""
    d = (a - b) & PSN_MAX
    return min(d, (PSN_MAX + 1) - d)
