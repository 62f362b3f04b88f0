"""Port counters from fixture sysfs trees, and deltas/rates with wrap and reset."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

import pytest

import fabricprobe.probes.counters as counters_mod
from fabricprobe.core.errors import ParseError
from fabricprobe.probes.counters import (
    RETRANSMIT_COUNTERS,
    CounterDelta,
    counter_delta,
    counter_deltas,
    counter_width,
    hw_counter_changes,
    parse_counter,
    read_port_counters,
)

SYS = Path(__file__).resolve().parents[1] / "fixtures" / "sys"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0\n", 0),
        ("18446744073709551615", 2**64 - 1),
        ("  42 ", 42),
    ],
)
def test_parse_counter(text: str, expected: int) -> None:
    assert parse_counter(text) == expected


@pytest.mark.parametrize("text", ["", "-1", "N/A (no PMA)", "0x10", "1.5", "12 34"])
def test_parse_counter_rejects(text: str) -> None:
    with pytest.raises(ParseError, match="not a counter"):
        parse_counter(text)


def test_mlx5_has_pma_and_hw_counters() -> None:
    pc = read_port_counters(SYS / "mlx5", "mlx5_0", 1)
    assert pc.pma is not None and pc.hw is not None
    assert pc.skipped == ()
    # port_*_data count 4-byte words
    assert pc.pma.port_rcv_data == 2031318449137
    assert pc.pma.port_rcv_bytes == 2031318449137 * 4
    assert pc.pma.port_xmit_bytes == pc.pma.port_xmit_data * 4  # type: ignore[operator]
    assert pc.pma.vl15_dropped == 0
    assert pc.hw.out_of_buffer == 0
    assert pc.hw.np_cnp_sent == 184213
    assert pc.hw.local_ack_timeout_err == 3
    # lifespan is a period in ms, not a counter
    assert "lifespan" not in pc.hw.values
    # rxe-only fields are absent, not zero
    assert pc.hw.rcvd_seq_err is None
    assert pc.value("roce_adp_retrans") == 41
    assert pc.value("port_xmit_packets") == 2087461005
    assert pc.value("no_such_counter") is None


def test_bnxt_re_has_no_counters_dir() -> None:
    pc = read_port_counters(SYS / "bnxt_re", "bnxt_re0", 1)
    assert pc.pma is None
    assert pc.hw is not None
    assert pc.hw.rx_roce_discards == 0
    assert pc.hw.to_retransmits == 0
    assert pc.hw.rx_cnp_pkts == 1904
    assert pc.hw.out_of_buffer is None  # bnxt_re calls it rx_out_of_buffer
    assert pc.hw.rx_out_of_buffer == 0


def test_rxe_counter_names() -> None:
    pc = read_port_counters(SYS / "rxe", "rxe0", 1)
    assert pc.pma is None and pc.hw is not None
    assert pc.hw.sent_pkts == 120442
    assert pc.hw.rcvd_pkts == 120391
    assert pc.hw.rdma_sends == 60211
    assert pc.hw.completer_retry_err == 0
    assert pc.hw.retry_exceeded_err == 0
    assert pc.hw.rcvd_seq_err == 0
    assert "lifespan" not in pc.hw.values


def test_irdma_names_kept_as_the_kernel_spells_them() -> None:
    pc = read_port_counters(SYS / "irdma", "irdma0", 1)
    assert pc.pma is None and pc.hw is not None
    assert pc.hw.values["cnpHandled"] == 912
    assert pc.hw.values["RxECNMrkd"] == 1207
    assert pc.hw.rp_cnp_handled is None


def test_device_without_hw_counters() -> None:
    pc = read_port_counters(SYS / "no_hw_counters", "mlx4_0", 1)
    assert pc.hw is None
    assert pc.pma is not None
    assert pc.pma.port_xmit_wait == 88121
    assert pc.pma.symbol_error == 4


def test_missing_port_gives_nothing() -> None:
    pc = read_port_counters(SYS / "mlx5", "mlx5_0", 2)
    assert pc.pma is None and pc.hw is None and pc.skipped == ()


def _copy(tmp_path: Path, kind: str) -> Path:
    dst = tmp_path / kind
    shutil.copytree(SYS / kind, dst, symlinks=True)
    return dst


def test_directory_where_a_counter_is_expected(tmp_path: Path) -> None:
    root = _copy(tmp_path, "mlx5")
    f = root / "class/infiniband/mlx5_0/ports/1/hw_counters/out_of_sequence"
    f.unlink()
    f.mkdir()
    pc = read_port_counters(root, "mlx5_0", 1)
    assert pc.hw is not None
    assert pc.hw.out_of_sequence is None
    assert [(s.name, s.reason) for s in pc.skipped] == [("hw_counters/out_of_sequence", "EISDIR")]


def test_unreadable_counter_is_skipped_with_errno(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tests run as root, so chmod 000 would not stop the read: fail that one path instead.
    root = _copy(tmp_path, "mlx5")
    target = root / "class/infiniband/mlx5_0/ports/1/hw_counters/np_cnp_sent"
    real = counters_mod.read_small

    def fake_read_small(path: Path) -> str:
        if Path(path) == target:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(counters_mod, "read_small", fake_read_small)
    pc = read_port_counters(root, "mlx5_0", 1)
    assert pc.hw is not None and pc.hw.np_cnp_sent is None
    assert [(s.name, s.reason) for s in pc.skipped] == [("hw_counters/np_cnp_sent", "EACCES")]


def test_non_numeric_counter_is_skipped(tmp_path: Path) -> None:
    root = _copy(tmp_path, "no_hw_counters")
    (root / "class/infiniband/mlx4_0/ports/1/counters/port_xmit_wait").write_text("N/A (no PMA)\n")
    pc = read_port_counters(root, "mlx4_0", 1)
    assert pc.pma is not None and pc.pma.port_xmit_wait is None
    assert pc.skipped[0].name == "counters/port_xmit_wait"
    assert "not a counter" in pc.skipped[0].reason


@pytest.mark.parametrize(
    ("prev", "cur", "width", "expected"),
    [
        (100, 150, 64, CounterDelta(50, wrapped=False, reset=False)),
        (7, 7, 32, CounterDelta(0, wrapped=False, reset=False)),
        # 32-bit wrap: 2**32 - 10 -> 5 is an increase of 15
        (2**32 - 10, 5, 32, CounterDelta(15, wrapped=True, reset=False)),
        # backwards by a little on a 32-bit counter: not a plausible wrap, a reset
        (1_000_000, 200, 32, CounterDelta(200, wrapped=False, reset=True)),
        # a 64-bit counter going backwards is always a reset
        (2**40, 12, 64, CounterDelta(12, wrapped=False, reset=True)),
        # a "32-bit" counter above 2**32 cannot have wrapped at 32 bits
        (2**33, 3, 32, CounterDelta(3, wrapped=False, reset=True)),
    ],
)
def test_counter_delta(prev: int, cur: int, width: int, expected: CounterDelta) -> None:
    assert counter_delta(prev, cur, width) == expected


@pytest.mark.parametrize(
    ("args", "message"),
    [((1, 2, 16), "width"), ((-1, 2, 64), "negative"), ((1, -2, 32), "negative")],
)
def test_counter_delta_rejects(args: tuple[int, int, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        counter_delta(*args)


def test_counter_deltas_leave_out_counters_missing_from_one_side() -> None:
    d = counter_deltas({"a": 1, "b": 2}, {"b": 5, "c": 9}, widths={"b": 32})
    assert d == {"b": CounterDelta(3, wrapped=False, reset=False)}


@pytest.mark.parametrize(
    ("name", "driver", "width"),
    [
        ("out_of_buffer", "mlx5_core", 32),
        ("out_of_buffer", None, 32),
        ("out_of_buffer", "bnxt_re", 64),
        ("np_cnp_sent", "mlx5_core", 64),
        ("symbol_error", None, 32),
        ("port_xmit_data", None, 64),
        ("sent_pkts", "rdma_rxe", 64),
    ],
)
def test_counter_width(name: str, driver: str | None, width: int) -> None:
    assert counter_width(name, driver) == width


def _bump(root: Path, dev: str, name: str, value: int) -> None:
    (root / f"class/infiniband/{dev}/ports/1/hw_counters/{name}").write_text(f"{value}\n")


@pytest.mark.parametrize(
    ("kind", "dev", "driver", "moved"),
    [
        ("rxe", "rxe0", "rdma_rxe", {"completer_retry_err": 7, "duplicate_request": 2}),
        ("mlx5", "mlx5_0", "mlx5_core", {"local_ack_timeout_err": 4, "roce_adp_retrans": 9}),
    ],
)
def test_retransmit_counter_changes_per_driver(
    tmp_path: Path, kind: str, dev: str, driver: str, moved: dict[str, int]
) -> None:
    root = _copy(tmp_path, kind)
    before = read_port_counters(root, dev, 1)
    assert before.hw is not None
    for name, by in moved.items():
        _bump(root, dev, name, before.hw.values[name] + by)
    after = read_port_counters(root, dev, 1)
    got = hw_counter_changes(before, after, RETRANSMIT_COUNTERS, driver)
    # every retransmit counter this driver has, in the catalogue's order; others left out
    assert list(got) == [n for n in RETRANSMIT_COUNTERS if n in before.hw.values]
    assert {n: d.delta for n, d in got.items() if d.delta} == moved
    assert "sent_pkts" not in got and "np_cnp_sent" not in got  # not retransmit counters


def test_retransmit_counter_changes_wrap_as_the_driver_does(tmp_path: Path) -> None:
    root = _copy(tmp_path, "mlx5")
    _bump(root, "mlx5_0", "packet_seq_err", 2**32 - 2)
    before = read_port_counters(root, "mlx5_0", 1)
    _bump(root, "mlx5_0", "packet_seq_err", 3)  # a 32-bit Q counter on mlx5
    after = read_port_counters(root, "mlx5_0", 1)
    d = hw_counter_changes(before, after, ["packet_seq_err"], "mlx5_core")["packet_seq_err"]
    assert (d.delta, d.wrapped, d.reset) == (5, True, False)


def test_retransmit_counter_changes_without_hw_counters_or_across_ports() -> None:
    none = read_port_counters(SYS / "no_hw_counters", "mlx4_0", 1)
    assert hw_counter_changes(none, none, RETRANSMIT_COUNTERS, None) == {}
    rxe = read_port_counters(SYS / "rxe", "rxe0", 1)
    with pytest.raises(ValueError, match="two ports"):
        hw_counter_changes(none, rxe, RETRANSMIT_COUNTERS, None)
