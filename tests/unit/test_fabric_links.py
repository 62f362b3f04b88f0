"""collector/fabric off the lane: a fabric file shaped as the lane's leaf-spine, traces
placed on its links, the tomography over scripted class windows (a degraded link
ranked first and alone; host-bound windows never make a suspect; loss as well as
delay), the retraces asked for, the /metrics families against metrics.toml, and hostile
fabric files refused with where and why."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from fabricprobe.collector.fabric.links import FabricLinks
from fabricprobe.collector.fabric.localize import ClassKey, ClassWindow, LocalizeConfig, Localizer
from fabricprobe.collector.fabric.service import LinkCollector, links_reply
from fabricprobe.collector.fabric.topology import Topology, TopologyError
from fabricprobe.core.api import fabricprobe_pb2 as pb
from fabricprobe.core.sketchwire import to_wire
from fabricprobe.core.stats import SlotTally

ROOT = Path(__file__).resolve().parents[2]
# host -> (leaf, address): the lane's plan for 4 hosts on 3 leaves
HOSTS = {
    "h0": (0, "192.0.2.1"),
    "h1": (0, "192.0.2.2"),
    "h2": (1, "192.0.2.3"),
    "h3": (2, "192.0.2.4"),
}
TWO_LEAVES = {**HOSTS, "h3": (1, "192.0.2.4")}


def leaf_spine(hosts: dict[str, tuple[int, str]] = HOSTS) -> dict:
    """Leaves (as many as HOSTS use), two spines: the lane's shape and address plan."""
    leaves = 1 + max(x for x, _ in hosts.values())
    names = [*(f"leaf{x}" for x in range(leaves)), "spine0", "spine1"]
    links, routers, k = [], {n: [] for n in names}, 0

    def cable(a: str, a_dev: str, b: str, b_dev: str, tier: str, a_ip: str | None = None):
        nonlocal k
        ip_a = a_ip or f"203.0.113.{2 * k}"
        ip_b = f"203.0.113.{2 * k + 1}"
        k += 1
        links.append(
            {
                "a": a,
                "a_dev": a_dev,
                "a_ip": ip_a,
                "b": b,
                "b_dev": b_dev,
                "b_ip": ip_b,
                "rail": 0,
                "tier": tier,
            }
        )
        for node, dev, ip, peer in ((a, a_dev, ip_a, b), (b, b_dev, ip_b, a)):
            if node in routers:
                routers[node].append({"dev": dev, "ip": ip, "peer": peer})

    for x in range(leaves):
        for y in (0, 1):
            cable(f"leaf{x}", f"l{x}s{y}", f"spine{y}", f"s{y}l{x}", "leaf-spine")
    for h, (x, ip) in hosts.items():
        cable(h, f"{h}l{x}", f"leaf{x}", f"l{x}{h}", "host", a_ip=ip)
    return {
        "fabric": "leaf-spine",
        "routers": [
            {"name": n, "kind": n[:-1], "rail": 0, "interfaces": i} for n, i in routers.items()
        ],
        "links": links,
        "nics": [
            {"name": h, "ip": ip, "rail": 0, "leaf": f"leaf{x}"} for h, (x, ip) in hosts.items()
        ],
    }


def addr(doc: dict, node: str, peer: str) -> str:
    """The address of NODE's interface towards PEER."""
    for c in doc["links"]:
        if (c["a"], c["b"]) == (node, peer):
            return c["a_ip"]
        if (c["b"], c["a"]) == (node, peer):
            return c["b_ip"]
    raise KeyError((node, peer))


def hops(doc: dict, src: str, dst: str, spine: int) -> list[str]:
    """What a trace from SRC to DST through SPINE returns: each router's inbound address."""
    leaf = {n["name"]: n["leaf"] for n in doc["nics"]}
    ls, ld = leaf[src], leaf[dst]
    if ls == ld:
        return [addr(doc, ls, src)]
    s = f"spine{spine}"
    return [addr(doc, ls, src), addr(doc, s, ls), addr(doc, ld, s)]


def test_a_trace_names_its_links() -> None:
    doc = leaf_spine()
    topo = Topology.from_doc(doc)
    got = topo.resolve("192.0.2.1", "192.0.2.3", hops(doc, "h0", "h2", 1))
    assert got.links == ("h0->leaf0", "leaf0->spine1", "spine1->leaf1", "leaf1->h2")
    near = topo.resolve("192.0.2.1", "192.0.2.2", hops(doc, "h0", "h1", 0))
    assert near.links == ("h0->leaf0", "leaf0->h1")
    assert topo.resolve("192.0.2.1", "192.0.2.3", [None]).reason == "a hop did not answer"
    assert topo.resolve("192.0.2.9", "192.0.2.3", ["203.0.113.1"]).reason
    assert topo.resolve("192.0.2.1", "192.0.2.3", ["198.51.100.7"]).reason
    assert topo.resolve("192.0.2.1", "192.0.2.3", []).reason == "no routed hop"
    assert len(topo.links()) == 20 and topo.rail_of("leaf0->spine1") == 0


@pytest.mark.parametrize(
    "mutate, words",
    [
        (lambda d: d.update(links="x"), "links"),
        (lambda d: d["links"][0].update(a_ip="300.1.1.1"), "links[0].a_ip"),
        (lambda d: d["links"][0].update(a="bad name!"), "links[0].a"),
        (lambda d: d["links"][1].update(b_ip=d["links"][0]["a_ip"]), "on both"),
        (lambda d: d["nics"][0].update(rail=True), "rail"),
        (lambda d: d["routers"].append(7), "routers[5]"),
    ],
)
def test_hostile_fabric_files_are_refused_with_where(mutate, words: str) -> None:
    doc = leaf_spine()
    mutate(doc)
    with pytest.raises(TopologyError, match=words.replace("[", r"\[").replace("]", r"\]")):
        Topology.from_doc(doc)


def test_fabric_files_on_disk(tmp_path: Path) -> None:
    good = tmp_path / "fabric.json"
    good.write_text(json.dumps(leaf_spine()))
    assert len(Topology.load(good).links()) == 20
    for text in ("{", "[" * 100_000, "[]"):
        (tmp_path / "bad.json").write_text(text)
        with pytest.raises(TopologyError):
            Topology.load(tmp_path / "bad.json")
    with pytest.raises(TopologyError, match="No such file"):
        Topology.load(tmp_path / "missing.json")


def paths_and_classes(doc: dict) -> tuple[dict[ClassKey, tuple[str, ...]], list[ClassKey]]:
    """Every ordered pair in 4 classes, two over each spine (cross-leaf), out and back."""
    topo = Topology.from_doc(doc)
    ip = {n["name"]: n["ip"] for n in doc["nics"]}
    out = {}
    for s in ip:
        for d in ip:
            if s == d:
                continue
            for c in range(4):
                spine, back = c % 2, (c // 2) % 2
                fwd = topo.resolve(ip[s], ip[d], hops(doc, s, d, spine)).links
                rev = topo.resolve(ip[d], ip[s], hops(doc, d, s, back)).links
                out[ClassKey(s, d, 0xC000 + c)] = fwd + rev
    return out, list(out)


def feed(loc: Localizer, keys, t: float, rtt: dict[ClassKey, float], lost=None, prober=None):
    for k in keys:
        loc.observe(
            ClassWindow(
                k, t, rtt.get(k, 0.001), 100, (lost or {}).get(k, 0), (prober or {}).get(k, 0.0)
            )
        )


@pytest.mark.parametrize(
    "bad", ["leaf0->spine1", "spine0->leaf1", "leaf1->spine0", "spine1->leaf0", "leaf2->spine1"]
)
@pytest.mark.parametrize("how", ["delay", "loss"])
def test_the_degraded_link_is_ranked_first_and_alone(bad: str, how: str) -> None:
    paths, keys = paths_and_classes(leaf_spine())
    loc = Localizer(LocalizeConfig(min_rise_s=0.0005))
    for w in range(4):  # baselines: 1 ms with a little noise, no loss
        feed(loc, keys, float(w), {k: 0.001 + 0.00001 * (hash(k) % 7) for k in keys})
    through = [k for k in keys if bad in paths[k]]
    rtt = {k: 0.001 + (0.003 if how == "delay" and k in through else 0) for k in keys}
    lost = {k: 3 for k in through} if how == "loss" else {}
    feed(loc, keys, 5.0, rtt, lost)
    verdicts = loc.rank(paths, 5.0)
    assert verdicts[0].link == bad and verdicts[0].suspect
    assert [v.link for v in verdicts if v.suspect] == [bad]
    assert verdicts[0].bad_classes == verdicts[0].classes == len(through)
    if how == "delay":
        assert verdicts[0].rtt_rise_s == pytest.approx(0.003, rel=0.05)
    else:
        assert verdicts[0].loss == pytest.approx(3 / 200)  # over its newest two windows


def test_a_fault_held_in_part_by_a_window_names_no_link_after_it() -> None:
    """While a fault is new, a window holds it in part: of the six classes through the
    faulty leaf0->spine1 three rose, too many good ones for it to be named; the two
    classes of spine1->leaf1, both through leaf0->spine1 too, both rose. spine1->leaf1 is
    not named for them (leaf0->spine1 explains them and more), and the next window, the
    fault whole, names leaf0->spine1 alone."""
    ks = [ClassKey("h0", f"h{i}", 0xC000 + i) for i in range(1, 9)]
    paths = {k: ["h0->leaf0", "leaf0->spine1", f"spine1->leaf{2 * (i % 2)}"]
             for i, k in enumerate(ks[:6])}  # fmt: skip
    paths[ks[0]] = paths[ks[1]] = ["h0->leaf0", "leaf0->spine1", "spine1->leaf1"]
    paths[ks[6]] = paths[ks[7]] = ["h0->leaf0", "leaf0->spine0", "spine0->leaf2"]
    loc = Localizer(LocalizeConfig(min_rise_s=0.0005))
    for w in range(4):
        feed(loc, ks, float(w), {})
    feed(loc, ks, 5.0, {k: 0.004 for k in ks[:3]})
    assert [v.link for v in loc.rank(paths, 5.0) if v.suspect] == []
    feed(loc, ks, 6.0, {k: 0.004 for k in ks[:6]})
    assert [v.link for v in loc.rank(paths, 6.0) if v.suspect] == ["leaf0->spine1"]


@pytest.mark.parametrize("loss_windows", [1, 2])
def test_sparse_loss_is_counted_over_a_class_s_newest_windows(loss_windows: int) -> None:
    """Four of the 16 classes through a link lose a probe in each of two windows: one
    window's four losses are within chance (the link carries a third of the probes), the
    two windows' eight are not; a window past fresh_s no longer counts."""
    paths, keys = paths_and_classes(leaf_spine())
    bad = "leaf0->spine1"
    through = [k for k in keys if bad in paths[k]]
    loc = Localizer(LocalizeConfig(min_rise_s=0.0005, loss_windows=loss_windows, fresh_s=10))
    for w in range(4):
        feed(loc, keys, float(w), {})
    feed(loc, keys, 5.0, {}, {k: 1 for k in through[:4]})
    assert not [v for v in loc.rank(paths, 5.0) if v.suspect]
    feed(loc, keys, 6.0, {}, {k: 1 for k in through[2:6]})
    suspects = [v.link for v in loc.rank(paths, 6.0) if v.suspect]
    assert suspects == ([bad] if loss_windows == 2 else [])
    feed(loc, keys, 16.5, {})  # 6.0 is past fresh_s: the newest window alone
    assert not [v for v in loc.rank(paths, 16.5) if v.suspect]
    with pytest.raises(ValueError):
        LocalizeConfig(loss_windows=0)


def test_two_leaves_cannot_tell_an_uplink_from_the_downlink_after_it() -> None:
    """With two leaves every class through leaf0->spine1 goes on through spine1->leaf1:
    the two have the same classes, so the lane's fabric has three leaves."""
    paths, keys = paths_and_classes(leaf_spine(TWO_LEAVES))
    up = {k for k in keys if "leaf0->spine1" in paths[k]}
    down = {k for k in keys if "spine1->leaf1" in paths[k]}
    assert up == down


def test_host_bound_windows_never_make_a_suspect() -> None:
    paths, keys = paths_and_classes(leaf_spine())
    loc = Localizer(LocalizeConfig(min_rise_s=0.0005))
    for w in range(4):
        feed(loc, keys, float(w), {})
    # h0 is busy: every class it probes rose, and its prober's own delay holds the rise
    busy = [k for k in keys if k.src == "h0"]
    feed(loc, keys, 5.0, {k: 0.004 for k in busy}, prober={k: 0.0025 for k in busy})
    assert not [v for v in loc.rank(paths, 5.0) if v.suspect]
    assert loc.stats.host_bound == len(busy)


def test_quiet_noise_flags_nothing_and_old_windows_do_not_count() -> None:
    paths, keys = paths_and_classes(leaf_spine())
    loc = Localizer(LocalizeConfig(min_rise_s=0.0005, fresh_s=10))
    for w in range(8):
        feed(loc, keys, float(w), {k: 0.001 + 0.0001 * ((hash(k) + w) % 3) for k in keys})
    assert not [v for v in loc.rank(paths, 8.0) if v.suspect]
    assert all(v.classes == 0 for v in loc.rank(paths, 100.0))


def window_report(
    host: str, dst: str, sport: int, back: int, rtt_ns: int, lost: int
) -> pb.ProbeWindow:
    t = SlotTally()
    t.record_many([rtt_ns] * 50)
    t.record_lost(lost)
    return pb.ProbeWindow(
        dst=dst, transport="rdma", op="ud", size=64, rtt=to_wire(t), sport=sport, return_sport=back
    )


def traced(doc: dict, host: str, dst: str, sport: int, spine: int, t: float) -> pb.WindowReport:
    """HOST's report at T holding one class path: to DST on SPORT, through SPINE."""
    r = pb.WindowReport(host=host, window_end_unix_ns=int(t * 1e9))
    r.class_paths.append(
        pb.ClassPath(
            dst=dst, sport=sport, src_ip=HOSTS[host][1], dst_ip=HOSTS[dst][1],
            hops=hops(doc, host, dst, spine),
        )
    )  # fmt: skip
    return r


def test_fabric_links_learn_paths_ask_for_traces_and_export(tmp_path: Path) -> None:
    doc = leaf_spine()
    clock = [1000.0]
    links = FabricLinks(
        Topology.from_doc(doc),
        LocalizeConfig(min_rise_s=0.0005),
        refresh_s=60,
        clock=lambda: clock[0],
    )
    r = pb.WindowReport(host="h0", window_end_unix_ns=int(clock[0] * 1e9))
    r.class_windows.append(window_report("h0", "h2", 0xC001, 0xC002, 1_000_000, 0))
    links.take("h0", r)
    # a class with no path yet: no address known to trace it towards
    assert links.retraces("h0") == []
    r.class_paths.append(
        pb.ClassPath(
            dst="h2",
            sport=0xC001,
            src_ip="192.0.2.1",
            dst_ip="192.0.2.3",
            hops=hops(doc, "h0", "h2", 1),
        )
    )
    links.take("h0", r)
    links.take("h2", traced(doc, "h2", "h1", 0xC009, 0, clock[0]))
    # the way back of h0's class is h2's to trace, towards h0's address
    assert [(x.dst, x.address, x.sport) for x in links.retraces("h2")] == [
        ("h0", "192.0.2.1", 0xC002)
    ]
    links.take("h0", r)  # the next window: asked already, not again yet
    assert links.retraces("h2") == []
    assert links.links_of("h0", "h2") == [
        (0xC001, ("h0->leaf0", "leaf0->spine1", "spine1->leaf1", "leaf1->h2"), None)
    ]
    clock[0] += 120  # past the refresh: the next window asks h0 to trace it again
    r.ClearField("class_paths")
    links.take("h0", r)
    assert [(x.dst, x.sport) for x in links.retraces("h0")] == [("h2", 0xC001)]
    bad = pb.WindowReport(host="h0")
    bad.class_windows.append(pb.ProbeWindow(dst="h2", sport=0))
    bad.class_paths.append(pb.ClassPath(dst="h2", sport=70000))
    links.take("h0", bad)
    snap = links.snapshot()
    assert (
        snap.counts.class_windows_refused == 1
        and snap.counts.paths_unresolved["bad class path"] == 1
    )
    # h2 was asked for h0's way back twice: at first, and again once ASK_AGAIN_S had gone
    # by without the trace (a window in between asked for nothing)
    assert snap.counts.retraces_asked == {"new": 2, "old": 1}
    reply = links_reply(links, "h0", "h2")
    assert reply.configured and reply.classes[0].sport == 0xC001 and len(reply.links) == 20
    assert not links_reply(None).configured

    reg = CollectorRegistry()
    reg.register(LinkCollector(links))
    cat = tomllib.loads((ROOT / "collector" / "metrics.toml").read_text())["link_metric"]
    families = {m.name: m for m in reg.collect()}
    for row in cat:
        fam = families[row["name"].removesuffix("_total")]
        assert fam.type == row["type"], row["name"]
        assert sorted({k for s in fam.samples for k in s.labels}) == sorted(row["labels"]), row[
            "name"
        ]
    assert len(families) == len(cat)
    # one series per link, never per pair or class
    assert len(families["fabricprobe_link_suspect"].samples) == 20

    # h0's class has its way out alone until h2 traces the way back (h2 -> h0, 0xC002):
    # counted as partial, and whole once that trace is in
    key = ClassKey("h0", "h2", 0xC001)
    assert links.snapshot().partial == 1 and len(links.class_links()[key]) == 4
    links.take("h2", traced(doc, "h2", "h0", 0xC002, 0, clock[0]))
    assert links.snapshot().partial == 0
    assert links.class_links()[key][4:] == (
        "h2->leaf1",
        "leaf1->spine0",
        "spine0->leaf0",
        "leaf0->h0",
    )


def test_cover_probabilities_are_exact_on_small_throws() -> None:
    """Against brute force over every way of throwing C classes onto S uplinks."""
    import itertools

    from fabricprobe.collector.fabric.plan import classes_per_leaf, cover_probabilities

    for spines, k in ((2, 1), (3, 2), (4, 1)):
        q = cover_probabilities(8, spines, k)
        for c in range(9):
            ways = itertools.product(range(spines), repeat=c)
            ok = sum(1 for w in ways if all(w.count(s) >= k for s in range(spines)))
            assert q[c] == pytest.approx(ok / spines**c, abs=1e-12), (spines, k, c)
    c = classes_per_leaf(4, 2, 0.9)
    q = cover_probabilities(c, 4, 2)
    assert q[c] >= 0.9 > q[c - 1]


def test_coverage_names_the_links_short_of_k() -> None:
    from fabricprobe.collector.fabric.plan import coverage

    paths, _ = paths_and_classes(leaf_spine())
    counts, short = coverage(paths, Topology.from_doc(leaf_spine()).links(), k=2)
    assert not short and min(counts.values()) >= 2
    one = {k: v for k, v in paths.items() if k.sport == 0xC000 and k.src == "h0"}
    _, short = coverage(one, Topology.from_doc(leaf_spine()).links(), k=2)
    assert "leaf0->spine1" in short and "h3->leaf2" in short


def test_sparse_loss_on_one_link_is_named_by_its_counts() -> None:
    """2 % loss on one link at 40 probes per class and window: most classes through it
    lose one probe or none, yet their counts against the others' (0.2 % background)
    name the link alone; background loss alone names nothing."""
    import random

    paths, keys = paths_and_classes(leaf_spine())
    rng = random.Random(7)
    for bad in ("leaf0->spine1", "spine0->leaf2", "leaf1->spine1"):
        for background_only in (False, True):
            loc = Localizer(LocalizeConfig(min_rise_s=0.0005))
            for w in range(3):
                feed(loc, keys, float(w), {})
            for k in keys:
                p = 0.002 + (0.02 if bad in paths[k] and not background_only else 0.0)
                lost = sum(rng.random() < p for _ in range(40))
                loc.observe(ClassWindow(k, 5.0, 0.001, 40, lost))
            flagged = [v.link for v in loc.rank(paths, 5.0) if v.suspect]
            assert flagged == ([] if background_only else [bad]), (bad, background_only)


@pytest.mark.parametrize(("lost_each", "named"), [(2, []), (12, ["spine1->leaf2"])])
def test_two_links_with_the_same_losing_classes_wait_for_the_clean_probes(
    lost_each: int, named: list[str]
) -> None:
    """An uplink's 12 classes and the downlink after it, 10 of them: the losses fall on
    3 classes the two share. Six losses on their 2,000 and 2,400 probes are about as
    likely either way (1.2^6 = 3): neither is named (the downlink, whose rate is the
    higher, was: CI's trials flagged a healthy downlink so); 36 are 700 times likelier
    on the downlink, which alone is named."""
    up = [ClassKey("h0", f"h{i}", 0xC000 + i) for i in range(12)]
    others = [ClassKey("h9", f"h{i}", 0xC100 + i) for i in range(60)]
    paths = {k: ["leaf0->spine1", "spine1->leaf2" if i < 10 else "spine1->leaf3"]
             for i, k in enumerate(up)}  # fmt: skip
    paths.update({k: ["leaf1->spine0", f"spine0->leaf{2 + i % 2}"] for i, k in enumerate(others)})
    loc = Localizer(LocalizeConfig(min_rise_s=0.0005))
    for w in range(4):
        feed(loc, [*up, *others], float(w), {})
    feed(loc, [*up, *others], 5.0, {}, {k: lost_each for k in up[:3]})
    assert [v.link for v in loc.rank(paths, 5.0) if v.suspect] == named


def test_binomial_tail() -> None:
    import math

    from fabricprobe.collector.fabric.localize import binomial_tail

    assert binomial_tail(0, 10, 0.5) == 1.0
    assert binomial_tail(10, 10, 0.5) == pytest.approx(0.5**10)
    assert binomial_tail(1, 10, 0.1) == pytest.approx(1 - 0.9**10)
    assert binomial_tail(3, 1000, 0.0) == 0.0
    assert binomial_tail(5, 2000, 0.001) == pytest.approx(
        1 - sum(math.comb(2000, i) * 0.001**i * 0.999 ** (2000 - i) for i in range(5))
    )
