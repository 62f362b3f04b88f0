"""`ethtool -S` parsing, the PFC view of four drivers, the ethtool runner, ECN sysfs."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from fabricprobe.core.errors import NotSupported, ParseError, ProbeError
from fabricprobe.probes.ethtool import (
    CommandResult,
    parse_ethtool_stats,
    parse_pfc_stats,
    read_ecn_config,
    read_ethtool_stats,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ETHTOOL = FIXTURES / "ethtool"
SYS = FIXTURES / "sys"


def _stats(name: str) -> str:
    return (ETHTOOL / name).read_text()


@pytest.mark.parametrize(
    ("fixture", "name", "value"),
    [
        ("mlx5_core.txt", "rx_prio3_pause", 18233),
        ("mlx5_core.txt", "rx_vport_rdma_unicast_packets", 2143156360),
        ("bnxt_en.txt", "[1]: rx_ucast_packets", 301224),
        ("bnxt_en.txt", "pfc_pri3_rx_duration_us", 14022),
        ("ice.txt", "rx_priority_3_xoff.nic", 980),
        ("ice.txt", "tx_queue_1_bytes", 1022114),
        ("veth.txt", "peer_ifindex", 7),
    ],
)
def test_parse_real_outputs(fixture: str, name: str, value: int) -> None:
    stats = parse_ethtool_stats(_stats(fixture))
    assert stats.skipped == ()
    assert stats.get(name) == value


@pytest.mark.parametrize(
    ("text", "values", "skipped"),
    [
        # garbage line among good ones
        (
            "NIC statistics:\n     rx_packets: 5\n     this is not a stat\n     tx_packets: 7\n",
            {"rx_packets": 5, "tx_packets": 7},
            ["line 3: not 'name: value'"],
        ),
        # non-integer and negative values
        (
            "NIC statistics:\n     a: 1.5\n     b: -3\n     c: 0x10\n     d: 4\n",
            {"d": 4},
            ["a: value '1.5' is not a non-", "b: value '-3' is negative", "c: value '0x10'"],
        ),
        # a value over 2**64 - 1 is skipped, whatever its length (int() refuses 4,300 digits)
        (
            "NIC statistics:\n     a: 18446744073709551616\n"
            + f"     b: {'9' * 5000}\n     c: 1\n",
            {"c": 1},
            ["a: value 18446744073709551616 is over", "b: value a 5000-digit number is over"],
        ),
        # the largest counter, with leading zeros, is kept
        ("NIC statistics:\n     a: 0018446744073709551615\n", {"a": 2**64 - 1}, []),
        # digits of other scripts are not counters
        ("NIC statistics:\n     a: \u0663\n     b: \u00b2\n", {}, ["a: value", "b: value"]),
        # CRLF and CR line ends; NUL bytes in a value
        ("NIC statistics:\r\n     a: 1\r\n     b: 2\r", {"a": 1, "b": 2}, []),
        ("NIC statistics:\n     a: 1\x00\n     b: 2\n", {"b": 2}, ["a: value '1\\x00'"]),
        # a repeated name keeps the first value
        ("NIC statistics:\n     a: 1\n     a: 2\n", {"a": 1}, ["a: repeated"]),
        # empty value and an empty name
        ("NIC statistics:\n     a:\n     : 3\n", {}, ["a: value ''", "line 3: not 'name: value'"]),
        # header only (a driver that has no counters)
        ("NIC statistics:\n", {}, []),
        # text before the header (a warning on stderr folded in) is ignored
        ("ethtool: warning\nNIC statistics:\n     x: 1\n", {"x": 1}, []),
    ],
)
def test_parse_bad_lines_are_skipped(text: str, values: dict[str, int], skipped: list[str]) -> None:
    stats = parse_ethtool_stats(text)
    assert dict(stats.values) == values
    assert len(stats.skipped) == len(skipped)
    for got, want in zip(stats.skipped, skipped, strict=True):
        assert want in got


@pytest.mark.parametrize(
    "text", ["", "no stats available\n", "Cannot get stats strings information: No such device"]
)
def test_parse_not_ethtool_output(text: str) -> None:
    with pytest.raises(ParseError, match="not `ethtool -S` output"):
        parse_ethtool_stats(text)


def test_parse_strict_raises_on_first_bad_line() -> None:
    with pytest.raises(ParseError, match="line 2"):
        parse_ethtool_stats("NIC statistics:\n     rx: x\n", strict=True)


def test_pfc_mlx5() -> None:
    pfc = parse_pfc_stats(parse_ethtool_stats(_stats("mlx5_core.txt")))
    assert pfc.scheme == "mlx5" and pfc.has_pfc
    p3 = pfc.priority(3)
    assert p3 is not None
    assert (p3.rx_pause, p3.tx_pause) == (18233, 4410)
    assert (p3.rx_pause_duration_us, p3.tx_pause_duration_us) == (90412, 22051)
    assert p3.rx_pause_transitions == 9116
    assert p3.rx_discards == 0
    assert p3.rx_xon is None  # ice only
    # mlx5 prints pause counters only for priorities with PFC enabled
    p0 = pfc.priority(0)
    assert p0 is not None and p0.rx_pause is None and p0.rx_discards == 0
    assert pfc.tx_pause_storm_warning_events == 0
    assert pfc.tx_pause_storm_error_events == 0
    assert pfc.rx_discards_phy == 0
    assert pfc.rx_ecn_mark == 190422
    assert pfc.rx_link_pause == 0


def test_pfc_bnxt_en() -> None:
    pfc = parse_pfc_stats(parse_ethtool_stats(_stats("bnxt_en.txt")))
    assert pfc.scheme == "bnxt_en"
    p3 = pfc.priority(3)
    assert p3 is not None
    assert (p3.rx_pause, p3.tx_pause) == (3012, 1164)
    assert (p3.rx_pause_duration_us, p3.tx_pause_duration_us) == (14022, 5120)
    assert (p3.rx_pause_transitions, p3.tx_pause_transitions) == (1506, 582)
    assert pfc.continuous_pause_events == 0
    assert pfc.tx_pause_storm_error_events is None  # an mlx5 counter
    assert pfc.rx_link_pause == 0


def test_pfc_bnxt_en_old_firmware_name() -> None:
    pfc = parse_pfc_stats({"rx_pfc_ena_frames_pri3": 5, "rx_pfc_xon2xoff_frames_pri3": 2})
    p3 = pfc.priority(3)
    assert pfc.scheme == "bnxt_en" and p3 is not None and p3.rx_pause_transitions == 2


def test_pfc_ice() -> None:
    pfc = parse_pfc_stats(parse_ethtool_stats(_stats("ice.txt")))
    assert pfc.scheme == "ice"
    p3 = pfc.priority(3)
    assert p3 is not None
    assert (p3.rx_pause, p3.tx_pause, p3.rx_xon, p3.tx_xon) == (980, 411, 977, 410)
    assert p3.rx_pause_duration_us is None
    assert pfc.rx_link_pause == 0


def test_pfc_veth_has_none() -> None:
    pfc = parse_pfc_stats(parse_ethtool_stats(_stats("veth.txt")))
    assert pfc.scheme is None and not pfc.has_pfc
    assert pfc.priorities == ()
    assert pfc.priority(3) is None
    assert pfc.tx_pause_storm_error_events is None


class _Runner:
    def __init__(self, result: CommandResult | BaseException) -> None:
        self.result = result
        self.calls: list[tuple[list[str], float]] = []

    def __call__(self, argv: Sequence[str], timeout: float) -> CommandResult:
        self.calls.append((list(argv), timeout))
        if isinstance(self.result, BaseException):
            raise self.result
        return self.result


def test_read_ethtool_stats_runs_ethtool() -> None:
    runner = _Runner(CommandResult(0, _stats("veth.txt")))
    stats = read_ethtool_stats("veth0", runner=runner, timeout=3)
    assert stats.get("peer_ifindex") == 7
    assert runner.calls == [(["ethtool", "-S", "veth0"], 3)]


@pytest.mark.parametrize(
    ("result", "error", "message"),
    [
        (FileNotFoundError("ethtool"), NotSupported, "not installed"),
        (subprocess.TimeoutExpired("ethtool", 5), ProbeError, "did not finish"),
        (CommandResult(94, "no stats available\n"), NotSupported, "no ethtool statistics"),
        (
            CommandResult(96, "", "Cannot get stats strings information: No such device\n"),
            ProbeError,
            "no network device",
        ),
        (CommandResult(1, "", "something odd\n"), ProbeError, "failed \\(exit 1\\)"),
    ],
)
def test_read_ethtool_stats_errors(
    result: CommandResult | BaseException, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        read_ethtool_stats("eth9", runner=_Runner(result))


def test_read_ecn_config_mlx5() -> None:
    ecn = read_ecn_config(SYS / "mlx5", "ens1f0np0")
    assert ecn is not None
    assert ecn.rp_enabled[3] and ecn.np_enabled[3]
    assert not ecn.rp_enabled[0] and not ecn.np_enabled[6]
    assert sorted(ecn.rp_enabled) == list(range(8))
    assert (ecn.cnp_dscp, ecn.cnp_802p_prio) == (48, 6)


@pytest.mark.parametrize(("kind", "netdev"), [("bnxt_re", "ens2f0np0"), ("rxe", "veth0")])
def test_read_ecn_config_absent(kind: str, netdev: str) -> None:
    assert read_ecn_config(SYS / kind, netdev) is None


def test_read_ecn_config_ignores_junk(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    shutil.copytree(SYS / "mlx5", root, symlinks=True)
    np_dir = root / "class/net/ens1f0np0/ecn/roce_np"
    (np_dir / "enable/5").write_text("maybe\n")
    (np_dir / "cnp_dscp").unlink()
    ecn = read_ecn_config(root, "ens1f0np0")
    assert ecn is not None
    assert 5 not in ecn.np_enabled
    assert ecn.cnp_dscp is None
