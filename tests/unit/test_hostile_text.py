"""Hostile text against every parser of outside text, one row per reproducer: numbers of
thousands of digits (int() refuses more than 4,300), values past 64 bits, CRLF and other
line ends, non-hex GIDs, JSON of the wrong shape, NUL bytes, digits of other scripts.
Each row says what the parser must do: raise its documented error, or skip the bad part
and keep the rest."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from fabricprobe.agent.config import AgentConfig
from fabricprobe.agent.counters import CounterSampler, netdevs_of
from fabricprobe.agent.exporter import AgentCollector
from fabricprobe.agent.identity import discover_devices
from fabricprobe.agent.nixl import NixlReader, parse_totals
from fabricprobe.collector.attribution import otlp_http
from fabricprobe.collector.exposition import load_web_config
from fabricprobe.core import settings
from fabricprobe.core.errors import ConfigError, ParseError
from fabricprobe.core.settings import parse_toml
from fabricprobe.core.shards import parse_member
from fabricprobe.core.tomlpos import TomlError, toml_loads
from fabricprobe.probes import ethtool
from fabricprobe.probes.counters import parse_counter, read_port_counters
from fabricprobe.probes.hostload import parse_pressure
from fabricprobe.probes.numbers import U64_MAX, parse_uint, uint_or_none
from fabricprobe.probes.roce import hwtools, tools
from fabricprobe.probes.roce.host import HostView
from fabricprobe.probes.roce.policy import PolicyError, parse_policy
from fabricprobe.probes.sysfs import Gid, parse_gid, read_device
from fabricprobe.report import frames, sources
from tests.support.agentview import agent_view

GIANT = "9" * 5000  # past int()'s 4,300-digit limit
OVER = str(2**64)  # one past the widest counter
FIX = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.mark.parametrize(
    ("text", "limit", "want"),
    [
        ("0", U64_MAX, 0),
        (str(U64_MAX), U64_MAX, U64_MAX),
        ("000000000000000000000000000042", U64_MAX, 42),  # leading zeros are not digits
        (" 7\r\n", 7, 7),
        (OVER, U64_MAX, None),
        (GIANT, U64_MAX, None),
        ("8", 7, None),
        ("", U64_MAX, None),
        ("-1", U64_MAX, None),
        ("+1", U64_MAX, None),
        ("1_000", U64_MAX, None),
        ("0x10", U64_MAX, None),
        ("\u0663", U64_MAX, None),  # ARABIC-INDIC DIGIT THREE: isdecimal, not a counter
        ("\u00b2", U64_MAX, None),  # SUPERSCRIPT TWO
        ("1\x00", U64_MAX, None),
        ("1 2", U64_MAX, None),
    ],
)
def test_parse_uint(text: str, limit: int, want: int | None) -> None:
    if want is None:
        with pytest.raises(ParseError):
            parse_uint(text, "x", limit)
    else:
        assert parse_uint(text, "x", limit) == want
    assert uint_or_none(text, limit) == want


# (parser, text): each must raise ParseError, never anything else
RAISES: list[tuple[str, Callable[[str], object], str]] = [
    ("counter giant", parse_counter, GIANT),
    ("counter over 64 bits", parse_counter, OVER),
    ("pressure giant", parse_pressure, f"some avg10=0.00 total={GIANT}\n"),
    ("dcb pfc giant priority", tools.parse_dcb_pfc, f"prio-pfc {GIANT}:on\n"),
    ("dcb pfc giant priority off", tools.parse_dcb_pfc, f"prio-pfc {GIANT}:off\n"),
    ("dcb app giant priority", tools.parse_dcb_app, f"dscp-prio AF31:{GIANT}\n"),
    ("dcb app giant dscp", tools.parse_dcb_app, f"dscp-prio {GIANT}:3\n"),
    (
        "mlnx_qos giant dscp",
        tools.parse_mlnx_qos,
        f"Priority trust state: dscp\n prio:0 dscp:{GIANT}\n",
    ),
    ("lldptool giant priority", tools.parse_lldptool_pfc, f"PFC enabled: {GIANT}\n"),
    ("ibv_devinfo giant port", tools.parse_ibv_devinfo, f"hca_id: x\n\tport:\t{GIANT}\n"),
    ("ibv_devinfo giant mtu", tools.parse_ibv_devinfo, f"\tport:\t1\n\t\tactive_mtu:\t{GIANT}\n"),
    ("ip -j giant mtu", tools.parse_ip_addr, f'[{{"ifname": "x", "mtu": {GIANT}}}]'),
    ("ip -j giant negative", tools.parse_ip_addr, f'[{{"ifname": "x", "mtu": -{GIANT}}}]'),
    ("ip -j nested deep", tools.parse_ip_addr, "[" * 100_000),
    ("ip -j a number", tools.parse_ip_addr, "5"),
    ("ip -j null", tools.parse_ip_addr, "null"),
    ("ip -j list of lists", tools.parse_ip_addr, "[[1, 2]]"),
    ("ip -j list of strings", tools.parse_ip_addr, '["eth0"]'),
    ("ip -j addr_info an object", tools.parse_ip_addr, '[{"addr_info": {"local": "1.2.3.4"}}]'),
    ("ip -j NUL", tools.parse_ip_addr, '[{"ifname": "x\x00"}'),
    ("dcb ets giant tc", hwtools.parse_dcb_ets, f"tc-bw {GIANT}:50\n"),
    ("dcb ets giant share", hwtools.parse_dcb_ets, f"tc-bw 0:{GIANT}\n"),
    ("dcb buffer giant index", hwtools.parse_dcb_buffer, f"prio-buffer 0:{GIANT}\n"),
    ("dcb app giant udp port", hwtools.parse_dcb_app_ports, f"dgram-port-prio {GIANT}:3\n"),
    ("dcb app giant priority", hwtools.parse_dcb_app_ports, f"dgram-port-prio 4791:{GIANT}\n"),
    (
        "mlnx_qos giant buffer",
        hwtools.parse_mlnx_qos_buffers,
        f"Receive buffer size (bytes): {GIANT}\n",
    ),
    ("ethtool giant lanes", hwtools.parse_ethtool_link, f"Settings for x:\n\tLanes: {GIANT}\n"),
    (
        "fec giant count",
        hwtools.parse_ethtool_fec,
        f"Active FEC encoding: RS\n corrected_blocks: {GIANT}\n",
    ),
    ("width giant", hwtools.parse_link_width, GIANT),
    ("gid non-hex", parse_gid, "fe80:0000:0000:0000:zzzz:0000:0000:0001"),
    ("gid short", parse_gid, "fe80::1"),
    ("gid NUL", parse_gid, "fe80:0000:0000:0000:0000:0000:0000:000\x00"),
    ("gid signed group", parse_gid, "fe80:0000:0000:0000:0000:0000:0000:-001"),
    (
        "ethtool -S strict over 64 bits",
        lambda t: ethtool.parse_ethtool_stats(t, strict=True),
        f"NIC statistics:\n a: {OVER}\n",
    ),
]


@pytest.mark.parametrize(("name", "fn", "text"), RAISES, ids=[r[0] for r in RAISES])
def test_hostile_text_raises_parse_error(name: str, fn: Callable[[str], object], text: str) -> None:
    with pytest.raises(ParseError):
        fn(text)


def test_ethtool_stats_skip_over_long_and_over_64_bit_values() -> None:
    text = f"NIC statistics:\r\n     rx_prio3_pause: {GIANT}\r\n     tx_prio3_pause: {OVER}\r\n"
    text += "     rx_ecn_mark: 5\r\n"
    stats = ethtool.parse_ethtool_stats(text)
    assert dict(stats.values) == {"rx_ecn_mark": 5}
    assert len(stats.skipped) == 2 and all("is over" in s for s in stats.skipped)
    assert ethtool.parse_pfc_stats(stats).rx_ecn_mark == 5


def test_mlnx_qos_with_crlf_reads_as_with_lf() -> None:
    lf = (FIX / "tools" / "mlx5" / "mlnx_qos.txt").read_text()
    crlf = lf.replace("\n", "\r\n")
    assert tools.parse_mlnx_qos(crlf) == tools.parse_mlnx_qos(lf)
    assert hwtools.parse_mlnx_qos_ets(crlf) == hwtools.parse_mlnx_qos_ets(lf)
    assert hwtools.parse_mlnx_qos_buffers(crlf) == hwtools.parse_mlnx_qos_buffers(lf)
    assert hwtools.parse_mlnx_qos_dcbx(crlf) == hwtools.parse_mlnx_qos_dcbx(lf)
    cr = lf.replace("\n", "\r")
    assert tools.parse_mlnx_qos(cr) == tools.parse_mlnx_qos(lf)


def test_mlnx_qos_dscp_list_does_not_run_into_the_next_line() -> None:
    got = tools.parse_mlnx_qos("Priority trust state: dscp\n\tprio:0 dscp:1,2\n3\n")
    assert dict(got.dscp_prio) == {1: 0, 2: 0}


@pytest.mark.parametrize(
    ("fixture", "parser"),
    [
        ("dcb_pfc_show.txt", tools.parse_dcb_pfc),
        ("dcb_app_show.txt", tools.parse_dcb_app),
        ("lldptool_pfc.txt", tools.parse_lldptool_pfc),
        ("ibv_devinfo.txt", tools.parse_ibv_devinfo),
        ("dcb_ets_show.txt", hwtools.parse_dcb_ets),
        ("dcb_buffer_show.txt", hwtools.parse_dcb_buffer),
        ("dcb_app_show.txt", hwtools.parse_dcb_app_ports),
        ("lldptool_app.txt", hwtools.parse_lldptool_app),
        ("ethtool.txt", hwtools.parse_ethtool_link),
        ("ethtool_a.txt", hwtools.parse_ethtool_pause),
        ("ethtool_fec.txt", hwtools.parse_ethtool_fec),
        ("ethtool_i.txt", hwtools.parse_ethtool_driver),
        ("mlxlink.txt", hwtools.parse_mlxlink),
    ],
)
def test_tools_output_with_crlf_reads_as_with_lf(
    fixture: str, parser: Callable[[str], object]
) -> None:
    lf = (FIX / "tools" / "mlx5" / fixture).read_text()
    assert parser(lf.replace("\n", "\r\n")) == parser(lf)


@pytest.mark.parametrize(
    ("text", "ipv4", "mtu", "operstate"),
    [
        # entries that are not objects, or hold a `local` that is not a string, are left out
        (
            '[{"addr_info": [1, null, "x", [], {"family": "inet", "local": "10.0.0.1"}]}]',
            ("10.0.0.1",),
            None,
            None,
        ),
        (
            '[{"addr_info": [{"family": "inet", "local": [1]}, {"family": "inet", "local": 5}]}]',
            (),
            None,
            None,
        ),
        # fields of the wrong type read as absent
        ('[{"mtu": "9000", "operstate": [1], "ifname": {}}]', (), None, None),
        ('[{"mtu": true, "operstate": "UP"}]', (), None, "UP"),
        ('[{"mtu": -1}]', (), None, None),
        (f'[{{"mtu": {2**40}}}]', (), None, None),
        ('[{"mtu": 9000}, 5, null]', (), 9000, None),
        ('[{"addr_info": null}]', (), None, None),
    ],
)
def test_ip_addr_json_of_wrong_shapes(
    text: str, ipv4: tuple[str, ...], mtu: int | None, operstate: str | None
) -> None:
    if '"addr_info": null' in text:
        with pytest.raises(ParseError, match="not a list"):
            tools.parse_ip_addr(text)
        return
    got = tools.parse_ip_addr(text)
    assert (got.ipv4, got.mtu, got.operstate) == (ipv4, mtu, operstate)


@pytest.mark.parametrize(
    "gid",
    [
        "0000:0000:0000:0000:0000:ffff:zzzz:0101",
        "0000:0000:0000:0000:0000:ffff:c0a8",
        "0000:0000:0000:0000:0000:ffff:c0a8:0a0b:0000",
        "0000:0000:0000:0000:0000:ffff:c0a8:0a\x00b",
        "0000:0000:0000:0000:0000:ffff:c0a8:+a0b",
        "",
    ],
)
def test_gid_ipv4_of_non_gid_text_is_none(gid: str) -> None:
    assert Gid(0, gid, "RoCE v2", None).ipv4 is None


def test_gid_ipv4_of_a_mapped_gid() -> None:
    assert Gid(0, "0000:0000:0000:0000:0000:ffff:c0a8:0a0b", None, None).ipv4 == "192.168.10.11"


def test_sysfs_gid_that_is_not_hex_is_skipped_and_named(tmp_path: Path) -> None:
    port = tmp_path / "class" / "infiniband" / "d0" / "ports" / "1"
    (port / "gids").mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "gids" / "0").write_text("fe80:0000:0000:0000:zzzz:0000:0000:0001\n")
    (port / "gids" / "1").write_text("fe80:0000:0000:0000:0000:0000:0000:0001\n")
    (port / "gids" / GIANT[:200]).write_text("fe80:0000:0000:0000:0000:0000:0000:0002\n")
    p = read_device(tmp_path, "d0").ports[0]
    assert [g.index for g in p.gids] == [1]
    assert len(p.skipped) == 1 and p.skipped[0].startswith("gids/0: not a GID")


@pytest.mark.parametrize("value", [GIANT[:4000], OVER, "1\x00", "\u0663", "\xff\xfe"])
def test_sysfs_counter_that_is_no_counter_is_skipped(tmp_path: Path, value: str) -> None:
    hw = tmp_path / "class" / "infiniband" / "d0" / "ports" / "1" / "hw_counters"
    hw.mkdir(parents=True)
    (hw / "out_of_buffer").write_text(value, encoding="utf-8", errors="surrogateescape")
    (hw / "np_cnp_sent").write_text("12\n")
    pc = read_port_counters(tmp_path, "d0", 1)
    assert pc.hw is not None and dict(pc.hw.values) == {"np_cnp_sent": 12}
    assert [s.name for s in pc.skipped] == ["hw_counters/out_of_buffer"]


@pytest.mark.parametrize(
    ("page", "values", "skipped"),
    [
        ("agent_errors_total +Inf\nagent_tx_bytes_total 5\n", {"bytes": 5.0}, 1),
        (f"agent_errors_total {GIANT}\nagent_tx_bytes_total 5\n", {"bytes": 5.0}, 1),
        ("agent_errors_total NaN\nagent_errors_total -1\n", {}, 2),
        ('agent_errors_total{a="1" 3\nagent_errors_total{a="2"} 3\n', {"errors": 3.0}, 1),
        ("agent_tx_bytes_total 5\r\nagent_rx_bytes_total 6\r\n", {"bytes": 11.0}, 0),
        ("\x00garbage\nagent_tx_bytes_total 5\n", {"bytes": 5.0}, 1),
        # a total past the readings' 64 bits is left out (the sum of two near-2**64 lines)
        (f"agent_tx_bytes_total {2**63 + 2**62}\nagent_rx_bytes_total {2**63}\n", {}, 1),
        # other series are not this reader's to judge
        ("other_metric{ broken\nagent_tx_bytes_total 5\n", {"bytes": 5.0}, 0),
    ],
)
def test_nixl_page_bad_lines_are_skipped_and_counted(
    page: str, values: dict[str, float], skipped: int
) -> None:
    got = parse_totals(page)
    assert (got.values, got.skipped) == (values, skipped)


def test_nixl_reader_counts_skipped_lines_and_keeps_good_ones() -> None:
    body = f"agent_errors_total {GIANT}\nagent_tx_bytes_total 7\n".encode() + b"\xff\xfe\n"
    r = NixlReader(["http://127.0.0.1:9/metrics"], fetch=lambda url, timeout: body)
    out = r.sample()
    assert [(c.name, c.value) for c in out] == [("bytes", 7)]
    assert (r.skipped_lines, r.errors) == (2, 0)


def test_tool_output_that_is_not_utf8_is_read(tmp_path: Path) -> None:
    """run_command decodes a tool's bytes with replacement (no UnicodeDecodeError)."""
    script = tmp_path / "tool"
    script.write_bytes(b"#!/bin/sh\nprintf 'NIC statistics:\\n     rx_\\377: 1\\n     tx: 2\\n'\n")
    script.chmod(0o755)
    res = ethtool.run_command([str(script)], 5.0)
    stats = ethtool.parse_ethtool_stats(res.stdout)
    assert stats.get("tx") == 2 and stats.get("rx_\ufffd") == 1


def _settings_file(text: str) -> object:
    return parse_toml(text, "agent.toml")


def _otlp_json(text: str) -> object:
    return otlp_http.decode(text.encode(), otlp_http.JSON)


def _member(text: str) -> object:
    return parse_member(text.encode())


ERRORS: dict[str, type[Exception]] = {
    "policy": PolicyError,
    "settings": ConfigError,
    "otlp": otlp_http.BadRequest,
    "member": ValueError,
}


# TOML and JSON readers: an integer of more than 4,300 digits, or nesting past Python's
# stack, is the reader's own error (the decoders raise ValueError / RecursionError)
NESTED: list[tuple[str, Callable[[str], object], str]] = [
    ("policy", parse_policy, f"[roce]\npriority = {GIANT}\n"),
    ("policy", parse_policy, "[roce]\npriority = " + "[" * 5000 + "\n"),
    ("policy", parse_policy, "[roce]\npriority = " + "{a = " * 5000 + "\n"),
    ("settings", _settings_file, f"[agent]\nwindow_s = {GIANT}\n"),
    ("settings", _settings_file, "[agent]\nwindow_s = " + "[" * 5000 + "\n"),
    ("otlp", _otlp_json, "[" * 50_000),
    ("otlp", _otlp_json, '{"a": ' * 50_000),
    ("otlp", _otlp_json, '{"resourceSpans": ' + "[" * 900 + "]" * 900 + "}"),
    ("otlp", _otlp_json, f'{{"resourceSpans": [{{"x": {GIANT}}}]}}'),
    ("member", _member, "[" * 1000),
    ("member", _member, '{"name": ' + "[" * 1000),
]


@pytest.mark.parametrize(
    ("kind", "fn", "text"), NESTED, ids=[f"{r[0]}-{i}" for i, r in enumerate(NESTED)]
)
def test_toml_and_json_readers_refuse_deep_and_long_input(
    kind: str, fn: Callable[[str], object], text: str
) -> None:
    with pytest.raises(ERRORS[kind]):
        fn(text)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[roce\n", "not valid TOML: "),
        (f"a = {GIANT}\n", "a number too long to read: "),
        ("a = " + "[" * 5000 + "\n", "nested too deep to read"),
        ("a = " + "{b = " * 5000 + "\n", "nested too deep to read"),
    ],
)
def test_toml_from_outside_fails_one_way_saying_why(text: str, why: str) -> None:
    with pytest.raises(TomlError) as e:
        toml_loads(text)
    assert str(e.value).startswith(why) and len(str(e.value)) < 300
    with pytest.raises(PolicyError, match=f"^policy: {why}"):
        parse_policy(text.replace("a = ", "[roce]\npriority = "))
    assert toml_loads("[roce]\npriority = 3\n") == {"roce": {"priority": 3}}


def test_settings_value_of_deep_toml_is_a_value_error() -> None:
    spec = next(s for s in settings.specs(AgentConfig) if s.is_many)
    for text in ("[" * 5000, f"[{GIANT}]"):
        with pytest.raises(ValueError, match="not a TOML array"):
            settings.parse_text(spec, text)


@pytest.mark.parametrize(
    "point", [{}, {"0": 1}, "ab", None, 5, [10**400, "1"], [1.0, 10**400], [1.0], []]
)
def test_prometheus_matrix_point_of_wrong_shape_is_skipped(point: object) -> None:
    series = {"metric": {"src": "a"}, "values": [point, [2.0, "3"]]}
    df = frames.range_frame([series])
    assert list(df["t"]) == [2.0] and list(df["value"]) == [3.0]


@pytest.mark.parametrize("body", [b"[" * 100_000, b'{"a": ' * 100_000, b"9" * 5000])
def test_prometheus_answer_nested_too_deep_is_a_source_error(
    body: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sources, "http_get", lambda *a, **k: body)
    with pytest.raises(sources.SourceError, match="not JSON"):
        sources.prometheus_range(
            "http://127.0.0.1:9",
            "up",
            start=0,
            end=1,
            step=1,
            auth=sources.HttpAuth(),
            timeout=1.0,
        )


def test_agent_counts_what_its_readers_skipped(tmp_path: Path) -> None:
    """A bad counter file and bad ethtool lines cost only themselves, and show on the
    agent's /metrics as fabricprobe_agent_inputs_skipped_total{source}."""
    root = tmp_path / "sys"
    shutil.copytree(FIX / "sys" / "mlx5", root, symlinks=True)
    hw = root / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "hw_counters"
    (hw / "out_of_buffer").write_text(OVER + "\n")
    text = (FIX / "ethtool" / "mlx5_core.txt").read_text()
    text += f"     rx_giant: {GIANT}\n     tx_over: {OVER}\r\n"

    def runner(argv: Sequence[str], timeout: float) -> ethtool.CommandResult:
        return ethtool.CommandResult(0, text)

    devices = discover_devices(str(root))
    sampler = CounterSampler(str(root), devices, netdevs_of(devices), runner)
    readings = sampler.sample()
    assert not [r for r in readings if r.name == "out_of_buffer"]
    assert [r for r in readings if r.name == "local_ack_timeout_err"]
    assert [r for r in readings if r.kind == "pfc"]
    assert (sampler.skipped_counters, sampler.skipped_lines) == (1, 2)
    view = agent_view(inputs_skipped={"sysfs": 1, "ethtool": 2}, registered=False)
    reg = CollectorRegistry()
    reg.register(AgentCollector(view))  # type: ignore[arg-type]
    got = generate_latest(reg).decode()
    assert 'fabricprobe_agent_inputs_skipped_total{source="ethtool"} 2.0' in got
    assert 'fabricprobe_agent_inputs_skipped_total{source="nixl"} 0.0' in got


@pytest.mark.parametrize("body", ["a: " + "[" * 5000, "a: " + "{b: " * 5000])
def test_web_config_nested_too_deep_is_a_value_error(tmp_path: Path, body: str) -> None:
    path = tmp_path / "web.yml"
    path.write_text(body)
    with pytest.raises(ValueError, match="nested too deep"):
        load_web_config(str(path))


@pytest.mark.parametrize(
    ("mtu", "tos", "want"),
    [
        ("9000\n", "106\n", (9000, 106)),
        (GIANT, GIANT, (None, None)),
        ("\u0663", "256", (None, None)),
    ],
)
def test_host_view_netdev_mtu_and_tos_bounded(
    tmp_path: Path, mtu: str, tos: str, want: tuple[int | None, int | None]
) -> None:
    (tmp_path / "sys" / "class" / "net" / "eth0").mkdir(parents=True)
    (tmp_path / "sys" / "class" / "net" / "eth0" / "mtu").write_text(mtu)
    port = tmp_path / "cfg" / "rdma_cm" / "d0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "default_roce_tos").write_text(tos)
    (port / "default_roce_mode").write_text("RoCE v2\n")
    view = HostView(sysfs_root=tmp_path / "sys", configfs_root=tmp_path / "cfg")
    assert (view.netdev_mtu("eth0"), view.rdma_cm("d0", 1).tos) == want
