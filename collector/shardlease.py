"""A collector shard's two etcd leases (see collector/shard.py).

A short one (the shard's `ttl_s`, a few seconds) holds the member record, so that a shard
killed outright leaves the member set within the TTL; a long one (`forget_after`) holds
the registrations of the hosts that registered with the shard, so that a host whose shard
died stays in the fleet's plan until it registers with its new owner. The keepalives use
their own etcd client, on the shard's beat thread: a long read of the fleet must never
hold them past the short lease's TTL.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from fabricprobe.core.shards import Etcd, EtcdError, Member, b64

log = logging.getLogger("fabricprobe.collector.shard")


class Leases:
    """The member lease and the registrations' lease of one shard, and the puts under them."""

    def __init__(
        self, etcd: Etcd, beat_etcd: Etcd, *, prefix: str, ttl_s: int, forget_after: float
    ) -> None:
        self.etcd, self.beat_etcd, self.prefix = etcd, beat_etcd, prefix
        self.ttl_s = max(2, int(ttl_s))
        self.long_ttl_s = max(self.ttl_s * 2, int(forget_after))
        self.member_lease = 0  # holds the member record
        self.registrations = 0  # holds this shard's hosts' registrations
        self.lost = 0  # times a lease ran out and the shard joined again
        self._lock = threading.Lock()

    def grant(self, member: Member, etcd: Etcd | None = None) -> None:
        """A fresh member lease with MEMBER's record under it (and the registrations' lease
        when there is none). Raises EtcdError."""
        etcd = etcd or self.etcd

        def grant(c: Any, ttl: int) -> int:
            return int(c.post(c.get_url("/lease/grant"), json={"TTL": ttl, "ID": 0})["ID"])

        with self._lock:
            self.member_lease = int(etcd.call("lease grant", lambda c: grant(c, self.ttl_s)))
            if not self.registrations:
                self.registrations = int(
                    etcd.call("lease grant", lambda c: grant(c, self.long_ttl_s))
                )
            self.put(f"shards/{member.name}", member.record(), self.member_lease, etcd)

    def put(self, sub: str, value: bytes, lease: int, etcd: Etcd | None = None) -> None:
        """VALUE at the prefix's SUB key under LEASE. Raises EtcdError."""
        key = self.prefix + sub

        def put(c: Any) -> None:
            c.post(
                c.get_url("/kv/put"), json={"key": b64(key), "value": b64(value), "lease": lease}
            )

        (etcd or self.etcd).call(f"put {key}", put)

    def keepalive(self, member: Member) -> bool:
        """Refresh both leases; True when one had run out (a pause longer than its TTL) and
        MEMBER joined again under fresh ones. Raises EtcdError."""
        for lease in (self.member_lease, self.registrations):

            def refresh(c: Any, lease: int = lease) -> int:
                doc = c.post(c.get_url("/lease/keepalive"), json={"ID": lease})
                return int(doc["result"].get("TTL", -1))

            if self.beat_etcd.call("keepalive", refresh) <= 0:
                self.lost += 1
                log.warning("shard %s: lease %x ran out; joining again", member.name, lease)
                if lease == self.registrations:
                    self.registrations = 0
                self.grant(member, self.beat_etcd)
                return True
        return False

    def revoke(self, member: Member) -> None:
        """Revoke the member lease, so the others take the shard's hosts at once."""
        if not self.member_lease:
            return

        def revoke(c: Any) -> None:
            c.post(c.get_url("/lease/revoke"), json={"ID": self.member_lease})

        try:
            self.etcd.call("lease revoke", revoke)
        except EtcdError as e:
            log.warning("shard %s: %s", member.name, e)
