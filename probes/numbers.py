"""Bounded integers from outside text (sysfs files, tools' output, JSON).

`int()` of a decimal string costs time quadratic in its length and refuses more than
4,300 digits with a ValueError no parser documents; `str.isdecimal()` accepts digits of
every script. Every parser of outside text goes through `parse_uint`, which takes ASCII
digits only and counts them before converting, so a value over its limit (2**64 - 1 for a
counter) is a ParseError that names it, whatever its length.
"""

from __future__ import annotations

from fabricprobe.core.errors import ParseError

U64_MAX = 2**64 - 1  # the widest counter the kernel and the NICs keep
U32_MAX = 2**32 - 1


def parse_uint(text: str, what: str, limit: int = U64_MAX) -> int:
    """TEXT (surrounding whitespace, CR included, ignored) as an integer in 0..LIMIT.

    Raises ParseError naming WHAT when TEXT is not ASCII decimal digits, or when its value
    is over LIMIT; the digits are counted before int() so no length costs more than that.
    """
    s = text.strip()
    if not s or not s.isascii() or not s.isdigit():
        raise ParseError(f"{what} {s[:30]!r} is not a non-negative integer")
    digits = s.lstrip("0") or "0"
    if len(digits) > len(str(limit)) or int(digits) > limit:
        shown = digits if len(digits) <= 30 else f"a {len(digits)}-digit number"
        raise ParseError(f"{what} {shown} is over {limit}")
    return int(digits)


def uint_or_none(text: str | None, limit: int = U64_MAX) -> int | None:
    """TEXT as an integer in 0..LIMIT, or None when it is absent or not one (optional
    attributes: a value that cannot be used is skipped, never read as 0)."""
    if text is None:
        return None
    try:
        return parse_uint(text, "value", limit)
    except ParseError:
        return None
