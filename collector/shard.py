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

The view of the fleet (member records, registrations and their leases) and the watch that
keeps it current are in collector/shardfleet.py. Spans reach the shard that owns their
path through `spans`, its SpanRouter (collector/spanroute.py).

A shard takes any host that registers or reports to it (agents choose their owner; a
refusal would only strand a host whose view of the members lags), and lets go of a host
once the host registered with another shard (its registration in etcd is under that
shard's lease) and stopped reporting here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from fabricprobe.collector.assign import Planner
from fabricprobe.collector.attribution.linking import HostDirectory, MatchConfig
from fabricprobe.collector.shardfleet import Admit, Fleet, Watch
from fabricprobe.collector.shardlease import Leases
from fabricprobe.collector.spanroute import Forwarder, SpanRouter
from fabricprobe.collector.store import MAX_HOSTS, HostState, WindowStore
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.shards import (
    DEFAULT_PREFIX,
    Change,
    Etcd,
    EtcdError,
    Member,
    b64,
    owner_of,
)

log = logging.getLogger("fabricprobe.collector.shard")


@dataclass(frozen=True)
class ShardConfig:
    """How a collector joins the shards (collector/configsections.py fills one)."""

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
    # names their path (collector/attribution/spanpath.py), then go by their own host
    span_hold_s: float = 10.0
    # while etcd's watch stream delivers the changes, the fleet is read in full only
    # this often (a check on the watch); without the watch, every refresh_s it moved
    resync_s: float = 300.0
    etcd_ca_file: str = ""
    etcd_cert_file: str = ""
    etcd_key_file: str = ""


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
        self.cfg, self.store, self.planner = cfg, store, planner
        self.forget_after = forget_after
        self.etcd = etcd or etcd_client(cfg)
        # the lease keep-alive has a client of its own: a watch or a read never delays it
        self.leases = Leases(
            self.etcd,
            etcd or etcd_client(cfg),
            prefix=cfg.prefix,
            ttl_s=cfg.ttl_s,
            forget_after=forget_after,
        )
        self.member = Member(cfg.name, cfg.advertise_api)
        self.fleet = Fleet(admit, cfg.prefix, match or MatchConfig())
        self.watch = Watch(
            self.etcd, self.fleet, self.apply, cfg.refresh_s, lambda: self.member.name
        )
        self.spans = SpanRouter(self, Forwarder(cfg), store.clock, hold_s=cfg.span_hold_s)
        self._stop = threading.Event()
        self._sync_lock = threading.RLock()  # a full read and a watch's changes, one at a time
        self._threads: list[threading.Thread] = []

    # -- lifecycle ----------------------------------------------------------------------

    def start(self, member: Member) -> None:
        """Join as MEMBER: its record under a fresh lease, the fleet read once, then
        threads that keep both up to date. Raises EtcdError when etcd cannot be reached."""
        self.member = member
        self.leases.grant(member)
        self.sync(force=True)
        self.spans.forwarder.start()
        for name, run in (
            ("shard", self._loop),
            ("shard-beat", self._beat_loop),
            ("shard-watch", lambda: self.watch.run(self._stop)),
        ):
            t = threading.Thread(target=run, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        members = len(self.fleet.current_members())
        log.info("shard %s joined: api=%s members=%d", member.name, member.api, members)

    def _loop(self) -> None:
        while not self._stop.wait(self.cfg.refresh_s):
            self.spans.relay.expire()
            try:
                if not self.watch.watching:
                    self.sync()
                elif time.monotonic() - self.fleet.read_at > self.cfg.resync_s:
                    self.sync(force=True)  # the watch's check: the whole fleet once more
                self.republish()
            except EtcdError as e:
                log.warning("shard %s: %s", self.member.name, e)

    def _beat_loop(self) -> None:
        while not self._stop.wait(max(2, self.cfg.ttl_s) / 3):
            try:
                if self.leases.keepalive(self.member):
                    # the next sync reads all, republish() puts ours back
                    self.fleet.forget_revision()
            except EtcdError as e:
                log.warning("shard %s: %s", self.member.name, e)

    def stop(self) -> None:
        """Leave: revoke the member lease so the others take this shard's hosts at once."""
        self._stop.set()
        self.watch.close()
        for t in self._threads:
            t.join(timeout=5)
        self.spans.forwarder.stop()
        self.leases.revoke(self.member)

    # -- the fleet in etcd --------------------------------------------------------------

    def apply(self, changes: list[Change]) -> None:
        """Changes the watch delivered, into the view and the planner."""
        with self._sync_lock:
            plan = self.fleet.apply(changes, self.local_hosts())
            for spec in plan.upserts:
                self.planner.upsert(spec)
            if plan.removes:
                self.planner.remove(plan.removes)

    def sync(self, *, force: bool = False) -> bool:
        """Re-read members and registrations if etcd changed; True when it did."""
        with self._sync_lock:
            rev = self.etcd.revision()
            if rev == self.fleet.revision and not force:
                return False
            members, bad = self.etcd.members()
            rows = self.etcd.read_prefix("hosts/", MAX_HOSTS + 1)
            specs = self.fleet.replace(members, rows, bad, rev)
            local = self.local_hosts()
            for spec in specs:
                if spec.name not in local:  # a host that registered here is planned from here
                    self.planner.upsert(spec)
            fleet = self.fleet.names()
            gone = [h for h in self.planner.hosts() if h not in fleet and h not in local]
            self.planner.remove(gone)
            return True

    def local_hosts(self) -> set[str]:
        return set(self.store.host_names())

    def remote_hosts(self) -> frozenset[str]:
        """Hosts of the fleet (in etcd) that the planner keeps though they are not here."""
        return self.fleet.names()

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
        self.fleet.put(info, lease)

    def republish(self) -> None:
        """Registrations held here that etcd lacks (an outage, or a lease run out)."""
        held = {name: h.info for name, h in self.store.host_views().items()}
        published = self.fleet.names()
        for info in [info for name, info in held.items() if name not in published]:
            self.publish(info)

    def released(self, quiet_s: float) -> Callable[[str, HostState], bool]:
        """Picks the hosts this shard lets go of: registered since with another shard (their
        registration in etcd is under another shard's lease) and silent here for QUIET_S
        seconds. Called with the store locked."""
        leases, mine = self.fleet.lease_of(), self.leases.registrations
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
        return self.fleet.current_members()

    def owner(self, host: str) -> Member | None:
        return owner_of(host, self.current_members())

    def hosts_owned(self) -> int:
        members, names = self.fleet.current_members(), set(self.fleet.names())
        names |= self.local_hosts()
        return sum(1 for h in names if owner_of(h, members) == self.member)

    def fleet_addresses(self) -> list[tuple[str, list[str]]]:
        """(host, addresses) of every registration in etcd."""
        return self.fleet.addresses()

    def directory(self) -> HostDirectory:
        """The fleet's hosts and addresses (kept until the fleet changes)."""
        return self.fleet.directory()


def etcd_client(cfg: ShardConfig) -> Etcd:
    return Etcd(
        cfg.etcd,
        prefix=cfg.prefix,
        ca_file=cfg.etcd_ca_file,
        cert_file=cfg.etcd_cert_file,
        key_file=cfg.etcd_key_file,
    )


class ShardCollector:
    """The shard's own figures on /metrics (collector/metrics.toml, [[shard_metric]])."""

    def __init__(self, shard: Shard) -> None:
        self.shard = shard

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> list[Metric]:
        s = self.shard
        fleet = s.fleet.counts()
        out: list[Metric] = [
            GaugeMetricFamily(
                "fabricprobe_shard_members",
                "Collector shards live in etcd, as this one sees them.",
                fleet.members,
            ),
            GaugeMetricFamily(
                "fabricprobe_shard_fleet_hosts",
                "Hosts registered with any shard (the plan's fleet).",
                fleet.hosts,
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
                s.watch.restarts,
            ),
            CounterMetricFamily(
                "fabricprobe_shard_leases_lost",
                "Times this shard's lease ran out and it joined again.",
                s.leases.lost,
            ),
            GaugeMetricFamily(
                "fabricprobe_shard_records_unreadable",
                "Member or host records in etcd that could not be read, at the last read.",
                fleet.unreadable,
            ),
        ]
        fwd = CounterMetricFamily(
            "fabricprobe_shard_forwarded_spans",
            "Spans sent on to the shard owning their path, by result.",
            labels=["result"],
        )
        for result, n in s.spans.forwarder.counts().items():
            fwd.add_metric([result], n)
        out.append(fwd)
        routed = CounterMetricFamily(
            "fabricprobe_shard_routed_spans",
            "Spans whose shard this one found, by how: a KV span's source host, the path its"
            " engine trace names, unpaired (no side named the path: its own host), or the"
            " host its resource names.",
            labels=["by"],
        )
        for by, n in s.spans.routed_counts().items():
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
