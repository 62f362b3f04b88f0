"""Collector shards on etcd, with one of them killed: a real etcd (Debian's), three
collector shards with real gRPC on loopback, a real Prometheus scraping all of them, and
loopback agents that find their shard in etcd.

The shard that owns host-2 is stopped hard (no drain, no goodbye to etcd: its lease runs
out as a killed process's would). Then: its hosts report to the others within one
window; every window any shard acknowledged is held by a live shard (the agents replay
what the dead one had taken, the new owner drops duplicates); stage spans sent to a
shard that does not own their path are joined on the owner; and every dashboard query
still returns data.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabricprobe.agent.agent import Agent
from fabricprobe.collector.assign import PlanConfig
from fabricprobe.collector.service import ApiConfig, CollectorServer
from fabricprobe.collector.shard import ShardConfig
from fabricprobe.core import shards
from fabricprobe.core.shards import Etcd, Member, b64, owner_of
from tests.support.feeds import fixture_checks, fixture_rdma_windows, rising_ethtool, send_spans
from tests.support.fleet import (
    FIXTURES,
    HOSTS,
    fast_server_config,
    free_port,
    loopback_agent_config,
    scrape,
    wait_for,
)
from tests.support.prom import missing_queries, running_prometheus

WINDOW_S = 4.0  # the shards' report interval: a dead shard's hosts must move within it
TTL_S = 2  # the shards' etcd lease
JOINED = "fabricprobe_path_explained_seconds"  # KV transfers joined with their path RTT
AGENT_METRICS = {h: free_port(h) for h in HOSTS}


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[int]:
    """A one-member etcd on loopback with its data in TMP_PATH; yields its client port."""
    assert shutil.which("etcd"), "etcd is not installed (Debian's etcd-server; scripts/setup.sh)"
    client, peer = free_port(), free_port()
    log = (tmp_path / "etcd.log").open("wb")
    proc = subprocess.Popen(
        [
            "etcd",
            "--name=t",
            f"--data-dir={tmp_path / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{client}",
            f"--advertise-client-urls=http://127.0.0.1:{client}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=t=http://127.0.0.1:{peer}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    def healthy() -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{client}/health", timeout=2) as r:
            return b"true" in r.read()

    try:
        wait_for(healthy, 30, "etcd to start")
        yield client
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def shard_server(name: str, etcd_port: int) -> CollectorServer:
    return CollectorServer(
        fast_server_config(
            api=ApiConfig(
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


def seqs(server: CollectorServer, host: str) -> set[tuple[int, int]]:
    return {(e, s) for e, ss in server.store.seqs_taken(host).items() for s in ss}


def test_a_killed_shard_loses_no_window_and_every_query_keeps_data(
    etcd: int, tmp_path: Path
) -> None:
    t0 = time.monotonic()
    shards = [shard_server(f"shard-{i}", etcd) for i in range(3)]
    for s in shards:
        s.start()
    by_name = {s.shard.member.name: s for s in shards if s.shard is not None}
    alive = list(shards)

    def members() -> list[str]:
        view = alive[0].shard
        assert view is not None
        view.sync()
        return [m.name for m in view.members]

    wait_for(lambda: len(members()) == 3, 10, "three shards in etcd")

    def owner(host: str) -> CollectorServer:
        view = alive[0].shard
        assert view is not None
        m = owner_of(host, view.members)
        assert m is not None
        return by_name[m.name]

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
            # checked as "every window is on a live shard" (by default it is the last 60 s)
            handoff_keep_s=300.0,
        )
        for a in HOSTS
    ]
    configs[0].sysfs_root, configs[0].ethtool = str(FIXTURES / "sys" / "mlx5"), True
    names = [c.host for c in configs]
    victim = owner(names[0])
    entry = next(s for s in shards if s is not victim)  # spans enter here, a non-owner
    fixture_checks(entry)

    collectors = [f"127.0.0.1:{s.metrics_port}" for s in shards]
    agent_targets = [f"{h}:{p}" for h, p in AGENT_METRICS.items()]
    agents = [Agent(configs[0], ethtool_runner=rising_ethtool())]
    agents += [Agent(c) for c in configs[1:]]
    stop = threading.Event()
    with running_prometheus(tmp_path, collectors, agent_targets) as prom:
        for a in agents:
            a.start()
        try:
            wait_for(
                lambda: all(any(n in s.store.hosts for s in shards) for n in names),
                15,
                "every agent registered with a shard",
            )
            for n in names:  # each agent found its owner
                assert n in owner(n).store.hosts, n

            def feed() -> None:
                seq = 1
                while not stop.is_set():
                    src_owner = owner(names[0])
                    door = next(s for s in alive if s is not src_owner)
                    send_spans(f"127.0.0.1:{door.port}", names[0], names[1], 20, batch=seq)
                    fixture_rdma_windows(owner, seq)
                    seq += 1
                    stop.wait(2.0)

            feeder = threading.Thread(target=feed, name="feed", daemon=True)
            feeder.start()
            wait_for(
                lambda: len(prom.query("fabricprobe_rtt_seconds_count")) >= 6,
                40,
                "every loopback pair's RTT histogram in Prometheus",
            )
            # spans entered a shard that does not own their path and were joined on the owner
            try:
                wait_for(
                    lambda: has_series(scrape(victim), JOINED, src=names[0], dst=names[1]),
                    30,
                    "spans forwarded to the path's owner and joined there",
                )
            except AssertionError:
                assert entry.shard is not None
                own = [x for x in scrape(victim).splitlines() if "path_" in x or "kv_" in x]
                raise AssertionError(
                    f"spans forwarded: {entry.shard.forwarder.spans}; the owner has:\n"
                    + "\n".join(own[:40])
                ) from None
            assert entry.shard is not None and entry.shard.forwarder.spans["sent"] > 0
            assert not has_series(
                scrape(entry), "fabricprobe_kv_transfer_seconds_count", src=names[0]
            ), "the shard the spans entered joined them itself"

            # -- kill the owner of host-2 -------------------------------------------------
            moved = [n for n in names if n in victim.store.hosts]
            killed_at = time.time_ns()
            victim.kill()
            alive.remove(victim)
            held = {n: seqs(victim, n) for n in moved}
            t_kill = time.monotonic()
            wait_for(
                lambda: all(
                    any(
                        n in s.store.hosts and s.store.hosts[n].last_report_ns > killed_at
                        for s in alive
                    )
                    for n in moved
                ),
                3 * WINDOW_S,
                "the dead shard's hosts reporting elsewhere",
            )
            took = time.monotonic() - t_kill
            assert took <= WINDOW_S, f"hosts moved after {took:.1f} s, more than one window"
            assert len(members()) == 2

            # every window the dead shard acknowledged is on a live shard
            time.sleep(WINDOW_S)
            for n in moved:
                live = set().union(*(seqs(s, n) for s in alive))
                lost = held[n] - live
                assert not lost, f"{n}: windows {sorted(lost)} acknowledged by the dead shard only"
                top = max(s for _, s in live)
                gaps = set(range(1, top + 1)) - {s for _, s in live}
                assert not gaps, f"{n}: windows {sorted(gaps)} missing"
            for a in agents:
                if a.cfg.host in moved:
                    assert a.handoffs == 1 and a.replayed >= len(held[a.cfg.host])
            print(
                f"\nshard killed: {len(moved)} hosts moved in {took:.2f} s (window {WINDOW_S:g} s);"
                f" {sum(map(len, held.values()))} windows the dead shard held,"
                f" {sum(a.replayed for a in agents)} replayed, none lost"
            )

            # spans now reach the new owner of host-2's path
            new_owner = owner(names[0])
            wait_for(
                lambda: has_series(scrape(new_owner), JOINED, src=names[0], dst=names[1]),
                30,
                "spans joined on the new owner",
            )
            first = missing_queries(prom)
            try:
                wait_for(lambda: not missing_queries(prom), 40, "every query to return data")
            except AssertionError:
                raise AssertionError(
                    "queries without data at the first look:\n"
                    + "\n".join(first)
                    + "\nand at the last:\n"
                    + "\n".join(missing_queries(prom))
                    + f"\ntargets: {prom.targets()}\nthe new owner of {names[0]}:\n"
                    + "\n".join(
                        x
                        for x in scrape(new_owner).splitlines()
                        if "port_stat" in x and names[0] in x
                    )[:3000]
                    + f"\nreplayed {[a.replayed for a in agents]}"
                ) from None
        finally:
            stop.set()
            for a in agents:
                a.stop()
            for a in agents:
                a.close(flush_timeout=0.0)
            for s in alive:
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
