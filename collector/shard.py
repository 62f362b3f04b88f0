"""One collector shard of many, with membership in etcd (fabricprobe.core.shards).

A shard keeps two etcd leases alive: a short one (`ttl_s`, a few seconds) that holds its
member record, so that a shard killed outright leaves the member set within the TTL;
and a long one (`forget_after`) that holds the registrations of the hosts that
registered here, so that a host whose shard died stays in the fleet's plan until it
registers with its new owner (or the long lease runs out).

One fleet-wide plan, no leader: every shard reads every host registration from etcd and
feeds them to its own Planner. The planner is deterministic for one set of hosts, so
each shard hands its own hosts the same assignments any other shard would. After one
full read, etcd's watch stream (through its gateway) brings each change to the member
records and registrations as it is made; the fleet is read in full again every
`resync_s` (a check on the watch) and whenever the stream breaks (counted), and until a
new watch is in place the shard polls the store's revision every `refresh_s` and reads
in full when it moved.

Spans reach the shard that owns their path through `spans`, its SpanRouter
(collector/spanroute.py).

A shard takes any host that registers or reports to it (agents choose their owner; a
refusal would only strand a host whose view of the members lags), and lets go of a host
once the host registered with another shard (its registration in etcd is under that
shard's lease) and stopped reporting here.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from fabricprobe.collector.assign import HostSpec, Planner
from fabricprobe.collector.linking import HostDirectory, MatchConfig
from fabricprobe.collector.shardlease import Leases
from fabricprobe.collector.spanroute import Forwarder, SpanRouter
from fabricprobe.collector.store import MAX_HOSTS, HostState, WindowStore
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.shards import (
    DEFAULT_PREFIX,
    MAX_MEMBERS,
    Change,
    Etcd,
    EtcdError,
    Member,
    b64,
    owner_of,
    parse_member,
)

log = logging.getLogger("fabricprobe.collector.shard")

MAX_REGISTRATION = 64 << 10  # bytes of one host's registration in etcd


@dataclass(frozen=True)
class ShardConfig:
    """How a collector joins the shards (collector/config.py fills one)."""

    etcd: tuple[tuple[str, int], ...]
    name: str
    advertise_api: str = ""  # "" -> the agent API's listen address and bound port
    advertise_otlp: str = ""  # "" -> the agent API's address (OTLP shares its port)
    advertise_metrics: str = ""  # "" -> the /metrics listen address and bound port
    ttl_s: int = 3
    refresh_s: float = 1.0
    prefix: str = DEFAULT_PREFIX
    # how this shard proves itself to the others when it forwards spans: a bearer token
    # holding the ingest role there, over TLS with CA_FILE (and a client certificate)
    token_file: str = ""
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    server_name: str = ""
    # engine spans wait this long on the shard owning their trace for the side that
    # names their path (collector/spanpath.py), then go by their own host
    span_hold_s: float = 10.0
    # while etcd's watch stream delivers the changes, the fleet is read in full only
    # this often (a check on the watch); without the watch, every refresh_s it moved
    resync_s: float = 300.0
    etcd_ca_file: str = ""
    etcd_cert_file: str = ""
    etcd_key_file: str = ""


Admit = Callable[[pb.HostInfo], HostSpec]  # checks a registration, returns its plan entry


class Shard:
    """This collector's membership and its view of the fleet; `spans` routes spans."""

    def __init__(
        self,
        cfg: ShardConfig,
        store: WindowStore,
        planner: Planner,
        admit: Admit,
        *,
        match: MatchConfig | None = None,
        forget_after: float = 600.0,
        etcd: Etcd | None = None,
    ) -> None:
        self.cfg, self.store, self.planner, self.admit = cfg, store, planner, admit
        self.match = match or MatchConfig()
        self.forget_after = forget_after

        def client() -> Etcd:
            return Etcd(
                cfg.etcd,
                prefix=cfg.prefix,
                ca_file=cfg.etcd_ca_file,
                cert_file=cfg.etcd_cert_file,
                key_file=cfg.etcd_key_file,
            )

        self.etcd = etcd or client()
        self.leases = Leases(
            self.etcd,
            etcd or client(),
            prefix=cfg.prefix,
            ttl_s=cfg.ttl_s,
            forget_after=forget_after,
        )
        self.member = Member(cfg.name, cfg.advertise_api)
        self.lock = threading.Lock()
        self.members: tuple[Member, ...] = ()
        self.fleet: dict[str, pb.HostInfo] = {}  # every registration in etcd, by host
        self.fleet_leases: dict[str, int] = {}
        self._revision = -1
        self._stop = threading.Event()
        self._sync_lock = threading.RLock()  # a full read and a watch's changes, one at a time
        self._watching = False
        self._watch_open: list[Any] = []  # the watch's open response (stop() closes it)
        self._read_at = 0.0  # monotonic time of the last full read
        self.watched = 0  # changes the watch delivered
        self.watch_restarts = 0
        self._watcher: threading.Thread | None = None
        self._thread: threading.Thread | None = None
        self._beat: threading.Thread | None = None
        self._fleet_version = 0
        self._directory: tuple[int, HostDirectory] | None = None
        self.spans = SpanRouter(self, Forwarder(cfg), store.clock, hold_s=cfg.span_hold_s)
        self.records_unreadable = 0  # member or host records in etcd, at the last read

    # -- lifecycle ----------------------------------------------------------------------

    def start(self, member: Member) -> None:
        """Join as MEMBER: its record under a fresh lease, the fleet read once, then a
        thread that keeps both up to date. Raises EtcdError when etcd cannot be reached."""
        self.member = member
        self.leases.grant(member)
        self.sync(force=True)
        self.spans.forwarder.start()
        self._thread = threading.Thread(target=self._loop, name="shard", daemon=True)
        self._thread.start()
        self._beat = threading.Thread(target=self._beat_loop, name="shard-beat", daemon=True)
        self._beat.start()
        self._watcher = threading.Thread(target=self._watch_loop, name="shard-watch", daemon=True)
        self._watcher.start()
        log.info("shard %s joined: api=%s members=%d", member.name, member.api, len(self.members))

    def _loop(self) -> None:
        while not self._stop.wait(self.cfg.refresh_s):
            self.spans.relay.expire()
            try:
                if not self._watching:
                    self.sync()
                elif time.monotonic() - self._read_at > self.cfg.resync_s:
                    self.sync(force=True)  # the watch's check: the whole fleet once more
                self.republish()
            except EtcdError as e:
                log.warning("shard %s: %s", self.member.name, e)

    def _beat_loop(self) -> None:
        while not self._stop.wait(max(2, self.cfg.ttl_s) / 3):
            try:
                if self.leases.keepalive(self.member):
                    self._revision = -1  # the next sync reads all, republish() puts ours back
            except EtcdError as e:
                log.warning("shard %s: %s", self.member.name, e)

    def _watch_loop(self) -> None:
        """Apply etcd's changes as its watch delivers them, from the revision of the last
        full read on; a stream that breaks is counted, and the fleet is read in full again
        (by the refresh loop) before the next watch starts."""
        while not self._stop.is_set():
            start = self._revision
            if start < 0:  # not read yet, or the last watch broke: wait for a full read
                self._stop.wait(min(self.cfg.refresh_s, 1.0))
                continue
            opened: list[Any] = []
            self._watch_open = opened
            try:
                for changes in self.etcd.watch(start + 1, opened):
                    self._watching = True
                    if changes:
                        self.apply(changes)
            except EtcdError as e:
                if self._stop.is_set():
                    return
                self.watch_restarts += 1
                log.warning("shard %s: %s; reading etcd in full", self.member.name, e)
            self._watching = False
            with self.lock:
                self._revision = -1
            self._stop.wait(self.cfg.refresh_s)

    def _close_watch(self) -> None:
        """End the watch's stream from another thread (a blocked read sees its socket shut)."""
        for resp in list(self._watch_open):
            with contextlib.suppress(Exception):
                fd = resp.raw._fp.fileno()  # the HTTP response's socket
                sock = socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM)
                sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            with contextlib.suppress(Exception):
                resp.close()

    def apply(self, changes: list[Change]) -> None:
        """Changes the watch delivered: member records and host registrations put or
        deleted, checked as a full read checks them."""
        shards_key, hosts_key = self.cfg.prefix + "shards/", self.cfg.prefix + "hosts/"
        upserts: list[HostSpec] = []
        removes: list[str] = []
        with self._sync_lock:
            local = self.local_hosts()
            with self.lock:
                by = {m.name: m for m in self.members}
                moved = False
                for ch in changes:
                    self.watched += 1
                    key = ch.key.decode(errors="replace")
                    if key.startswith(shards_key):
                        name = key[len(shards_key) :]
                        if ch.deleted:
                            by.pop(name, None)
                            continue
                        try:
                            m = parse_member(ch.value)
                            if m.name != name:
                                raise ValueError("key and name differ")
                        except ValueError:
                            self.records_unreadable += 1
                            continue
                        if name in by or len(by) < MAX_MEMBERS:
                            by[name] = m
                    elif key.startswith(hosts_key):
                        name = key[len(hosts_key) :]
                        if ch.deleted:
                            if self.fleet.pop(name, None) is not None:
                                self.fleet_leases.pop(name, None)
                                moved = True
                                if name not in local:
                                    removes.append(name)
                            continue
                        try:
                            info, spec = self._registration(name, ch.value)
                        except (DecodeError, ValueError):
                            self.records_unreadable += 1
                            continue
                        if name not in self.fleet and len(self.fleet) >= MAX_HOSTS:
                            self.records_unreadable += 1
                            continue
                        self.fleet[name], self.fleet_leases[name] = info, ch.lease
                        moved = True
                        if name not in local:
                            upserts.append(spec)
                self.members = tuple(sorted(by.values()))
                if moved:
                    self._fleet_version += 1
            for spec in upserts:
                self.planner.upsert(spec)
            if removes:
                self.planner.remove(removes)

    def _registration(self, name: str, value: bytes) -> tuple[pb.HostInfo, HostSpec]:
        """A host's registration from etcd, checked; DecodeError or ValueError when bad."""
        if len(value) > MAX_REGISTRATION:
            raise ValueError("registration too large")
        info = pb.HostInfo.FromString(value)
        if info.host != name:
            raise ValueError("key and host differ")
        return info, self.admit(info)

    def stop(self) -> None:
        """Leave: revoke the member lease so the others take this shard's hosts at once."""
        self._stop.set()
        self._close_watch()
        for t in (self._thread, self._beat, self._watcher):
            if t is not None:
                t.join(timeout=5)
        self.spans.forwarder.stop()
        self.leases.revoke(self.member)

    def sync(self, *, force: bool = False) -> bool:
        """Re-read members and registrations if etcd changed; True when it did."""
        with self._sync_lock:
            return self._sync(force)

    def _sync(self, force: bool) -> bool:
        rev = self.etcd.revision()
        if rev == self._revision and not force:
            return False
        members, bad = self.etcd.members()
        rows = self.etcd.read_prefix("hosts/", MAX_HOSTS + 1)
        bad += max(0, len(rows) - MAX_HOSTS)
        fleet: dict[str, pb.HostInfo] = {}
        leases: dict[str, int] = {}
        specs: list[HostSpec] = []
        for key, value, lease in rows[:MAX_HOSTS]:
            name = key.decode(errors="replace").rpartition("/")[2]
            try:
                info, spec = self._registration(name, value)
            except (DecodeError, ValueError):
                bad += 1
                continue
            specs.append(spec)
            fleet[name], leases[name] = info, lease
        with self.lock:
            self.members = tuple(members)
            if fleet.keys() != self.fleet.keys() or any(
                list(fleet[h].addresses) != list(self.fleet[h].addresses) for h in fleet
            ):
                self._fleet_version += 1
            self.fleet, self.fleet_leases = fleet, leases
            self.records_unreadable = bad
            self._revision = rev
            self._read_at = time.monotonic()
        local = self.local_hosts()
        for spec in specs:
            if spec.name not in local:  # a host that registered here is planned from here
                self.planner.upsert(spec)
        gone = [h for h in self.planner.hosts() if h not in fleet and h not in local]
        self.planner.remove(gone)
        return True

    def local_hosts(self) -> set[str]:
        return set(self.store.host_names())

    def remote_hosts(self) -> frozenset[str]:
        """Hosts of the fleet (in etcd) that the planner keeps though they are not here."""
        with self.lock:
            return frozenset(self.fleet)

    def publish(self, info: pb.HostInfo) -> None:
        """Put INFO's registration in etcd under this shard's long lease (a failure is
        counted; the next round retries it)."""
        lease = self.leases.registrations
        if not lease:
            return  # not joined yet: republish() puts it once the lease is there
        try:
            self.leases.put(f"hosts/{info.host}", info.SerializeToString(), lease)
        except EtcdError as e:
            log.warning(
                "shard %s: registration of %s not published: %s", self.member.name, info.host, e
            )
            return
        with self.lock:
            self.fleet[info.host] = info
            self.fleet_leases[info.host] = lease
            self._fleet_version += 1

    def republish(self) -> None:
        """Registrations held here that etcd lacks (an outage, or a lease run out)."""
        held = {name: h.info for name, h in self.store.host_views().items()}
        with self.lock:
            missing = [info for name, info in held.items() if name not in self.fleet]
        for info in missing:
            self.publish(info)

    def released(self, quiet_s: float) -> Callable[[str, HostState], bool]:
        """Picks the hosts this shard lets go of: registered since with another shard (their
        registration in etcd is under another shard's lease) and silent here for QUIET_S
        seconds. Called with the store locked."""
        with self.lock:
            leases, mine = dict(self.fleet_leases), self.leases.registrations
        now = self.store.clock()

        def pick(name: str, state: HostState) -> bool:
            lease = leases.get(name)
            if lease is None or lease == mine:
                return False
            return (now - state.last_report_ns) / 1e9 > quiet_s

        return pick

    def forget(self, hosts: list[str]) -> None:
        """Delete the registrations of HOSTS this shard forgot, unless another shard has
        put them since (the delete holds only while the key is still under our lease)."""
        for host in hosts:
            key = b64(f"{self.cfg.prefix}hosts/{host}")
            txn = {
                "compare": [
                    {
                        "key": key,
                        "target": "LEASE",
                        "result": "EQUAL",
                        "lease": self.leases.registrations,
                    }
                ],
                "success": [{"request_delete_range": {"key": key}}],
                "failure": [],
            }
            try:
                self.etcd.call("delete", lambda c, t=txn: c.post(c.get_url("/kv/txn"), json=t))
            except EtcdError as e:
                log.warning("shard %s: %s", self.member.name, e)

    # -- ownership ------------------------------------------------------------------

    def current_members(self) -> tuple[Member, ...]:
        with self.lock:
            return self.members

    def owner(self, host: str) -> Member | None:
        return owner_of(host, self.current_members())

    def hosts_owned(self) -> int:
        with self.lock:
            members, names = self.members, set(self.fleet)
        names |= self.local_hosts()
        return sum(1 for h in names if owner_of(h, members) == self.member)

    def fleet_addresses(self) -> list[tuple[str, list[str]]]:
        """(host, addresses) of every registration in etcd."""
        with self.lock:
            return [(h, list(i.addresses)) for h, i in self.fleet.items()]

    def directory(self) -> HostDirectory:
        """The fleet's hosts and addresses (kept until the fleet changes)."""
        with self.lock:
            if self._directory is None or self._directory[0] != self._fleet_version:
                hosts = [(h, list(i.addresses)) for h, i in self.fleet.items()]
                self._directory = (self._fleet_version, HostDirectory(hosts, self.match))
            return self._directory[1]


class ShardCollector:
    """The shard's own figures on /metrics (collector/metrics.toml, [[shard_metric]])."""

    def __init__(self, shard: Shard) -> None:
        self.shard = shard

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> list[Metric]:
        s = self.shard
        with s.lock:
            members, fleet = len(s.members), len(s.fleet)
        out: list[Metric] = [
            GaugeMetricFamily(
                "fabricprobe_shard_members",
                "Collector shards live in etcd, as this one sees them.",
                members,
            ),
            GaugeMetricFamily(
                "fabricprobe_shard_fleet_hosts",
                "Hosts registered with any shard (the plan's fleet).",
                fleet,
            ),
            GaugeMetricFamily(
                "fabricprobe_shard_hosts_owned",
                "Hosts of the fleet this shard owns.",
                s.hosts_owned(),
            ),
            CounterMetricFamily(
                "fabricprobe_shard_etcd_errors",
                "etcd calls that failed.",
                s.etcd.errors + (b.errors if (b := s.leases.beat_etcd) is not s.etcd else 0),
            ),
            CounterMetricFamily(
                "fabricprobe_shard_etcd_watch_restarts",
                "Times etcd's watch stream broke and the fleet was read in full again.",
                s.watch_restarts,
            ),
            CounterMetricFamily(
                "fabricprobe_shard_leases_lost",
                "Times this shard's lease ran out and it joined again.",
                s.leases.lost,
            ),
            GaugeMetricFamily(
                "fabricprobe_shard_records_unreadable",
                "Member or host records in etcd that could not be read, at the last read.",
                s.records_unreadable,
            ),
        ]
        fwd = CounterMetricFamily(
            "fabricprobe_shard_forwarded_spans",
            "Spans sent on to the shard owning their path, by result.",
            labels=["result"],
        )
        with s.spans.forwarder.lock:
            for result, n in s.spans.forwarder.spans.items():
                fwd.add_metric([result], n)
        out.append(fwd)
        routed = CounterMetricFamily(
            "fabricprobe_shard_routed_spans",
            "Spans whose shard this one found, by how: a KV span's source host, the path its"
            " engine trace names, unpaired (no side named the path: its own host), or the"
            " host its resource names.",
            labels=["by"],
        )
        with s.spans.lock:
            for by, n in s.spans.routed.items():
                routed.add_metric([by], n)
        out.append(routed)
        out.append(
            GaugeMetricFamily(
                "fabricprobe_shard_spans_waiting",
                "Engine spans waiting on this shard for the side of their trace that names"
                " their path.",
                s.spans.relay.held,
            )
        )
        return out
