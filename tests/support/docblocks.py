"""The shell blocks of README.md and docs/*.md, with the marker that says how each is held.

Every fenced `bash`, `console`, `sh` or `shell` block carries an HTML comment on the line
just before it (other comments, such as a `NAME:begin` marker, may sit between the two):

- `<!-- run: host -->`: a test runs it on this machine, loopback only, and it must end;
  `<!-- run: host; expect: TEXT -->` (repeatable) wants TEXT in what it prints;
- `<!-- run: lane -->`: a test under tests/rdma runs it in the VM lane; the block sits
  between `<!-- NAME:begin -->` and `<!-- NAME:end -->`, which that test looks for;
- `<!-- run: no — REASON -->` (or `-` for the dash): never run, for the reason given.

The fences come from markdown-it (the CommonMark parser rich already brings), so a fence
inside a list item or another fence's text is read as a renderer reads it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[2]
SHELL_LANGS = frozenset({"bash", "console", "sh", "shell"})
MAX_REASON = 200
MAX_EXPECT = 200

_COMMENT = re.compile(r"^<!--\s*(.*?)\s*-->$")
_NAMED = re.compile(r"^([a-z][a-z0-9-]*):begin$")


class MarkerError(ValueError):
    """A `run:` comment that says nothing this module knows how to hold."""


@dataclass(frozen=True)
class Marker:
    how: str  # host, lane or no
    expect: tuple[str, ...] = ()
    reason: str = ""


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    marker: Marker | None
    name: str | None  # the NAME of a `<!-- NAME:begin -->` just above, if any

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def parse_marker(comment: str) -> Marker | None:
    """The marker in one comment's inner text (`run: ...`), None when it is not one."""
    if not comment.startswith("run:"):
        return None
    body = comment[len("run:") :].strip()
    head, _, rest = body.partition(";")
    head = head.strip()
    if head in ("host", "lane"):
        expect: list[str] = []
        for part in rest.split(";") if rest.strip() else []:
            key, sep, value = part.strip().partition(":")
            if key.strip() != "expect" or not sep or not value.strip():
                raise MarkerError(f"unknown option {part.strip()!r} (only 'expect: TEXT')")
            if head != "host":
                raise MarkerError("'expect' is for host blocks only")
            if len(value.strip()) > MAX_EXPECT:
                raise MarkerError(f"expect longer than {MAX_EXPECT} characters")
            expect.append(value.strip())
        return Marker(head, tuple(expect))
    m = re.fullmatch(r"no\s*(?:—|-)\s*(.+)", body, re.S)
    if m and m.group(1).strip():
        reason = m.group(1).strip()
        if len(reason) > MAX_REASON:
            raise MarkerError(f"reason longer than {MAX_REASON} characters")
        return Marker("no", reason=reason)
    raise MarkerError(f"'run: {body}': want host, lane or 'no — REASON'")


def blocks(path: Path) -> list[Block]:
    """Every shell block of one Markdown file, with the marker and name above it."""
    text = path.read_text()
    lines = text.splitlines()
    found = []
    for tok in MarkdownIt("commonmark").parse(text):
        if tok.type != "fence" or tok.map is None:
            continue
        lang = tok.info.split()[0] if tok.info.strip() else ""
        if lang not in SHELL_LANGS:
            continue
        marker, name = None, None
        k = tok.map[0] - 1
        while k >= 0 and (m := _COMMENT.match(lines[k].strip())):
            named = _NAMED.match(m.group(1))
            if named and name is None:
                name = named.group(1)
            got = parse_marker(m.group(1))
            if got is not None and marker is None:
                marker = got
            k -= 1
        found.append(Block(path, tok.map[0] + 1, lang, tok.content, marker, name))
    return found


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def all_blocks() -> list[Block]:
    return [b for p in doc_files() for b in blocks(p)]
