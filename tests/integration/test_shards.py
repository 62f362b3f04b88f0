"""Collector shards on etcd, with one of them killed: a real etcd (Debian's), three
collector shards with real gRPC on loopback (two in this process, one as a `probe
collector` process), a real Prometheus scraping all of them, and loopback agents that
find their shard in etcd.

The process, which owns host-2, gets SIGKILL: no drain, no goodbye to etcd, its lease
runs out by itself. Then: its hosts report to the others within one window; every
window any shard acknowledged is held by a live shard with no seq missing (the agents
replay what the dead one had taken, the new owner drops duplicates); stage spans sent to
a shard that does not own their path are joined on the owner, before and after; and
every dashboard query still returns data.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from fabricprobe.agent.agent import Agent
from fabricprobe.cli import main
from fabricprobe.collector.assign import PlanConfig
from fabricprobe.collector.service import ApiConfig, CollectorServer
from fabricprobe.collector.shard import ShardConfig
from fabricprobe.core import shards
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.shards import Etcd, Member, b64, owner_of
from tests.support.etcd import running_etcd
from tests.support.feeds import fixture_checks, live_feed, rising_ethtool
from tests.support.fleet import (
    FIXTURES,
    HOSTS,
    fast_server_config,
    free_port,
    loopback_agent_config,
    scrape,
    wait_for,
)
from tests.support.prom import FABRIC_ROWS, missing_queries, running_prometheus

WINDOW_S = 4.0  # the shards' report interval: a dead shard's hosts must move within it
TTL_S = 2  # the shards' etcd lease
JOINED = "fabricprobe_path_explained_seconds"  # KV transfers joined with their path RTT
AGENT_METRICS = {h: free_port(h) for h in HOSTS}


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[int]:
    """A one-member etcd on loopback with its data in TMP_PATH; yields its client port."""
    with running_etcd(tmp_path) as port:
        yield port


def shard_server(name: str, etcd_port: int) -> CollectorServer:
    return CollectorServer(
        fast_server_config(
            api=ApiConfig(
                trust_local_registration=True,
                report_interval_ms=int(WINDOW_S * 1000),
                plan=PlanConfig(interval_ms=300, count=5, budget=8),
            ),
            shard=ShardConfig(
                etcd=(("127.0.0.1", etcd_port),), name=name, ttl_s=TTL_S, refresh_s=0.25
            ),
        )
    )


def has_series(text: str, name: str, **labels: str) -> bool:
    """Whether TEXT (/metrics) has a sample of NAME with these LABELS."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return any(
        line.startswith(name + "{") and all(w in line for w in want) for line in text.splitlines()
    )


def seqs(server: CollectorServer, host: str) -> set[int]:
    return {s for ss in server.store.seqs_taken(host).values() for s in ss}


def get(address: str) -> str:
    """GET http://ADDRESS/metrics."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
        return str(resp.read().decode())


def named_to_own(host: str, others: list[str]) -> str:
    """A shard name that, beside OTHERS, owns HOST (ownership follows names alone)."""
    for i in range(1000):
        name = f"shard-v{i}"
        group = [Member(n, "127.0.0.1:1") for n in [*others, name]]
        m = owner_of(host, group)
        if m is not None and m.name == name:
            return name
    raise AssertionError("no name found")


@contextmanager
def shard_process(name: str, etcd_port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`probe collector` as one shard, in its own process, with the plan the in-process
    shards have (one fleet-wide plan needs the same plan settings everywhere)."""
    argv = [
        sys.executable,
        "-m",
        "fabricprobe",
        "collector",
        "--insecure",
        "--trust-loopback",  # the agents on 127.0.0.N call from 127.0.0.1
        "--listen=127.0.0.1:0",
        "--metrics-listen=127.0.0.1:0",
        f"--etcd=127.0.0.1:{etcd_port}",
        f"--shard-name={name}",
        f"--shard-ttl={TTL_S}",
        f"--report-interval={WINDOW_S:g}",
        "--probe-interval=0.3",
        "--probe-count=5",
        "--budget=8",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)


def test_a_killed_shard_loses_no_window_and_every_query_keeps_data(
    etcd: int, tmp_path: Path
) -> None:
    t0 = time.monotonic()
    configs = [
        loopback_agent_config(
            tmp_path,
            a,
            0,
            metrics_listen=f"{a}:{AGENT_METRICS[a]}",
            etcd=f"127.0.0.1:{etcd}",
            etcd_refresh_s=0.25,
            collector="127.0.0.1:1",  # never used: etcd names the shard
            # every window of the run is kept for a handoff, so that "nothing lost" can be
            # checked as "every acknowledged window is on a live shard" (by default, the
            # windows of the last 60 s: those Prometheus may not have scraped)
            handoff_keep_s=300.0,
        )
        for a in HOSTS
    ]
    configs[0].sysfs_root, configs[0].ethtool = str(FIXTURES / "sys" / "mlx5"), True
    names = [c.host for c in configs]
    # two shards in this process, and a third, which owns host-2, as `probe collector`
    shards = [shard_server(f"shard-{i}", etcd) for i in range(2)]
    doomed = named_to_own(names[0], [f"shard-{i}" for i in range(2)])
    with shard_process(doomed, etcd, tmp_path / "victim.log") as victim_proc:
        for s in shards:
            s.start()
        by_name: dict[str, CollectorServer | None] = {
            s.shard.member.name: s for s in shards if s.shard is not None
        }
        by_name[doomed] = None

        def members() -> list[Member]:
            view = shards[0].shard
            assert view is not None
            view.sync()
            return list(view.current_members())

        wait_for(lambda: len(members()) == 3, 30, "three shards in etcd")
        victim = next(m for m in members() if m.name == doomed)

        def owner(host: str) -> CollectorServer | None:
            view = shards[0].shard
            assert view is not None
            m = owner_of(host, view.current_members())
            assert m is not None
            return by_name[m.name]

        assert owner(names[0]) is None  # the process
        moved = [n for n in names if owner(n) is None]
        entry = shards[0]  # spans and the check verdicts enter here, not host-2's owner
        fixture_checks(entry)

        def rdma_door(host: str) -> CollectorServer:
            return owner(host) or entry  # a shard takes any host; the process is out of reach

        collectors = [f"127.0.0.1:{s.metrics_port}" for s in shards] + [victim.metrics]
        agent_targets = [f"{h}:{p}" for h, p in AGENT_METRICS.items()]
        agents = [Agent(configs[0], ethtool_runner=rising_ethtool())]
        agents += [Agent(c) for c in configs[1:]]
        stop = threading.Event()
        with running_prometheus(tmp_path, collectors, agent_targets) as prom:
            for a in agents:
                a.start()
            try:
                wait_for(
                    lambda: (
                        all(
                            has_series(get(victim.metrics), "fabricprobe_host_up", src=n)
                            for n in moved
                        )
                        and all(n in s.store.hosts for n in names if (s := owner(n)) is not None)
                    ),
                    20,
                    "every agent registered with the shard that owns its host",
                )

                def door() -> str:  # a shard that does not own the spans' path
                    return f"127.0.0.1:{next(s for s in shards if s is not owner(names[0])).port}"

                live_feed(stop, door, rdma_door, names[0], names[1])
                wait_for(
                    lambda: len(prom.query("fabricprobe_rtt_seconds_count")) >= 6,
                    40,
                    "every loopback pair's RTT histogram in Prometheus",
                )
                # spans entered a shard that does not own their path; joined on the owner
                wait_for(
                    lambda: has_series(get(victim.metrics), JOINED, src=names[0], dst=names[1]),
                    30,
                    "spans forwarded to the path's owner and joined there",
                )
                assert entry.shard is not None and entry.shard.spans.forwarder.spans["sent"] > 0
                assert not has_series(
                    scrape(entry), "fabricprobe_kv_transfer_seconds_count", src=names[0]
                ), "the shard the spans entered joined them itself"

                # -- SIGKILL the owner of host-2 ----------------------------------------
                killed_at = time.time_ns()
                victim_proc.send_signal(signal.SIGKILL)
                victim_proc.wait(timeout=10)
                t_kill = time.monotonic()
                # every window any shard acknowledged, as the agents know them
                acked = {
                    a.cfg.host: {k.seq for _, k, _ in a.sender.handoff.kept}
                    for a in agents
                    if a.sender.handoff is not None
                }
                assert all(acked[n] for n in moved)
                wait_for(
                    lambda: all(
                        any(
                            n in s.store.hosts and s.store.hosts[n].last_report_ns > killed_at
                            for s in shards
                        )
                        for n in moved
                    ),
                    3 * WINDOW_S,
                    "the dead shard's hosts reporting elsewhere",
                )
                took = time.monotonic() - t_kill
                assert took <= WINDOW_S, f"hosts moved after {took:.1f} s, more than a window"
                assert len(members()) == 2

                # every window a shard acknowledged is on a live shard, none missing
                time.sleep(WINDOW_S)
                for n in names:
                    live = set().union(*(seqs(s, n) for s in shards))
                    lost = acked[n] - live
                    assert not lost, f"{n}: windows {sorted(lost)} acknowledged, now nowhere"
                    gaps = set(range(1, max(live) + 1)) - live
                    assert not gaps, f"{n}: windows {sorted(gaps)} missing"
                for a in agents:
                    if a.cfg.host in moved:
                        assert a.sender.handoffs == 1 and a.sender.replayed >= len(
                            acked[a.cfg.host]
                        )
                print(
                    f"\nshard SIGKILLed: {len(moved)} host(s) moved in {took:.2f} s"
                    f" (window {WINDOW_S:g} s, lease {TTL_S} s);"
                    f" {sum(len(acked[n]) for n in moved)} windows it had acknowledged,"
                    f" {sum(a.sender.replayed for a in agents)} replayed, none lost"
                )

                # spans now reach the new owner of host-2's path
                new_owner = owner(names[0])
                assert new_owner is not None
                wait_for(
                    lambda: has_series(scrape(new_owner), JOINED, src=names[0], dst=names[1]),
                    30,
                    "spans joined on the new owner",
                )
                first = missing_queries(prom, FABRIC_ROWS)
                try:
                    wait_for(
                        lambda: not missing_queries(prom, FABRIC_ROWS),
                        40,
                        "every query to return data",
                    )
                except AssertionError:
                    raise AssertionError(
                        "queries without data at the first look:\n"
                        + "\n".join(first)
                        + "\nand at the last:\n"
                        + "\n".join(missing_queries(prom, FABRIC_ROWS))
                        + f"\ntargets: {prom.targets()}"
                    ) from None
            finally:
                stop.set()
                for a in agents:
                    a.stop()
                for a in agents:
                    a.close(flush_timeout=0.0)
                for s in shards:
                    s.stop(0)
    assert time.monotonic() - t0 < 120


def test_etcd_reads_page_through_the_fleet_and_skip_bad_records(
    etcd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reads come in pages (the gateway caps one answer), in key order; a member record
    that cannot be read is counted, never fatal; a keepalive does not move the revision."""
    client = Etcd((("127.0.0.1", etcd),), prefix="/t/")
    page = 40
    monkeypatch.setattr(shards, "PAGE", page)  # pages of 40 keys: a few hundred puts less

    def put(key: str, value: bytes, lease: int = 0) -> None:
        body = {"key": b64("/t/" + key), "value": b64(value), "lease": lease}
        client.call("put", lambda c: c.post(c.get_url("/kv/put"), json=body))

    n = page * 2 + 7
    for i in range(n):
        put(f"hosts/h{i:05d}", b"x" * 10)
    rows = client.read_prefix("hosts/", 100_000)
    assert [k for k, _, _ in rows] == [f"/t/hosts/h{i:05d}".encode() for i in range(n)]
    assert len(client.read_prefix("hosts/", page + 1, serializable=True)) == page + 1
    lease = int(
        client.call(
            "grant", lambda c: c.post(c.get_url("/lease/grant"), json={"TTL": 5, "ID": 0})["ID"]
        )
    )
    put("shards/good", Member("good", "127.0.0.1:4794").record(), lease)
    put("shards/bad", b"{not json")
    members, bad = client.members()
    assert [m.name for m in members] == ["good"] and bad == 1
    rev = client.revision()
    client.call("keepalive", lambda c: c.post(c.get_url("/lease/keepalive"), json={"ID": lease}))
    assert client.revision() == rev


def test_probe_shards_lists_members_owners_and_a_file_sd(etcd: int, tmp_path: Path) -> None:
    server = shard_server("shard-x", etcd)
    server.start()
    try:
        sd = tmp_path / "shards.json"
        res = CliRunner().invoke(
            main,
            ["shards", f"--etcd=127.0.0.1:{etcd}", "--host=gpu-1", f"--file-sd={sd}", "--json"],
        )
        assert res.exit_code == 0, res.output
        doc = json.loads(res.output)
        assert doc["members"] == [
            {
                "name": "shard-x",
                "api": f"127.0.0.1:{server.port}",
                "otlp": f"127.0.0.1:{server.port}",
                "metrics": f"127.0.0.1:{server.metrics_port}",
            }
        ]
        assert doc["owners"] == {"gpu-1": "shard-x"} and doc["unreadable"] == 0
        assert json.loads(sd.read_text()) == [
            {"targets": [f"127.0.0.1:{server.metrics_port}"], "labels": {"shard": "shard-x"}}
        ]
    finally:
        server.stop(0)
    res = CliRunner().invoke(main, ["shards", "--etcd=127.0.0.1:1"])
    assert res.exit_code == 1 and "etcd read" in res.output


def test_a_shard_whose_leases_ran_out_joins_again_with_its_hosts(etcd: int) -> None:
    """A pause past the TTL (here: both leases revoked behind its back) costs the shard its
    member record and its hosts' registrations; it joins again and puts them back."""
    server = shard_server("shard-p", etcd)
    server.start()
    try:
        shard = server.shard
        assert shard is not None
        server.api.register(pb.HostInfo(host="gpu-9", addresses=["127.0.0.9"]))
        client = Etcd((("127.0.0.1", etcd),))
        assert [k for k, _, _ in client.read_prefix("hosts/", 10)] == [b"/fabricprobe/hosts/gpu-9"]
        for lease in (shard.leases.member_lease, shard.leases.registrations):
            body = {"ID": lease}
            client.call("revoke", lambda c, b=body: c.post(c.get_url("/lease/revoke"), json=b))
        assert client.members()[0] == [] and client.read_prefix("hosts/", 10) == []
        wait_for(
            lambda: (
                shard.leases.lost >= 1
                and [m.name for m in client.members()[0]] == ["shard-p"]
                and len(client.read_prefix("hosts/", 10)) == 1
            ),
            10,
            "the shard back in etcd with its host",
        )
    finally:
        server.stop(0)
    assert client.members()[0] == []  # a graceful stop leaves at once


def sdk_provider(endpoint: str, host: str, service: str) -> Any:
    """An engine process's tracer provider: OTLP/gRPC to ENDPOINT, each span exported on
    its own (the hardest case for routing: no span sees its neighbours)."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    p = TracerProvider(resource=Resource.create({"service.name": service, "host.name": host}))
    p.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True)))
    return p


def vllm_pair(pre: Any, dec: Any, t: int, rid: str, *, prefill: bool = True) -> None:
    """vLLM 0.32 behind a prefill/decode proxy that forwards `traceparent`: each side's
    `llm_request` (tests/unit/test_engines.py's attributes), the prefill call asking for
    one token."""
    import secrets as _secrets

    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    ctx = trace.set_span_in_context(
        NonRecordingSpan(
            SpanContext(
                int.from_bytes(_secrets.token_bytes(16)),
                int.from_bytes(_secrets.token_bytes(8)),
                is_remote=True,
                trace_flags=TraceFlags(1),
            )
        )
    )
    common = {"gen_ai.request.id": rid, "gen_ai.usage.prompt_tokens": 32}
    sides = [(dec, 100, 0.03, 9, 16)]
    if prefill:
        sides.insert(0, (pre, 0, 0.002, 1, 1))
    for provider, off_ms, queue, out, max_tokens in sides:
        s = provider.get_tracer("vllm.api_server").start_span(
            "llm_request",
            context=ctx,
            start_time=t + off_ms * MS,
            attributes={
                **common,
                "gen_ai.request.max_tokens": max_tokens,
                "gen_ai.latency.time_in_queue": queue,
                "gen_ai.latency.time_in_model_prefill": 0.01,
                "gen_ai.latency.time_in_model_decode": 0.02,
                "gen_ai.latency.time_to_first_token": queue + 0.01,
                "gen_ai.latency.e2e": queue + 0.03,
                "gen_ai.usage.completion_tokens": out,
            },
        )
        s.end(end_time=t + off_ms * MS + int((queue + 0.03) * 1e9))


MS = 1_000_000


def test_the_two_sides_of_disaggregated_engines_meet_on_their_paths_owner(etcd: int) -> None:
    """vLLM, SGLang, Dynamo and llm-d request sides, each sent by its own process to the
    shard that does NOT own its host, prefill and decode sides to two different shards:
    every request is joined on the owner of its prefill host, with its path; a decode
    side whose prefill side never comes goes to its own host's owner after the hold."""
    from tests.integration.test_engine_sdk import dynamo_request, llmd_request, sglang_request

    def server(name: str) -> CollectorServer:
        return CollectorServer(
            fast_server_config(
                shard=ShardConfig(
                    etcd=(("127.0.0.1", etcd),),
                    name=name,
                    ttl_s=TTL_S,
                    refresh_s=0.25,
                    span_hold_s=1.0,
                )
            )
        )

    servers = [server(f"shard-{i}") for i in range(2)]
    for s in servers:
        s.start()
    try:
        group = [Member(f"shard-{i}", "127.0.0.1:1") for i in range(2)]
        by_name = {f"shard-{i}": s for i, s in enumerate(servers)}

        def owns(host: str) -> CollectorServer:
            m = owner_of(host, group)
            assert m is not None
            return by_name[m.name]

        def apart(stem: str) -> tuple[str, str]:
            pre = f"{stem}-prefill"
            dec = next(
                f"{stem}-decode-{i}"
                for i in range(100)
                if owns(f"{stem}-decode-{i}") is not owns(pre)
            )
            return pre, dec

        hosts = {e: apart(e) for e in ("vllm", "sg", "dyn", "llmd")}
        addresses = {hosts["llmd"][0]: "127.0.0.6"}  # the sidecar's prefill target
        for pre, dec in hosts.values():
            for h in (pre, dec):
                owns(h).api.register(pb.HostInfo(host=h, addresses=[addresses.get(h, "127.0.0.9")]))
        wait_for(
            lambda: all(
                s.shard is not None
                and len(s.shard.fleet.members) == 2
                and len(s.shard.fleet.hosts) == 8
                for s in servers
            ),
            20,
            "both shards with the eight hosts",
        )

        def entry(host: str) -> str:  # the shard that does not own HOST
            other = next(s for s in servers if s is not owns(host))
            return f"127.0.0.1:{other.port}"

        def side(engine: str, i: int, service: str) -> Any:
            host = hosts[engine][i]
            return sdk_provider(entry(host), host, service)

        vl = (side("vllm", 0, "vllm-prefill"), side("vllm", 1, "vllm-decode"))
        sg = (side("sg", 0, "sglang"), side("sg", 1, "sglang"))
        front = sdk_provider(f"127.0.0.1:{servers[0].port}", "dyn-frontend", "dynamo-frontend")
        dy = (
            front,
            side("dyn", 0, "dynamo-worker-prefill"),
            side("dyn", 1, "dynamo-worker-decode"),
        )
        ld = (
            side("llmd", 1, "llm-d-pd-proxy"),  # the sidecar runs beside the decode side
            side("llmd", 0, "vllm-prefill"),
            side("llmd", 1, "vllm-decode"),
        )
        t0 = time.monotonic()
        now = time.time_ns() - 2_000 * MS
        n = 3
        for i in range(n):
            t = now + i * 200 * MS
            vllm_pair(*vl, t, f"vllm-{i}")
            sglang_request(*sg, t, f"sgl{i:05d}aaaa", 0x1F00 + i)
            dynamo_request(*dy, t, f"dyn-{i}")
            llmd_request(*ld, t, f"llmd-{i}")
        vllm_pair(*vl, now, "lonely", prefill=False)  # a decode side alone
        for p in (*vl, *sg, *dy, *ld):
            p.shutdown()
        want = {
            "vllm": [f"vllm-{i}" for i in range(n)],
            "sg": [f"sgl{i:05d}aaaa" for i in range(n)],
            "dyn": [f"dyn-{i}" for i in range(n)],
            "llmd": [f"llmd-{i}" for i in range(n)],
        }

        def joined() -> dict[str, list[str]]:
            got: dict[str, list[str]] = {}
            for engine, (pre, dec) in hosts.items():
                req = owns(pre).attribution.analyse(window_s=600).requests
                paths = dict(zip(req["request_id"], req["path"], strict=True))
                got[engine] = [r for r in want[engine] if paths.get(r) == f"{pre}->{dec}"]
            return got

        wait_for(lambda: joined() == want, 20, "every request joined on its prefill host's owner")
        took = time.monotonic() - t0
        for engine, (_pre, dec) in hosts.items():
            other = owns(dec).attribution.analyse(window_s=600).requests
            assert not set(want[engine]) & set(other["request_id"]), engine
        res = owns(hosts["vllm"][0]).attribution.analyse(window_s=600).requests
        kv = res.set_index("request_id").loc["vllm-0", "kv_transfer_s"]
        assert kv == pytest.approx(0.03)  # the decode side's time_in_queue, as one collector
        # the lone decode side waited for its prefill side, then went by its own host
        lonely = owns(hosts["vllm"][1])
        wait_for(
            lambda: (
                "lonely" in set(lonely.attribution.analyse(window_s=600).requests["request_id"])
            ),
            10,
            "the lone decode side on its own host's owner",
        )
        routed = {
            by: sum(s.shard.spans.routed[by] for s in servers if s.shard is not None)
            for by in ("path", "unpaired")
        }
        assert routed["unpaired"] == 1 and routed["path"] > 0, routed
        assert all(s.shard is not None and s.shard.spans.relay.held == 0 for s in servers)
        print(f"\n{sum(map(len, want.values()))} requests joined across 2 shards in {took:.2f} s")
    finally:
        for s in servers:
            s.stop(0)


def test_a_shard_follows_etcd_through_its_watch_and_reads_in_full_when_it_breaks(
    etcd: int,
) -> None:
    """Registrations and member records put and deleted (a lease running out among them)
    reach the shard through etcd's watch, with no full read between; a broken stream is
    counted, the fleet read in full, and the next watch carries on."""
    server = CollectorServer(
        fast_server_config(
            shard=ShardConfig(
                etcd=(("127.0.0.1", etcd),),
                name="shard-w",
                ttl_s=TTL_S,
                refresh_s=0.25,
                resync_s=3600.0,  # no periodic full read: only the watch can bring changes
            )
        )
    )
    server.start()
    client = Etcd((("127.0.0.1", etcd),))

    def put(key: str, value: bytes, lease: int = 0) -> None:
        body = {"key": b64("/fabricprobe/" + key), "value": b64(value), "lease": lease}
        client.call("put", lambda c: c.post(c.get_url("/kv/put"), json=body))

    def delete(key: str) -> None:
        body = {"key": b64("/fabricprobe/" + key)}
        client.call("delete", lambda c: c.post(c.get_url("/kv/deleterange"), json=body))

    try:
        shard = server.shard
        assert shard is not None
        wait_for(lambda: shard.watch.watching, 10, "the watch open")
        read_at = shard.fleet.read_at
        put("hosts/w-1", pb.HostInfo(host="w-1", addresses=["127.0.0.5"]).SerializeToString())
        wait_for(lambda: "w-1" in shard.fleet.hosts and "w-1" in shard.planner.hosts(), 5, "w-1")
        lease = int(
            client.call(
                "grant",
                lambda c: c.post(c.get_url("/lease/grant"), json={"TTL": 2, "ID": 0})["ID"],
            )
        )
        put("shards/shard-z", Member("shard-z", "127.0.0.1:4999").record(), lease)
        wait_for(
            lambda: [m.name for m in shard.fleet.members] == ["shard-w", "shard-z"], 5, "shard-z"
        )
        put("hosts/bad", b"\xff not a registration")
        delete("hosts/w-1")
        wait_for(
            lambda: "w-1" not in shard.fleet.hosts and "w-1" not in shard.planner.hosts(), 5, "-w-1"
        )
        # the lease runs out (no keepalive): etcd deletes the record, the watch says so
        wait_for(lambda: [m.name for m in shard.fleet.members] == ["shard-w"], 10, "shard-z gone")
        assert shard.fleet.read_at == read_at and shard.fleet.records_unreadable >= 1
        assert shard.fleet.watched >= 5 and shard.watch.restarts == 0
        # the stream breaks: counted, the fleet read in full, a new watch
        shard.watch.close()
        wait_for(
            lambda: shard.watch.restarts == 1 and shard.fleet.read_at > read_at, 10, "a full read"
        )
        put("hosts/w-2", pb.HostInfo(host="w-2", addresses=["127.0.0.6"]).SerializeToString())
        wait_for(lambda: "w-2" in shard.fleet.hosts, 10, "w-2 through the next watch")
        assert shard.watch.restarts == 1
    finally:
        server.stop(0)
