"""Which link, on a fabric of two rails: a host's classes to one peer on each rail are
kept apart (one source port on two rails is two classes), the way back is traced on the
class's own rail, and a link degraded on rail 1 is named rail 1, from the fabric file or,
where the file says no rail, from the rail of the classes that cross it."""

from __future__ import annotations

from typing import Any

import pytest

from fabricprobe.collector.fabric.links import FabricLinks
from fabricprobe.collector.fabric.localize import LocalizeConfig
from fabricprobe.collector.fabric.service import links_reply
from fabricprobe.collector.fabric.topology import Topology
from fabricprobe.core.api import fabricprobe_pb2 as pb
from tests.unit.test_fabric_links import window_report

NETS = ("192.0.2", "198.51.100")  # rail 0's hosts, rail 1's


def two_rails(rail_on_cables: bool) -> dict[str, Any]:
    """Hosts h0..h3, each with a NIC on rail 0 and one on rail 1; each rail two leaves of
    its own (h0, h1 on the first, h2, h3 on the second), both rails on spine0 and spine1."""
    links, nics, k = [], [], 0
    for r, net in enumerate(NETS):
        leaves = (f"leaf{2 * r}", f"leaf{2 * r + 1}")
        pairs = [(leaf, f"spine{s}", "leaf-spine", None) for leaf in leaves for s in (0, 1)]
        for i in range(4):
            ip = f"{net}.{i + 1}"
            pairs.append((f"h{i}", leaves[i // 2], "host", ip))
            nics.append({"name": f"h{i}", "ip": ip, "rail": r, "leaf": leaves[i // 2]})
        for a, b, tier, a_ip in pairs:
            cable = {
                "a": a,
                "a_ip": a_ip or f"203.0.113.{2 * k}",
                "b": b,
                "b_ip": f"203.0.113.{2 * k + 1}",
                "tier": tier,
            }
            links.append(cable | ({"rail": r} if rail_on_cables else {}))
            k += 1
    routers = [{"name": n} for n in ("leaf0", "leaf1", "leaf2", "leaf3", "spine0", "spine1")]
    return {"routers": routers, "links": links, "nics": nics}


def inbound(doc: dict[str, Any], node: str, prev: str) -> str:
    """NODE's address on its cable from PREV: what it answers an expiring probe from."""
    for c in doc["links"]:
        if (c["a"], c["b"]) == (prev, node):
            return str(c["b_ip"])
        if (c["b"], c["a"]) == (prev, node):
            return str(c["a_ip"])
    raise KeyError((node, prev))


def trace(doc: dict[str, Any], rail: int, src: int, dst: int, spine: int) -> pb.ClassPath:
    """The class path SRC -> DST on RAIL through SPINE, as an agent reports it."""
    ls, ld, s = f"leaf{2 * rail + src // 2}", f"leaf{2 * rail + dst // 2}", f"spine{spine}"
    hops = [inbound(doc, ls, f"h{src}"), inbound(doc, s, ls), inbound(doc, ld, s)]
    return pb.ClassPath(
        dst=f"h{dst}",
        sport=0xC001,
        src_ip=f"{NETS[rail]}.{src + 1}",
        dst_ip=f"{NETS[rail]}.{dst + 1}",
        hops=hops,
        rail=rail,
    )


@pytest.mark.parametrize("rail_on_cables", [True, False])
def test_a_fault_on_rail_1_is_named_rail_1(rail_on_cables: bool) -> None:
    doc = two_rails(rail_on_cables)
    clock = [1000.0]
    links = FabricLinks(
        Topology.from_doc(doc), LocalizeConfig(min_rise_s=0.0005, min_bad=1), clock=lambda: clock[0]
    )
    # h0 -> h2 on both rails, on one source port: rail 0 over spine0, rail 1 over spine1
    paths = pb.WindowReport(host="h0")
    paths.class_paths.extend([trace(doc, 0, 0, 2, 0), trace(doc, 1, 0, 2, 1)])
    links.take("h0", paths)
    for w in range(6):
        clock[0] += 10
        r = pb.WindowReport(host="h0", window_end_unix_ns=int(clock[0] * 1e9))
        for rail in (0, 1):
            rtt = 8_000_000 if (rail == 1 and w == 5) else 1_000_000  # rail 1 rises at last
            win = window_report("h0", "h2", 0xC001, 0xC002, rtt, 0)
            win.rail = rail
            r.class_windows.append(win)
        links.take("h0", r)
    classes = links.links_of("h0", "h2")
    assert [(sport, rail) for sport, _, rail in classes] == [(0xC001, 0), (0xC001, 1)]
    assert classes[1][1] == ("h0->leaf2", "leaf2->spine1", "spine1->leaf3", "leaf3->h2")
    snap = links.snapshot()
    suspects = [v for v in snap.verdicts if v.suspect]
    assert suspects and {v.rail for v in suspects} == {1}
    assert all(v.link in classes[1][1] for v in suspects)
    rails = {v.link: v.rail for v in snap.verdicts}
    assert rails["leaf0->spine0"] == 0 and rails["leaf2->spine1"] == 1
    reply = links_reply(links, "h0", "h2")
    assert reply.links[0].rail == 1
    assert [c.rail for c in reply.classes] == [0, 1]


def test_the_way_back_is_traced_on_the_classs_own_rail() -> None:
    doc = two_rails(True)
    links = FabricLinks(Topology.from_doc(doc), clock=lambda: 1000.0)
    learn = pb.WindowReport(host="h0")  # h0's addresses on each rail, from its own traces
    learn.class_paths.extend([trace(doc, 0, 0, 2, 0), trace(doc, 1, 0, 2, 0)])
    links.take("h0", learn)
    r = pb.WindowReport(host="h0", window_end_unix_ns=int(1000e9))
    for rail in (0, 1):
        win = window_report("h0", "h2", 0xC001, 0xC00A, 1_000_000, 0)
        win.rail = rail
        r.class_windows.append(win)
    links.take("h0", r)
    back = sorted(links.retraces("h2"), key=lambda x: x.rail)
    assert [(x.dst, x.address, x.sport, x.rail) for x in back] == [
        ("h0", "192.0.2.1", 0xC00A, 0),
        ("h0", "198.51.100.1", 0xC00A, 1),
    ]
