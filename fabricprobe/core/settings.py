"""One declaration per setting; values from defaults < a TOML file < the environment < flags.

A settings class is a plain dataclass whose fields are declared with `setting(...)`: the
type comes from the annotation, and the declaration carries the default, the help text,
the bounds of a number, the choices of a string, a check of each value, and the flag's
name. From it come the TOML keys of the class's table (`[agent]`), the environment
variables (`FABRICPROBE_AGENT_<NAME>`), and, in `fabricprobe.cli.options`, the click
options. Every value is checked the same way whatever its source, and an error names the
source: `agent.toml:7: window_s must be within 0.1..3600, not 0`,
`FABRICPROBE_AGENT_WINDOW_S must be a float, not 'fast'`, `--window must be ...`.

Adding a setting is one line in its class, e.g.
`drain_s: float = setting(5.0, "Seconds to drain at shutdown.", lo=0, hi=600)`: the TOML
key `drain_s`, the variable FABRICPROBE_<SECTION>_DRAIN_S and the flag `--drain` follow
(tests/unit/test_settings.py holds every field to having help, and every number bounds).

Why dataclass metadata and not pydantic-settings: the settings stay the plain, mutable
dataclasses that the agent, the collector and the tests build by keyword
(`AgentConfig(host="h2", ...)`, checked only when `validate()` asks); pydantic's errors
name a key path but no file or line, and its settings sources know neither click nor
where a key sits in a TOML file, so both would be rebuilt around it anyway; and it would
add a compiled dependency (pydantic-core) to every agent for what a few hundred lines
here do.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import ipaddress
import os
import re
import tomllib
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from fabricprobe.core.errors import ConfigError
from fabricprobe.core.hostport import parse_hostport
from fabricprobe.core.tomlpos import KeyPath, TomlError, key_lines, line_of, toml_loads

# Every table a fabricprobe TOML file may hold, and who reads it. One file may serve both
# daemons (and hold the policy `probe validate --policy` reads); a section missing here is
# a typo, and the error says so with its line.
SECTIONS: dict[str, str] = {
    "agent": "probe agent",
    "collector": "probe collector",
    "serve": "probe serve",
    "roce": "probe validate --policy",
    "thresholds": "probe validate --policy",
}
MAX_FILE_BYTES = 1 << 20  # a settings file larger than this is not one
MAX_TEXT = 4096  # longest string setting, in characters
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})

T = TypeVar("T")


# --- declaring ------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """A test of one value (one item of a list); TEST raises ValueError saying why.
    EMPTY_OK: the empty string means "not given" and is not tested."""

    test: Callable[[Any], object]
    metavar: str = ""
    empty_ok: bool = False

    def __call__(self, value: Any) -> None:
        if not (self.empty_ok and value == ""):
            self.test(value)


@dataclass(frozen=True)
class Setting:
    """What a field's declaration says beyond its type and default."""

    help: str
    lo: float | None = None  # bounds of a number, or of each number in a list
    hi: float | None = None
    choices: tuple[str, ...] = ()  # of a string, or of each string in a list
    check: Check | None = None  # of the value, or of each item of a list
    flag: str | None = ""  # "" for --name (a trailing _s dropped); None: no flag
    metavar: str = ""
    shown: str = ""  # the default as --help says it, when the value itself would not do
    min_items: int = 0
    max_items: int = 1024


def setting(default: Any = dataclasses.MISSING, help: str = "", **kw: Any) -> Any:
    """A dataclass field with its declaration: `budget: int = setting(16, "Peers.", lo=1,
    hi=1024)`. A list or dict default is copied for each instance; `factory=` computes one."""
    factory = kw.pop("factory", None)
    meta = {"setting": Setting(help, **kw)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    if isinstance(default, list | dict):
        value = default
        return field(default_factory=lambda: copy.deepcopy(value), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Spec:
    """One declared setting of a class, as the loaders and the CLI see it."""

    name: str
    kind: Any  # the resolved annotation: str, int, float, bool, list[...], dict[str, str]
    setting: Setting
    default: Any  # a fresh default value (the factory's result for a factory)

    @property
    def flag(self) -> str | None:
        if self.setting.flag is None:
            return None
        if self.setting.flag:
            return self.setting.flag
        return "--" + self.name.removesuffix("_s").replace("_", "-")

    def env(self, section: str) -> str:
        return env_var(section, self.name)

    @property
    def is_many(self) -> bool:
        return typing.get_origin(self.kind) in (list, dict)


_SPECS: dict[type, tuple[Spec, ...]] = {}


def specs(cls: type) -> tuple[Spec, ...]:
    """The declared settings of the dataclass CLS, in field order. A field declared without
    `setting()` still loads (typed, unbounded); tests/unit/test_settings.py rejects it."""
    if cls in _SPECS:
        return _SPECS[cls]
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        decl = f.metadata.get("setting") or Setting("")
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None
        if not _supported(hints[f.name]):
            raise TypeError(
                f"{cls.__name__}.{f.name}: a setting is a str, int, float or bool, "
                "or a list or str-keyed table of them"
            )
        out.append(Spec(f.name, hints[f.name], decl, default))
    _SPECS[cls] = tuple(out)
    return _SPECS[cls]


def _supported(kind: Any) -> bool:
    if kind in (str, int, float, bool, object):  # object: any TOML value, left to the check
        return True
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is list:
        return _supported(args[0])
    return origin is dict and args[0] is str and _supported(args[1])


def env_var(section: str, name: str) -> str:
    return f"FABRICPROBE_{section.upper()}_{name.upper()}"


def config_var(section: str) -> str:
    """The variable that names the settings file (`probe agent --config`)."""
    return env_var(section, "config")


# --- checks shared by both daemons ----------------------------------------------------


def _listen(text: str) -> None:
    parse_hostport(text, 0, allow_port_zero=True)
    if not re.search(r"(^|\]|[^:]):\d+$", text.strip()):
        raise ValueError(f"{text!r}: expected ADDR:PORT")


def _peer(text: str) -> None:
    _, port = parse_hostport(text, 0)
    if port == 0:
        raise ValueError(f"{text!r}: expected HOST:PORT")


def _file(path: str) -> None:
    if not Path(path).is_file():
        raise ValueError(f"{path!r}: no such file")


def _network(text: str) -> None:
    ipaddress.ip_network(text, strict=False)


def _ip(text: str) -> None:
    ipaddress.ip_address(text)


def _name(text: str) -> None:
    if not text or any(c.isspace() for c in text):
        raise ValueError(f"{text!r} is not a name (empty, or with spaces)")


LISTEN = Check(_listen, "ADDR:PORT")  # an address to listen on; port 0 picks a free one
LISTEN_OR_OFF = Check(_listen, "ADDR:PORT", empty_ok=True)  # "" serves nothing
PEER = Check(_peer, "HOST:PORT")
FILE = Check(_file, "FILE", empty_ok=True)  # must exist when given
NETWORK = Check(_network, "CIDR")
NAME = Check(_name, "NAME")
IP = Check(_ip, "IP")


# --- checking one value ---------------------------------------------------------------


class _Must(ValueError):
    """A message that reads after the setting's name: `budget` + `must be ...`."""


_KIND_NAMES = {str: "a string", int: "an integer", float: "a float", bool: "true or false"}
_KIND_NAMES[object] = "a value"


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind_name(kind: Any) -> str:
    if kind in _KIND_NAMES:
        return _KIND_NAMES[kind]
    args = typing.get_args(kind)
    if typing.get_origin(kind) is dict:
        return f"a table of {_kind_name(args[1]).split(' ', 1)[1]}s"
    inner = _kind_name(args[0]).split(" ", 1)[1]
    return f"a list of {inner}s" if inner[-1] != "s" else f"a list of {inner}"


def _typed(kind: Any, value: Any) -> Any:
    """VALUE as KIND (an int is a float too); ValueError when it is not one."""
    bad = _Must(f"must be {_kind_name(kind)}, not {_show(value)}")
    if kind is object:
        return value
    if kind is bool or kind is str:
        if type(value) is not kind:
            raise bad
        return value
    if kind is int:
        if type(value) is not int:
            raise bad
        return value
    if kind is float:
        if type(value) not in (int, float):
            raise bad
        return float(value)
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is list:
        if not isinstance(value, list | tuple):
            raise bad
        try:
            return [_typed(args[0], v) for v in value]
        except ValueError:
            raise bad from None
    if origin is dict:
        if not isinstance(value, dict) or not all(type(k) is str for k in value):
            raise bad
        try:
            return {k: _typed(args[1], v) for k, v in value.items()}
        except ValueError:
            raise bad from None
    raise TypeError(f"settings of type {kind} are not supported")


def _items(kind: Any, value: Any) -> list[Any]:
    """The scalars the bounds, choices and checks apply to."""
    if typing.get_origin(kind) is dict:
        return list(value.values())
    return list(value) if typing.get_origin(kind) is list else [value]


def check_value(spec: Spec, value: Any) -> Any:
    """VALUE typed and checked against SPEC's declaration; ValueError says why (without
    the setting's name: the caller prefixes where the value came from)."""
    value = _typed(spec.kind, value)
    decl = spec.setting
    if spec.is_many and not decl.min_items <= len(value) <= decl.max_items:
        raise _Must(f"must have {decl.min_items}..{decl.max_items} items, not {len(value)}")
    for item in _items(spec.kind, value):
        for text in item if isinstance(item, list) else [item]:
            if isinstance(text, str) and (len(text) > MAX_TEXT or _CONTROL.search(text)):
                raise _Must(f"must be short text without control characters, not {_show(text)}")
        if isinstance(item, int | float) and not isinstance(item, bool):
            lo, hi = decl.lo, decl.hi
            if (lo is not None and not item >= lo) or (hi is not None and not item <= hi):
                raise _Must(f"must be within {_num(lo)}..{_num(hi)}, not {_num(item)}")
        if decl.choices and item not in decl.choices:
            near = difflib.get_close_matches(str(item), decl.choices, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise _Must(f"must be one of {', '.join(decl.choices)}, not {_show(item)}{hint}")
        if decl.check is not None:
            decl.check(item)
    return value


def _num(x: float | None) -> str:
    if x is None:
        return ""
    return str(int(x)) if float(x).is_integer() else repr(x)


def parse_text(spec: Spec, text: str) -> Any:
    """A value of SPEC's type from the text of an environment variable or a flag: numbers,
    true/false (also 1/0, yes/no, on/off), and for lists either comma-separated items or a
    TOML array; for tables a TOML inline table or `key=value` pairs."""
    kind = spec.kind
    t = text.strip()
    if spec.is_many and t[:1] in ("[", "{"):
        try:
            doc = tomllib.loads("v = " + t)
        except (ValueError, RecursionError):  # TOMLDecodeError, an over-long int, deep nesting
            raise ValueError(f"{_show(text)} is not a TOML array or inline table") from None
        if set(doc) != {"v"}:
            raise ValueError(f"{_show(text)} is not one TOML value")
        return doc["v"]
    if typing.get_origin(kind) is list:
        inner = typing.get_args(kind)[0]
        if typing.get_origin(inner) is not None:
            raise _Must(f"must be a TOML array like [[...], ...], not {_show(text)}")
        return [_scalar(inner, p) for p in t.split(",") if p.strip()]
    if typing.get_origin(kind) is dict:
        out = {}
        for pair in (p for p in t.split(",") if p.strip()):
            k, eq, v = pair.partition("=")
            if not eq:
                raise ValueError(f"{_show(pair)}: expected KEY=VALUE")
            out[k.strip()] = v.strip()
        return out
    return _scalar(kind, text)


def _scalar(kind: Any, text: str) -> Any:
    t = text.strip()
    if kind is str:
        return t
    if kind is bool:
        if t.lower() in _TRUE:
            return True
        if t.lower() in _FALSE:
            return False
        raise _Must(f"must be true or false, not {_show(text)}")
    if kind is int:
        if not re.fullmatch(r"[+-]?\d{1,19}", t):
            raise _Must(f"must be an integer, not {_show(text)}")
        return int(t)
    if kind is float:
        try:
            return float(t)
        except ValueError:
            raise _Must(f"must be a float, not {_show(text)}") from None
    raise _Must(f"must be {_kind_name(kind)}, not {_show(text)}")


# --- reading a file -------------------------------------------------------------------


@dataclass(frozen=True)
class TomlFile:
    """A settings file that parsed, its sections all known, with the line of each key."""

    path: str
    data: dict[str, Any]
    lines: dict[KeyPath, int]

    def where(self, *path: str) -> str:
        """`FILE:LINE` of a key path, or the file alone when its line cannot be found."""
        line = line_of(self.lines, tuple(path))
        return f"{self.path}:{line}" if line else self.path


def _suggest(word: str, known: list[str], fmt: str = "{!r}") -> str:
    if len(word) > 64:  # difflib is quadratic; no typo of a setting's name is this long
        return ""
    near = difflib.get_close_matches(word, known, n=1)
    return f"did you mean {fmt.format(near[0])}? " if near else ""


def read_toml(path: str | Path) -> TomlFile:
    """Read and parse a settings file (see parse_toml); ConfigError names the file."""
    name = str(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{name}: {e.strerror or e}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"{name}: larger than {MAX_FILE_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{name}: not UTF-8 text") from None
    return parse_toml(text, name)


def parse_toml(text: str, name: str) -> TomlFile:
    """TEXT of the settings file NAME, parsed (pure); ConfigError for text that is not
    TOML or holds a section no fabricprobe command reads."""
    try:
        data = toml_loads(text)
    except TomlError as e:
        raise ConfigError(f"{name}: {e}") from None
    doc = TomlFile(name, data, key_lines(text))
    known = list(SECTIONS)
    for section, table in data.items():
        where = doc.where(section)
        if section not in SECTIONS and not isinstance(table, dict):
            raise ConfigError(
                f"{where}: {section!r} is outside any table (known: {', '.join(known)})"
            )
        if section not in SECTIONS:
            hint = _suggest(section, known, "[{}]")
            raise ConfigError(
                f"{where}: unknown section [{section}] ({hint}known: {', '.join(known)})"
            )
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: [{section}] must be a table, not {_show(table)}")
    return doc


# --- loading --------------------------------------------------------------------------


def _given(value: Any) -> bool:
    return value is not None and value != ()


def load(
    cls: type[T],
    section: str,
    *,
    file: str | Path | TomlFile | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> T:
    """An instance of the settings class CLS: its defaults, overridden by the [SECTION]
    table of FILE, then by ENV's FABRICPROBE_<SECTION>_<NAME> variables, then by FLAGS
    (setting name -> value; None or () means not given). Unknown keys and variables, and
    values that fail their declaration, raise ConfigError naming their source."""
    by_name = {s.name: s for s in specs(cls)}
    values: dict[str, Any] = {}
    if file is not None:
        doc = file if isinstance(file, TomlFile) else read_toml(file)
        for key, value in doc.data.get(section, {}).items():
            where = doc.where(section, key)
            spec = by_name.get(key.replace("-", "_"))
            if spec is None:
                hint = _suggest(key, list(by_name))
                raise ConfigError(
                    f"{where}: unknown setting {key!r} in [{section}]"
                    + (f" ({hint.strip()})" if hint else "")
                )
            values[spec.name] = _checked(spec, value, f"{where}: {key}")
    if env is not None:
        prefix = env_var(section, "")
        for var in sorted(env):
            if not var.startswith(prefix) or var == config_var(section):
                continue
            spec = by_name.get(var[len(prefix) :].lower())
            if spec is None:
                upper = [n.upper() for n in by_name]
                hint = _suggest(var[len(prefix) :], upper, f"'{prefix}{{}}'")
                raise ConfigError(
                    f"{var}: unknown setting" + (f" ({hint.strip()})" if hint else "")
                )
            values[spec.name] = _checked(spec, _parsed(spec, env[var], var), var)
    for name, value in (flags or {}).items():
        if not _given(value):
            continue
        spec = by_name[name]
        where = spec.flag or name
        if isinstance(value, str):
            value = _parsed(spec, value, where)
        elif isinstance(value, tuple):  # a repeated flag: one item each time
            value = _flag_items(spec, value, where)
        values[name] = _checked(spec, value, where)
    return cls(**values)


def _flag_items(spec: Spec, given: tuple[Any, ...], where: str) -> Any:
    kind = spec.kind
    try:
        if typing.get_origin(kind) is dict:
            pairs = [str(v).partition("=") for v in given]
            if not all(eq for _, eq, _ in pairs):
                raise _Must("must be given as KEY=VALUE")
            return {k.strip(): v.strip() for k, _, v in pairs}
        inner = typing.get_args(kind)[0]
        return [_scalar(inner, v) if isinstance(v, str) else v for v in given]
    except ValueError as e:
        raise ConfigError(_message(where, e)) from None


def _parsed(spec: Spec, text: str, where: str) -> Any:
    try:
        return parse_text(spec, text)
    except ValueError as e:
        raise ConfigError(_message(where, e)) from None


def _message(where: str, e: ValueError) -> str:
    return f"{where} {e}" if isinstance(e, _Must) else f"{where}: {e}"


def _checked(spec: Spec, value: Any, where: str) -> Any:
    """WHERE is the source and the name the operator wrote: `a.toml:3: budget`, `--budget`,
    `FABRICPROBE_COLLECTOR_BUDGET`."""
    try:
        return check_value(spec, value)
    except ValueError as e:
        raise ConfigError(_message(where, e)) from None


def check(obj: Any) -> None:
    """Hold every declared field of a settings object built directly (not loaded) to its
    declaration; ConfigError names the setting."""
    for spec in specs(type(obj)):
        _checked(spec, getattr(obj, spec.name), spec.name)


def environ() -> Mapping[str, str]:
    """The process environment (a function, so that tests and callers can pass their own)."""
    return os.environ
