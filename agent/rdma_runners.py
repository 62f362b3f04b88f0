"""RDMA probe runners for the agent, registered when pyverbs and the RC probes load.

`rdma_rc_lat` runs an RC SEND/RECV ping-pong burst (fabricprobe.probes.rdma.rc) against the peer's
responder; `rdma_ud` sends COUNT UD probes with two ACKs each (fabricprobe.probes.rdma.ud, the
R-Pingmesh manner) and keeps the network RTT with the responder's delay taken out;
`rdma_rc_bw` streams COUNT RDMA WRITEs of SIZE bytes and reports the bytes completed
(planned, like `tcp_bw`, only on request). The source address picks the local RDMA
device (the one whose RoCE v2 GID maps it), so on a shared machine each host probes
from its own device. Without pyverbs this module registers nothing, and the agent then
advertises TCP probes only.

Latency and UD bursts run over kept links (the agent's ProbeContext.links): the first burst to a
target sets up the verbs resources and the control session on both ends, and later
bursts reuse them.
"""

from __future__ import annotations

import logging
from typing import Any

from fabricprobe.agent.probing import (
    ProbeContext,
    ProbeOutcome,
    ProbeSpec,
    keepalive_for,
    register_runner,
)
from fabricprobe.probes.errors import ProbeError
from fabricprobe.probes.stats import LatencySketch

log = logging.getLogger("fabricprobe.agent")

# QP setup on both ends can take seconds on a loaded or emulated host.
SETUP_TIMEOUT_S = 10.0


def _failed_burst(op: str, count: int, err: Exception) -> ProbeOutcome:
    """A burst that could not run: every exchange in it counts as lost."""
    lost = LatencySketch("rtt")
    lost.record_lost(count)
    return ProbeOutcome("rdma", op, rtt=lost, failed=True, error=str(err))


def _reach(spec: ProbeSpec, ctx: ProbeContext) -> dict[str, Any]:
    """Where and how patiently every RDMA probe of this agent reaches SPEC's peer."""
    return {
        "port": spec.port,
        "bind": ctx.bind,
        "sysfs_root": ctx.sysfs_root,
        "timeout": max(ctx.timeout, SETUP_TIMEOUT_S),
        "step_s": ctx.timeout,
    }


try:
    from fabricprobe.probes.rdma.rc import RcPingLink, rc_bandwidth
    from fabricprobe.probes.rdma.ud import UdLink
except ImportError as e:  # no pyverbs on this host: RDMA probes are not offered
    log.debug("RDMA runners not loaded: %s", e)
else:

    @register_runner("rdma_rc_lat")
    def rc_send_pingpong(spec: ProbeSpec, ctx: ProbeContext) -> ProbeOutcome:
        """COUNT RC SEND/RECV round trips of SIZE bytes; RTTs into the burst's sketch."""
        try:
            res = ctx.links.burst(
                spec,
                lambda: RcPingLink(
                    spec.address,
                    op="send",
                    size=spec.size,
                    keepalive_s=keepalive_for(spec),
                    **_reach(spec, ctx),
                ),
                lambda link: link.round(spec.count, warmup=1),
            )
        except (ProbeError, OSError, ValueError) as e:
            return _failed_burst("send", spec.count, e)
        return ProbeOutcome(
            "rdma", "send", rtt_ns=res.rtt_ns.tolist(), lost=res.lost, error=res.error
        )

    @register_runner("rdma_rc_bw")
    def rc_write_stream(spec: ProbeSpec, ctx: ProbeContext) -> ProbeOutcome:
        """COUNT RC RDMA WRITEs of SIZE bytes, several in flight; bytes completed and time."""
        try:
            res = rc_bandwidth(
                spec.address,
                op="write",
                size=spec.size,
                iters=spec.count,
                **_reach(spec, ctx),
            )
        except (ProbeError, OSError, ValueError) as e:
            return ProbeOutcome("rdma", "write_stream", failed=True, error=str(e))
        return ProbeOutcome(
            "rdma",
            "write_stream",
            bytes_moved=res.completed * res.size,
            busy_seconds=res.duration_s,
            error=res.error,
        )

    @register_runner("rdma_ud")
    def ud_probes(spec: ProbeSpec, ctx: ProbeContext) -> ProbeOutcome:
        """COUNT UD probes; network RTTs (responder delay subtracted), losses counted."""
        try:
            res = ctx.links.burst(
                spec,
                lambda: UdLink(spec.address, keepalive_s=keepalive_for(spec), **_reach(spec, ctx)),
                lambda link: link.round(spec.count, warmup=1),
            )
        except (ProbeError, OSError, ValueError) as e:
            return _failed_burst("ud", spec.count, e)
        return ProbeOutcome("rdma", "ud", rtt_ns=res.rtt_ns, lost=res.lost, error=res.error)
