"""RDMA probe runners for the agent, registered when pyverbs and the RC probes load.

`rdma_rc_lat` runs an RC SEND/RECV ping-pong burst (probes.rdma.rc) against the peer's
responder; `rdma_ud` sends COUNT UD probes with two ACKs each (probes.rdma.ud, the
R-Pingmesh manner) and keeps the network RTT with the responder's delay taken out;
`rdma_rc_bw` streams COUNT RDMA WRITEs of SIZE bytes and reports the bytes completed
(planned, like `tcp_bw`, only on request). The source address picks the local RDMA
device (the one whose RoCE v2 GID maps it), so on a shared machine each host probes
from its own device. Without pyverbs this module registers nothing, and the agent then
advertises TCP probes only.

Latency and UD bursts run over kept links (LINKS): the first burst to a target sets up
the verbs resources and the control session on both ends, and later bursts reuse them,
which is what keeps an agent probing dozens of peers every few seconds cheap. A link
whose round fails is closed and set up again at the next burst; one whose responder let
it go (restart, keepalive) is set up again at once, in the same burst.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from agent.probing import KEEPERS, ProbeContext, ProbeOutcome, ProbeSpec, register_runner
from probes.control import MAX_KEEPALIVE_S, LinkStale
from probes.errors import ProbeError
from probes.stats import LatencySketch

log = logging.getLogger("fabricprobe.agent")

# QP setup on both ends can take seconds on a loaded or emulated host.
SETUP_TIMEOUT_S = 10.0


class Link(Protocol):
    def close(self) -> None: ...


L = TypeVar("L", bound=Link)
R = TypeVar("R")


def keepalive_for(spec: ProbeSpec) -> float:
    """How long the peer holds a link between bursts: three intervals (jitter and a busy
    rate budget never make it lapse), at least 30 s, at most the protocol's bound."""
    return min(MAX_KEEPALIVE_S, max(30.0, 3 * spec.interval_s))


class _Kept:
    __slots__ = ("dropped", "link", "lock")

    def __init__(self, link: Any) -> None:
        self.lock = threading.Lock()  # one burst at a time on a link
        self.link = link
        self.dropped = False  # no longer assigned: closed after the burst that holds it


class Links:
    """Kept probe links by target; each carries one burst at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._links: dict[tuple[str, str, int, int], _Kept] = {}

    @staticmethod
    def key(spec: ProbeSpec) -> tuple[str, str, int, int]:
        return (spec.kind, spec.address, spec.port, spec.size)

    def burst(self, spec: ProbeSpec, new: Callable[[], L], run: Callable[[L], R]) -> R:
        """RUN over SPEC's link (made by NEW the first time). A link gone stale before
        its round started is set up again once, at once."""
        with self._lock:
            kept = self._links.get(self.key(spec))
            if kept is None:
                kept = self._links[self.key(spec)] = _Kept(new())
        with kept.lock:
            try:
                return run(kept.link)
            except LinkStale as e:
                log.debug("link to %s (%s) was let go, set up again: %s", spec.dst, spec.kind, e)
                return run(kept.link)
            finally:
                if kept.dropped:
                    kept.link.close()

    def __len__(self) -> int:
        return len(self._links)

    def retain(self, specs: list[ProbeSpec]) -> None:
        """Close the links of targets no longer assigned."""
        keep = {self.key(s) for s in specs}
        with self._lock:
            gone = [self._links.pop(k) for k in list(self._links) if k not in keep]
            for kept in gone:
                kept.dropped = True
        for kept in gone:
            with kept.lock:  # after a burst still running on it
                kept.link.close()

    def close(self) -> None:
        self.retain([])


LINKS = Links()


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
    from probes.rdma.rc import RcPingLink, rc_bandwidth
    from probes.rdma.ud import UdLink
except ImportError as e:  # no pyverbs on this host: RDMA probes are not offered
    log.debug("RDMA runners not loaded: %s", e)
else:
    KEEPERS.append(LINKS)

    @register_runner("rdma_rc_lat")
    def rc_send_pingpong(spec: ProbeSpec, ctx: ProbeContext) -> ProbeOutcome:
        """COUNT RC SEND/RECV round trips of SIZE bytes; RTTs into the burst's sketch."""
        try:
            res = LINKS.burst(
                spec,
                lambda: RcPingLink(
                    spec.address,
                    op="send",
                    size=spec.size,
                    keepalive_s=keepalive_for(spec),
                    **_reach(spec, ctx),
                ),
                lambda link: link.run(spec.count, warmup=1),
            )
        except (ProbeError, OSError, ValueError) as e:
            return _failed_burst("send", spec.count, e)
        return ProbeOutcome("rdma", "send", rtt=res.sketch, error=res.error)

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
            res = LINKS.burst(
                spec,
                lambda: UdLink(spec.address, keepalive_s=keepalive_for(spec), **_reach(spec, ctx)),
                lambda link: link.run(spec.count),
            )
        except (ProbeError, OSError, ValueError) as e:
            return _failed_burst("ud", spec.count, e)
        return ProbeOutcome("rdma", "ud", rtt=res.sketch, error=res.error)
