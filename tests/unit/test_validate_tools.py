"""Pure parsers for dcb, mlnx_qos, lldptool, ibv_devinfo and `ip -j addr` output."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabricprobe.core.errors import ParseError
from fabricprobe.probes.roce.tools import (
    bounded_lines,
    dscp_value,
    entries,
    parse_dcb_app,
    parse_dcb_apptrust,
    parse_dcb_pfc,
    parse_ibv_devinfo,
    parse_ip_addr,
    parse_lldptool_pfc,
    parse_mlnx_qos,
)

TOOLS = Path(__file__).resolve().parents[1] / "fixtures" / "tools"


def _read(rel: str) -> str:
    return (TOOLS / rel).read_text()


@pytest.mark.parametrize(
    ("text", "enabled"),
    [
        (_read("mlx5/dcb_pfc_show.txt"), {3}),
        (_read("pfc_wrong_priority/dcb_pfc_show.txt"), {4}),
        ("pfc-cap 8 macsec-bypass off delay 0\nprio-pfc 0:off 1:off 2:off 3:off\n", set()),
        ("prio-pfc 3:on 4:on\n", {3, 4}),
        # early iproute2 called it pg-pfc
        ("pfc-cap 8 macsec-bypass on delay 0\npg-pfc 0:off 1:on 7:on\n", {1, 7}),
    ],
)
def test_parse_dcb_pfc(text: str, enabled: set[int]) -> None:
    cfg = parse_dcb_pfc(text)
    assert cfg.enabled == enabled and cfg.source == "dcb"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no prio-pfc line"),
        ("Attribute read: Operation not supported\n", "no prio-pfc line"),
        ("prio-pfc 3:maybe\n", "on/off"),
        ("prio-pfc 9:on\n", "bad priority entry"),
        ("prio-pfc 3on\n", "bad priority entry"),
    ],
)
def test_parse_dcb_pfc_bad(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_dcb_pfc(text)


@pytest.mark.parametrize(
    ("key", "value"),
    [("AF31", 26), ("CS6", 48), ("EF", 46), ("CS0", 0), ("default", 0), ("26", 26), ("0x1a", 26)],
)
def test_dscp_value(key: str, value: int) -> None:
    assert dscp_value(key) == value


@pytest.mark.parametrize("key", ["AF51", "64", "-1", "cs6", ""])
def test_dscp_value_bad(key: str) -> None:
    with pytest.raises(ParseError):
        dscp_value(key)


def test_parse_dcb_app_mlx5_full_table() -> None:
    table = parse_dcb_app(_read("mlx5/dcb_app_show.txt"))
    assert len(table) == 64
    assert table[26] == (3,) and table[48] == (6,) and table[0] == (0,)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("dscp-prio AF31:3 CS6:6 \n", {26: (3,), 48: (6,)}),
        ("", {}),
        # other selectors are not DSCP
        ("ethtype-prio 8906:3\ndefault-prio 0\ndscp-prio 26:3\n", {26: (3,)}),
        # the same DSCP listed twice is kept as a conflict
        ("dscp-prio 26:3 26:5\n", {26: (3, 5)}),
    ],
)
def test_parse_dcb_app(text: str, expected: dict[int, tuple[int, ...]]) -> None:
    assert dict(parse_dcb_app(text)) == expected


@pytest.mark.parametrize("text", ["dscp-prio 26\n", "dscp-prio AF31:9\n", "dscp-prio XX:3\n"])
def test_parse_dcb_app_bad(text: str) -> None:
    with pytest.raises(ParseError):
        parse_dcb_app(text)


def test_parse_dcb_apptrust() -> None:
    assert parse_dcb_apptrust("order dscp pcp \n") == ("dscp", "pcp")
    with pytest.raises(ParseError, match="no order line"):
        parse_dcb_apptrust("Attribute read: Operation not supported\n")


def test_parse_mlnx_qos_dscp() -> None:
    q = parse_mlnx_qos(_read("mlx5/mlnx_qos.txt"))
    assert q.trust == "dscp"
    assert q.pfc_enabled == {3}
    assert len(q.dscp_prio) == 64
    assert q.dscp_prio[26] == 3 and q.dscp_prio[48] == 6 and q.dscp_prio[7] == 0


def test_parse_mlnx_qos_pcp() -> None:
    q = parse_mlnx_qos(_read("trust_pcp/mlnx_qos.txt"))
    assert q.trust == "pcp" and dict(q.dscp_prio) == {} and q.pfc_enabled == {3}


@pytest.mark.parametrize(
    ("text", "trust", "pfc"),
    [
        # older MLNX_OFED printed only the PFC table
        (
            "PFC configuration:\n\tpriority    0 1 2 3 4 5 6 7\n\tenabled     0 0 0 1 0 0 1 0\n",
            None,
            {3, 6},
        ),
        ("Priority trust mode: DSCP\n", "dscp", None),
    ],
)
def test_parse_mlnx_qos_variants(text: str, trust: str | None, pfc: set[int] | None) -> None:
    q = parse_mlnx_qos(text)
    assert q.trust == trust
    assert q.pfc_enabled == (frozenset(pfc) if pfc is not None else None)


@pytest.mark.parametrize(
    "text", ["", "Netlink error: Operation not permitted\n", "usage: mlnx_qos -i <interface>\n"]
)
def test_parse_mlnx_qos_bad(text: str) -> None:
    with pytest.raises(ParseError, match="mlnx_qos"):
        parse_mlnx_qos(text)


@pytest.mark.parametrize(
    ("text", "enabled"),
    [
        (_read("mlx5/lldptool_pfc.txt"), {3}),
        ("IEEE 8021QAZ PFC TLV\n\t Willing: yes\n\t PFC enabled: 1 3 7 \n", {1, 3, 7}),
        ("IEEE 8021QAZ PFC TLV\n\t PFC enabled: none\n", set()),
    ],
)
def test_parse_lldptool_pfc(text: str, enabled: set[int]) -> None:
    assert parse_lldptool_pfc(text).enabled == enabled


@pytest.mark.parametrize(
    "text", ["", "Agent instance for device not found\n", "\t PFC enabled: 1 x\n", "PFC enabled: 8"]
)
def test_parse_lldptool_pfc_bad(text: str) -> None:
    with pytest.raises(ParseError, match="lldptool"):
        parse_lldptool_pfc(text)


def test_parse_ibv_devinfo() -> None:
    ports = parse_ibv_devinfo(_read("mlx5/ibv_devinfo.txt"))
    p1 = ports[1]
    assert (p1.state, p1.max_mtu, p1.active_mtu, p1.link_layer) == (
        "PORT_ACTIVE",
        4096,
        4096,
        "Ethernet",
    )
    rxe = parse_ibv_devinfo(_read("rxe/ibv_devinfo.txt"))[1]
    assert (rxe.max_mtu, rxe.active_mtu) == (4096, 1024)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Failed to get IB devices list: Function not implemented\n", "no port section"),
        ("hca_id:\tx\n\t\tport:\t1\n\t\t\tactive_mtu:\t\tbig (5)\n", "is not a non-"),
    ],
)
def test_parse_ibv_devinfo_bad(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_ibv_devinfo(text)


def test_parse_ip_addr() -> None:
    a = parse_ip_addr(_read("mlx5/ip_addr.json"))
    assert a.ifname == "ens1f0np0" and a.mtu == 9000 and a.operstate == "UP"
    assert a.ipv4 == ("192.168.10.11",)
    assert a.ipv6 == ("fe80::ba3f:d2ff:fea1:b2c4",)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('Device "eth9" does not exist.\n', "not JSON"),
        ("[]", "non-empty list"),
        ('{"ifname": "x"}', "non-empty list"),
        ('[{"ifname": "x", "addr_info": 5}]', "not a list"),
    ],
)
def test_parse_ip_addr_bad(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_ip_addr(text)


@pytest.mark.parametrize(
    ("words", "last", "out"),
    [
        (["3:on", "4:off"], False, [("3", "on"), ("4", "off")]),
        (["a:b:c"], False, [("a", "b:c")]),
        (["a:b:c"], True, [("a:b", "c")]),
        (["3:"], False, [("3", "")]),
        ([], False, []),
    ],
)
def test_entries_split_each_word_once(words: list[str], last: bool, out: list[object]) -> None:
    got = list(entries(words, "tool: bad entry", last=last))
    assert [(a, b) for a, b, _ in got] == out
    assert all(why.startswith("tool: bad entry '") for _, _, why in got)


def test_entries_and_lines_refuse_what_is_not_theirs() -> None:
    with pytest.raises(ParseError, match="tool: bad entry 'nocolon'"):
        list(entries(["1:on", "nocolon"], "tool: bad entry"))
    assert bounded_lines("a\r\nb\rc\n", "tool") == "a\nb\nc"
    with pytest.raises(ParseError, match="more than any port has"):
        bounded_lines("x" * ((1 << 20) + 1), "tool")
