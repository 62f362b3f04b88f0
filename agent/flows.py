"""The agent's list of the live connected QPs on its devices, for the collector to pair
them across hosts into flows and learn each flow's links (collector/fabric/flows.py).
Only when the collector asks (it has a fabric file: Assignments.list_qps).

Read every `interval_s` (not every window: the listing forks iproute2's rdma), on this
host's devices only, each QP with its source port by its device's driver rule, its rail,
and whether the agent made it itself. A listing that cannot be read says why in the
report (QpList.error) and is tried again at the next interval; it never fails a window.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.errors import ProbeError
from fabricprobe.probes.ethtool import Runner, run_command
from fabricprobe.probes.qps import LiveQp, own_task, read_qps
from fabricprobe.probes.sport import source_port
from fabricprobe.probes.sysfs import RdmaDevice

log = logging.getLogger("fabricprobe.agent")

MAX_REPORTED = 1024  # connected QPs in one report (an engine host has hundreds)


@dataclass
class QpReader:
    """DRIVERS: each of this host's devices' kernel driver; RAILS: each one's rail."""

    drivers: Mapping[str, str]
    rails: Mapping[str, int] = field(default_factory=dict)
    interval_s: float = 15.0  # 0: never read
    runner: Runner = run_command
    failures: int = 0  # listings that could not be read (the first is logged)
    wanted: bool = False  # the collector knows the fabric's links (Assignments.list_qps)

    def __post_init__(self) -> None:
        self._next_s = 0.0

    @classmethod
    def of(
        cls,
        interval_s: float,
        devices: Sequence[RdmaDevice],
        rails: Mapping[str, int],
        runner: Runner,
    ) -> QpReader:
        """A reader of DEVICES (each one's rail in RAILS), every INTERVAL_S."""
        return cls({d.name: d.driver or "" for d in devices}, dict(rails), interval_s, runner)

    def due(self, now_s: float) -> pb.QpList | None:
        """The listing when one is due at NOW_S (seconds), else None: at the first call
        past each multiple of interval_s on the wall clock, so that every agent, its
        windows cut at the same instants, lists at the same cut (the collector pairs two
        ends by PSNs that move while the flow runs)."""
        if not self.wanted or self.interval_s <= 0 or not self.drivers or now_s < self._next_s:
            return None
        self._next_s = (int(now_s / self.interval_s) + 1) * self.interval_s
        return self.listing()

    def listing(self) -> pb.QpList:
        try:
            got = read_qps(set(self.drivers), self.runner)
        except ProbeError as e:  # ToolMissing among them
            self.failures += 1
            if self.failures == 1:
                log.info("live QPs cannot be read, so flows keep their host path: %s", e)
            return pb.QpList(error=str(e)[:300])
        connected = [q for q in got.qps if q.connected]
        out = pb.QpList(dropped=got.dropped + max(0, len(connected) - MAX_REPORTED))
        out.qps.extend(self.message(q) for q in connected[:MAX_REPORTED])
        return out

    def message(self, q: LiveQp) -> pb.LiveQp:
        return pb.LiveQp(
            device=q.device,
            lqpn=q.lqpn,
            rqpn=q.rqpn,
            type=q.type,
            state=q.state,
            sq_psn=q.sq_psn,
            rq_psn=q.rq_psn,
            pid=q.pid,
            comm=q.comm,
            sport=source_port(self.drivers.get(q.device, ""), q.lqpn, q.rqpn) or 0,
            own=own_task(q.pid),
            rail=self.rails.get(q.device),
        )
