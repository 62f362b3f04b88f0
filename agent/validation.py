"""`probe validate` on a schedule, for fleet drift (collector/drift.py).

The agent runs the RoCE checks hourly by default. Each run starts at a jittered time
(interval x (1 +/- jitter)), so a fleet restarted at once does not run its tools in step,
and the first run comes within `first_within_s` of the start, jittered too. A run reads
sysfs and runs the hosts' tools (ip, ethtool, dcb, mlnx_qos...) through the same runner
as the counter sampler, each with its own timeout; a tool that is missing or needs root
makes its check SKIP, never fail the run. Live probes are not part of it: the fleet's
probes already measure the paths.

Only the newest report is kept until the collector takes it: verdicts an hour old are
worth nothing once newer ones exist, so nothing piles up while the collector is away.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.probes.ethtool import Runner
from fabricprobe.probes.roce import HostView, Policy, Report, Status, load_policy, validate

log = logging.getLogger("fabricprobe.agent")

MAX_VERDICTS = 1024  # the collector's bound (collector/drift.py)
MAX_TEXT = 256


def policy_digest(policy: Policy) -> str:
    """A short digest of the policy, so hosts checked under different ones stand out."""
    text = json.dumps(policy.to_dict(), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _clip(text: str | None) -> str:
    t = (text or "").replace("\n", " ")
    return "".join(c for c in t if ord(c) >= 32)[:MAX_TEXT]


def check_report(
    host: str, report: Report, policy: Policy, taken_ns: int, took_s: float
) -> pb.CheckReport:
    """The message for the collector: every verdict with the value behind it."""
    msg = pb.CheckReport(
        host=host, taken_unix_ns=taken_ns, policy=policy_digest(policy), took_s=took_s
    )
    for r in report.results[:MAX_VERDICTS]:
        msg.checks.append(
            pb.CheckVerdict(
                check=_clip(r.check),
                device=_clip(r.device),
                port=max(0, r.port or 0),
                netdev=_clip(r.netdev),
                status=r.status.value,
                value=_clip(r.value),
                message=_clip(r.message),
            )
        )
    return msg


class ValidationSchedule:
    """Runs the checks every INTERVAL_S (jittered) and holds the newest report."""

    def __init__(
        self,
        host: str,
        *,
        sysfs_root: str,
        runner: Runner,
        interval_s: float,
        jitter: float = 0.2,
        first_within_s: float = 60.0,
        policy_file: str = "",
        window_s: float = 2.0,
        devices: tuple[str, ...] = (),
        clock: Callable[[], int] = time.time_ns,
        rng: random.Random | None = None,
    ) -> None:
        self.host = host
        self.sysfs_root = sysfs_root
        self.runner = runner
        self.interval_s = interval_s
        self.jitter = jitter
        self.first_within_s = first_within_s
        self.policy = load_policy(policy_file) if policy_file else Policy()
        self.window_s = window_s
        self.devices = devices
        self.clock = clock
        self.rng = rng or random.Random()
        self.lock = threading.Lock()
        self.pending: pb.CheckReport | None = None  # newest report the collector lacks
        self.runs = 0
        self.failures = 0
        self.last_took_s = 0.0
        self.sent = 0
        self.last_sent: pb.CheckReport | None = None

    def first_delay(self) -> float:
        return self.rng.uniform(0.0, max(0.0, min(self.first_within_s, self.interval_s)))

    def next_delay(self) -> float:
        j = self.jitter
        return self.interval_s * self.rng.uniform(1.0 - j, 1.0 + j)

    def run_once(self) -> pb.CheckReport:
        """One run of the checks; the report also becomes the pending one."""
        t0 = time.monotonic()
        taken = self.clock()
        view = HostView(sysfs_root=Path(self.sysfs_root), runner=self.runner)
        report = validate(view, self.policy, devices=self.devices, window=self.window_s)
        took = time.monotonic() - t0
        msg = check_report(self.host, report, self.policy, taken, took)
        with self.lock:
            self.pending = msg
            self.runs += 1
            self.last_took_s = took
        log.info(
            "checks run: %d verdicts (%d FAIL, %d WARN) in %.1f s",
            len(msg.checks),
            report.count(Status.FAIL),
            report.count(Status.WARN),
            took,
        )
        return msg

    def loop(self, stop: threading.Event, after: Callable[[], None] | None = None) -> None:
        """Run until STOP is set, calling AFTER once a run made a new report pending; a
        failing run is logged and counted, the loop goes on."""
        delay = self.first_delay()
        while not stop.wait(delay):
            try:
                self.run_once()
                if after is not None:
                    after()
            except Exception as e:  # one bad run must not end the schedule
                with self.lock:
                    self.failures += 1
                log.error("checks run failed: %s: %s", type(e).__name__, e)
            delay = self.next_delay()

    def take_pending(self) -> pb.CheckReport | None:
        with self.lock:
            return self.pending

    def sent_ok(self, msg: pb.CheckReport) -> None:
        """The collector holds MSG: drop it unless a newer run replaced it meanwhile."""
        with self.lock:
            if self.pending is msg:
                self.pending = None
            self.last_sent = msg
            self.sent += 1

    def resend(self) -> None:
        """A collector that lacks the newest verdicts (another shard took this host, or
        the collector restarted): send the last ones again, unless newer ones wait."""
        with self.lock:
            if self.pending is None:
                self.pending = self.last_sent
