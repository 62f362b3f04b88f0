"""Assignment planner: full mesh, ToR mesh with inter-ToR coverage, budget, generations."""

from __future__ import annotations

import time

import pytest

from fabricprobe.collector.assign import HostSpec, PlanConfig, Planner, plan_peers, targets_for


def fleet(tors: int, per_tor: int) -> list[HostSpec]:
    return [
        HostSpec(name=f"h{t:03d}-{i:02d}", topology=f"tor{t:03d}", address=f"10.{t}.0.{i}")
        for t in range(tors)
        for i in range(per_tor)
    ]


def test_small_fleet_is_a_full_mesh() -> None:
    hosts = fleet(2, 3)
    plan = plan_peers(hosts, PlanConfig(budget=8))
    assert all(len(peers) == 5 for peers in plan.values())
    assert all(name not in peers for name, peers in plan.items())


def test_large_fleet_stays_within_budget_and_covers_tor_pairs() -> None:
    hosts = fleet(20, 16)
    cfg = PlanConfig(budget=8)
    plan = plan_peers(hosts, cfg)
    tor = {h.name: h.topology for h in hosts}
    assert all(0 < len(p) <= cfg.budget for p in plan.values())
    assert all(len(set(p)) == len(p) and n not in p for n, p in plan.items())
    covered = {(tor[a], tor[b]) for a, peers in plan.items() for b in peers}
    tors = sorted(set(tor.values()))
    missing = [(a, b) for a in tors for b in tors if a != b and (a, b) not in covered]
    assert not missing
    # every host has some intra-ToR peers
    assert all(any(tor[b] == tor[a] for b in peers) for a, peers in plan.items())


def test_single_tor_large_fleet_uses_whole_budget_inside() -> None:
    plan = plan_peers(fleet(1, 40), PlanConfig(budget=6))
    assert all(len(p) == 6 for p in plan.values())


def test_targets_only_for_kinds_both_ends_offer() -> None:
    a = HostSpec("a", kinds=frozenset({"tcp_lat", "rdma_rc_lat"}))
    b = HostSpec("b", kinds=frozenset({"tcp_lat"}), device="rxe0", gid="fe80::1")
    cfg = PlanConfig(sizes=(64, 4096))
    ts = targets_for(a, [b], cfg)
    assert {(t.kind, t.size) for t in ts} == {("tcp_lat", 64), ("tcp_lat", 4096)}
    assert all(t.device == "" for t in ts)


def test_generation_grows_only_for_hosts_whose_targets_change() -> None:
    p = Planner(PlanConfig(budget=8), pace=0)
    for h in fleet(1, 3):
        p.upsert(h)
    g = {n: p.generation(n) for n in p.hosts()}
    assert set(g.values()) == {1}
    p.upsert(HostSpec("h000-00", topology="tor000", address="10.0.0.0"))  # same spec again
    assert p.generation("h000-00") == 1
    p.remove(["h000-02"])
    assert p.generation("h000-00") == 2
    assert p.assignments("h000-02")[1] == ()
    assert p.generation("h000-02") == 2
    p.upsert(HostSpec("h000-09", topology="tor000"))
    assert p.generation("h000-01") == 3


def test_replans_are_paced_by_their_cost() -> None:
    p = Planner(PlanConfig(budget=8), pace=1e9)  # every replan waits the 5 s cap
    for h in fleet(1, 3):
        p.upsert(h)
    assert p.generation("h000-00") == 1  # the first replan is not held back
    p.upsert(HostSpec("h000-07", topology="tor000"))
    assert p.generation("h000-07") == 0 and p.replans == 1
    p.remove(["h000-01"])  # not replanned yet: the others' targets skip the leaver
    assert all(t.dst != "h000-01" for t in p.assignments("h000-00")[1])


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError):
        PlanConfig(budget=0)


def test_ten_thousand_hosts_plan_quickly() -> None:
    hosts = fleet(250, 40)
    t0 = time.perf_counter()
    plan = plan_peers(hosts, PlanConfig(budget=16))
    assert time.perf_counter() - t0 < 2.0
    assert len(plan) == 10_000
