"""One UD round in a session of its own, as the RDMA tests run it (the agent and the CLI
keep a UdLink across rounds instead)."""

from __future__ import annotations

from fabricprobe.probes.measure import LatencyResult, LinkParams
from fabricprobe.probes.rdma.ud import UdLink


def ud_probe(link: LinkParams, *, probes: int = 200, interval_s: float = 0.0) -> LatencyResult:
    """PROBES UD probes (at most one per INTERVAL_S) in one session; network RTT. Each
    probe waits LINK's step_s (default 0.5 s) for its ACKs."""
    with UdLink(link) as kept:
        return kept.run(probes, interval_s)
