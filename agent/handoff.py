"""Which collector shard this agent reports to, and what it hands a new one.

With `etcd` set, the agent reads the live shards from etcd (fabricprobe.core.shards)
every `etcd_refresh_s`, and at once after a failed send, and reports to the shard that
owns its host. etcd being unreachable keeps the shard it has.

"No acknowledged window is lost" when a shard dies: a window the shard acknowledged but
Prometheus had not yet scraped lived only in that shard's memory. So the agent keeps
the windows acknowledged within the last `handoff_keep_s` seconds (bounded in count and
bytes too) and, when it moves because its shard left the member set, replays them to
the new owner before anything newer; the new owner takes each (host, epoch, seq) once
and counts the rest as duplicates. A move to a shard that joined (the old one is still
a member and still holds the windows) replays nothing; a shard that answers "register
first" (it restarted and lost its memory) gets the replay too.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

from fabricprobe.agent.spool import SpoolKey
from fabricprobe.core.shards import Etcd, EtcdError, Member, owner_of, parse_endpoints

log = logging.getLogger("fabricprobe.agent")

MAX_KEPT = 720  # windows kept for a handoff (two hours of 10 s windows at most)
MAX_KEPT_BYTES = 16 << 20


class Handoff:
    """The agent's shard, from etcd, and the acknowledged windows kept for a move."""

    def __init__(
        self,
        host: str,
        endpoints: str,
        *,
        prefix: str,
        refresh_s: float,
        keep_s: float,
        clock: Callable[[], float] = time.monotonic,
        etcd: Etcd | None = None,
        ca_file: str = "",
        cert_file: str = "",
        key_file: str = "",
    ) -> None:
        self.host = host
        self.etcd = etcd or Etcd(
            parse_endpoints(endpoints),
            prefix=prefix,
            timeout=2.0,
            ca_file=ca_file,
            cert_file=cert_file,
            key_file=key_file,
        )
        self.refresh_s, self.keep_s, self.clock = refresh_s, keep_s, clock
        self.owner: Member | None = None
        self._next = 0.0
        self.kept: deque[tuple[float, SpoolKey, bytes]] = deque()
        self._kept_bytes = 0
        self.to_replay: list[tuple[SpoolKey, bytes]] = []
        self.handoffs = 0
        self.replayed = 0
        self.errors = 0

    def soon(self) -> None:
        """Read the members at the next check (a send failed)."""
        self._next = 0.0

    def check(self) -> Member | None:
        """The new owner when this host's owner changed (else None). Reads etcd at most
        every refresh_s."""
        now = self.clock()
        if now < self._next:
            return None
        self._next = now + self.refresh_s
        try:
            members, _ = self.etcd.members(serializable=True)
        except EtcdError as e:
            self.errors += 1
            log.warning("shard members unknown, staying with %s: %s", self.owner, e)
            return None
        new = owner_of(self.host, members)
        if new is None or new == self.owner:
            return None
        old = self.owner
        self.owner = new
        if old is None:
            return new  # the first owner: nothing to hand over
        self.handoffs += 1
        if old.name not in {m.name for m in members}:
            # the old shard is gone, and with it what Prometheus had not scraped
            self.to_replay = [(k, d) for t, k, d in self.kept if now - t <= self.keep_s]
        log.info(
            "host %s moves from shard %s to %s (%d windows to replay)",
            self.host,
            old.name,
            new.name,
            len(self.to_replay),
        )
        return new

    def restarted(self) -> None:
        """The shard forgot this host (it restarted under the same name and address, so
        the members did not change): what it had taken and not yet had scraped is gone
        with its memory, so the kept windows are replayed to it as to a new owner."""
        now = self.clock()
        self.to_replay = [(k, d) for t, k, d in self.kept if now - t <= self.keep_s]

    def acked(self, key: SpoolKey, data: bytes) -> None:
        """KEY (its serialized report DATA) was acknowledged: keep it for keep_s."""
        if self.keep_s <= 0:
            return
        now = self.clock()
        self.kept.append((now, key, data))
        self._kept_bytes += len(data)
        while self.kept and (
            now - self.kept[0][0] > self.keep_s
            or len(self.kept) > MAX_KEPT
            or self._kept_bytes > MAX_KEPT_BYTES
        ):
            self._kept_bytes -= len(self.kept.popleft()[2])
