"""The report page: one self-contained HTML file (pictures inlined as data: URIs, no
script, no fetch), assembled from escaped text and tables. Every string that came from
outside goes through `esc()`, which bounds it too."""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from fabricprobe.report.frames import clip

STYLE = """
body { font-family: sans-serif; margin: 1.5em auto; max-width: 1300px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; border-bottom: 1px solid #ccc; margin-top: 2em; }
h3 { font-size: 1em; margin-bottom: 0.3em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 2px 6px; text-align: right; }
th { background: #f3f3f3; } td.l, th.l { text-align: left; }
img { max-width: 100%; border: 1px solid #eee; }
p.note, figcaption { color: #555; font-size: 0.85em; } p.error { color: #b00; }
dl.meta dt { font-weight: bold; float: left; width: 10em; } dl.meta dd { margin-left: 10em; }
.request { display: inline-block; vertical-align: top; margin: 0 1em 1em 0; max-width: 18em; }
"""


def esc(text: object, limit: int = 200) -> str:
    return html.escape(clip(text, limit), quote=True)


@dataclass(frozen=True)
class Picture:
    """A PNG shown inline and written beside the page."""

    file: str
    data: bytes
    alt: str
    caption: str = ""

    def tag(self) -> str:
        b64 = base64.b64encode(self.data).decode("ascii")
        cap = f"<figcaption>{esc(self.caption, 2000)}</figcaption>" if self.caption else ""
        return (
            f'<figure><img src="data:image/png;base64,{b64}" alt="{esc(self.alt)}">{cap}</figure>'
        )


@dataclass(frozen=True)
class Section:
    title: str
    parts: Sequence[str] = field(default_factory=list)  # HTML already escaped


def table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], left: int = 1, limit: int = 100
) -> str:
    """An HTML table of ROWS (at most LIMIT, then a count of the rest); the first LEFT
    columns are left-aligned text."""
    cls = [' class="l"' if i < left else "" for i in range(len(headers))]
    head = "".join(f"<th{c}>{esc(h)}</th>" for c, h in zip(cls, headers, strict=True))
    body = []
    for row in rows[:limit]:
        cells = "".join(f"<td{c}>{esc(v)}</td>" for c, v in zip(cls, row, strict=True))
        body.append(f"<tr>{cells}</tr>")
    more = len(rows) - limit
    tail = f'<p class="note">{more} more not shown.</p>' if more > 0 else ""
    return f"<table><tr>{head}</tr>{''.join(body)}</table>{tail}"


def para(text: str, cls: str = "note") -> str:
    return f'<p class="{cls}">{esc(text, 2000)}</p>'


def number(v: object, fmt: str = "{:,.0f}") -> str:
    try:
        f = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "-"
    return "-" if math.isnan(f) else fmt.format(f)


def page(title: str, meta: Sequence[tuple[str, str]], sections: Sequence[Section]) -> str:
    dl = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v, 400)}</dd>" for k, v in meta)
    toc = "".join(f'<li><a href="#s{i}">{esc(s.title)}</a></li>' for i, s in enumerate(sections))
    body = "".join(
        f'<section id="s{i}"><h2>{esc(s.title)}</h2>{"".join(s.parts)}</section>'
        for i, s in enumerate(sections)
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        # nothing on the page may reach the network: inline pictures and style only
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "img-src data:; style-src 'unsafe-inline'\">"
        f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>"
        f'<h1>{esc(title)}</h1><dl class="meta">{dl}</dl><ul>{toc}</ul>{body}'
        "</body></html>\n"
    )
