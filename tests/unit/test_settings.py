"""Settings declared once (fabricprobe.core.settings): the declarations themselves, the
loader's errors (each naming file:line, variable or flag), and the precedence
defaults < file < environment < flags."""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any

import pytest

from fabricprobe.agent.config import AgentConfig
from fabricprobe.collector.assign import PROBE_KINDS
from fabricprobe.collector.config import CollectorSettings
from fabricprobe.core import settings
from fabricprobe.core.errors import ConfigError
from fabricprobe.core.settings import specs
from fabricprobe.core.tomlpos import key_lines

CLASSES: dict[str, type] = {"agent": AgentConfig, "collector": CollectorSettings}


def load(section: str, text: str | None = None, **kw: Any) -> Any:
    file = settings.parse_toml(text, "agent.toml") if text is not None else None
    return settings.load(CLASSES[section], section, file=file, **kw)


# --- the declarations -------------------------------------------------------------------


@pytest.mark.parametrize("section", sorted(CLASSES))
def test_every_field_is_declared_with_help_and_bounds(section: str) -> None:
    flags: list[str] = []
    for spec in specs(CLASSES[section]):
        decl = spec.setting
        assert decl.help, f"{spec.name}: declare it with setting(default, help, ...)"
        item = typing.get_args(spec.kind)[0] if spec.is_many else spec.kind
        if item in (int, float):
            assert decl.lo is not None and decl.hi is not None, f"{spec.name}: no bounds"
        settings.check_value(spec, spec.default)  # every default passes its own checks
        if spec.flag:
            flags.append(spec.flag)
    assert len(flags) == len(set(flags)), "two settings share a flag"


def test_planned_kinds_are_the_agents_runners() -> None:
    from fabricprobe.agent.probing import TCP_RUNNERS
    from fabricprobe.agent.rdma_runners import rdma_runners

    assert set(PROBE_KINDS) == set(TCP_RUNNERS) | set(rdma_runners())


# --- unknown sections and keys, with their lines -----------------------------------------

UNKNOWN = [
    # (file text, the error it must give)
    (
        '[agent]\nhost = "h1"\n[colector]\nbudget = 3\n',
        "agent.toml:3: unknown section [colector] (did you mean [collector]? "
        "known: agent, collector, serve, roce, thresholds)",
    ),
    (
        "# c\n\n[agent]\nwindo_s = 3\n",
        "agent.toml:4: unknown setting 'windo_s' in [agent] (did you mean 'window_s'?)",
    ),
    ('[agent]\nhost = "a"\n"spool dir" = "x"\n', "agent.toml:3: unknown setting 'spool dir'"),
    ("agent.windw_s = 1\n", "agent.toml:1: unknown setting 'windw_s'"),
    ('[agent]\nhost = "h"\n\n  agent_typo.x = 1\n', "agent.toml:4: unknown setting 'agent_typo'"),
    ('\nagent = { host = "h", jiter = 0.1 }\n', "agent.toml:2: unknown setting 'jiter'"),
    ('[agent]\nhost = "h"\n[agent.tls]\nca = 1\n', "agent.toml:3: unknown setting 'tls'"),
    ('[[agent]]\nhost = "h"\n', "agent.toml:1: [agent] must be a table"),
    ("window_s = 3\n", "agent.toml:1: 'window_s' is outside any table"),
    # a value spanning lines that looks like keys and sections must not confuse the lines
    (
        '[agent]\nnixl_metrics = [\n  "http://a:1/m",\n]\ntopology = """\n[x]\nq = 1\n"""\n'
        "[rocee]\n",
        "agent.toml:9: unknown section [rocee] (did you mean [roce]?",
    ),
    ("[roce]\nmtu = 4096\n[thresholds]\n[agent]\nbogus = 1\n", "agent.toml:5: unknown setting"),
]


@pytest.mark.parametrize(("text", "error"), UNKNOWN)
def test_unknown_sections_and_keys_name_the_line(text: str, error: str) -> None:
    with pytest.raises(ConfigError) as e:
        load("agent", text)
    assert str(e.value).startswith(error), str(e.value)


def test_a_line_that_cannot_be_found_leaves_the_file_name() -> None:
    doc = settings.TomlFile("agent.toml", {"agent": {"bogus": 1}}, {})
    with pytest.raises(ConfigError, match=r"^agent.toml: unknown setting 'bogus'"):
        settings.load(AgentConfig, "agent", file=doc)


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.toml: No such file"):
        settings.load(AgentConfig, "agent", file=tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[agent\n")
    with pytest.raises(ConfigError, match=r"bad.toml: not valid TOML: .*line 1"):
        settings.load(AgentConfig, "agent", file=bad)
    bad.write_bytes(b"[agent]\nhost = '\xff'\n")
    with pytest.raises(ConfigError, match=r"bad\.toml: not UTF-8"):
        settings.load(AgentConfig, "agent", file=bad)


KEY_LINES = [
    ('[a]\nx = 1\n"q.k" = 2\n', {("a",): 1, ("a", "x"): 2, ("a", "q.k"): 3}),
    ("a . b.c = 1\n", {("a",): 1, ("a", "b"): 1, ("a", "b", "c"): 1}),
    ("t = {x = 1, y = {z = [1, {w = 2}]}}\n", {("t", "x"): 1, ("t", "y", "z"): 1}),
    ("s = '''\n[no]\n'''\n[yes]\n", {("s",): 1, ("yes",): 4}),
    ('s = """a\\"""\n[n]\n"""\n[y] # c\n', {("s",): 1, ("y",): 4}),
    ("a = [\n 1, # [x]\n 2,\n]\n[[b]]\nc = 1979-05-27 07:32:00Z\n", {("b", "c"): 6}),
    ('[a]\r\n"\\u0078" = 1\r\n', {("a", "x"): 2}),
]


@pytest.mark.parametrize(("text", "want"), KEY_LINES)
def test_key_lines(text: str, want: dict[tuple[str, ...], int]) -> None:
    found = key_lines(text)
    assert {k: found.get(k) for k in want} == want
    assert not any(k == ("no",) or k == ("n",) for k in found)


# --- bad values, from each source --------------------------------------------------------

BAD_VALUES = [
    # (section, source, setting, value, the error it must give)
    ("collector", "file", "kinds", ["rdma_rc_latt"],
     "agent.toml:2: kinds must be one of tcp_lat, tcp_bw, rdma_rc_lat, rdma_rc_read, "
     "rdma_rc_bw, rdma_ud, not 'rdma_rc_latt' (did you mean 'rdma_rc_lat'?)"),
    ("collector", "file", "sizes", ["64"], "agent.toml:2: sizes must be a list of integers"),
    ("collector", "file", "sizes", [64, 1 << 30], "sizes must be within 1..1048576"),
    ("collector", "file", "sizes", [], "sizes must have 1..16 items, not 0"),
    ("collector", "file", "budget", 16.0, "agent.toml:2: budget must be an integer"),
    ("collector", "file", "budget", True, "budget must be an integer, not True"),
    ("collector", "file", "intra_share", float("nan"), "intra_share must be within 0..1"),
    ("collector", "file", "health", "opne", "health must be one of open, any, off"),
    ("collector", "file", "fleet_networks", ["10.0.0.0/33"], "fleet_networks: "),
    ("collector", "file", "host_rewrite", [["(", "x"]], "host_rewrite: '('"),
    ("collector", "file", "host_rewrite", [["a"]], "each rule is [regex, replacement]"),
    ("collector", "file", "listen", "0.0.0.0", "listen: '0.0.0.0': expected ADDR:PORT"),
    ("collector", "file", "tls_cert", "/nonexistent.pem", "tls_cert: '/nonexistent.pem': no such"),
    ("agent", "file", "window_s", "fast", "agent.toml:2: window_s must be a float, not 'fast'"),
    ("agent", "file", "collector", "h:0", "collector: bad port in 'h:0': expected 1..65535"),
    ("agent", "file", "host", "a b", "host: 'a b' is not a name"),
    ("agent", "file", "nixl_metrics", ["ftp://x/"], "nixl_metrics: 'ftp://x/': expected http"),
    ("agent", "file", "topology", "a\nb", "topology must be short text without control"),
    ("collector", "file", "drift_min_group", 1, "drift_min_group must be within 2..100000, not 1"),
    ("collector", "file", "drift_waivers", [{"host": "a", "check": "c", "reason": "", "x": 1}],
     "agent.toml:2: drift_waivers: unknown key(s) x"),
    ("collector", "env", "drift_waivers", '[{ host = "a" }]',
     "FABRICPROBE_COLLECTOR_DRIFT_WAIVERS: check must be a non-empty string"),
    ("agent", "env", "validate_interval_s", "30", "_S: 30 is neither 0 (off) nor within 60..86400"),
    ("agent", "flag", "role", "a b", "--role: 'a b' is not a label"),
    ("agent", "flag", "addresses", ("10.0.0.1", "gpu-2"), "--address: 'gpu-2' does not appear"),
    ("agent", "file", "validate_policy", "/no/p.toml", "validate_policy: '/no/p.toml': no such"),
    ("agent", "env", "window_s", "0", "FABRICPROBE_AGENT_WINDOW_S must be within 0.1..3600, not 0"),
    ("agent", "env", "spool_max_bytes", "64M", "FABRICPROBE_AGENT_SPOOL_MAX_BYTES must be an int"),
    ("agent", "env", "ethtool", "maybe", "FABRICPROBE_AGENT_ETHTOOL must be true or false"),
    ("agent", "env", "token_file", "/no/such", "FABRICPROBE_AGENT_TOKEN_FILE: '/no/such': no such"),
    ("collector", "env", "kinds", "tcp_lat,tcp_lag", "FABRICPROBE_COLLECTOR_KINDS must be one of"),
    ("collector", "env", "sizes", "[64, x]", "_SIZES: '[64, x]' is not a TOML array"),
    ("collector", "flag", "budget", "0", "--budget must be within 1..1024, not 0"),
    ("collector", "flag", "budget", "many", "--budget must be an integer, not 'many'"),
    ("collector", "flag", "sizes", ("64", "x"), "--size must be an integer, not 'x'"),
    ("collector", "flag", "kinds", ("tcp",), "--kind must be one of"),
    ("collector", "flag", "host_aliases", ("a",), "--host-alias must be given as KEY=VALUE"),
    ("agent", "flag", "probe_listen", "127.0.0.1", "--listen: '127.0.0.1': expected ADDR:PORT"),
    ("agent", "flag", "jitter", "1", "--jitter must be within 0..0.9, not 1"),
]  # fmt: skip


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v != v:
        return "nan"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace("\n", "\\n") + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml(x)}" for k, x in v.items()) + "}"
    return repr(v)


@pytest.mark.parametrize(("section", "source", "name", "value", "error"), BAD_VALUES)
def test_bad_values_name_setting_and_source(
    section: str, source: str, name: str, value: Any, error: str
) -> None:
    with pytest.raises(ConfigError) as e:
        if source == "file":
            load(section, f"[{section}]\n{name} = {_toml(value)}\n")
        elif source == "env":
            load(section, env={f"FABRICPROBE_{section.upper()}_{name.upper()}": value})
        else:
            load(section, flags={name: value})
    assert error in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_unknown_variables_are_rejected_but_the_config_path_is_not_a_setting() -> None:
    with pytest.raises(ConfigError, match="FABRICPROBE_AGENT_SPOOLDIR: unknown setting "
                       r"\(did you mean 'FABRICPROBE_AGENT_SPOOL_DIR'\?\)"):  # fmt: skip
        load("agent", env={"FABRICPROBE_AGENT_SPOOLDIR": "/x"})
    cfg = load("agent", env={"FABRICPROBE_AGENT_CONFIG": "/x", "FABRICPROBE_COLLECTOR_X": "1"})
    assert cfg.spool_dir == AgentConfig().spool_dir


def test_directly_built_settings_are_checked_too() -> None:
    with pytest.raises(ConfigError, match=r"^window_s must be within 0\.1\.\.3600, not 0$"):
        AgentConfig(window_s=0, insecure=True).validate()
    with pytest.raises(ConfigError, match=r"^kinds must be one of"):
        CollectorSettings(kinds=["tcp"]).server_config()
    with pytest.raises(ConfigError, match="streams_per_identity must be at most workers / 2"):
        CollectorSettings(workers=4, streams_per_identity=3).server_config()


# --- precedence -------------------------------------------------------------------------


def test_defaults_then_file_then_environment_then_flags() -> None:
    text = '[collector]\nbudget = 2\nprobe_count = 3\nkinds = ["tcp_lat"]\nintra_share = 0.1\n'
    env = {"FABRICPROBE_COLLECTOR_PROBE_COUNT": "4", "FABRICPROBE_COLLECTOR_INTRA_SHARE": "0.2",
           "FABRICPROBE_COLLECTOR_KINDS": "tcp_lat, tcp_bw", "PATH": "/bin"}  # fmt: skip
    flags = {"intra_share": "0.3", "budget": None, "sizes": ("64", "4096"), "kinds": ()}
    s = load("collector", text, env=env, flags=flags)
    assert (s.budget, s.probe_count, s.intra_share) == (2, 4, 0.3)
    assert (s.kinds, s.sizes, s.workers) == (["tcp_lat", "tcp_bw"], [64, 4096], 64)
    assert load("collector").budget == 16


@pytest.mark.parametrize(
    ("env_text", "want"),
    [
        ("a=b, c=d", {"a": "b", "c": "d"}),
        ('{ "vllm-0" = "gpu-1" }', {"vllm-0": "gpu-1"}),
    ],
)
def test_environment_tables(env_text: str, want: dict[str, str]) -> None:
    s = load("collector", env={"FABRICPROBE_COLLECTOR_HOST_ALIASES": env_text})
    assert s.host_aliases == want


def test_one_file_serves_both_daemons_and_the_policy() -> None:
    text = (
        '[agent]\nhost = "h1"\n[collector]\nbudget = 3\n[roce]\nmtu = 4096\n'
        "[thresholds]\npause_duration_warn_pct = 2.0\n"
    )
    assert load("agent", text).host == "h1"
    assert load("collector", text).budget == 3


def test_docstring_examples_load(tmp_path: Path) -> None:
    """The TOML examples in the config modules' docstrings load as they are (with the
    files they name under TMP_PATH)."""
    import fabricprobe.agent.config as a
    import fabricprobe.collector.config as c

    for section, module in (("agent", a), ("collector", c)):
        doc = module.__doc__ or ""
        example = doc.split("Example file::", 1)[1]
        text = "\n".join(re.sub(r"^    ", "", ln) for ln in example.splitlines())
        text = text.replace("/etc/fabricprobe/", f"{tmp_path}/")
        for name in re.findall(rf"{tmp_path}/([\w.-]+)", text):
            (tmp_path / name).write_text("x\n")
        load(section, text)


def test_declaring_a_setting_is_one_line() -> None:
    from dataclasses import dataclass

    from fabricprobe.core.settings import setting

    @dataclass
    class Demo:
        validate_every_s: float = setting(3600.0, "Seconds between checks.", lo=60, hi=86400)
        waivers: list[str] = setting([], "Check names not to alert on.", flag="--waive")

    (every, waivers) = specs(Demo)
    assert (every.flag, every.env("agent")) == (
        "--validate-every",
        "FABRICPROBE_AGENT_VALIDATE_EVERY_S",
    )
    assert waivers.flag == "--waive" and Demo().waivers is not Demo().waivers
    d = settings.load(Demo, "agent", env={"FABRICPROBE_AGENT_WAIVERS": "pfc, ecn"})
    assert d.waivers == ["pfc", "ecn"]

    @dataclass
    class Bad:
        x: int | None = setting(None, "No null in TOML.")

    with pytest.raises(TypeError, match=r"Bad\.x: a setting is"):
        specs(Bad)


def test_kv_models_reach_the_server_config_and_a_bad_shape_is_a_config_error() -> None:
    from fabricprobe.core.errors import ConfigError

    shape = "layers=4,kv_heads=2,head_dim=64,dtype=fp32,block=128"
    s = load("collector", flags={"kv_models": (f"*={shape}", "m=Llama-3.1-8B")})
    got = s.server_config().kv_models
    assert got["*"].block_tokens == 128 and got["*"].shape.bytes_per_token == 4096
    assert got["m"].shape.layers == 32 and got["m"].block_tokens == 16
    bad = load("collector", flags={"kv_models": ("m=layers=4",)})
    with pytest.raises(ConfigError, match="kv_models"):
        bad.server_config()
