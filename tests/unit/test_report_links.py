"""The report's fabric links: the leaf-spine found in the links' names (rails kept
apart), its suspect cables drawn, the evidence tabled, and hostile names and figures
taken without a failure (hypothesis)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fabricprobe.report.links import MAX_LEAVES, cables, links_section, tiers

HOSTS = ["h0", "h1", "h2", "h3"]
EVIL = '<script>alert("x")</script>$\\frac{a}{b}$' + "x" * 300


def verdict(link: str, rail: int | None = 0, **kw: Any) -> dict[str, Any]:
    v = {"link": link, "rank": 0, "suspect": False, "classes": 6, "bad_classes": 0,
         "rtt_rise_s": 0.0, "loss": 0.0, "rail": rail}  # fmt: skip
    return {**v, **kw}


def lane_links() -> list[dict[str, Any]]:
    """The lane's leaf-spine of two rails: leaves 0-2 (rail 0) and 3-5 (rail 1), two
    spines, h0 and h1 on leaf0 / leaf3, h2 on leaf1 / leaf4, h3 on leaf2 / leaf5."""
    out = []
    for rail in (0, 1):
        for x in range(3 * rail, 3 * rail + 3):
            for y in (0, 1):
                out += [verdict(f"leaf{x}->spine{y}", rail), verdict(f"spine{y}->leaf{x}", rail)]
        for i, h in enumerate(HOSTS):
            leaf = f"leaf{3 * rail + min(2, max(0, i - 1))}"
            out += [verdict(f"{h}->{leaf}", rail), verdict(f"{leaf}->{h}", rail)]
    return out


def test_leaves_spines_and_hosts_come_from_the_links_names_rail_by_rail() -> None:
    leaves, spines, hosts_of = tiers(lane_links(), HOSTS)
    assert leaves == [f"leaf{x}" for x in range(6)]  # rail 0's, then rail 1's
    assert spines == ["spine0", "spine1"]
    assert hosts_of["leaf0"] == ["h0", "h1"] and hosts_of["leaf5"] == ["h3"]
    by = cables(lane_links(), leaves, spines)
    assert len(by) == 12 and {v["link"] for v in by[("leaf0", "spine1")]} == {
        "leaf0->spine1",
        "spine1->leaf0",
    }


def test_the_section_draws_the_suspect_and_tables_its_evidence() -> None:
    links = [
        verdict("leaf0->spine1", suspect=True, bad_classes=6, rtt_rise_s=0.0023, rank=1),
        *(v for v in lane_links() if v["link"] != "leaf0->spine1"),
    ]
    doc = {
        "configured": True,
        "class_paths": 96,
        "links": links,
        "requests": [
            {"request_id": "req-one", "src": "h0", "dst": "h2", "suspect": ["leaf0->spine1"]},
            {"request_id": "req-two", "src": "h2", "dst": "h3", "suspect": []},
        ],
    }
    sec, pics = links_section(doc, "", HOSTS)
    assert [p.file for p in pics] == ["fabric_links.png"]
    assert pics[0].data.startswith(b"\x89PNG")
    html = "".join(sec.parts[1:])  # past the picture
    assert "leaf0-&gt;spine1" in html and "2.300" in html  # the table: rise in ms
    assert "req-one" in html and "req-two" not in html  # requests that may cross a suspect


def test_no_fabric_file_a_failed_query_and_no_hosts_each_say_so() -> None:
    sec, pics = links_section({"configured": False}, "", HOSTS)
    assert not pics and "no fabric file" in "".join(sec.parts)
    sec, pics = links_section(None, "collector c:1: UNAVAILABLE: down", HOSTS)
    assert not pics and "UNAVAILABLE" in "".join(sec.parts)
    sec, pics = links_section({"configured": True, "links": lane_links()}, "", [])
    assert not pics and "No leaf-spine found" in "".join(sec.parts)


def test_a_large_fabric_draws_its_worst_leaves() -> None:
    links = []
    for x in range(MAX_LEAVES + 20):
        links += [verdict(f"leaf{x}->spine0"), verdict(f"h{x}->leaf{x}")]
    links[0] = verdict("leaf0->spine0", suspect=True, bad_classes=6, rtt_rise_s=0.001)
    hosts = [f"h{x}" for x in range(MAX_LEAVES + 20)]
    _, pics = links_section({"configured": True, "links": links}, "", hosts)
    assert len(pics) == 1 and "20 leaves and 0 spines" in pics[0].caption


names = st.one_of(st.sampled_from(["leaf0", "spine1", "h0", "", EVIL, "$x$", "->"]), st.text())
numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 10**9))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "link": st.one_of(st.builds(lambda a, b: f"{a}->{b}", names, names), names),
                "suspect": st.booleans(),
                "classes": st.integers(0, 100),
                "bad_classes": st.integers(0, 100),
                "rtt_rise_s": numbers,
                "loss": numbers,
                "rail": st.one_of(st.none(), st.integers(0, 8)),
            }
        ),
        max_size=30,
    ),
    st.lists(names, max_size=6),
)
def test_hostile_links_never_fail_the_section(
    links: list[dict[str, Any]], hosts: list[str]
) -> None:
    doc = {"configured": True, "class_paths": 3, "links": links, "requests": []}
    sec, _ = links_section(doc, "", ["h0", *hosts])
    assert sec.parts
    assert "<script>" not in "".join(sec.parts)
