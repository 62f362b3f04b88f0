"""TOML from outside, read safely, and where each key of it is defined.

`toml_loads(text)` is tomllib's parse with every way it can fail on hostile text as one
TomlError: not TOML, an integer too long for int(), nesting past Python's stack.

tomllib returns values without positions, so a settings error could not name its line.
`key_lines(text)` scans text that tomllib has already accepted and records the first line
of every table header, dotted key and inline-table key, so that `("agent", "tls", "ca")`
is found whether the file wrote `[agent.tls]` + `ca = ...`, `agent.tls.ca = ...` or
`tls = { ca = ... }`. The scanner only skips values (strings, arrays, scalars); it never
interprets them. On text it cannot follow it stops and returns what it found so far:
a missing line only makes an error message less precise.
"""

from __future__ import annotations

import bisect
import contextlib
import tomllib
from collections.abc import Callable
from typing import Any

KeyPath = tuple[str, ...]


class TomlError(ValueError):
    """Text tomllib cannot read; the message says why in a phrase (`not valid TOML: ...`)
    that its caller puts after the name of what it read."""


def toml_loads(text: str) -> dict[str, Any]:
    """TEXT parsed by tomllib; TomlError for text it cannot read."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise TomlError(f"not valid TOML: {e}") from None
    except ValueError as e:  # tomllib's int() of an integer of more than 4,300 digits
        raise TomlError(f"a number too long to read: {str(e)[:80]}") from None
    except RecursionError:  # arrays or inline tables nested past Python's stack
        raise TomlError("nested too deep to read") from None


_BARE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_SCALAR_END = frozenset(",]}\n#")


class _Stop(Exception):
    """The scanner lost its way (text tomllib would reject, or a case it does not know)."""


class _Scanner:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.newlines = [i for i, c in enumerate(text) if c == "\n"]
        self.found: dict[KeyPath, int] = {}

    def line(self, pos: int) -> int:
        return bisect.bisect_left(self.newlines, pos) + 1

    def peek(self, n: int = 1) -> str:
        return self.text[self.pos : self.pos + n]

    def record(self, path: KeyPath, pos: int) -> None:
        for i in range(1, len(path) + 1):  # a.b.c = 1 also defines a and a.b on that line
            self.found.setdefault(path[:i], self.line(pos))

    def skip_blank(self, newlines: bool) -> None:
        """Spaces, tabs, comments and (when NEWLINES) line ends."""
        t = self.text
        while self.pos < len(t):
            c = t[self.pos]
            if c in " \t\r" or (newlines and c == "\n"):
                self.pos += 1
            elif c == "#":
                end = t.find("\n", self.pos)
                self.pos = len(t) if end < 0 else end
            else:
                return

    def expect(self, s: str) -> None:
        if not self.text.startswith(s, self.pos):
            raise _Stop
        self.pos += len(s)

    def string(self) -> str:
        """One string at pos (basic, literal, or either multi-line form), decoded."""
        start = self.pos
        quote = self.peek()
        if self.peek(3) == quote * 3:
            i = start + 3
            while not self.text.startswith(quote * 3, i):
                if i >= len(self.text):
                    raise _Stop
                i += 2 if quote == '"' and self.text[i] == "\\" else 1
            end = i + 3
            while self.text[end : end + 1] == quote:  # up to two quotes may close it
                end += 1
        else:
            i = start + 1
            while i < len(self.text) and self.text[i] not in (quote, "\n"):
                i += 2 if quote == '"' and self.text[i] == "\\" else 1
            if self.text[i : i + 1] != quote:
                raise _Stop
            end = i + 1
        self.pos = end
        raw = self.text[start:end]
        if quote == "'" or "\\" not in raw:
            return raw.strip(quote) if not raw.startswith(quote * 3) else raw[3:-3]
        value = tomllib.loads("k = " + raw)["k"]  # escapes decoded by the real parser
        if not isinstance(value, str):
            raise _Stop
        return value

    def key(self) -> KeyPath:
        """A dotted key: simple keys (bare or quoted) joined by dots."""
        parts: list[str] = []
        while True:
            self.skip_blank(newlines=False)
            c = self.peek()
            if c in ('"', "'"):
                parts.append(self.string())
            else:
                start = self.pos
                while self.pos < len(self.text) and self.text[self.pos] in _BARE:
                    self.pos += 1
                if self.pos == start:
                    raise _Stop
                parts.append(self.text[start : self.pos])
            self.skip_blank(newlines=False)
            if self.peek() != ".":
                return tuple(parts)
            self.pos += 1

    def value(self, path: KeyPath | None) -> None:
        """Skip one value; record the keys of inline tables under PATH."""
        self.skip_blank(newlines=False)
        c = self.peek()
        if c in ('"', "'"):
            self.string()
        elif c == "[":  # tables inside arrays have no key path of their own
            self.items("]", True, lambda: self.value(None))
        elif c == "{":
            self.items("}", False, lambda: self.member(path))
        else:  # number, bool, date-time: up to the next delimiter
            start = self.pos
            while self.pos < len(self.text) and self.text[self.pos] not in _SCALAR_END:
                self.pos += 1
            if not self.text[start : self.pos].strip():
                raise _Stop

    def items(self, close: str, newlines: bool, item: Callable[[], None]) -> None:
        """An array or inline table from its opening bracket to CLOSE: ITEM reads each
        item; commas between them (and after the last); NEWLINES: line ends between."""
        self.pos += 1
        while True:
            self.skip_blank(newlines=newlines)
            if self.peek() == close:
                self.pos += 1
                return
            item()
            self.skip_blank(newlines=newlines)
            if self.peek() == ",":
                self.pos += 1

    def member(self, path: KeyPath | None) -> None:
        """One `key = value` of an inline table; its keys recorded under PATH."""
        at = self.pos
        key = self.key()
        if path is not None:
            self.record(path + key, at)
        self.expect("=")
        self.value(None if path is None else path + key)

    def document(self) -> None:
        table: KeyPath = ()
        while True:
            self.skip_blank(newlines=True)
            if self.pos >= len(self.text):
                return
            at = self.pos
            if self.peek() == "[":
                double = self.peek(2) == "[["
                self.pos += 2 if double else 1
                table = self.key()
                self.expect("]]" if double else "]")
                self.record(table, at)
            else:
                key = self.key()
                self.record(table + key, at)
                self.expect("=")
                self.value(table + key)


def key_lines(text: str) -> dict[KeyPath, int]:
    """Key path -> the 1-based line that first defines it, for TOML that tomllib accepts."""
    scanner = _Scanner(text)
    with contextlib.suppress(_Stop, IndexError, tomllib.TOMLDecodeError, RecursionError):
        scanner.document()
    return scanner.found


def line_of(lines: dict[KeyPath, int], path: KeyPath) -> int | None:
    """The line of PATH, or of its longest recorded prefix; None when none is known."""
    for n in range(len(path), 0, -1):
        if path[:n] in lines:
            return lines[path[:n]]
    return None
