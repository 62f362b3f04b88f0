"""Fleet drift: each host's `probe validate` verdicts, compared with its peers'.

Agents run the RoCE checks on a schedule (agent/validation.py) and send the newest
verdicts with the value each check compared (`CheckVerdict.value`: "3" for the PFC
priorities, "9000/4096" for the MTUs, the firmware and driver versions...). The collector
keeps the newest report per registered host and groups hosts twice: by their topology
label (the ToR) and by their role. Within a group of at least `min_group` hosts that
reported a check, the value most of them hold is the group's; a host whose value differs
from it drifts. Hosts with no majority to compare with (two hosts, or a tie) are never
flagged: a difference is only drift when the rest of the group agrees.

A host's value of a check is the set of values over its ports, so a host whose eight
NICs agree compares with peers whose eight NICs agree, whatever the devices are named,
and one mis-set NIC among eight stands out. A check without a value compares by status.
Checks about state rather than configuration (counters, live probes) are not compared.

Everything here is bounded: a report holds at most MAX_CHECKS verdicts with texts of at
most MAX_TEXT characters, only registered hosts are kept, and a host the store forgets
is forgotten here too. Waivers (config `drift_waivers`) accept a known difference, with
a reason and optionally an expiry date; waived rows stay visible but do not alert.
"""

from __future__ import annotations

import fnmatch
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime
from typing import Any

from fabricprobe.collector.store import ReportError, WindowStore
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.errors import ConfigError

MAX_CHECKS = 1024  # verdicts per report: 64 ports x 16 checks
MAX_TEXT = 256  # characters of a check, device, value or message
MAX_WAIVERS = 1000
STATUSES = ("PASS", "SKIP", "WARN", "FAIL")
STATUS_RANK = {s: i for i, s in enumerate(STATUSES)}
# verdicts about what happened in the sampled window, not about how the host is set up
STATE_CHECKS = frozenset({"pause", "discards", "rdma_errors", "live"})
GROUP_BY = ("topology", "role")
REJECT_REASONS = ("unregistered", "malformed", "too_large")


@dataclass(frozen=True)
class Verdict:
    check: str
    device: str
    port: int
    netdev: str
    status: str
    value: str
    message: str

    @property
    def where(self) -> str:
        return f"{self.device}/{self.port}" if self.device else (self.netdev or "host")


@dataclass(frozen=True)
class HostVerdicts:
    """One host's newest check report, checked (verdicts_of): its verdicts, the policy
    they were judged by, when they were taken and when the collector got them."""

    host: str
    taken_unix_ns: int
    policy: str
    checks: tuple[Verdict, ...]
    received_unix_ns: int = 0

    def by_check(self) -> dict[str, list[Verdict]]:
        out: dict[str, list[Verdict]] = {}
        for v in self.checks:
            out.setdefault(v.check, []).append(v)
        return out

    def counts(self) -> dict[str, int]:
        c = Counter(v.status for v in self.checks)
        return {s: c.get(s, 0) for s in STATUSES}

    def worst(self) -> dict[str, str]:
        """check -> its worst status over the host's ports."""
        out: dict[str, str] = {}
        for v in self.checks:
            if v.check not in out or STATUS_RANK[v.status] > STATUS_RANK[out[v.check]]:
                out[v.check] = v.status
        return out


def _text(value: str, what: str) -> str:
    if len(value) > MAX_TEXT:
        raise ReportError(f"{what}: longer than {MAX_TEXT} characters")
    if any(ord(c) < 32 for c in value):
        raise ReportError(f"{what}: control characters")
    return value


def verdicts_of(report: pb.CheckReport, received_unix_ns: int) -> HostVerdicts:
    """The checked content of REPORT; ReportError names what is wrong with it."""
    if not report.host:
        raise ReportError("host name is empty")
    if len(report.checks) > MAX_CHECKS:
        raise ReportError(f"{len(report.checks)} verdicts, more than {MAX_CHECKS}")
    checks = []
    for i, c in enumerate(report.checks):
        if c.status not in STATUS_RANK:
            raise ReportError(f"verdict {i}: status {c.status[:20]!r} is not one of {STATUSES}")
        if not c.check:
            raise ReportError(f"verdict {i}: no check name")
        checks.append(
            Verdict(
                check=_text(c.check, f"verdict {i} check"),
                device=_text(c.device, f"verdict {i} device"),
                port=int(c.port),
                netdev=_text(c.netdev, f"verdict {i} netdev"),
                status=c.status,
                value=_text(c.value, f"verdict {i} value"),
                message=_text(c.message, f"verdict {i} message"),
            )
        )
    return HostVerdicts(
        host=_text(report.host, "host"),
        taken_unix_ns=int(report.taken_unix_ns),
        policy=_text(report.policy, "policy"),
        checks=tuple(checks),
        received_unix_ns=received_unix_ns,
    )


# --------------------------------------------------------------------------- waivers


@dataclass(frozen=True)
class Waiver:
    """A known difference accepted: hosts matching HOST (a glob), check CHECK ("*": any)."""

    host: str
    check: str
    reason: str
    until: date | None = None  # the last day it holds (UTC); None: until removed

    def covers(self, host: str, check: str, today: date) -> bool:
        if self.until is not None and today > self.until:
            return False
        return fnmatch.fnmatchcase(host, self.host) and (
            self.check == "*" or fnmatch.fnmatchcase(check, self.check)
        )


def parse_waivers(items: Any, where: str = "drift_waivers") -> tuple[Waiver, ...]:
    """Waivers from config: a list of tables {host, check, reason, until = "YYYY-MM-DD"}."""
    if not isinstance(items, list):
        raise ConfigError(f"{where}: must be a list of tables")
    if len(items) > MAX_WAIVERS:
        raise ConfigError(f"{where}: more than {MAX_WAIVERS} waivers")
    out = []
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise ConfigError(f"{at}: must be a table with host, check and reason")
        unknown = set(item) - {"host", "check", "reason", "until"}
        if unknown:
            raise ConfigError(f"{at}: unknown key(s) {', '.join(sorted(unknown))}")
        host, check, reason = item.get("host"), item.get("check"), item.get("reason")
        for key, v in (("host", host), ("check", check), ("reason", reason)):
            if not isinstance(v, str) or not v.strip() or len(v) > MAX_TEXT:
                raise ConfigError(f"{at}: {key} must be a non-empty string")
        until = item.get("until")
        day: date | None = None
        if until is not None:
            if isinstance(until, datetime):
                day = until.date()
            elif isinstance(until, date):
                day = until
            elif isinstance(until, str):
                try:
                    day = date.fromisoformat(until)
                except ValueError:
                    raise ConfigError(f"{at}: until must be a date (YYYY-MM-DD)") from None
            else:
                raise ConfigError(f"{at}: until must be a date (YYYY-MM-DD)")
        assert isinstance(host, str) and isinstance(check, str) and isinstance(reason, str)
        out.append(Waiver(host=host, check=check, reason=reason, until=day))
    return tuple(out)


# --------------------------------------------------------------------------- drift


@dataclass(frozen=True)
class Drift:
    host: str
    group_by: str  # "topology" or "role"
    group: str
    check: str
    value: str
    peers_value: str
    peers_agree: int
    group_size: int
    ports: str  # the host's ports whose value is not the group's
    waived: bool = False
    waiver: str = ""


@dataclass(frozen=True)
class Member:
    verdicts: HostVerdicts
    topology: str
    role: str


def _values(vs: list[Verdict]) -> frozenset[str]:
    return frozenset(v.value or v.status for v in vs)


def _show(values: frozenset[str]) -> str:
    return ", ".join(sorted(values))


def find_drift(
    members: Mapping[str, Member],
    *,
    min_group: int = 3,
    waivers: Iterable[Waiver] = (),
    today: date | None = None,
) -> list[Drift]:
    """Every (host, check) whose value differs from the one most of its group holds."""
    day = today or datetime.now(UTC).date()
    waivers = tuple(waivers)
    out: list[Drift] = []
    per_host = {h: m.verdicts.by_check() for h, m in members.items()}
    for group_by in GROUP_BY:
        groups: dict[str, list[str]] = {}
        for h, m in members.items():
            label = m.topology if group_by == "topology" else m.role
            if label:
                groups.setdefault(label, []).append(h)
        for label, hosts in sorted(groups.items()):
            if len(hosts) < min_group:
                continue
            policy = {h: frozenset([members[h].verdicts.policy]) for h in hosts}
            tables: dict[str, dict[str, frozenset[str]]] = {"policy": policy}
            for h in hosts:
                for check, vs in per_host[h].items():
                    if check not in STATE_CHECKS:
                        tables.setdefault(check, {})[h] = _values(vs)
            for check, vals in sorted(tables.items()):
                if len(vals) < min_group:
                    continue
                (top, agree), *_ = Counter(vals.values()).most_common(1)
                if agree * 2 <= len(vals):
                    continue  # no majority: nothing to call normal
                for h, v in sorted(vals.items()):
                    if v == top:
                        continue
                    ports = ", ".join(
                        sorted(
                            {
                                x.where
                                for x in per_host[h].get(check, [])
                                if (x.value or x.status) not in top
                            }
                        )
                    )
                    w = next((w for w in waivers if w.covers(h, check, day)), None)
                    out.append(
                        Drift(
                            host=h,
                            group_by=group_by,
                            group=label,
                            check=check,
                            value=_show(v),
                            peers_value=_show(top),
                            peers_agree=agree,
                            group_size=len(vals),
                            ports=ports,
                            waived=w is not None,
                            waiver=w.reason if w is not None else "",
                        )
                    )
    return out


@dataclass(frozen=True)
class ReportCounts:
    """Verdict reports the book took and refused (a copy)."""

    taken: int
    rejected: dict[str, int]  # reason -> reports


@dataclass
class DriftBook:
    """The newest verdicts of each registered host, and the drift they show."""

    store: WindowStore
    min_group: int = 3
    waivers: tuple[Waiver, ...] = ()
    clock: Callable[[], int] = time.time_ns
    lock: threading.Lock = field(default_factory=threading.Lock)
    hosts: dict[str, HostVerdicts] = field(default_factory=dict)
    reports_total: int = 0
    rejected: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REJECT_REASONS, 0))
    _version: int = 0
    _cached: tuple[int, int, list[Drift]] | None = None  # (version, day, rows)

    def take(self, report: pb.CheckReport) -> HostVerdicts:
        """Keep REPORT as its host's newest verdicts; ReportError (counted) otherwise."""
        try:
            v = verdicts_of(report, self.clock())
        except ReportError as e:
            reason = "too_large" if "more than" in str(e) or "longer" in str(e) else "malformed"
            with self.lock:
                self.rejected[reason] += 1
            raise
        known = self.store.has_host(v.host)
        with self.lock:
            if not known:
                self.rejected["unregistered"] += 1
                raise ReportError(f"{v.host}: not registered")
            old = self.hosts.get(v.host)
            if old is not None and old.taken_unix_ns > v.taken_unix_ns:
                return old  # an older run arriving late changes nothing
            self.hosts[v.host] = v
            self.reports_total += 1
            self._version += 1
        return v

    def members(self) -> dict[str, Member]:
        """Hosts with verdicts that the store still holds; forgotten hosts go here too."""
        infos = {h: (v.info.topology, v.info.role) for h, v in self.store.host_views().items()}
        with self.lock:
            for h in [h for h in self.hosts if h not in infos]:
                del self.hosts[h]
                self._version += 1
            return {
                h: Member(v, infos[h][0], infos[h][1]) for h, v in self.hosts.items() if h in infos
            }

    def drift(self, members: Mapping[str, Member] | None = None) -> list[Drift]:
        """The drift rows over MEMBERS (the book's members() when not given), cached until a
        report changes them or the day (waivers' expiry) turns."""
        members = self.members() if members is None else members
        today = datetime.now(UTC).date()
        with self.lock:
            cached = self._cached
            version = self._version
        if cached is not None and cached[0] == version and cached[1] == today.toordinal():
            return cached[2]
        rows = find_drift(members, min_group=self.min_group, waivers=self.waivers, today=today)
        with self.lock:
            self._cached = (version, today.toordinal(), rows)
        return rows

    def counts(self) -> ReportCounts:
        with self.lock:
            return ReportCounts(self.reports_total, dict(self.rejected))

    def reply(self, host: str = "", include_waived: bool = False) -> pb.DriftReply:
        members = self.members()
        rows = [
            d
            for d in self.drift(members)
            if (not host or d.host == host) and (include_waived or not d.waived)
        ]
        registered = set(self.store.host_names())
        msg = pb.DriftReply(hosts_without_checks=len(registered - set(members)))
        msg.drift.extend(pb.DriftRow(**asdict(d)) for d in rows)  # the same fields
        for h, m in sorted(members.items()):
            if host and h != host:
                continue
            worst = m.verdicts.worst()
            msg.hosts.append(
                pb.HostChecks(
                    host=h,
                    topology=m.topology,
                    role=m.role,
                    taken_unix_ns=m.verdicts.taken_unix_ns,
                    by_status=m.verdicts.counts(),
                    failing=sorted(c for c, s in worst.items() if s == "FAIL"),
                )
            )
        return msg


class DriftCollector:
    """Prometheus view of the book: each check's worst status per host, drift rows,
    the verdicts' age, and reports taken and refused."""

    def __init__(self, book: DriftBook) -> None:
        self.book = book

    def describe(self) -> list[Any]:
        return self._families(False)

    def collect(self) -> list[Any]:
        return self._families(True)

    def _families(self, fill: bool) -> list[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        status = GaugeMetricFamily(
            "fabricprobe_host_check_status",
            "Worst verdict of a check over the host's ports: 0 PASS, 1 SKIP, 2 WARN, 3 FAIL.",
            labels=["host", "check"],
        )
        drift = GaugeMetricFamily(
            "fabricprobe_host_check_drift",
            "1 where the host's value of a check differs from the one most of its group holds.",
            labels=["host", "check", "group_by", "group", "waived"],
        )
        age = GaugeMetricFamily(
            "fabricprobe_host_checks_age_seconds",
            "Seconds since the host's newest verdicts were taken.",
            labels=["host"],
        )
        drifting = GaugeMetricFamily(
            "fabricprobe_drift_hosts", "Hosts with a difference from their group not waived."
        )
        taken = CounterMetricFamily(
            "fabricprobe_check_reports", "Verdict reports taken from agents."
        )
        refused = CounterMetricFamily(
            "fabricprobe_check_reports_rejected",
            "Verdict reports refused, by reason.",
            labels=["reason"],
        )
        if fill:
            b = self.book
            members = b.members()
            now = b.clock()
            for h, m in sorted(members.items()):
                for check, s in sorted(m.verdicts.worst().items()):
                    status.add_metric([h, check], float(STATUS_RANK[s]))
                age.add_metric([h], max(0.0, (now - m.verdicts.taken_unix_ns) / 1e9))
            rows = b.drift(members)
            for d in rows:
                drift.add_metric(
                    [d.host, d.check, d.group_by, d.group, "true" if d.waived else "false"], 1.0
                )
            drifting.add_metric([], float(len({d.host for d in rows if not d.waived})))
            counts = b.counts()
            taken.add_metric([], float(counts.taken))
            for reason, n in sorted(counts.rejected.items()):
                refused.add_metric([reason], float(n))
        return [status, drift, age, drifting, taken, refused]
