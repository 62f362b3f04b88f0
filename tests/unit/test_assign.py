"""Assignment planner: full mesh, ToR mesh with inter-ToR coverage, budget, generations."""

from __future__ import annotations

import time

import pytest

from fabricprobe.collector.assign import (
    HostSpec,
    PlanConfig,
    Planner,
    RailNic,
    Target,
    plan_peers,
    targets_for,
)


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


# ------------------------------------------------------------------ rails

RDMA = frozenset({"tcp_lat", "rdma_rc_lat", "rdma_ud"})


def rail_host(name: str, i: int, rails: range | tuple[int, ...]) -> HostSpec:
    """A GPU host: mlx5_r on rail r at 10.100.r.I, and its first rail as the host's device."""
    nics = tuple(RailNic(r, f"mlx5_{r}", f"gid-{name}-{r}", f"10.100.{r}.{i}") for r in rails)
    return HostSpec(
        name, address=f"192.0.2.{i}", port=4793, kinds=RDMA, device="mlx5_0", gid="g0", rails=nics
    )


def test_rail_hosts_pair_their_devices_rail_by_rail() -> None:
    a, b = rail_host("a", 1, range(8)), rail_host("b", 2, range(8))
    ts = targets_for(a, [b], PlanConfig(kinds=("tcp_lat", "rdma_rc_lat", "rdma_ud")))
    rdma = [t for t in ts if t.kind != "tcp_lat"]
    assert len(rdma) == 2 * 8
    for t in rdma:  # from my device on rail r to the peer's on rail r, at its rail address
        assert t.rail is not None
        assert (t.src_device, t.device, t.address, t.gid) == (
            f"mlx5_{t.rail}",
            f"mlx5_{t.rail}",
            f"10.100.{t.rail}.2",
            f"gid-b-{t.rail}",
        )
    (tcp,) = [t for t in ts if t.kind == "tcp_lat"]  # TCP stays host to host
    assert tcp.rail is None and tcp.address == "192.0.2.2" and tcp.src_device == ""


def test_rails_are_never_crossed() -> None:
    """Only the rails both hosts are on; a pair with none in common gets no RDMA target."""
    a, b = rail_host("a", 1, (0, 1, 2)), rail_host("b", 2, (1, 2, 5))
    ts = targets_for(a, [b], PlanConfig(kinds=("rdma_ud",)))
    assert sorted((t.rail, t.src_device, t.device) for t in ts) == [
        (1, "mlx5_1", "mlx5_1"),
        (2, "mlx5_2", "mlx5_2"),
    ]
    c = rail_host("c", 3, (6, 7))
    assert targets_for(a, [c], PlanConfig(kinds=("rdma_ud",))) == []


def test_hosts_without_rails_are_planned_exactly_as_before() -> None:
    """A host that names no rail (a laptop, the lane's bridge, an older agent), on either
    end: one RDMA target to the peer's device, no rail, as before rails."""
    plain = HostSpec("p", address="192.0.2.9", port=4793, kinds=RDMA, device="rxe0", gid="g")
    railed = rail_host("a", 1, range(2))
    cfg = PlanConfig(kinds=("tcp_lat", "rdma_ud"), sizes=(64, 4096))
    for src, dst in ((plain, railed), (railed, plain)):
        ts = targets_for(src, [dst], cfg)
        assert all(t.rail is None and t.src_device == "" for t in ts)
        assert {(t.kind, t.address, t.device) for t in ts} == {
            ("tcp_lat", dst.address, ""),
            ("rdma_ud", dst.address, dst.device),
        }
    no_rails = HostSpec("q", address="192.0.2.8", port=4793, kinds=RDMA, device="rxe1", gid="h")
    before = targets_for(plain, [no_rails], cfg)
    assert before == [
        Target(no_rails.name, "192.0.2.8", 4793, k, s, cfg.interval_ms, cfg.count, d, g)
        for k, d, g in (("tcp_lat", "", ""), ("rdma_ud", "rxe1", "h"))
        for s in cfg.sizes
    ]


def test_a_host_whose_rails_change_gets_a_new_generation() -> None:
    p = Planner(PlanConfig(budget=8, kinds=("rdma_ud",)), pace=0)
    for i, name in enumerate(("a", "b")):
        p.upsert(rail_host(name, i, range(2)))
    gen, ts = p.assignments("a")
    assert {t.rail for t in ts} == {0, 1}
    p.upsert(rail_host("b", 1, (1,)))  # b's rail-0 NIC went away
    gen2, ts2 = p.assignments("a")
    assert gen2 > gen and {t.rail for t in ts2} == {1}
