"""The report's fabric links: the collector's links ranked (the Links query, as
`probe why --links --json` gives them) drawn as the leaf-spine they make, with the
suspects marked, their evidence in a table, and the slowest requests' suspect links.

The tiers come from the links' names and the fleet's hosts alone: a leaf is a switch
cabled to a host, a spine a switch cabled only to switches. Rails keep their own leaves,
so leaves are drawn rail by rail.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fabricprobe.report import figures
from fabricprobe.report.page import Picture, Section, number, para, table

MAX_LEAVES = 48  # leaves drawn: those whose links' classes went bad most first
MAX_SPINES = 64
MAX_ROWS = 20  # links in the table


def ends(link: str) -> tuple[str, str] | None:
    a, sep, b = link.partition("->")
    return (a, b) if sep and a and b else None


def tiers(
    links: Sequence[Mapping[str, Any]], hosts: Iterable[str]
) -> tuple[list[str], list[str], dict[str, list[str]]]:
    """(leaves, spines, each leaf's hosts) of the fabric LINKS cross; leaves by rail,
    then name."""
    hosts = set(hosts)
    near: dict[str, set[str]] = defaultdict(set)
    rail: dict[str, int] = {}
    for v in links:
        e = ends(str(v.get("link", "")))
        if e is None:
            continue
        a, b = e
        near[a].add(b)
        near[b].add(a)
        if v.get("rail") is not None:
            for n in e:
                rail.setdefault(n, int(v["rail"]))
    switches = [n for n in near if n not in hosts]
    leaves = sorted((n for n in switches if near[n] & hosts), key=lambda n: (rail.get(n, -1), n))
    spines = sorted(n for n in switches if not near[n] & hosts)
    hosts_of = {leaf: sorted(near[leaf] & hosts) for leaf in leaves}
    return leaves, spines, hosts_of


def cables(
    links: Sequence[Mapping[str, Any]], leaves: Sequence[str], spines: Sequence[str]
) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
    """The verdicts of each leaf-spine cable's two directions, by (leaf, spine)."""
    is_leaf, is_spine = set(leaves), set(spines)
    out: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for v in links:
        e = ends(str(v.get("link", "")))
        if e is None:
            continue
        a, b = e
        if a in is_leaf and b in is_spine:
            out[(a, b)].append(v)
        elif b in is_leaf and a in is_spine:
            out[(b, a)].append(v)
    return dict(out)


def _badness(ways: Iterable[Mapping[str, Any]]) -> tuple[bool, float]:
    ways = list(ways)
    share = max((v["bad_classes"] / v["classes"] for v in ways if v.get("classes")), default=0)
    return any(v.get("suspect") for v in ways), float(share)


def links_section(
    doc: Mapping[str, Any] | None, error: str, hosts: Iterable[str]
) -> tuple[Section, list[Picture]]:
    """The section, and its picture where there are links to draw."""
    title = "Fabric links"
    if doc is None:
        return Section(title, [para(f"Links query failed: {error}", "error")]), []
    if not doc.get("configured"):
        return Section(title, [para("The collector has no fabric file: links are not ranked.")]), []
    links = list(doc.get("links") or [])
    requests = list(doc.get("requests") or [])
    hosts = set(hosts) | {h for r in requests for h in (r.get("src"), r.get("dst")) if h}
    leaves, spines, hosts_of = tiers(links, hosts)
    by_cable = cables(links, leaves, spines)
    parts: list[str] = []
    pics: list[Picture] = []
    left_out = ""
    if leaves and spines:
        if len(leaves) > MAX_LEAVES or len(spines) > MAX_SPINES:
            worst: dict[str, tuple[bool, float]] = defaultdict(lambda: (False, 0.0))
            for (leaf, spine), ways in by_cable.items():
                b = _badness(ways)
                worst[leaf], worst[spine] = max(worst[leaf], b), max(worst[spine], b)
            rank = sorted(leaves, key=lambda n: worst[n], reverse=True)[:MAX_LEAVES]
            left_out = (
                f" {max(0, len(leaves) - MAX_LEAVES)} leaves and "
                f"{max(0, len(spines) - MAX_SPINES)} spines whose links went bad least are"
                " not drawn."
            )
            leaves = [n for n in leaves if n in set(rank)]
            spines = sorted(spines, key=lambda n: worst[n], reverse=True)[:MAX_SPINES]
            spines.sort()
        pic = Picture(
            "fabric_links.png",
            figures.leaf_spine(leaves, spines, by_cable, hosts_of),
            "the leaf-spine with its suspect links",
            f"{doc.get('class_paths', 0)} ECMP class paths known. A cable is red when a "
            "direction of it is suspect (its classes rose or lost, those that avoid it did "
            "not), labelled with that direction's median rise and loss; the others are grey, "
            "darker as more of their classes went bad. Leaves drawn rail by rail." + left_out,
        )
        pics.append(pic)
        parts.append(pic.tag())
    elif links:
        parts.append(para("No leaf-spine found in the links' names (no host is cabled to them)."))
    rows = [
        [
            v["link"],
            "" if v.get("rail") is None else str(v["rail"]),
            "yes" if v.get("suspect") else "",
            number(v.get("classes")),
            number(v.get("bad_classes")),
            number(float(v.get("rtt_rise_s") or 0.0) * 1e3, "{:,.3f}"),
            number(float(v.get("loss") or 0.0) * 100, "{:,.2f}"),
        ]
        for v in links[:MAX_ROWS]
    ]
    heads = ["link", "rail", "suspect", "classes", "bad classes", "rise ms", "loss %"]
    none = para("No link ranked yet.")
    parts.append(table(heads, rows, left=3, limit=MAX_ROWS) if rows else none)
    hit = [r for r in requests if r.get("suspect")]
    if hit:
        parts.append(
            table(
                ["request", "path", "suspect links", "its links known from"],
                [
                    [
                        r.get("request_id", ""),
                        f"{r['src']} → {r['dst']}",
                        ", ".join(r["suspect"]),
                        str(r.get("links_of", "")),
                    ]
                    for r in hit
                ],
                left=4,
            )
        )
        parts.append(
            para(
                "A request's links are its own flow's where its hosts' agents listed the QP "
                "pair that carried it and its source port was traced; else those of its "
                "pair's probed ECMP classes, which it may or may not cross."
            )
        )
    return Section(title, parts), pics
