"""README.md and docs/: every shell block says how it is held, host blocks stay on
loopback, lane blocks are run by a lane test, links lead somewhere, and the README stays
a front door."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from tests.support.docblocks import (
    ROOT,
    Marker,
    MarkerError,
    all_blocks,
    blocks,
    doc_files,
    parse_marker,
)

README_MAX_LINES = 300


def test_every_shell_block_says_how_it_is_held() -> None:
    found = all_blocks()
    assert len(found) >= 10  # README.md and docs/ were both read
    unmarked = [b.where for b in found if b.marker is None]
    assert not unmarked, f"add <!-- run: host|lane|no — REASON --> above: {unmarked}"


def test_host_blocks_exist_and_stay_on_this_machine() -> None:
    host = [b for b in all_blocks() if b.marker and b.marker.how == "host"]
    assert len(host) >= 2
    for b in host:
        assert not re.search(r"\bsudo\b|lane/run\.sh", b.text), b.where
        for addr in re.findall(r"(?<![\d.])\d{1,3}(?:\.\d{1,3}){3}(?![\d.])", b.text):
            assert ipaddress.ip_address(addr).is_loopback, f"{b.where}: {addr}"


def test_lane_blocks_are_named_and_run_by_a_lane_test() -> None:
    lane = [b for b in all_blocks() if b.marker and b.marker.how == "lane"]
    assert lane
    tests = "\n".join(
        p.read_text() for d in ("rdma", "fabric") for p in (ROOT / "tests" / d).glob("test_*.py")
    )
    for b in lane:
        assert b.name, f"{b.where}: a lane block sits between <!-- NAME:begin/end -->"
        assert f"<!-- {b.name}:end -->" in b.path.read_text(), b.where
        assert f"<!-- {b.name}:begin -->" in tests, f"{b.where}: no lane test runs it"


def test_the_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES
    assert "make demo" in "\n".join(lines) and "make test" in "\n".join(lines)


def _headings(path: Path) -> list[str]:
    toks = MarkdownIt("commonmark").parse(path.read_text())
    return [toks[i + 1].content for i, t in enumerate(toks) if t.type == "heading_open"]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation gone, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: p.name)
def test_headings_are_unique_and_links_lead_somewhere(path: Path) -> None:
    heads = _headings(path)
    assert len(heads) == len(set(heads)), f"repeated headings in {path.name}"
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        assert dest.exists(), f"{path.name}: {target}"
        if anchor and dest.suffix == ".md":
            assert anchor in {_slug(h) for h in _headings(dest)}, f"{path.name}: {target}"


def test_blocks_are_read_as_a_renderer_reads_them(tmp_path: Path) -> None:
    doc = tmp_path / "page.md"
    doc.write_text(
        "<!-- run: host; expect: up; expect: 2 -->\n```bash\necho up 2\n```\n\n"
        "- a list item\n\n  <!-- run: no — needs a NIC -->\n  ```sh\n  probe validate\n  ```\n\n"
        "<!-- run: lane -->\n<!-- fleet:begin -->\n```console\n$ true\n```\n<!-- fleet:end -->\n\n"
        "```python\nprint('not a shell block')\n```\n\n"
        "<!-- a plain comment -->\n\n```bash\nunmarked\n```\n\n"
        "````markdown\n<!-- run: host -->\n```bash\ninside another fence\n```\n````\n"
    )
    got = [(b.line, b.lang, b.text, b.marker, b.name) for b in blocks(doc)]
    assert got == [
        (2, "bash", "echo up 2\n", Marker("host", ("up", "2")), None),
        (9, "sh", "probe validate\n", Marker("no", reason="needs a NIC"), None),
        (15, "console", "$ true\n", Marker("lane"), "fleet"),
        (26, "bash", "unmarked\n", None, None),
    ]


@pytest.mark.parametrize(
    ("comment", "error"),
    [
        ("run: maybe", "want host, lane or 'no — REASON'"),
        ("run: no", "want host, lane"),
        ("run: no —  ", "want host, lane"),
        ("run: host; timeout: 5", "unknown option 'timeout: 5'"),
        ("run: host; expect:", "unknown option"),
        ("run: lane; expect: x", "'expect' is for host blocks only"),
        ("run: no — " + "x" * 201, "reason longer than 200"),
        ("run: host; expect: " + "x" * 201, "expect longer than 200"),
    ],
)
def test_bad_markers_say_what_is_wrong(comment: str, error: str) -> None:
    with pytest.raises(MarkerError, match=re.escape(error)):
        parse_marker(comment)


_text = st.text(
    st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp"), blacklist_characters=";"),
    min_size=1,
    max_size=60,
).filter(lambda s: s.strip() != "" and s == s.strip())


@given(_text, st.sampled_from(["—", "-"]))
def test_a_reason_comes_back_as_written(reason: str, dash: str) -> None:
    assert parse_marker(f"run: no {dash} {reason}") == Marker("no", reason=reason)


@given(st.lists(_text, max_size=4))
def test_expectations_come_back_in_order(expect: list[str]) -> None:
    comment = "run: host" + "".join(f"; expect: {e}" for e in expect)
    assert parse_marker(comment) == Marker("host", tuple(expect))


@given(st.text(max_size=80))
def test_any_comment_is_a_marker_none_or_a_marker_error(comment: str) -> None:
    try:
        got = parse_marker(comment)
    except MarkerError:
        assert comment.startswith("run:")
    else:
        assert (got is None) != comment.startswith("run:")
