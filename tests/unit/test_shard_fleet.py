"""A shard's view of the fleet in etcd (collector/shardfleet.py): a full read replaces it,
the watch's changes update it, each record checked the same way; and the watch loop."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from fabricprobe.collector.attribution.linking import MatchConfig
from fabricprobe.collector.service import admit
from fabricprobe.collector.shardfleet import MAX_REGISTRATION, Fleet, Watch
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.shards import Change, EtcdError, Member

PREFIX = "/fabricprobe/"
A = Member("shard-a", "10.0.0.1:4794")
B = Member("shard-b", "10.0.0.2:4794")


def reg(host: str, *addresses: str) -> bytes:
    return pb.HostInfo(host=host, addresses=list(addresses or ["10.1.0.1"])).SerializeToString()


def row(host: str, lease: int = 7, value: bytes | None = None) -> tuple[bytes, bytes, int]:
    return (f"{PREFIX}hosts/{host}".encode(), reg(host) if value is None else value, lease)


def put(key: str, value: bytes, lease: int = 0) -> Change:
    return Change(False, (PREFIX + key).encode(), value, lease, 1)


def delete(key: str) -> Change:
    return Change(True, (PREFIX + key).encode(), b"", 0, 1)


def fleet() -> Fleet:
    return Fleet(admit, PREFIX, MatchConfig())


def test_a_full_read_replaces_the_view_and_counts_bad_records() -> None:
    f = fleet()
    rows = [row("gpu-1"), row("gpu-2", 9), row("gpu-3", value=b"\xff"), row("x", value=reg("y"))]
    rows.append(row("big", value=b"\0" * (MAX_REGISTRATION + 1)))
    specs = f.replace([B, A], rows, bad=1, revision=42)
    assert [s.name for s in specs] == ["gpu-1", "gpu-2"]
    assert f.current_members() == (B, A) and f.names() == frozenset({"gpu-1", "gpu-2"})
    assert f.lease_of() == {"gpu-1": 7, "gpu-2": 9} and f.revision == 42 and f.read_at > 0
    assert f.counts().unreadable == 4  # the one etcd found, a garbled, a misnamed, a huge one
    f.forget_revision()
    assert f.revision == -1


def test_the_watch_changes_update_the_view_and_say_what_to_plan() -> None:
    f = fleet()
    f.replace([A], [row("gpu-1"), row("here")], 0, 1)
    plan = f.apply(
        [
            put("shards/shard-b", B.record()),
            put("shards/shard-c", Member("other", "10.0.0.3:1").record()),  # name differs
            put("hosts/gpu-2", reg("gpu-2"), lease=11),
            delete("hosts/gpu-1"),
            delete("hosts/here"),
            put("hosts/bad", b"\xff"),
            delete("shards/shard-a"),
        ],
        local={"here"},
    )
    assert f.current_members() == (B,)
    assert [s.name for s in plan.upserts] == ["gpu-2"] and plan.removes == ["gpu-1"]
    assert f.names() == frozenset({"gpu-2"}) and f.lease_of() == {"gpu-2": 11}
    assert f.counts().unreadable == 2 and f.watched == 7


def test_the_directory_is_kept_until_the_fleet_moves() -> None:
    f = fleet()
    f.replace([A], [row("gpu-1")], 0, 1)
    first = f.directory()
    assert f.directory() is first
    f.replace([A], [row("gpu-1")], 0, 2)  # the same hosts and addresses
    assert f.directory() is first
    f.put(pb.HostInfo(host="gpu-2", addresses=["10.1.0.2"]), 5)
    assert f.directory() is not first and f.addresses()[-1] == ("gpu-2", ["10.1.0.2"])
    assert f.counts().hosts == 2 and f.counts().members == 1


class ScriptedEtcd:
    """Watch streams as a test writes them: each a list of batches, then a break."""

    def __init__(self, streams: list[list[list[Change]]], stop: threading.Event) -> None:
        self.streams, self.stop, self.starts = streams, stop, []  # type: ignore[var-annotated]

    def watch(self, start_revision: int, opened: list[Any]) -> Iterator[list[Change]]:
        self.starts.append(start_revision)
        if not self.streams:
            self.stop.set()
            raise EtcdError("watch: etcd gone")
        yield from self.streams.pop(0)
        raise EtcdError("watch: the stream broke")


def test_the_watch_applies_batches_and_asks_for_a_full_read_when_it_breaks() -> None:
    f, stop = fleet(), threading.Event()
    f.replace([A], [], 0, revision=10)
    etcd = ScriptedEtcd([[[], [put("hosts/gpu-1", reg("gpu-1"))]]], stop)
    got: list[frozenset[str]] = []

    def apply(changes: list[Change]) -> None:
        f.apply(changes, set())
        got.append(f.names())

    def reread() -> None:  # the shard's refresh loop reads in full after a break
        while not stop.is_set():
            if f.revision < 0:
                f.replace([A], [], 0, revision=20)
            stop.wait(0.01)

    w = Watch(etcd, f, apply, refresh_s=0.01, name=lambda: "shard-a")  # type: ignore[arg-type]
    helper = threading.Thread(target=reread)
    helper.start()
    w.run(stop)
    helper.join()
    assert etcd.starts == [11, 21]  # from the revision after each full read
    assert got == [frozenset({"gpu-1"})]  # the empty batch is only the watch in place
    assert w.restarts == 1 and not w.watching
    w.close()  # nothing open: nothing to do
