"""Collector shards: who owns a host, member records, the agent's handoff, span routing,
authenticated forwarding, and the shard's metrics against the catalogue."""

from __future__ import annotations

import time
import tomllib
from collections import Counter
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts_pb

from fabricprobe.agent.handoff import Handoff
from fabricprobe.agent.spool import SpoolKey
from fabricprobe.collector.assign import Planner
from fabricprobe.collector.auth import TokenAuth, read_token_file
from fabricprobe.collector.service import admit
from fabricprobe.collector.shard import Shard, ShardCollector, ShardConfig
from fabricprobe.collector.spanroute import FORWARDED, Forwarder
from fabricprobe.collector.store import WindowStore
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.shards import EtcdError, Member, owner_of, parse_endpoints, parse_member
from tests.support.fleet import fast_server_config, running_collector, wait_for
from tests.unit.spanmaker import S, attr, kv_span, span

ROOT = Path(__file__).resolve().parents[2]
A, B, C = (Member(n, f"127.0.0.1:{p}") for n, p in (("a", 4001), ("b", 4002), ("c", 4003)))


def test_owner_is_deterministic_and_a_leaving_member_moves_only_its_hosts() -> None:
    hosts = [f"gpu-{i}" for i in range(3000)]
    three = {h: owner_of(h, [A, B, C]) for h in hosts}
    assert three == {h: owner_of(h, [C, A, B]) for h in hosts}  # order does not matter
    share = Counter(m.name for m in three.values() if m is not None)
    assert all(800 < n < 1200 for n in share.values()), share
    two = {h: owner_of(h, [A, C]) for h in hosts}
    moved = {h for h in hosts if two[h] != three[h]}
    assert moved == {h for h in hosts if three[h] == B}
    assert owner_of("gpu-1", []) is None


def test_member_records_round_trip_and_bad_ones_say_why() -> None:
    m = Member("shard-1", "10.0.0.5:4794", "10.0.0.5:4317", "10.0.0.5:9794")
    assert parse_member(m.record()) == m
    for data, why in (
        (b"{", "not JSON"),
        (b"[]", "not a JSON object"),
        (b'{"name": "a b", "api": "h:1"}', "bad shard name"),
        (b'{"name": "a", "api": "h"}', "bad api address"),
        (b'{"name": "a", "api": "h:1", "otlp": "h:0"}', "bad otlp address"),
        (b'{"name": "a", "api": "h:1", "x": "' + b"y" * 2000 + b'"}', "bytes"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_member(data)
    assert parse_endpoints("127.0.0.1:2379, [::1]:2380") == (("127.0.0.1", 2379), ("::1", 2380))
    for bad in ("", "etcd", "h:0", ",".join(["h:1"] * 9)):
        with pytest.raises(ValueError):
            parse_endpoints(bad)


class FakeEtcd:
    """Members as a test sets them; `down` makes every read fail."""

    def __init__(self, members: list[Member]) -> None:
        self.now = members
        self.down = False
        self.errors = 0

    def members(self, *, serializable: bool = False) -> tuple[list[Member], int]:
        if self.down:
            raise EtcdError("etcd read: refused")
        return sorted(self.now), 0


def handoff(etcd: FakeEtcd, clock: list[float], keep_s: float = 30.0) -> Handoff:
    return Handoff(
        "gpu-7",
        "127.0.0.1:2379",
        prefix="/fabricprobe/",
        refresh_s=1.0,
        keep_s=keep_s,
        clock=lambda: clock[0],
        etcd=etcd,  # type: ignore[arg-type]
    )


def test_handoff_replays_only_when_the_old_shard_died_and_only_what_it_kept() -> None:
    etcd, clock = FakeEtcd([A, B, C]), [100.0]
    h = handoff(etcd, clock)
    first = h.check()
    assert first == owner_of("gpu-7", [A, B, C]) and h.handoffs == 0 and not h.to_replay
    assert h.check() is None  # within refresh_s: etcd is not read again
    for seq in range(1, 41):
        h.acked(SpoolKey(1, seq), b"w%d" % seq)
        clock[0] += 1.0
    # acked at 100..139, now 140: what was acked within the last keep_s (30 s) at the last ack
    assert [k.seq for _, k, _ in h.kept] == list(range(10, 41))
    # a shard joins and takes the host: the old one still holds the windows
    others = [m for m in (A, B, C) if m != first]
    newcomer = next(
        Member(f"n{i}", f"127.0.0.1:{5000 + i}")
        for i in range(100)
        if owner_of("gpu-7", [A, B, C, Member(f"n{i}", f"127.0.0.1:{5000 + i}")]).name == f"n{i}"  # type: ignore[union-attr]
    )
    etcd.now = [A, B, C, newcomer]
    h.soon()
    assert h.check() == newcomer and h.handoffs == 1 and not h.to_replay
    # the newcomer dies: its hosts go back, with the windows it may not have had scraped
    etcd.now = [A, B, C]
    h.soon()
    assert h.check() == first and h.handoffs == 2
    assert [k.seq for k, _ in h.to_replay] == list(range(11, 41))  # within keep_s of now
    assert others  # three members: the host had somewhere else to go


def test_a_shard_that_forgot_the_host_gets_the_kept_windows_again() -> None:
    etcd, clock = FakeEtcd([A, B]), [0.0]
    h = handoff(etcd, clock, keep_s=10.0)
    h.check()
    for seq in range(1, 6):
        h.acked(SpoolKey(1, seq), b"w")
        clock[0] += 4.0
    h.restarted()  # now 20: acked at 0, 4, 8, 12, 16
    assert [k.seq for k, _ in h.to_replay] == [4, 5]


def test_handoff_keeps_its_shard_while_etcd_is_down() -> None:
    etcd, clock = FakeEtcd([A, B]), [0.0]
    h = handoff(etcd, clock)
    owner = h.check()
    etcd.down = True
    h.soon()
    assert h.check() is None and h.owner == owner and h.errors == 1


def shard_with(members: list[Member], me: Member) -> Shard:
    store = WindowStore()
    s = Shard(
        ShardConfig(etcd=(("127.0.0.1", 1),), name=me.name),
        store,
        Planner(),
        admit,
        etcd=FakeEtcd(members),  # type: ignore[arg-type]
    )
    s.member, s.fleet.members = me, tuple(members)
    for h in ("gpu-1", "gpu-2", "gpu-3", "gpu-4"):
        s.fleet.hosts[h] = pb.HostInfo(host=h, addresses=[f"10.0.0.{h[-1]}"])
    return s


def traced(trace: int, *spans: object, resource: dict[str, str] | None = None) -> object:
    req = ts_pb.ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    for k, v in (resource or {}).items():
        rs.resource.attributes.append(attr(k, v))
    ss = rs.scope_spans.add()
    for sp in spans:
        sp.trace_id = bytes([trace]) * 16  # type: ignore[attr-defined]
        ss.spans.append(sp)
    return req


def test_spans_go_to_the_owner_of_their_path_by_trace() -> None:
    members = [A, B, C]
    owners = {h: owner_of(h, members) for h in ("gpu-1", "gpu-2", "gpu-3", "gpu-4")}
    host, far = next((h, m) for h, m in owners.items() if m != A)
    s = shard_with(members, A)
    t = time.time_ns()
    req = ts_pb.ExportTraceServiceRequest()
    # trace 1: a KV transfer from HOST (another shard's) and its request root, no host
    one = traced(1, kv_span("r1", t, 0.01, host, "gpu-9", 1 << 20), span("llm_request", t, t + S))
    # trace 2: names no host: kept here
    two = traced(2, span("decode", t, t + S))
    # trace 3: the resource names HOST by address
    three = traced(3, span("prefill", t, t + S), resource={"host.name": f"10.0.0.{host[-1]}"})
    for r in (one, two, three):
        req.resource_spans.extend(r.resource_spans)  # type: ignore[attr-defined]
    keep, sent = s.spans.route(req)
    assert sent == 3
    kept = [
        sp.trace_id[0] for rs in keep.resource_spans for ss in rs.scope_spans for sp in ss.spans
    ]
    assert kept == [2]
    dest, fwd, n = s.spans.forwarder.queue.get_nowait()  # type: ignore[misc]
    assert dest == far and n == 3
    got = {sp.trace_id[0] for rs in fwd.resource_spans for ss in rs.scope_spans for sp in ss.spans}
    assert got == {1, 3}
    assert all(
        any(a.key == FORWARDED and a.value.string_value == "a" for a in rs.resource.attributes)
        for rs in fwd.resource_spans
    )
    # what arrives forwarded is never forwarded again (two shards with views apart)
    again, sent = shard_with(members, far).spans.route(fwd)
    assert sent == 0 and again is fwd


def test_a_full_forward_queue_drops_and_counts() -> None:
    fwd = Forwarder(ShardConfig(etcd=(("127.0.0.1", 1),), name="a"), max_queue=1)
    fwd.put(B, ts_pb.ExportTraceServiceRequest(), 5)
    fwd.put(B, ts_pb.ExportTraceServiceRequest(), 7)
    assert fwd.spans["queue_full"] == 7


def test_forwarding_authenticates_like_any_client(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("shard-a " + "s" * 24 + " ingest\n")
    ok = tmp_path / "ok"
    ok.write_text("s" * 24)
    bad = tmp_path / "bad"
    bad.write_text("x" * 24)
    with running_collector(fast_server_config(), auth=TokenAuth(read_token_file(tokens))) as server:
        owner = Member("b", f"127.0.0.1:{server.port}")
        t = time.time_ns()
        req = traced(1, kv_span("r1", t, 0.01, "gpu-1", "gpu-2", 1 << 20))
        for token, result in ((ok, "sent"), (bad, "failed"), (None, "failed")):
            cfg = ShardConfig(etcd=(("127.0.0.1", 1),), name="a", token_file=str(token or ""))
            fwd = Forwarder(cfg)
            fwd.start()
            fwd.put(owner, req, 1)
            wait_for(lambda f=fwd, r=result: f.spans[r] == 1, 10, f"forward {result}")  # type: ignore[misc]
            fwd.stop()
        assert server.attribution.ingest.received_total == 1  # the authenticated one only


def test_shard_metrics_match_the_catalogue() -> None:
    s = shard_with([A, B], A)
    cat = tomllib.loads((ROOT / "collector" / "metrics.toml").read_text())["shard_metric"]
    got = {}
    for fam in ShardCollector(s).collect():
        name = fam.name + ("_total" if fam.type == "counter" else "")
        labels = sorted({k for smp in fam.samples for k in smp.labels})
        got[name] = (fam.type, fam.documentation, labels, len(fam.samples))
    assert sorted(got) == sorted(m["name"] for m in cat)
    for m in cat:
        kind, help_, labels, n = got[m["name"]]
        assert (kind, help_, labels) == (m["type"], m["help"], sorted(m["labels"])), m["name"]
        assert n, m["name"]
    owned = next(
        f for f in ShardCollector(s).collect() if f.name == "fabricprobe_shard_hosts_owned"
    )
    assert owned.samples[0].value == sum(
        1 for h in ("gpu-1", "gpu-2", "gpu-3", "gpu-4") if owner_of(h, [A, B]) == A
    )


def test_a_shard_lets_go_of_hosts_that_registered_with_another_shard() -> None:
    now = [1_000 * S]
    s = shard_with([A, B], A)
    s.store = WindowStore(clock=lambda: now[0])
    s.leases.registrations = 7
    hosts = [f"gpu-{i}" for i in range(6)]
    for h in hosts:
        s.store.register(pb.HostInfo(host=h, addresses=["10.0.0.1"]))
    s.fleet.leases = {"gpu-0": 7, "gpu-1": 9, "gpu-2": 9}  # gpu-1, gpu-2 under B's lease
    now[0] += 10 * S  # silent here for 10 s
    assert s.store.forget_idle(also=s.released(30.0)) == []  # not yet quiet long enough
    assert sorted(s.store.forget_idle(also=s.released(5.0))) == ["gpu-1", "gpu-2"]
    assert sorted(s.store.hosts) == ["gpu-0", "gpu-3", "gpu-4", "gpu-5"]
