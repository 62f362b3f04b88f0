"""`probe trace` on the lane's leaf-spine: its hop lists are the routers' own choice for
each 5-tuple, class by class, on both rails; without CAP_NET_RAW it still traces, and
the UD way's fallback says why."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.fabric.conftest import Fabric

PROBE = [sys.executable, "-m", "fabricprobe"]


def trace(src: str, dst: str, *args: str, user: str | None = None) -> dict:
    argv = [*PROBE, "trace", dst, "--bind", src, "--json", *args]
    if user:
        argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *argv]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_lane_lists_every_router_and_link(fabric: Fabric) -> None:
    assert {"leaf0", "leaf1", "leaf2", "spine0", "spine1"} <= set(fabric.routers)
    names = {(link["a_dev"], link["b_dev"]) for link in fabric.doc["links"]}
    for x in (0, 1, 2):
        for y in (0, 1):
            assert (f"l{x}s{y}", f"s{y}l{x}") in names
    for r in fabric.routers:
        ns = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                r,
                "cat",
                "/proc/sys/net/ipv4/fib_multipath_hash_policy",
                "/proc/sys/net/ipv4/ip_forward",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert ns == ["1", "1"], r


def test_hops_are_the_routers_own_choice_per_class(fabric: Fabric) -> None:
    """16 classes from h0 to a host on the other leaf and one on its own, rail 0: each
    class's hop list is the walk the routers themselves give for its source port, and
    the classes cross both spines."""
    h0, h1, h2 = (fabric.nic(h) for h in ("h0", "h1", "h2"))
    got = trace(h0.ip, h2.ip, "--sports", "16")
    assert got["method"] == "udp", got["method_reason"]
    assert "hop limit" in got["method_reason"]  # the UD way was tried first
    spines = set()
    for c in got["classes"]:
        assert c["complete"], c
        assert c["hops"] == fabric.route_walk(h0, h2, c["sport"]), c
        assert len(c["hops"]) == 3 and all(r is not None and r > 0 for r in c["rtt_s"])
        spines.add(c["hops"][1])
    assert len(spines) == 2, "16 classes all hashed onto one spine"
    near = trace(h0.ip, h1.ip, "--sports", "4")
    for c in near["classes"]:
        assert c["hops"] == fabric.route_walk(h0, h1, c["sport"]) == [c["hops"][0]]


def test_rail_one_is_its_own_network(fabric: Fabric) -> None:
    a, b = fabric.nic("h1", 1), fabric.nic("h3", 1)
    assert (a.leaf, b.leaf) == ("leaf3", "leaf5")
    got = trace(a.ip, b.ip, "--sports", "8", "--method", "udp")
    rail1 = {i["ip"] for r in ("leaf3", "leaf5") for i in fabric.routers[r]["interfaces"]}
    for c in got["classes"]:
        assert c["hops"] == fabric.route_walk(a, b, c["sport"])
        assert c["hops"][0] in rail1 and c["hops"][2] in rail1


def test_without_cap_net_raw_it_says_so_and_still_traces(fabric: Fabric) -> None:
    h0, h3 = fabric.nic("h0"), fabric.nic("h3")
    got = trace(h0.ip, h3.ip, "--sports", "2", user="65534")
    assert got["method"] == "udp"
    assert "CAP_NET_RAW" in got["method_reason"]
    for c in got["classes"]:
        assert c["hops"] == fabric.route_walk(h0, h3, c["sport"])
    denied = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            *PROBE,
            "trace",
            h3.ip,
            "--bind",
            h0.ip,
            "--method",
            "ud",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert denied.returncode == 1 and "CAP_NET_RAW" in denied.stderr, denied.stderr
