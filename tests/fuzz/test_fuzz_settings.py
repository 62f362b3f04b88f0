"""Hypothesis fuzzers for the settings loader (fabricprobe.core.settings): whatever the
file text, the environment or the flags, loading the agent's or the collector's settings
(and checking them as `probe agent` / `probe collector` do) returns or raises
ConfigError, never anything else; and the line finder never fails on text tomllib takes.

Same shape as tests/fuzz/test_fuzz_parsers.py: files are built from bytes through pools
of keys and TOML literals (one binary draw per input keeps generation cheap), BATCH
inputs per example, counts in the terminal summary."""

from __future__ import annotations

import tomllib
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from fabricprobe.agent.config import AgentConfig
from fabricprobe.collector.config import CollectorSettings
from fabricprobe.core import settings
from fabricprobe.core.errors import ConfigError
from fabricprobe.core.tomlpos import key_lines
from tests.conftest import FuzzCounter
from tests.fuzz.test_fuzz_parsers import FUZZ, _probe, batch

CLASSES: dict[str, type] = {"agent": AgentConfig, "collector": CollectorSettings}
NAMES = sorted({s.name for cls in CLASSES.values() for s in settings.specs(cls)})
KEYS = [*NAMES, "windo_s", "spool-dir", "a.b", "agent.host", '"q k"', "kinds.x", "'k'"]
SECTIONS = ["[agent]", "[collector]", "[colector]", "[roce]", "[agent.tls]", "[[agent]]", "[]"]
SEPARATORS = ["\n", "\n\n", " # c\n", "\r\n", " "]
# TOML values of every type a setting has, and of types none has
LITERALS = [
    *[
        "0",
        "1",
        "-1",
        "16",
        "4096",
        "1048577",
        "1099511627776",
        "0.05",
        "0.5",
        "1e9",
        "nan",
        "inf",
        "-inf",
        "true",
        "false",
    ],
    *("1979-05-27", "07:32:00", '""', '"x"', '"a b"', '"tcp_lat"', '"rdma_rc_latt"'),
    *('"127.0.0.1:0"', '"h:99999"', '"0.0.0.0:4794"', '"10.0.0.0/8"', '"10.0.0.0/33"'),
    *('"http://127.0.0.1:1/m"', '"ftp://x"', '"/dev/null"', '"/no/such"', '"open"', '"("'),
    *('"^(.*)$"', r'"\u0000"', r"'\1'", '"""\n[x]\ny = 1\n"""', "'''q = 2'''", r'"""a\""""'),
    *("[]", "[64]", '["64"]', "[64, 0]", '["x"]', "[[1]]", '["tcp_lat", "rdma_ud"]'),
    *(r'[["^(.*)$", "\\1"]]', '[["("]]', "[true, 1]", "[\n 1,\n 2, # c\n]"),
    *("{}", '{ a = "b" }', "{ a = 1 }", '{ host = "h", jitter = 2 }', "{ x = { y = [1] } }"),
]


def _document(data: bytes) -> str:
    """Bytes to a settings file: each pair of bytes a key and a value from the pools
    above, or a table header."""
    out = []
    for i in range(0, len(data) - 1, 2):
        x, y = data[i], data[i + 1]
        if x >= 224:
            out.append(SECTIONS[y % len(SECTIONS)] + "\n")
            continue
        out.append(f"{KEYS[x % len(KEYS)]} = {LITERALS[y % len(LITERALS)]}")
        out.append(SEPARATORS[(x ^ y) % len(SEPARATORS)] if y & 1 else "\n")
    return "".join(out)


documents = st.binary(max_size=24).map(_document)


def _use(obj: Any) -> None:
    """What the commands do with loaded settings, short of opening sockets and files."""
    if isinstance(obj, AgentConfig):
        obj.validate()
    else:
        obj.server_config()


def _load_file(text: str) -> object:
    doc = settings.parse_toml(text, "fuzz.toml")
    for section, cls in CLASSES.items():
        _use(settings.load(cls, section, file=doc))
    return doc


def test_settings_files(fuzz_inputs: FuzzCounter) -> None:
    texts = st.one_of(st.text(max_size=60), documents)

    @FUZZ
    @given(batch(texts))
    def run(text: list[str]) -> None:
        _probe(fuzz_inputs, "settings.parse_toml+load", _load_file, text, (ConfigError,))

    run()


def test_line_finder_on_valid_toml(fuzz_inputs: FuzzCounter) -> None:
    def lines(text: str) -> object:
        try:
            tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            return None
        found = key_lines(text)
        assert all(1 <= n <= text.count("\n") + 1 for n in found.values())
        return found

    @FUZZ
    @given(batch(documents))
    def run(text: list[str]) -> None:
        _probe(fuzz_inputs, "tomlpos.key_lines", lines, text, ())

    run()


WORDS = [*LITERALS, *(w.strip("\"'") for w in LITERALS), "tcp_lat,rdma_ud", "a=b,c", " 7 "]


def _entry(data: bytes) -> tuple[str, str, str, bool]:
    """Bytes to (section, setting, text, given as a flag rather than a variable)."""
    x, y, z = (data + b"\0\0\0")[:3]
    text = WORDS[y % len(WORDS)] if z < 200 else data[3:].decode("utf-8", "replace")
    names = [*NAMES, "bogus"]
    return sorted(CLASSES)[x & 1], names[(x >> 1) % len(names)], text, z & 1 == 1


def _load_entry(entry: tuple[str, str, str, bool]) -> object:
    section, name, text, as_flag = entry
    cls = CLASSES[section]
    known = {s.name: s for s in settings.specs(cls)}
    if as_flag and name in known:
        flag: Any = (text, text) if known[name].is_many else text
        obj = settings.load(cls, section, flags={name: flag})
    else:
        obj = settings.load(cls, section, env={settings.env_var(section, name): text})
    _use(obj)
    return obj


def test_environment_and_flags(fuzz_inputs: FuzzCounter) -> None:
    @FUZZ
    @given(batch(st.binary(max_size=12).map(_entry)))
    def run(data: list[tuple[str, str, str, bool]]) -> None:
        _probe(fuzz_inputs, "settings.load (environment, flags)", _load_entry, data, (ConfigError,))

    run()
