"""RDMA probe runners for the agent: a kind -> runner table when pyverbs and the RDMA
probes load (`rdma_runners()`), and the whole table the agent runs (`all_runners()`).

`rdma_rc_lat` runs an RC SEND/RECV ping-pong burst (fabricprobe.probes.rdma.rc) against the
peer's responder; `rdma_rc_read` a burst of one-sided RDMA READs from the peer's region (the
peer's NIC answers: no software of the peer's in the RTT, as in a KV transfer's own READs and
WRITEs); `rdma_ud` sends COUNT UD probes with two ACKs each (fabricprobe.probes.rdma.ud, the
R-Pingmesh manner) and keeps the network RTT with the responder's delay taken out;
`rdma_rc_bw` streams COUNT RDMA WRITEs of SIZE bytes and reports the bytes completed
(planned, like `tcp_bw`, only on request). The source address picks the local RDMA
device (the one whose RoCE v2 GID maps it), so on a shared machine each host probes
from its own device. Without pyverbs the table is empty, and the agent then advertises
TCP probes only.

Latency and UD bursts run over kept links (the agent's ProbeContext.links): the first burst to a
target sets up the verbs resources and the control session on both ends, and later
bursts reuse them.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from fabricprobe.agent.probing import (
    TCP_RUNNERS,
    ProbeContext,
    ProbeOutcome,
    ProbeSpec,
    Runner,
    keepalive_for,
    kept_runner,
    link_params,
    stream_burst,
)
from fabricprobe.core.errors import SysfsError
from fabricprobe.probes.measure import LatencyRound
from fabricprobe.probes.sport import source_port
from fabricprobe.probes.sysfs import read_device

log = logging.getLogger("fabricprobe.agent")

# QP setup on both ends can take seconds on a loaded or emulated host.
SETUP_TIMEOUT_S = 10.0


@functools.lru_cache(maxsize=64)
def device_driver(sysfs_root: str, device: str) -> str:
    """DEVICE's kernel driver ("" when sysfs does not say)."""
    try:
        return read_device(sysfs_root, device).driver or ""
    except SysfsError:
        return ""


def name_class(out: ProbeOutcome, ports: Any, sysfs_root: str) -> None:
    """Put the ECMP class of a UD link (its UdPorts) on OUT: the source ports out and
    back, by the driver's rule (the peer's by ours: a fleet runs one kind of NIC)."""
    driver = device_driver(sysfs_root, ports.device)
    out.sport = source_port(driver, ports.qpn) or 0
    out.return_sport = source_port(driver, ports.remote_qpn) or 0
    out.source = ports.source


def rdma_runners() -> dict[str, Runner]:
    """Probe kind -> runner for RDMA; none when pyverbs (or the RDMA probes) cannot load."""
    try:
        from fabricprobe.probes.rdma.rc import RcPingLink, rc_bandwidth
        from fabricprobe.probes.rdma.ud import UdLink
    except ImportError as e:  # no pyverbs on this host: RDMA probes are not offered
        log.debug("RDMA runners not loaded: %s", e)
        return {}

    def rc_write_stream(spec: ProbeSpec, ctx: ProbeContext) -> ProbeOutcome:
        """COUNT RC RDMA WRITEs of SIZE bytes, several in flight; bytes completed and time."""
        return stream_burst(
            ("rdma", "write_stream"),
            lambda: rc_bandwidth(
                link_params(spec, ctx, SETUP_TIMEOUT_S),
                op="write",
                size=spec.size,
                iters=spec.count,
            ),
        )

    def ud_probes(spec: ProbeSpec, ctx: ProbeContext) -> ProbeOutcome:
        """COUNT UD probes; network RTTs (responder delay subtracted), losses counted; the
        outcome names its ECMP class where the driver's rule is known."""
        ports: list[Any] = []  # the link's UdPorts once its session is open

        def run(link: UdLink, count: int) -> LatencyRound:
            r = link.round(count, warmup=1)
            if getattr(link, "ports", None) is not None:
                ports.append(link.ports)
            return r

        out = kept_runner(
            ("rdma", "ud"),
            lambda params, spec: UdLink(params, keepalive_s=keepalive_for(spec)),
            run,
            SETUP_TIMEOUT_S,
        )(spec, ctx)
        if ports:
            name_class(out, ports[0], ctx.sysfs_root)
        return out

    def rc_links(op: str) -> Runner:
        """COUNT RC round trips of SIZE bytes of OP over kept links; RTTs into the burst."""
        return kept_runner(
            ("rdma", op),
            lambda params, spec: RcPingLink(
                params, op=op, size=spec.size, keepalive_s=keepalive_for(spec)
            ),
            lambda link, count: link.round(count, warmup=1),
            SETUP_TIMEOUT_S,
        )

    return {
        "rdma_rc_lat": rc_links("send"),  # SEND/RECV ping-pongs
        "rdma_rc_read": rc_links("read"),  # one-sided READs, one at a time: the NIC answers
        "rdma_rc_bw": rc_write_stream,
        "rdma_ud": ud_probes,
    }


def all_runners() -> dict[str, Runner]:
    """Every probe kind this host can run: TCP, and RDMA where pyverbs loads."""
    return {**TCP_RUNNERS, **rdma_runners()}
