"""Known delay or loss on one path (source netdev -> destination address) with tc netem.

A `prio` qdisc on the source netdev gets one extra band holding netem; a u32 filter sends
only packets for the destination address into that band, so every other path through
the same netdev is untouched. Used by the demo and by ground-truth tests in the VM lane
(needs root and the sch_prio, sch_netem and cls_u32 modules).
"""

from __future__ import annotations

import ipaddress
import re
import subprocess
from collections.abc import Sequence

from fabricprobe.core.errors import ProbeError

_BAND = "1:4"
_HANDLE = "40:"
_TIME = re.compile(r"^\d+(\.\d+)?(us|ms|s)$")
_PERCENT = re.compile(r"^\d+(\.\d+)?%$")


class NetemError(ProbeError):
    """tc refused a change; the message carries tc's own words."""


def _tc(args: Sequence[str]) -> None:
    res = subprocess.run(["tc", *args], capture_output=True, text=True, timeout=10, check=False)
    if res.returncode != 0:
        raise NetemError(f"tc {' '.join(args)}: {res.stderr.strip() or res.returncode}")


ROCE_V2_PORT = 4791  # the UDP port RoCE v2 packets go to


def impair(
    netdev: str,
    dst: str,
    delay: str | None = None,
    loss: str | None = None,
    *,
    udp_dport: int | None = None,
) -> None:
    """Delay (e.g. `2ms`) and/or drop (e.g. `1%`) packets leaving NETDEV for DST only;
    with UDP_DPORT, only UDP packets to that port (ROCE_V2_PORT: RDMA, not TCP)."""
    ipaddress.IPv4Address(dst)
    if udp_dport is not None and not 1 <= udp_dport <= 65535:
        raise ValueError(f"UDP port {udp_dport} outside 1..65535")
    if delay is None and loss is None:
        raise ValueError("give a delay, a loss or both")
    if delay is not None and not _TIME.match(delay):
        raise ValueError(f"delay {delay!r}: expected a number with us, ms or s")
    if loss is not None and not _PERCENT.match(loss):
        raise ValueError(f"loss {loss!r}: expected a percentage like 1%")
    clear(netdev)
    # bands 1:1..1:3 keep the default priority map; band 1:4 is only reached by the filter
    _tc(
        [
            "qdisc",
            "add",
            "dev",
            netdev,
            "root",
            "handle",
            "1:",
            "prio",
            "bands",
            "4",
            "priomap",
            *["1"] * 16,
        ]
    )
    spec = (["delay", delay] if delay else []) + (["loss", loss] if loss else [])
    _tc(["qdisc", "add", "dev", netdev, "parent", _BAND, "handle", _HANDLE, "netem", *spec])
    _tc(
        [
            "filter",
            "add",
            "dev",
            netdev,
            "parent",
            "1:",
            "protocol",
            "ip",
            "prio",
            "1",
            "u32",
            "match",
            "ip",
            "dst",
            f"{dst}/32",
            *(
                []
                if udp_dport is None
                else [
                    "match",
                    "ip",
                    "protocol",
                    "17",
                    "0xff",
                    "match",
                    "ip",
                    "dport",
                    str(udp_dport),
                    "0xffff",
                ]
            ),
            "flowid",
            _BAND,
        ]
    )


def clear(netdev: str) -> None:
    """Remove any root qdisc from NETDEV (no error when there is none)."""
    subprocess.run(
        ["tc", "qdisc", "del", "dev", netdev, "root"], capture_output=True, timeout=10, check=False
    )
