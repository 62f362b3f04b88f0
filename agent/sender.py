"""The agent's sender: the one thread that talks to the collector.

It registers, sends spooled windows oldest first and deletes them on ack, follows
assignment changes, sends the newest check verdicts, and with collector shards moves to
the shard that owns the host now and replays there what the old one had taken
(agent/handoff.py). A collector outage only makes the spool deeper.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from fabricprobe.agent.client import CallError, CollectorClient, Status, build_client
from fabricprobe.agent.config import AgentConfig
from fabricprobe.agent.handoff import Handoff
from fabricprobe.agent.spool import Spool, SpoolCorrupt, SpoolKey, decode_window
from fabricprobe.agent.tracing import ClassTracer
from fabricprobe.agent.validation import ValidationSchedule
from fabricprobe.core.api import fabricprobe_pb2 as pb

log = logging.getLogger("fabricprobe.agent")

SEND_BATCH = 64
MAX_BACKOFF_S = 10.0


class AgentParts(Protocol):
    """What the sender needs of the rest of the agent."""

    spool: Spool
    checks: ValidationSchedule | None
    window_s: float  # the report interval, which the collector may set
    generation: int  # of the assignments in force

    def host_info(self) -> pb.HostInfo: ...

    def apply(self, a: pb.Assignments) -> None: ...

    def counters_anew(self) -> None: ...

    @property
    def tracer(self) -> ClassTracer: ...


class Sender:
    """Registration, reports and check verdicts to the collector (or its shards)."""

    def __init__(
        self, cfg: AgentConfig, parts: AgentParts, client: CollectorClient | None = None
    ) -> None:
        self.cfg, self.parts = cfg, parts
        self.client = client or build_client(cfg)
        self.target = cfg.collector  # the collector (shard) reports go to
        self.handoff: Handoff | None = None
        if cfg.etcd:
            self.handoff = Handoff(
                cfg.host,
                cfg.etcd,
                prefix=cfg.etcd_prefix,
                refresh_s=cfg.etcd_refresh_s,
                keep_s=cfg.handoff_keep_s,
                ca_file=cfg.etcd_ca_file,
                cert_file=cfg.etcd_cert_file,
                key_file=cfg.etcd_key_file,
            )
        self.registered = False
        self.acked = 0
        self.rejected = 0
        self.last_ack_unix_s = 0.0

    def register(self) -> None:
        resp = self.client.register(self.parts.host_info())
        if resp.report_interval_ms:
            self.parts.window_s = resp.report_interval_ms / 1000.0
        self.parts.apply(resp.assignments)
        self.registered = True
        log.info(
            "registered host=%s generation=%d targets=%d window_s=%g",
            self.cfg.host,
            resp.assignments.generation,
            len(resp.assignments.targets),
            self.parts.window_s,
        )

    def send_checks(self) -> None:
        """Send the newest verdicts if the collector lacks them (one message, no spool)."""
        if self.parts.checks is None or (msg := self.parts.checks.take_pending()) is None:
            return
        try:
            self.client.report_checks(msg)
        except CallError as e:
            if e.code() in (Status.INVALID_ARGUMENT, Status.UNIMPLEMENTED):
                # the collector will never take this one: say so once and drop it
                log.error("collector refused the checks: %s", e)
                self.parts.checks.sent_ok(msg)
                return
            if e.code() == Status.FAILED_PRECONDITION:
                self.forgotten()  # the verdicts stay pending
            raise
        self.parts.checks.sent_ok(msg)

    def forgotten(self) -> None:
        """The collector restarted and forgot this host: register again, replay what the
        old one had taken (a shard's handoff) and send the newest verdicts again."""
        self.registered = False
        if self.handoff is not None:
            self.handoff.restarted()
        if self.parts.checks is not None:
            self.parts.checks.resend()

    @property
    def handoffs(self) -> int:
        return self.handoff.handoffs if self.handoff is not None else 0

    @property
    def replayed(self) -> int:
        return self.handoff.replayed if self.handoff is not None else 0

    def _follow_shard(self) -> None:
        """Move to the shard that owns this host now, if that changed (agent/handoff.py)."""
        if self.handoff is None:
            return
        owner = self.handoff.check()
        if owner is None or owner.api == self.target:
            return
        log.info("reporting to shard %s at %s", owner.name, owner.api)
        old, self.client = self.client, build_client(self.cfg, owner.api)
        old.close()
        self.target = owner.api
        self.registered = False
        self.parts.counters_anew()  # every counter twice: the new shard has their rates at once
        if self.parts.checks is not None:
            self.parts.checks.resend()  # and the newest check verdicts

    def _replay(self) -> None:
        """Windows the old shard acknowledged, to the new one (before anything newer)."""
        assert self.handoff is not None
        todo = self.handoff.to_replay
        while todo:
            batch = todo[:SEND_BATCH]
            acks, err = self.client.send(pb.WindowReport.FromString(d) for _, d in batch)
            self.handoff.replayed += len(acks)
            del todo[: len(acks)]
            if err is None:
                continue
            if err.code() == Status.INVALID_ARGUMENT and todo:
                del todo[0]  # never taken anywhere: do not hold the others up
                continue
            if err.code() == Status.FAILED_PRECONDITION:
                self.registered = False  # the shard forgot us meanwhile: register again
            raise err

    def loop(self, stop: threading.Event, wake: threading.Event) -> None:
        """Send until STOP, waking for each window WAKE announces."""
        backoff = 0.2
        while not stop.is_set():
            was_registered = self.registered
            try:
                self._follow_shard()
                if not self.registered:
                    self.register()
                if self.handoff is not None and self.handoff.to_replay:
                    self._replay()
                self.send_checks()
                if not self.parts.spool.depth:
                    # a window cut and a checks run wake this thread; only with shards
                    # is there something to look at in between (the members)
                    wake.wait(1.0 if self.handoff is not None else self.parts.window_s)
                    wake.clear()
                    continue
                ok = self.send_batch()
            except CallError as e:
                log.warning("collector %s: %s", self.target, e)
                ok = False
            if not ok and was_registered and not self.registered:
                # a collector that forgot us answers: register again soon, not after the
                # backoff its outage grew
                backoff = 0.2
            if not ok and self.handoff is not None:
                self.handoff.soon()  # the shard may be gone: read the members again
            if ok:
                backoff = 0.2
            else:
                # with shards, the members are read again at least every etcd_refresh_s
                # while sends fail: a dead shard's lease runs out within a few seconds
                wait = backoff if self.handoff is None else min(backoff, self.cfg.etcd_refresh_s)
                stop.wait(wait)
                backoff = min(backoff * 2, MAX_BACKOFF_S)

    def send_batch(self) -> bool:
        """Send up to SEND_BATCH spooled windows; False when the collector cut us short."""
        keys: list[SpoolKey] = []
        reports: list[pb.WindowReport] = []
        payloads: dict[SpoolKey, bytes] = {}
        for key in self.parts.spool.pending(SEND_BATCH):
            data = self.parts.spool.read(key)
            if data is None:
                continue
            try:
                reports.append(decode_window(data, key))
            except SpoolCorrupt as e:
                self.parts.spool.quarantine(key, str(e))
                log.error("spooled window %s quarantined: %s", key.filename, e)
                continue
            keys.append(key)
            payloads[key] = data
        if not reports:
            return True
        acks, err = self.client.send(reports)
        for ack in acks:
            acked = SpoolKey(ack.epoch, ack.seq)
            self.parts.spool.ack(acked)
            self.parts.tracer.asked(ack.retrace)
            self.acked += 1
            if self.handoff is not None and acked in payloads:
                self.handoff.acked(acked, payloads[acked])
        if acks:
            self.last_ack_unix_s = time.time()
        if acks and max(a.assignment_generation for a in acks) > self.parts.generation:
            self.parts.apply(self.client.assignments(self.cfg.host, self.parts.generation))
        if err is None:
            return True
        code = err.code()
        if code == Status.FAILED_PRECONDITION:
            self.forgotten()
        elif code == Status.INVALID_ARGUMENT and len(acks) < len(keys):
            bad = keys[len(acks)]
            self.parts.spool.ack(bad)  # it will never be taken: do not block the ones behind it
            self.rejected += 1
            log.error("collector refused window %s: %s", bad, err)
            return True
        log.warning("collector %s: %s", self.target, err)
        return False
