"""A collector shard's view of the fleet in etcd: the live shards' member records and
every host's registration with the lease it is under (collector/shard.py keeps one).

The view is changed two ways: a full read of etcd replaces it (`replace`), and the watch
stream's changes update it (`apply`); both check each record as the other does, and both
say which registrations the planner must add or drop. It does no I/O itself: the shard
reads etcd, `Watch` follows its watch stream.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from fabricprobe.collector.assign import HostSpec
from fabricprobe.collector.attribution.linking import HostDirectory, MatchConfig
from fabricprobe.collector.hosttable import MAX_HOSTS
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.shards import MAX_MEMBERS, Change, Etcd, EtcdError, Member, parse_member

log = logging.getLogger("fabricprobe.collector.shard")

MAX_REGISTRATION = 64 << 10  # bytes of one host's registration in etcd

Admit = Callable[[pb.HostInfo], HostSpec]  # checks a registration, returns its plan entry


@dataclass(frozen=True)
class FleetCounts:
    """How large the view is, and how many records it could not read (a copy)."""

    members: int
    hosts: int
    unreadable: int


@dataclass(frozen=True)
class PlanChanges:
    """What a read or a change of etcd means for the planner: registrations to plan
    (another shard's hosts) and hosts to drop."""

    upserts: list[HostSpec]
    removes: list[str]


class Fleet:
    """Members and registrations as this shard last read them; thread-safe."""

    def __init__(self, admit: Admit, prefix: str, match: MatchConfig) -> None:
        self.admit, self.prefix, self.match = admit, prefix, match
        self.lock = threading.Lock()
        self.members: tuple[Member, ...] = ()
        self.hosts: dict[str, pb.HostInfo] = {}  # every registration in etcd, by host
        self.leases: dict[str, int] = {}  # host -> the lease its registration is under
        self.revision = -1  # etcd's at the last full read; -1: read in full next
        self.read_at = 0.0  # monotonic time of the last full read
        self.records_unreadable = 0  # member or host records, at the last read
        self.watched = 0  # changes the watch delivered
        self._version = 0  # moves with the hosts and their addresses
        self._directory: tuple[int, HostDirectory] | None = None

    def registration(self, name: str, value: bytes) -> tuple[pb.HostInfo, HostSpec]:
        """A host's registration from etcd, checked; DecodeError or ValueError when bad."""
        if len(value) > MAX_REGISTRATION:
            raise ValueError("registration too large")
        info = pb.HostInfo.FromString(value)
        if info.host != name:
            raise ValueError("key and host differ")
        return info, self.admit(info)

    def replace(
        self,
        members: Iterable[Member],
        rows: list[tuple[bytes, bytes, int]],
        bad: int,
        revision: int,
    ) -> list[HostSpec]:
        """A full read: MEMBERS and the registration ROWS (key, value, lease) at REVISION,
        BAD records already found unreadable; the registrations read, for the planner."""
        bad += max(0, len(rows) - MAX_HOSTS)
        hosts: dict[str, pb.HostInfo] = {}
        leases: dict[str, int] = {}
        specs: list[HostSpec] = []
        for key, value, lease in rows[:MAX_HOSTS]:
            name = key.decode(errors="replace").rpartition("/")[2]
            try:
                info, spec = self.registration(name, value)
            except (DecodeError, ValueError):
                bad += 1
                continue
            specs.append(spec)
            hosts[name], leases[name] = info, lease
        with self.lock:
            self.members = tuple(members)
            if hosts.keys() != self.hosts.keys() or any(
                list(hosts[h].addresses) != list(self.hosts[h].addresses) for h in hosts
            ):
                self._version += 1
            self.hosts, self.leases = hosts, leases
            self.records_unreadable = bad
            self.revision = revision
            self.read_at = time.monotonic()
        return specs

    def apply(self, changes: list[Change], local: set[str]) -> PlanChanges:
        """Changes the watch delivered: member records and host registrations put or
        deleted, checked as a full read checks them; what they mean for the planner for
        hosts not held here (LOCAL)."""
        shards_key, hosts_key = self.prefix + "shards/", self.prefix + "hosts/"
        out = PlanChanges([], [])
        with self.lock:
            by = {m.name: m for m in self.members}
            for ch in changes:
                self.watched += 1
                key = ch.key.decode(errors="replace")
                if key.startswith(shards_key):
                    self._member_change(by, key[len(shards_key) :], ch)
                elif key.startswith(hosts_key):
                    self._host_change(key[len(hosts_key) :], ch, local, out)
            self.members = tuple(sorted(by.values()))
        return out

    def _member_change(self, by: dict[str, Member], name: str, ch: Change) -> None:
        if ch.deleted:
            by.pop(name, None)
            return
        try:
            m = parse_member(ch.value)
            if m.name != name:
                raise ValueError("key and name differ")
        except ValueError:
            self.records_unreadable += 1
            return
        if name in by or len(by) < MAX_MEMBERS:
            by[name] = m

    def _host_change(self, name: str, ch: Change, local: set[str], out: PlanChanges) -> None:
        if ch.deleted:
            if self.hosts.pop(name, None) is not None:
                self.leases.pop(name, None)
                self._version += 1
                if name not in local:
                    out.removes.append(name)
            return
        try:
            info, spec = self.registration(name, ch.value)
        except (DecodeError, ValueError):
            self.records_unreadable += 1
            return
        if name not in self.hosts and len(self.hosts) >= MAX_HOSTS:
            self.records_unreadable += 1
            return
        self.hosts[name], self.leases[name] = info, ch.lease
        self._version += 1
        if name not in local:
            out.upserts.append(spec)

    def put(self, info: pb.HostInfo, lease: int) -> None:
        """INFO's registration, published under LEASE by this shard."""
        with self.lock:
            self.hosts[info.host] = info
            self.leases[info.host] = lease
            self._version += 1

    def forget_revision(self) -> None:
        """Read etcd in full next (the watch broke, or a lease ran out)."""
        with self.lock:
            self.revision = -1

    def current_members(self) -> tuple[Member, ...]:
        with self.lock:
            return self.members

    def names(self) -> frozenset[str]:
        with self.lock:
            return frozenset(self.hosts)

    def lease_of(self) -> dict[str, int]:
        """host -> the lease its registration is under (a copy)."""
        with self.lock:
            return dict(self.leases)

    def addresses(self) -> list[tuple[str, list[str]]]:
        """(host, addresses) of every registration."""
        with self.lock:
            return [(h, list(i.addresses)) for h, i in self.hosts.items()]

    def directory(self) -> HostDirectory:
        """The fleet's hosts and addresses (kept until the fleet changes)."""
        with self.lock:
            if self._directory is None or self._directory[0] != self._version:
                hosts = [(h, list(i.addresses)) for h, i in self.hosts.items()]
                self._directory = (self._version, HostDirectory(hosts, self.match))
            return self._directory[1]

    def counts(self) -> FleetCounts:
        with self.lock:
            return FleetCounts(len(self.members), len(self.hosts), self.records_unreadable)


class Watch:
    """Applies etcd's changes as its watch stream delivers them, from the revision of the
    last full read on. A stream that breaks is counted, and the fleet is read in full
    again (by the shard's refresh loop) before the next watch starts."""

    def __init__(
        self,
        etcd: Etcd,
        fleet: Fleet,
        apply: Callable[[list[Change]], None],
        refresh_s: float,
        name: Callable[[], str],
    ) -> None:
        self.etcd, self.fleet, self.apply = etcd, fleet, apply
        self.refresh_s, self.name = refresh_s, name
        self.watching = False  # a stream is open and delivering
        self.restarts = 0  # streams that broke
        self._open: list[Any] = []  # the open stream's response (close() ends it)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            start = self.fleet.revision
            if start < 0:  # not read yet, or the last watch broke: wait for a full read
                stop.wait(min(self.refresh_s, 1.0))
                continue
            opened: list[Any] = []
            self._open = opened
            try:
                for changes in self.etcd.watch(start + 1, opened):
                    self.watching = True
                    if changes:
                        self.apply(changes)
            except EtcdError as e:
                if stop.is_set():
                    return
                self.restarts += 1
                log.warning("shard %s: %s; reading etcd in full", self.name(), e)
            self.watching = False
            self.fleet.forget_revision()
            stop.wait(self.refresh_s)

    def close(self) -> None:
        """End the stream from another thread (a blocked read sees its socket shut)."""
        for resp in list(self._open):
            with contextlib.suppress(Exception):
                fd = resp.raw._fp.fileno()  # the HTTP response's socket
                sock = socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM)
                sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            with contextlib.suppress(Exception):
                resp.close()
